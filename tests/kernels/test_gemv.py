"""The block-FP8 GEMV path (``_gemv_kernels.py``, ``blockscale_mm`` path "gemv", M <= 4).

CPU (``TRITON_INTERPRET=1``): against the fp32 dequantized oracle at M = 1..4, N that is and is not a multiple of
the rows per program or of 128, K that is and is not a multiple of the K step; the dispatcher's use of a TABLE row,
its fallback where the GEMV cannot run (M > 4, activation groups of 64), and the kernel's own refusals; the grouped
GEMV (HF's separate q / k / v or gate / up weights in one launch) against the separate GEMVs, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import assert_close, make_inputs, oracle

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm, gemv_mm_grouped
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "m, n, k, config",
    [
        (1, 256, 512, GemvConfig(4, 256)),
        (2, 200, 640, GemvConfig(8, 512)),  # N not a multiple of 128; K not a multiple of the step
        (3, 130, 384, GemvConfig(8, 128)),  # N not a multiple of the rows: the last program is partial
        (4, 64, 1024, GemvConfig(1, 1024, 2, 3)),
    ],
)
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_gemv_matches_oracle(m, n, k, config, out_dtype):
    q, xs, w, s = make_inputs(m, n, k)
    assert_close(gemv_mm(q, xs, w, s, out_dtype, config), oracle(q, xs, w, s), out_dtype, f"M={m} N={n} K={k} {config}")


def test_dispatch_runs_a_gemv_table_row_and_falls_back_where_it_cannot(monkeypatch):
    a = arch.arch_of("cpu")
    q, xs, w, s = make_inputs(2, 256, 512)
    monkeypatch.setitem(bm.TABLE, (a.name, 4, 256, 512), bm.Choice("gemv", GemvConfig(16, 256)))
    assert bm.plan_for(q, xs, w, s, BF16) == bm.Choice("gemv", GemvConfig(16, 256))
    assert torch.equal(bm.blockscale_mm(q, xs, w, s, BF16), gemv_mm(q, xs, w, s, BF16, GemvConfig(16, 256)))
    # M above the GEMV's rows (bucket 16 has no row: the default), and a row naming the GEMV for M = 5
    monkeypatch.setitem(bm.TABLE, (a.name, 16, 256, 512), bm.Choice("gemv", GemvConfig(16, 256)))
    q5, xs5, _, _ = make_inputs(5, 256, 512)
    assert bm.plan_for(q5, xs5, w, s, BF16).path != "gemv"
    assert_close(bm.blockscale_mm(q5, xs5, w, s, BF16), oracle(q5, xs5, w, s).to(BF16), BF16)
    # activation groups of 64: not the GEMV
    q64, xs64, _, _ = make_inputs(2, 256, 512, group=64)
    assert bm.plan_for(q64, xs64, w, s, BF16).path != "gemv"
    with pytest.raises(ValueError, match="cannot run"):
        bm.run("gemv", q64, xs64, w, s, BF16)
    with pytest.raises(ValueError, match="M <= 4"):
        bm.run("gemv", q5, xs5, w, s, BF16)


def test_plan_falls_back_to_the_small_m_config_measured_beside_a_gemv_row():
    # Qwen3-8B qkv at M = 1 on a simulated H200 with 1x64 activation groups: the GEMV row cannot run them
    with arch.simulate_arch("sm90") as a:
        choice = bm.plan(a, "cuda", torch.float8_e4m3fn, 1, 6144, 4096, 64, BF16)
    assert choice == bm.Choice("small_m", bm.SMALL_M_BEST[("sm90", 1, 6144, 4096)])


def test_config_is_validated():
    with pytest.raises(ValueError, match="powers of two"):
        GemvConfig(3, 512)
    with pytest.raises(ValueError, match="powers of two"):
        GemvConfig(4, 192)


def test_grouped_launch_runs_the_gemv_where_the_merged_plan_is_the_gemv(monkeypatch):
    from fp8_fusion_pass.kernels.triton import blockscale_mm_grouped as bmg

    a = arch.arch_of("cpu")
    q, xs, w, s = make_inputs(1, 256, 512)
    ws, ss = [w[:128], w[128:]], [s[:1], s[1:]]
    best = SmallMConfig(64, 2, 4, 2, "last")
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 256, 512), bm.Choice("gemv", GemvConfig(16, 256)))
    monkeypatch.setitem(bm.SMALL_M_BEST, (a.name, 1, 256, 512), best)
    assert bmg.grouped_choice(q, xs, ws, ss, BF16) == bm.Choice("gemv", GemvConfig(16, 256))
    assert torch.equal(bmg.blockscale_mm_grouped(q, xs, ws, ss, BF16),
                       torch.cat([gemv_mm(q, xs, wi, si, BF16, GemvConfig(16, 256)) for wi, si in zip(ws, ss)], -1))
    # a program's rows would straddle the two weights (256 rows per program, 128 in the first): the small-M config
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 256, 512), bm.Choice("gemv", GemvConfig(256, 256)))
    assert bmg.grouped_choice(q, xs, ws, ss, BF16) == bm.Choice("small_m", best)
    monkeypatch.setitem(bm.TABLE, (a.name, 1, 256, 512), bm.Choice("tiled"))  # another path won: separate GEMMs
    assert bmg.grouped_choice(q, xs, ws, ss, BF16) is None


@pytest.mark.parametrize("ns, config", [((256, 128, 128), GemvConfig(16, 256)),  # q / k / v, 32 programs
                                        ((128, 200), GemvConfig(8, 512, 2, 1)),  # the last weight's rows partial
                                        ((64, 64, 72), GemvConfig(64, 128))])  # one program per weight
@pytest.mark.parametrize("m", [1, 3])
def test_grouped_gemv_is_the_separate_gemvs_bit_for_bit(m, ns, config):
    q, xs, _, _ = make_inputs(m, 8, 384, seed=7)
    ws, ss = zip(*[make_inputs(m, n, 384, seed=i)[2:] for i, n in enumerate(ns)])
    want = torch.cat([gemv_mm(q, xs, w, s, BF16, config) for w, s in zip(ws, ss)], -1)
    assert torch.equal(gemv_mm_grouped(q, xs, ws, ss, BF16, config), want)
    assert_close(want, torch.cat([oracle(q, xs, w, s) for w, s in zip(ws, ss)], -1), BF16, f"ns={ns}")


def test_grouped_gemv_refuses_what_it_cannot_read_in_place():
    q, xs, w, s = make_inputs(1, 256, 512)
    with pytest.raises(ValueError, match="1 to 3 weights"):
        gemv_mm_grouped(q, xs, [w[:64]] * 4, [s[:1]] * 4, BF16, GemvConfig(4, 256))
    with pytest.raises(ValueError, match="not a multiple"):
        gemv_mm_grouped(q, xs, [w[:100], w[100:]], [s[:1], s[1:]], BF16, GemvConfig(8, 256))
    with pytest.raises(ValueError, match="laid out differently"):
        wide_rows = torch.cat([w[128:], w[128:]], 1)[:, :512]  # the same values, a row stride of 1024
        gemv_mm_grouped(q, xs, [w[:128], wide_rows], [s[:1], s[1:]], BF16, GemvConfig(4, 256))
    q5, xs5, _, _ = make_inputs(5, 256, 512)
    with pytest.raises(ValueError, match="M <= 4"):
        gemv_mm_grouped(q5, xs5, [w[:128], w[128:]], [s[:1], s[1:]], BF16, GemvConfig(4, 256))


def test_every_gemv_table_row_has_a_small_m_fallback():
    gemv_rows = {key for key, choice in bm.TABLE.items() if choice.path == "gemv"}
    assert gemv_rows and gemv_rows <= set(bm.SMALL_M_BEST)


def test_grouped_benchmark_dry_run_times_every_launch(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_json = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "grouped_gemm.py"), "--dry-run",
                           "--json", str(out_json)], env=dict(os.environ, PYTHONPATH=root), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out_json) as f:
        (row,) = json.load(f)["rows"]
    assert all(isinstance(row[key], float) for key in ("separate_us", "grouped_small_m_us", "grouped_gemv_us",
                                                        "merged_us")), row  # fmt: skip
