"""Stand-in of ``aiter/ops/triton/activation.py: act_mul_and_fp8_group_quant`` (same path v0.1.7 -> HEAD)."""

from __future__ import annotations

from typing import Literal

import torch

from aiter import _standin
from aiter.utility import dtypes


def act_mul_and_fp8_group_quant(
    x: torch.Tensor,
    activation: Literal["silu", "gelu", "gelu_tanh"],
    group_size,
    dtype_quant=None,  # real default: aiter.dtypes.fp8, bound at import; here read at call time
) -> tuple[torch.Tensor, torch.Tensor]:
    """``act(x[:, :N]) * x[:, N:]`` in fp32 (gate first; silu = ``a / (1 + exp2(-a * log2(e)))``, no rounding to
    x.dtype in between), then ``_fp8_quant_op`` per group. Returns ``(x_fp8 [M, N], out_bs fp32 [M, cdiv(N, g)])``."""
    dtype_quant = dtypes.fp8 if dtype_quant is None else dtype_quant
    M, N = x.shape
    assert N % 2 == 0
    if activation != "silu":
        raise NotImplementedError(f"stand-in models silu only, got {activation!r}")
    _standin.check_fp8("act_mul_and_fp8_group_quant", dtype_quant)
    half = N // 2
    a = x[:, :half].to(torch.float32)
    b = x[:, half:].to(torch.float32)
    y = a / (1.0 + torch.exp2(-(a * 1.44269504089))) * b
    return _standin.triton_group_quant(y, group_size, dtype_quant)
