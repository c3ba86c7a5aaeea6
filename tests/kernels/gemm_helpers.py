"""Shared by the block-scale GEMM tests: inputs at any (M, N, K), the fp32 oracle, error measures."""

from __future__ import annotations

import torch
from tolerances import GEMM_REL_ERR_BF16_OUT, GEMM_REL_ERR_FP32_OUT

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16, FP32 = torch.bfloat16, torch.float32
TOL = {BF16: GEMM_REL_ERR_BF16_OUT, FP32: GEMM_REL_ERR_FP32_OUT, torch.float16: GEMM_REL_ERR_BF16_OUT}


def make_inputs(m, n, k, group=128, device=DEVICE, seed=0):
    """Activations through the reference group quant; weights through the 128x128 block recipe, padded with
    zeros to whole blocks first so that N, K need not be multiples of 128 (ceil blocks)."""
    g = torch.Generator().manual_seed(seed)
    fp8, fp8_max = arch.fp8_dtype(device), arch.fp8_max(device)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=BF16)
    q, xs = ref.group_quant(x, group, fp8, fp8_max)
    nb, kb = -(-n // 128), -(-k // 128)
    w = torch.zeros(nb * 128, kb * 128)
    w[:n, :k] = torch.randn(n, k, generator=g) * 0.05
    w_q, w_s = ref.quantize_weight_blockwise(w.to(device), (128, 128), fp8, fp8_max)
    return q, xs, w_q[:n, :k].contiguous(), w_s


def dequant_weight_128(w_q, w_s):
    # Explicit 128-blocks. reference.dequant_weight infers the block as ceil(N / rows of w_scale), which is
    # 100 (not 128) for N=200: it is only right when N and K are multiples of 128 (reported to the lead).
    n, k = w_q.shape
    return w_q.float() * w_s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]


def oracle(q, xs, w_q, w_s):
    """fp32 dequantized matmul (``reference.blockscale_mm`` before its output cast)."""
    return ref.dequant_activation(q, xs) @ dequant_weight_128(w_q, w_s).t()


def rel_errors(y, want):
    """(Frobenius-relative error, max |error| / max |want|): the second catches one wrong row or column."""
    y, want = y.double(), want.double()  # norms of 1e30-sized rows overflow fp32
    d = (y - want).abs()
    return (d.norm() / want.norm()).item(), (d.max() / want.abs().max()).item()


def assert_close(y, want, out_dtype, what="", tol=None):
    fro, worst = rel_errors(y, want)
    bound = (tol or TOL)[out_dtype]
    assert y.dtype == out_dtype and y.shape == want.shape
    assert fro <= bound and worst <= bound, f"{what}: rel err {fro:.2e}, max {worst:.2e}"
    return fro, worst
