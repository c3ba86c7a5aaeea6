"""On a CUDA GPU: the GEMV that quantizes its own bf16 input (``_gemv_kernels.gemv_mm_bf16``) at the model shapes,
bit for bit ``gemv_mm`` on the group-quant kernel's output at the same config (random and adversarial rows); the op
``group_quant_blockscale_mm`` through its table, inside a CUDA graph. ``python -m pytest
tests/kernels/test_quantizing_gemv_gpu.py -m gpu -q``.
"""

from __future__ import annotations

import pytest
import torch
from elementwise_checks import _adversarial
from gemm_helpers import make_inputs

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels.triton import group_quant_blockscale_mm as gqm
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm, gemv_mm_bf16
from fp8_fusion_pass.kernels.triton.group_quant import group_quant

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
# (N, K): o_proj of Qwen3-8B / Llama-3.1-8B and Qwen3-32B, Qwen3-8B qkv, Llama-3.1-8B down
SHAPES = [(4096, 4096), (5120, 8192), (6144, 4096), (4096, 14336)]
CONFIGS = [GemvConfig(4, 1024, 4, 1), GemvConfig(8, 512, 4, 1), GemvConfig(8, 1024, 4, 3)]


def _bits(y):
    return y.view(torch.int16)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_quantizing_gemv_is_quant_then_gemv_bit_for_bit(m, n, k, config):
    _, _, w, s = make_inputs(m, n, k, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=BF16) * 3
    got = gemv_mm_bf16(x, w, s, BF16, config)
    assert torch.equal(_bits(got), _bits(gemv_mm(*group_quant(x, 128), w, s, BF16, config)))


@pytest.mark.parametrize("rows", [slice(0, 4), slice(4, 8), slice(8, 9)])
def test_adversarial_rows_bit_for_bit(rows):
    x = _adversarial(9, 4096, device="cuda")[rows]
    _, _, w, s = make_inputs(1, 4096, 4096, device="cuda")
    config = GemvConfig(4, 1024, 4, 1)
    assert torch.equal(_bits(gemv_mm_bf16(x, w, s, BF16, config)),
                       _bits(gemv_mm(*group_quant(x, 128), w, s, BF16, config)))  # fmt: skip


def test_the_op_in_a_cuda_graph(monkeypatch):
    n, k = 4096, 4096
    _, _, w, s = make_inputs(1, n, k, device="cuda")
    x = torch.randn(1, k, device="cuda", dtype=BF16)
    key = (arch.arch_of("cuda").name, 1, n, k)
    monkeypatch.setitem(gqm.TABLE, key, GemvConfig(8, 1024, 4, 1))
    config = gqm.fused_config(arch.arch_of("cuda"), "cuda", w.dtype, 1, n, k, 128, BF16)
    assert config == GemvConfig(8, 1024, 4, 1)
    op = torch.ops.fp8_fusion.group_quant_blockscale_mm
    with backends.use_backend("triton"):
        want = gemv_mm(*group_quant(x, 128), w, s, BF16, config)
        op(x, w, s, BF16, 128)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op(x, w, s, BF16, 128)
    for _ in range(5):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(_bits(out), _bits(want))
