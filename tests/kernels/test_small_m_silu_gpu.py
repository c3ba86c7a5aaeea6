"""On a CUDA GPU: the gate/up GEMM with the silu-quant in its epilogue (``_small_m_silu_kernels.py``) at the model
shapes, against the unfused pair at the same GEMM config (bit for bit: the same sums, the hardware's same
roundings) and against the reference; repeatable with split-K and inside a CUDA graph; the public op with its
table. ``python -m pytest tests/kernels/test_small_m_silu_gpu.py -m gpu -q``.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from gemm_helpers import make_inputs

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _gemv_silu_kernels as gvs
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import _small_m_silu_kernels as sms
from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
SHAPES = [(12288, 4096), (14336, 4096), (25600, 5120)]  # (I, K): Qwen3-8B, Llama-3.1-8B, Qwen3-32B gate_up
CONFIGS = [SmallMConfig(128, 1, 8, 3, "last"), SmallMConfig(128, 3, 8, 3, "last"), SmallMConfig(128, 2, 4, 4, "last"),
           # a quant group over 2 / 4 programs (GROUP_TILES), alone and after a split-K ticket (the 20 repeats
           # below are its race check)
           SmallMConfig(64, 1, 4, 4, "last"), SmallMConfig(64, 2, 4, 4, "last"), SmallMConfig(32, 1, 4, 4, "last"),
           # TMA: a gate and an up tile per K step (block_n >= 64: each MMA a wgmma, as the pair's)
           SmallMConfig(128, 1, 8, 3, "last", tma=True), SmallMConfig(128, 3, 4, 4, "last", tma=True),
           SmallMConfig(64, 2, 4, 4, "last", tma=True)]
# the GEMV with the epilogue (M <= 4): a group over 64 / 32 / 16 programs (their tickets), 2 and 4 warps
GEMV_CONFIGS = [GemvConfig(2, 2048, 2, 1), GemvConfig(4, 1024, 2, 3), GemvConfig(8, 1024, 4, 1),
                GemvConfig(8, 512, 4, 1)]


# Inputs and the reference depend on (m, i, k) only, not on the config under test: made once per point. The
# weights' randn and the float reference on the CPU took most of this file's run time (~2 s per test, 200 tests).
@functools.cache
def _inputs(m, i, k):
    q, xs, w, s = make_inputs(m, 2 * i, k, device="cuda")
    return q, xs, w, s, (w[:i], s[: i // 128], w[i:], s[i // 128:])


@functools.cache
def _reference(m, i, k):
    """``silu_mul_group_quant`` of the float GEMM, on the CPU (fp8 values and scales)."""
    q, xs, w, s, _ = _inputs(m, i, k)
    return ref.silu_mul_group_quant(ref.blockscale_mm(q.cpu(), xs.cpu(), w.cpu(), s.cpu(), BF16), 128,
                                    arch.fp8_dtype("cpu"), arch.fp8_max("cpu"))  # fmt: skip


def _dq(out):
    return ref.dequant_activation(*out).double()


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("i, k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_fused_equals_unfused_pair_and_reference(m, i, k, config):
    q, xs, _, _, halves = _inputs(m, i, k)
    fused = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, 128, config)
    # The pair's GEMM with at least 64 weight rows per tile: the fused tile has 2 * block_n rows, and a tile under
    # 64 rows is not a wgmma on sm90 (Triton takes mma.sync there), whose fp8 sums round differently: at block_n
    # 32 against a 32-row pair one bf16 GEMM output of 12288 differed by an ulp (H200, 2026-12-01).
    pair_config = dataclasses.replace(config, block_n=max(64, config.block_n))
    pair = silu_mul_group_quant(smk.small_m_mm_grouped(q, xs, [halves[0], halves[2]], [halves[1], halves[3]], BF16,
                                                       pair_config), 128)  # fmt: skip
    assert torch.equal(fused[1], pair[1]) and torch.equal(fused[0].view(torch.uint8), pair[0].view(torch.uint8))
    want = _reference(m, i, k)
    d = ((_dq(fused).cpu() - _dq(want)).norm() / _dq(want).norm()).item()
    assert d < 2e-2, f"rel err vs reference {d:.3g}"
    again = [sms.small_m_mm_silu_quant(q, xs, *halves, BF16, 128, config) for _ in range(20)]
    assert all(torch.equal(fused[0].view(torch.uint8), a[0].view(torch.uint8)) and torch.equal(fused[1], a[1])
               for a in again)  # fmt: skip


@pytest.mark.parametrize("config", [SmallMConfig(128, 1, 4, 4, "last", tma=True, swap=False),
                                    SmallMConfig(64, 2, 4, 4, "last", tma=True, swap=False),
                                    SmallMConfig(128, 3, 8, 4, "last", tma=True, swap=False)], ids=str)
@pytest.mark.parametrize("i, k", SHAPES)
@pytest.mark.parametrize("m", [1, 16, 40, 64])
def test_activation_rows_on_the_m_side_equal_the_unfused_pair_on_gpu(m, i, k, config):
    # Tuning idea 20: the same swapped MMA (64 activation rows x block_n weight rows, a wgmma either way) in the
    # fused launch and in the pair's GEMM at the same config: the same bits, then the same quant.
    q, xs, _, _, halves = _inputs(m, i, k)
    fused = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, 128, config)
    pair = silu_mul_group_quant(smk.small_m_mm_grouped(q, xs, [halves[0], halves[2]], [halves[1], halves[3]], BF16,
                                                       config), 128)  # fmt: skip
    assert torch.equal(fused[1], pair[1]) and torch.equal(fused[0].view(torch.uint8), pair[0].view(torch.uint8))
    want = _reference(m, i, k)
    assert ((_dq(fused).cpu() - _dq(want)).norm() / _dq(want).norm()).item() < 2e-2


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.tma], ids=str)
@pytest.mark.parametrize("i, k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, 16, 40, 64])
def test_tma_tiles_equal_the_pointer_tile_bitwise_on_gpu(m, i, k, config):
    # two descriptor tiles and two MMAs per K step against the pointer path's one [2 * block_n, K] tile
    q, xs, _, _, halves = _inputs(m, i, k)
    assert sms._descriptors(q, halves[0], halves[2], config, 16, 128)[0] is not q  # the TMA path runs
    fused = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, 128, config)
    plain = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, 128, dataclasses.replace(config, tma=False))
    assert torch.equal(fused[1], plain[1]) and torch.equal(fused[0].view(torch.uint8), plain[0].view(torch.uint8))


@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=str)
@pytest.mark.parametrize("i, k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 4])
def test_fused_gemv_equals_unfused_pair_and_reference(m, i, k, config):
    # the GEMV with the epilogue against gemv_mm on the merged weight at twice the rows (its gate and up rows are
    # one tile: the same per-row sums), then the silu-quant
    q, xs, w, s, halves = _inputs(m, i, k)
    fused = gvs.gemv_silu_quant(q, xs, *halves, BF16, 128, config)
    pair = silu_mul_group_quant(gemv_mm(q, xs, w, s, BF16, dataclasses.replace(config, rows=2 * config.rows)), 128)
    assert torch.equal(fused[1], pair[1]) and torch.equal(fused[0].view(torch.uint8), pair[0].view(torch.uint8))
    want = _reference(m, i, k)
    d = ((_dq(fused).cpu() - _dq(want)).norm() / _dq(want).norm()).item()
    assert d < 2e-2, f"rel err vs reference {d:.3g}"
    again = [gvs.gemv_silu_quant(q, xs, *halves, BF16, 128, config) for _ in range(20)]  # the group tickets
    assert all(torch.equal(fused[0].view(torch.uint8), a[0].view(torch.uint8)) and torch.equal(fused[1], a[1])
               for a in again)  # fmt: skip
    assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0  # reset for the next launch


@pytest.mark.parametrize("config", [SmallMConfig(128, 3, 8, 3, "last"), SmallMConfig(64, 2, 4, 4, "last"),
                                    SmallMConfig(64, 2, 4, 4, "last", tma=True), GemvConfig(8, 512, 4, 1)],
                         ids=str)  # fmt: skip
def test_in_cuda_graph_replays(config):
    m, i, k = (1 if isinstance(config, GemvConfig) else 4), 14336, 4096
    q, xs, _, _, halves = _inputs(m, i, k)
    launch = gvs.gemv_silu_quant if isinstance(config, GemvConfig) else sms.small_m_mm_silu_quant
    want = launch(q, xs, *halves, BF16, 128, config)  # allocates the counters outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch(q, xs, *halves, BF16, 128, config)
    bad = 0
    for _ in range(50):
        out[0].zero_()
        graph.replay()
        torch.cuda.synchronize()
        bad += not (torch.equal(out[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(out[1], want[1]))
    assert bad == 0


@pytest.mark.parametrize("i, k", SHAPES)
@pytest.mark.parametrize("m", [1, 4, 16, 64, 65])
def test_public_op_matches_reference(m, i, k):
    q, xs, w, s, _ = _inputs(m, i, k)
    with backends.use_backend("triton"):
        out = torch.ops.fp8_fusion.blockscale_mm_silu_mul_group_quant(q, xs, [w], [s], BF16, 128)
    want = _reference(m, i, k)
    d = ((_dq(out).cpu() - _dq(want)).norm() / _dq(want).norm()).item()
    assert d < 2e-2, f"M={m} I={i} K={k} ({bsq.fused_config.__name__}): rel err {d:.3g}"
