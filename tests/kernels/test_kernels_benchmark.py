"""``benchmarks/fused_kernels.py``: the ``--dry-run`` (CPU, Triton interpreter, tiny shapes) runs end to end in both
modes, and the ``MEASURED`` block ``--sweep`` prints is valid Python that ``_tiles`` then uses."""

from __future__ import annotations

import os
import sys

import pytest
from benchmark_script import ROOT, run_dry

from fp8_fusion_pass.kernels.triton import _tiles


def _run(tmp_path, *args: str) -> str:
    return run_dry("fused_kernels.py", tmp_path, *args)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """One dry run of the table (~20 s in the interpreter), read by the tests below: (stdout, its --out dir)."""
    out_dir = tmp_path_factory.mktemp("kernels_table")
    return _run(out_dir), out_dir


def test_dry_run_table(table):
    out, tmp_path = table
    for op in ("rms_norm_group_quant", "add_rms_norm_group_quant", "silu_mul_group_quant"):
        assert out.count(op) >= 2, out  # M = 5 and M = 1 rows
    assert "all M: fused / best peer" in out
    assert (tmp_path / "kernels.csv").read_text().count("\n") == 7  # header + 3 ops x 2 M
    assert "read_floor_us" in out  # the read-floor column of the table


def test_replot_reads_back_what_report_wrote(table):
    # --replot redraws the PNG from a measured CSV (docs/img/kernels_h200.png was redrawn so): the rows it reads
    # must be the numbers report() wrote, K and M as ints, the floats as floats.
    tmp_path = table[1]
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import fused_kernels

    rows = fused_kernels.read_csv(str(tmp_path / "kernels.csv"))
    assert len(rows) == 6 and {type(r["K"]) for r in rows} == {int} and {type(r["M"]) for r in rows} == {int}
    assert all(r["read_floor_us"] > 0 and r["fused_over_read_floor"] == r["fused_us"] / r["read_floor_us"]
               for r in rows)  # fmt: skip
    assert {r["op"] for r in rows} == set(fused_kernels.OPS)


def test_sweep_prints_a_pasteable_table(tmp_path, monkeypatch):
    out = _run(tmp_path, "--sweep")
    block = out[out.index("MEASURED: dict") :]
    block = block[: block.index("\n}") + 2]
    namespace = {"Tile": _tiles.Tile}
    exec(block, namespace)  # noqa: S102 - the text the script asks users to paste
    measured = namespace["MEASURED"]
    assert {op for op, _, _ in measured} == {"rms_norm", "add_rms_norm", "silu_mul"}, measured
    assert {bucket for _, _, bucket in measured} == {"small"}  # dry run: M = 5 and 1
    monkeypatch.setattr(_tiles, "MEASURED", measured)
    monkeypatch.setattr(_tiles.arch, "triton_interpreting", lambda: False)
    tile = measured[("rms_norm", 256, "small")]
    assert _tiles.row_tile(3, 256, 128) == tile and _tiles.row_tile(3, 256, 64) != tile  # group 128 only
    assert _tiles.row_tile(3, 256, 128, residual=True) == measured[("add_rms_norm", 256, "small")]
    assert _tiles.elementwise_tile(3, 3, 128, "silu_mul") == measured[("silu_mul", 384, "small")]
    assert all(t.split == 1 for t in measured.values())  # a split tile serves M <= SPLIT_MAX_M only: its own table
    # the dry run timed a split tile at M = 1 (K = 256: two programs of one group); SPLIT_ROWS is pasteable too,
    # holding a split tile wherever the dry run's (meaningless) times made one win
    assert "Tile(block_m=1, gpc=2, num_warps=2, one_pass=True, tail=0, per_sm=0, prefetch=False, split=2)" in out
    block = out[out.index("SPLIT_ROWS: dict") :]
    exec(block[: block.index("\n}") + 2], namespace)  # noqa: S102
    assert all(op in ("rms_norm", "add_rms_norm") and k == 256 and t.split == 2
               for (op, k), t in namespace["SPLIT_ROWS"].items()), namespace["SPLIT_ROWS"]
