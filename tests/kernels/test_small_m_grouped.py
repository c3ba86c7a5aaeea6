"""The grouped small-M GEMM: up to three GEMMs sharing one activation in one launch (``blockscale_mm_grouped``).

CPU (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): against the fp32 dequantized oracle and against the
per-weight ``small_m_mm`` (same config: the same partials in the same order, so bit for bit), at group N that
are and are not whole ``block_n`` tiles; the dispatcher's choice, its fallback, and its input errors. Small N
and K: the interpreter costs ~25 ms per program.
"""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import assert_close, make_inputs, oracle

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, ops
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton import blockscale_mm_grouped as bmg
from fp8_fusion_pass.kernels.triton import kernels
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig

BF16, FP32 = torch.bfloat16, torch.float32


def _inputs(m, ns, k, group=128):
    """One activation, one weight per N (their own seeds)."""
    q, xs, w, s = make_inputs(m, ns[0], k, group)
    ws, ss = [w], [s]
    for i, n in enumerate(ns[1:]):
        _, _, w, s = make_inputs(m, n, k, group, seed=i + 1)
        ws.append(w)
        ss.append(s)
    return q, xs, ws, ss


def _oracle(q, xs, ws, ss):
    return torch.cat([oracle(q, xs, w, s) for w, s in zip(ws, ss)], -1)


@pytest.mark.parametrize(
    "m, ns, k, config",
    [
        (1, (128, 64, 64), 256, SmallMConfig(64, 1, 4, 2)),  # q / k / v-like, whole tiles, no split
        (3, (128, 64, 64), 512, SmallMConfig(32, 2, 4, 2, "last")),
        (17, (256, 128), 384, SmallMConfig(64, 3, 4, 2, "kernel")),  # gate / up-like, two launches
        (3, (192, 64), 512, SmallMConfig(128, 2, 4, 2, "last")),  # 192 = 1.5 tiles: group 1 starts at tile 2
        (1, (192, 40, 96), 512, SmallMConfig(64, 4, 4, 2, "kernel")),  # partial tiles and weight blocks
        (17, (64, 200, 32), 256, SmallMConfig(128, 2, 4, 2, "last")),  # groups smaller than one tile
        (3, (64, 128, 32), 512, SmallMConfig(32, 3, 4, 2, "last", k_unroll=2)),  # 4 K tiles: splits of 2
        (40, (128, 64, 64), 256, SmallMConfig(64, 2, 4, 2, "last", block_m=16)),  # rows split: 3 row tiles
    ],
)
def test_grouped_matches_oracle_and_separate_launches(m, ns, k, config):
    q, xs, ws, ss = _inputs(m, ns, k)
    y = smk.small_m_mm_grouped(q, xs, ws, ss, FP32, config)
    assert_close(y, _oracle(q, xs, ws, ss), FP32, f"M={m} N={ns} {config}")
    separate = torch.cat([smk.small_m_mm(q, xs, w, s, FP32, config) for w, s in zip(ws, ss)], -1)
    assert_close(y, separate, FP32, "vs separate launches")
    # Same config: each tile reads the same bytes in the same order as its own launch would.
    assert torch.equal(y, separate)


def test_last_counters_span_groups_and_reset():
    # 70 rows: two 64-row tiles; 3 groups of 2 + 1 + 1 tiles -> 8 counters used, all back at 0 afterwards.
    q, xs, ws, ss = _inputs(70, (128, 64, 40), 384)
    want = smk.small_m_mm_grouped(q, xs, ws, ss, BF16, SmallMConfig(64, 3, 4, 2, "kernel"))
    for _ in range(2):  # the second call reuses the counters the first one reset
        assert torch.equal(smk.small_m_mm_grouped(q, xs, ws, ss, BF16, SmallMConfig(64, 3, 4, 2, "last")), want)
    assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0
    assert_close(want, _oracle(q, xs, ws, ss), BF16, "bf16 out")


def test_group_64_and_empty_group():
    # Activation group 64 (two scales per weight block); an empty weight adds no columns.
    q, xs, ws, ss = _inputs(5, (128, 0, 64), 256, group=64)
    y = smk.small_m_mm_grouped(q, xs, ws, ss, FP32, SmallMConfig(64, 2, 4, 2, "last"))
    assert y.shape == (5, 192)
    assert_close(y, _oracle(q, xs, ws, ss), FP32, "group 64")


def test_too_many_groups_for_one_launch():
    q, xs, ws, ss = _inputs(1, (32, 32, 32, 32), 256)
    with pytest.raises(ValueError, match="at most 3 weights"):
        smk.small_m_mm_grouped(q, xs, ws, ss, FP32, SmallMConfig(32, 1, 4, 2))


# ---------------------------------------------------------------- the dispatcher


def _spy(monkeypatch):
    calls = []
    real = bmg.small_m_mm_grouped

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(bmg, "small_m_mm_grouped", spy)
    return calls


@pytest.mark.parametrize("m, ns", [(3, (128, 64, 64)), (17, (192, 64))])
def test_dispatcher_uses_one_launch(monkeypatch, m, ns):
    calls = _spy(monkeypatch)
    q, xs, ws, ss = _inputs(m, ns, 256)
    y = kernels()["blockscale_mm_grouped"](q, xs, ws, ss, BF16)
    assert len(calls) == 1 and calls[0] is None  # the CPU has no TABLE row: the merged shape's default config
    assert_close(y, _oracle(q, xs, ws, ss), BF16, "dispatch")


def test_op_through_triton_backend(monkeypatch):
    calls = _spy(monkeypatch)
    q, xs, ws, ss = _inputs(3, (128, 64, 64), 256)
    with backends.use_backend("triton"):
        y = ops.blockscale_mm_grouped(q, xs, ws, ss, BF16)  # torch.ops.fp8_fusion.blockscale_mm_grouped
    assert len(calls) == 1
    assert_close(y, _oracle(q, xs, ws, ss), BF16, "op")


@pytest.mark.parametrize("ns, merged", [((4096, 1024, 1024), 6144), ((12288, 12288), 24576)])
def test_dispatcher_takes_the_merged_shapes_table_row(ns, merged):
    # Qwen3-8B q / k / v and gate / up at decode on a simulated H200: the merged shape's measured plan (at M = 1
    # its TABLE row, the GEMV, which reads the weights in place; at M = 2-4 and 16 its small-M rows, 0.98-1.04x the
    # merged weight's GEMM on the H200: benchmarks/grouped_gemm.py).
    fp8 = torch.float8_e4m3fn
    ws = [torch.empty(n, 4096, dtype=fp8) for n in ns]
    ss = [torch.ones(n // 128, 32) for n in ns]
    with arch.simulate_arch("sm90"):
        q, xs = torch.empty(1, 4096, dtype=fp8), torch.ones(1, 32)
        assert bm.TABLE[("sm90", 1, merged, 4096)].path == "gemv"
        assert bmg.grouped_choice(q, xs, ws, ss, BF16) == bm.TABLE[("sm90", 1, merged, 4096)]
        for m in (2, 4):
            q, xs = torch.empty(m, 4096, dtype=fp8), torch.ones(m, 32)
            assert bm.TABLE[("sm90", 4, merged, 4096)].path == "small_m"
            assert bmg.grouped_choice(q, xs, ws, ss, BF16) == bm.TABLE[("sm90", 4, merged, 4096)]
        q, xs = torch.empty(16, 4096, dtype=fp8), torch.ones(16, 32)
        assert bmg.grouped_choice(q, xs, ws, ss, BF16) == bm.TABLE[("sm90", 16, merged, 4096)]


@pytest.mark.parametrize("m, ns", [(1, (32, 32, 32, 32)), (65, (64, 64)), (2, (96,))])
def test_dispatcher_falls_back_to_separate_gemms(monkeypatch, m, ns):
    # 4 weights: more than one launch holds; 65 rows: not the small-M path; 1 weight: nothing to group.
    calls = _spy(monkeypatch)
    q, xs, ws, ss = _inputs(m, ns, 256)
    y = bmg.blockscale_mm_grouped(q, xs, ws, ss, FP32)
    assert calls == [] and bmg.grouped_choice(q, xs, ws, ss, FP32) is None
    assert torch.equal(y, torch.cat([bm.blockscale_mm(q, xs, w, s, FP32) for w, s in zip(ws, ss)], -1))
    assert_close(y, _oracle(q, xs, ws, ss), FP32, "fallback")


def test_bad_inputs_name_the_problem():
    q, xs, ws, ss = _inputs(2, (64, 64), 256)
    _, _, w512, s512 = make_inputs(2, 64, 512)
    with pytest.raises(ValueError, match=r"weight 1.*K=256"):
        bmg.blockscale_mm_grouped(q, xs, [ws[0], w512], [ss[0], s512], BF16)
    other = torch.float8_e4m3fnuz if q.dtype == torch.float8_e4m3fn else torch.float8_e4m3fn
    with pytest.raises(TypeError, match=r"weight 1.*fp8 dtype"):
        bmg.blockscale_mm_grouped(q, xs, [ws[0], ws[1].view(torch.uint8).view(other)], ss, BF16)
    with pytest.raises(ValueError, match="non-empty"):
        bmg.blockscale_mm_grouped(q, xs, [], [], BF16)
    with pytest.raises(ValueError, match="one length"):
        bmg.blockscale_mm_grouped(q, xs, ws, ss[:1], BF16)
    with pytest.raises(TypeError, match="lists"):
        bmg.blockscale_mm_grouped(q, xs, ws[0], ss[0], BF16)
    with pytest.raises(ValueError, match="w_scale"):
        bmg.blockscale_mm_grouped(q, xs, ws, [ss[0], ss[1][:, :1]], BF16)
