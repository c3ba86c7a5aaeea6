"""Stand-in of ``aiter/ops/quant.py`` (HIP quant kernels from ``csrc/kernels/quant_kernels.cu``).

Signatures as at aiter HEAD e4048607; ``per_group_quant_hip`` has no ``scale_type`` before ~v0.1.10 (unused here).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from aiter import _standin
from aiter.utility import dtypes

from .enum import QuantType


def per_group_quant_hip(
    x: Tensor,
    scale: Tensor | None = None,
    quant_dtype: torch.dtype = dtypes.i8,
    group_size: int = 128,
    transpose_scale: bool = False,
    num_rows: Tensor | None = None,
    num_rows_factor: int = 1,
    scale_type: torch.dtype = dtypes.fp32,
) -> tuple[Tensor, Tensor]:
    shape = x.shape
    if scale is not None:
        raise ValueError("unsupported: static per token quant")
    assert group_size in [32, 64, 128], f"unsupported group size {group_size=}, only support [32, 64, 128]"
    if num_rows is not None or scale_type != dtypes.fp32:
        raise NotImplementedError("stand-in: num_rows / e8m0 scales are not modelled")
    _standin.check_16bit("dynamic_per_token_scaled_quant", "input", x)
    # dynamic_per_token_scaled_quant: AITER_CHECK(input.is_contiguous()); the caller's x.view(-1, group_size)
    # already raises on a non-viewable x.
    x.view(-1, group_size)
    if not x.is_contiguous():
        raise RuntimeError("dynamic_per_token_scaled_quant: AITER_CHECK(input.is_contiguous()) failed")
    _standin.check_fp8("per_group_quant_hip", quant_dtype)
    y, s = _standin.hip_group_quant(x, group_size, quant_dtype)
    s = s.view(*shape[:-1], shape[-1] // group_size)
    if transpose_scale:  # shuffle_scale: the scale of (row x, group y) is written at y * rows + x
        s = s.reshape(-1, s.shape[-1]).t().contiguous().view(s.shape)
    return y, s


@functools.lru_cache
def get_hip_quant(qType):
    tmp = {QuantType.per_1x128.value: functools.partial(per_group_quant_hip, group_size=128)}

    def raise_NotImplementedError(*a, **k):
        raise NotImplementedError(f"unsupported quant type {qType=} (stand-in models per_1x128 only)")

    return tmp.get(qType.value, raise_NotImplementedError)


def dynamic_per_tensor_quant(out: Tensor, input: Tensor, scale: Tensor) -> None:
    """``initializeScale(scale, 0)`` -> per-row ``absMax * (1/DTYPE_MAX)`` atomic-maxed into ``scale[0]`` (no amax
    floor: an all-zero input gives scale 0 and NaN values) -> ``q = x * rcp(scale)``. The incoming scale is never read.
    """
    _standin.check_16bit("dynamic_per_tensor_quant", "input", input)
    if out.dtype not in (dtypes.fp8, dtypes.i8):
        raise RuntimeError(f"dynamic_per_tensor_quant: not support output type: {out.dtype}")
    if out.dtype == dtypes.i8:
        raise NotImplementedError("stand-in: int8 output is not modelled")
    # The kernel indexes rows as blockIdx.x * cols: non-contiguous tensors are read / written wrongly (no check).
    if not (input.is_contiguous() and out.is_contiguous()) or out.shape != input.shape:
        raise RuntimeError("stand-in: dynamic_per_tensor_quant needs contiguous input and out of one shape")
    if scale.dtype != torch.float32 or scale.numel() < 1:
        raise RuntimeError(f"stand-in: scale must be fp32 with one element, got {scale.dtype} {tuple(scale.shape)}")
    fmax = torch.finfo(out.dtype).max
    xf = input.to(torch.float32)
    s = xf.abs().amax() * torch.tensor(1.0 / fmax, dtype=torch.float32)
    scale.view(-1)[0] = s
    out.copy_((xf * (1.0 / s)).clamp(-fmax, fmax).to(out.dtype))
