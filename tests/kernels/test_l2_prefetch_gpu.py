"""The fused norms with the L2 hint (``prefetch``, the ``l2_prefetch`` rewrite) on the GPU: bit for bit the same
outputs, in eager and in a CUDA graph, at one row and at row counts where the norm's grid is persistent (the hinting
programs must take no row block)."""

from __future__ import annotations

import pytest
import torch

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels.triton import _l2_prefetch

pytestmark = pytest.mark.gpu
ops = torch.ops.fp8_fusion
BF16 = torch.bfloat16


def _inputs(m, k, n=10240):
    g = torch.Generator(device="cuda").manual_seed(m + k)
    x, res = (torch.randn(m, k, device="cuda", dtype=BF16, generator=g) for _ in range(2))
    w = 1 + 0.1 * torch.randn(k, device="cuda", dtype=BF16, generator=g)
    weight = torch.randn(n, k, device="cuda", generator=g).to(arch.fp8_dtype("cuda"))  # the next GEMM's, 52 MB
    return x, res, w, weight


def _bits(outs):
    return [t.view(torch.uint8) if t.dtype.itemsize == 1 else t for t in outs]


@pytest.mark.parametrize("m", [1, 4, 64, 8192])  # 8192 x 5120: more row blocks than the norm's persistent programs
@pytest.mark.parametrize("k", [4096, 5120])
def test_the_hint_changes_no_output(m, k):
    x, res, w, weight = _inputs(m, k)
    if not _l2_prefetch.prefetchable(weight):
        pytest.skip("the bulk L2 prefetch needs an sm_90+ GPU")
    for with_res in (False, True):
        args = (x, res, w, 1e-6, 128) if with_res else (x, w, 1e-6, 128)
        op = ops.add_rms_norm_group_quant if with_res else ops.rms_norm_group_quant
        want = _bits(op(*args))
        got = _bits(op(*args, prefetch=weight))
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (m, k, with_res)


def test_in_a_cuda_graph():
    x, res, w, weight = _inputs(1, 5120)
    if not _l2_prefetch.prefetchable(weight):
        pytest.skip("the bulk L2 prefetch needs an sm_90+ GPU")
    want = _bits(ops.add_rms_norm_group_quant(x, res, w, 1e-6, 128))
    ops.add_rms_norm_group_quant(x, res, w, 1e-6, 128, prefetch=weight)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.add_rms_norm_group_quant(x, res, w, 1e-6, 128, prefetch=weight)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(_bits(out), want))
