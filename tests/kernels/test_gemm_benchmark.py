"""``benchmarks/gemm.py``: the TABLE rows it prints are valid Python that ``blockscale_mm`` accepts, the small-M
sweep's candidates are pinned as they run, and (slow) the ``--dry-run`` (CPU, Triton interpreter) runs end to
end, checking every candidate against the oracle."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._blockscale_kernels import TiledConfig
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig
from fp8_fusion_pass.kernels.triton._small_m_kernels import FMA_MAX_M, SmallMConfig, split_plan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
NAMES = {"Choice": bm.Choice, "SmallMConfig": SmallMConfig, "TiledConfig": TiledConfig, "GemvConfig": GemvConfig}


def _parse(rows: list[str]) -> dict:
    return eval("{\n" + "\n".join(rows) + "\n}", dict(NAMES))


def test_table_rows_are_pasteable():
    import gemm

    small = SmallMConfig(128, 4, 8, 4, "last", 2, False)
    rows = [
        gemm.table_row("sm90", 3, 28672, 14336, "small_m", small, "41.1 us = 1.21x roofline; cuBLAS 50.1 us"),
        gemm.table_row("sm90", 2, 4096, 4096, "small_m", SmallMConfig(32, 8, fma=True, reduce="last"), "GEMV"),
        gemm.table_row("sm90", 2049, 4096, 4096, "tiled", TiledConfig(128, 128, 8, 8, 3), "x"),
        gemm.table_row("sm90", 2048, 4096, 12288, "cublas", None, "y"),
    ]
    assert _parse(rows) == {
        ("sm90", 4, 28672, 14336): bm.Choice("small_m", small),  # M=3 -> bucket 4
        ("sm90", 4, 4096, 4096): bm.Choice("small_m", SmallMConfig(32, 8, reduce="last", fma=True)),
        ("sm90", 8192, 4096, 4096): bm.Choice("tiled", TiledConfig(128, 128, 8, 8, 3)),
        ("sm90", 2048, 4096, 12288): bm.Choice("cublas"),
    }
    assert max(len(line) for row in rows for line in row.splitlines()) <= 120


@pytest.mark.parametrize("n, k", [(6144, 4096), (51200, 5120), (5120, 25600), (128, 640)])
@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_sweep_candidates(n, k, m):
    import _gemm_sweep as sweep

    cands = sweep.candidates(n, k, m)
    assert len(cands) == len(set(cands)) > 0
    for c in cands:
        assert split_plan(k // 128, c.split_k, c.k_unroll)[0] == c.split_k  # pinned as it runs
        assert c.reduce == "last"
        assert m <= FMA_MAX_M or not c.fma
    families = {(c.block_n, c.warps, c.stages, c.k_unroll, c.fma, c.tma) for c in cands}
    assert families == {f for f in sweep.FAMILIES if m <= FMA_MAX_M or not f[4]}


@pytest.mark.parametrize("m, block_ms", [(16, set()), (32, {16}), (64, {16, 32})])
def test_sweep_candidates_with_the_rows_split(m, block_ms):
    import _gemm_sweep as sweep

    cands = sweep.candidates(6144, 4096, m, row_split=sweep.ROW_SPLIT_FAMILIES)
    assert {c.block_m for c in cands} == {0} | block_ms
    split = [c for c in cands if c.block_m]
    assert len(cands) == len(set(cands)) and all(split_plan(32, c.split_k, 1)[0] == c.split_k for c in split)
    assert {(c.block_n, c.warps, c.stages, c.k_unroll, c.fma, c.tma) for c in split} <= set(sweep.ROW_SPLIT_FAMILIES)


def test_idea_ratios():
    import _gemm_sweep as sweep

    timed = {
        SmallMConfig(64, 4, reduce="last"): 10.0,
        SmallMConfig(64, 4, reduce="last", k_unroll=2): 9.0,
        SmallMConfig(128, 2, reduce="last"): 12.0,
        SmallMConfig(32, 4, stages=3, reduce="last", fma=True): 15.0,
        SmallMConfig(64, 4, reduce="last", tma=True): 8.0,
    }
    r = sweep.idea_ratios(timed)
    assert r["k_unroll 2"] == pytest.approx(0.9)
    assert r["fma GEMV"] == pytest.approx(15.0 / 9.0)
    assert r["bn 128 vs 64"] == pytest.approx(1.2)
    assert r["tma"] == pytest.approx(0.8)  # against the pointer-loaded configs only
    assert r["stages 6"] is None and r["split 1"] is None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the dry run needs the Triton interpreter")
def test_dry_run(capsys):
    import gemm

    assert gemm.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r'\s+\("cpu", \d+, \d+, \d+\): Choice\(', line)]
    table = _parse(rows)
    assert set(table) == {("cpu", 1, 128, 512), ("cpu", 128, 128, 512)}  # M=1 and M=65 (bucket 128)
    assert all(c.path in ("tiled", "small_m") and c.config is not None for c in table.values())
    assert "WRONG" not in out and "RACY" not in out
    assert "last/kernel @best" in out and "bf16-in GEMM" in out


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU run needs the Triton interpreter")
def test_the_committed_table_row_is_re_timed(monkeypatch):
    # A sweep's winner is only worth a TABLE change against the committed row timed in the same run: the point
    # times that row (here a config no sweep family has) and reports it beside the best.
    import _read_floor
    import gemm

    from fp8_fusion_pass import arch

    monkeypatch.setattr(gemm, "DEVICE", "cpu")
    a = arch.arch_of("cpu")
    mine = SmallMConfig(32, 2, 4, 2, "last")
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 128, 512), bm.Choice("small_m", mine))
    floor = _read_floor.ReadFloor("cpu", dry_run=True, launches=((1, 256),))
    row, _ = gemm.run_point(gemm.Shape(128, 512), 1, [], [], 1e12, a, floor)
    assert row["table_config"] == f"small_m {mine!r}"
    assert isinstance(row["table_us"], float) and row["small_m_best_us"] <= row["table_us"]
    # a GEMV row too, though no sweep passed here holds its config (the M = 1 rows are GEMV_WIDE configs)
    wide = GemvConfig(2, 256, 2, 1)
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 128, 512), bm.Choice("gemv", wide))
    row, _ = gemm.run_point(gemm.Shape(128, 512), 1, [], [], 1e12, a, floor, gemv_sweep=[GemvConfig(2, 512, 4, 1)])
    assert row["table_config"] == f"gemv {wide!r}" and isinstance(row["table_us"], float)
    assert repr(wide) in row["gemv_us"] and row["gemv_best_us"] <= row["table_us"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU run needs the Triton interpreter")
def test_table_only_times_the_committed_row(monkeypatch, capsys):
    # --table-only: the committed TABLE row alone, checked against the oracle like every candidate, no sweep.
    import gemm

    from fp8_fusion_pass import arch

    monkeypatch.setattr(gemm, "DEVICE", "cpu")
    a = arch.arch_of("cpu")
    mine = SmallMConfig(32, 2, 4, 2, "last")
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 128, 512), bm.Choice("small_m", mine))
    row = gemm.table_point(gemm.Shape(128, 512), 1, a)
    assert row["table_config"] == f"small_m {mine!r}" and isinstance(row["table_us"], float)
    assert "table_us" not in gemm.table_point(gemm.Shape(128, 512), 65, a)  # no row for that bucket: nothing timed
    # and from the command line: the dry run's tiny shape is this N x K, so M = 1 finds the row above (M = 65 none)
    assert gemm.main(["--dry-run", "--table-only"]) == 0
    out = capsys.readouterr().out
    assert "TABLE row" in out and repr(mine) in out


@pytest.mark.parametrize("words, programs", [(26214, 132), (99942, 528), (1024, 132), (7, 8)])
def test_launch_floor_reads_every_word(words, programs):
    # The first version dropped each program's tail (a 4 MB "read" read nothing at 4 programs per SM): the
    # slabs must cover every word, and the kernel's sum must see them all.
    import _read_floor

    per = _read_floor.read_plan(words, programs)
    assert per * programs >= words  # programs past the end get an empty slab
    src = torch.ones(words, dtype=torch.int32)
    out = torch.zeros(programs, dtype=torch.int32)
    _read_floor.read_call([src], out, programs, 256)(0)
    assert int(out.sum()) == words


def test_read_floor_times_each_size_once():
    # fused_kernels.py / gemm.py ask for the floor of every point's bytes: equal word counts share one measurement.
    import _read_floor

    floor = _read_floor.ReadFloor("cpu", dry_run=True, launches=((1, 256),))
    first = floor.us(4096 * 3 + 1)
    assert first > 0 and floor.us(4096 * 3 + 2) == first  # both round up to the same 3073 words
    assert len(floor.cache) == 1
    floor.us(64)
    assert sorted(floor.cache) == [16, 3073]


def test_ablation_edits_still_apply():
    # benchmarks/small_m_ablation.py edits _small_m_kernels.py's source: each edit must find its line exactly once,
    # or the probe would time a kernel it did not edit.
    import small_m_ablation

    unedited = small_m_ablation.variant_source("copy")
    for name in small_m_ablation.EDITS:
        assert (small_m_ablation.variant_source(name) == unedited) == (name == "copy"), name
    assert small_m_ablation.main(["--check"]) == 0
    # a copy imports from outside the package (its relative imports made absolute) and leaves the package alone
    package = os.path.dirname(smk.__file__)
    before = sorted(os.listdir(package))
    copy = small_m_ablation.load_variant("copy")
    assert copy.SmallMConfig is not smk.SmallMConfig and copy.FMA_MAX_M == smk.FMA_MAX_M
    assert not copy.__file__.startswith(package) and sorted(os.listdir(package)) == before
