"""Stand-in of the CK block-scale GEMMs in ``aiter/ops/gemm_op_a8w8.py`` (HEAD signatures; v0.1.7's
``gemm_a8w8_blockscale_bpreshuffle`` has no ``out``).

Layouts the real kernels take (CK reads scales by data_ptr only, so a wrong layout is a silent wrong answer there;
here it is either an error or a wrong number that the adapter tests catch):
- ``gemm_a8w8_blockscale``: XQ [M, K], WQ [N, K] row-major, x_scale fp32 [M, K/128] row-major,
  w_scale fp32 [ceil(N/128), ceil(K/128)].
- ``gemm_a8w8_blockscale_bpreshuffle``: WQ = ``shuffle_weight(W, (16, 16))``; x_scale column-major bytes
  ``s.t().contiguous().view(M, K/128)`` (stride(0) != 1); HEAD also takes the strided view ``s.t().contiguous().t()``
  (stride(0) == 1, PR #4406).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiter import _standin
from aiter.utility import dtypes
from fp8_fusion_pass.kernels import reference


def _check(fn, XQ, WQ, x_scale, w_scale, dtype):
    assert dtype in [dtypes.bf16, dtypes.fp16], f"Output {dtype=} is currently not supported in gemm_a8w8"
    if XQ.dtype != WQ.dtype:
        raise RuntimeError("Weights and activations should have the same dtype!")
    if x_scale.dtype != w_scale.dtype:
        raise RuntimeError("Scales should have the same dtype!")
    if x_scale.dtype != torch.float32:
        raise RuntimeError("Unsupported scales/output dtype!")
    _standin.check_fp8(fn, XQ.dtype)
    (m, k), n = XQ.shape, WQ.shape[0]
    if WQ.shape[1] != k or XQ.stride(-1) != 1 or WQ.stride(-1) != 1:
        raise RuntimeError(f"{fn}: XQ [M, K] and WQ [N, K] must agree on K and be contiguous in K")
    if tuple(x_scale.shape) != (m, k // 128) or k % 128:
        raise RuntimeError(f"{fn}: x_scale must be [M, K/128] = {(m, k // 128)}, got {tuple(x_scale.shape)}")
    if tuple(w_scale.shape) != (-(-n // 128), k // 128) or not w_scale.is_contiguous():
        raise RuntimeError(f"{fn}: w_scale must be a contiguous [ceil(N/128), K/128], got {tuple(w_scale.shape)}")


def gemm_a8w8_blockscale(
    XQ: Tensor, WQ: Tensor, x_scale: Tensor, w_scale: Tensor, dtype: torch.dtype = dtypes.bf16,
    isBpreshuffled: bool = False,
) -> Tensor:
    _check("gemm_a8w8_blockscale", XQ, WQ, x_scale, w_scale, dtype)
    m, k = XQ.shape
    if isBpreshuffled:
        assert _standin.get_gfx() == "gfx950" and m >= 16 and k >= 512 and dtype == dtypes.bf16, (
            "asm kernel only support B preshuffle and m >= 16"
        )
        return gemm_a8w8_blockscale_bpreshuffle(XQ, WQ, x_scale, w_scale, dtype)
    if _standin.is_shuffled(WQ):
        raise RuntimeError("stand-in: WQ was shuffled by shuffle_weight; the plain CK GEMM would read garbage")
    if not x_scale.is_contiguous():
        raise RuntimeError("stand-in: the plain CK GEMM reads x_scale as contiguous row-major [M, K/128]")
    return reference.blockscale_mm(XQ, x_scale, WQ, w_scale, dtype)


def gemm_a8w8_blockscale_bpreshuffle(
    XQ: Tensor, WQ: Tensor, x_scale: Tensor, w_scale: Tensor, dtype: torch.dtype = dtypes.bf16,
    out: Tensor | None = None,
) -> Tensor:
    _check("gemm_a8w8_blockscale_bpreshuffle", XQ, WQ, x_scale, w_scale, dtype)
    if not _standin.is_shuffled(WQ):
        raise RuntimeError("stand-in: WQ is not shuffle_weight(W, (16, 16)); the bpreshuffle GEMM would read garbage")
    m, groups = x_scale.shape
    if x_scale.stride(0) == 1 and x_scale.stride(1) == m:  # HEAD's strided column-major view: logical values
        logical = x_scale
    elif x_scale.is_contiguous():  # column-major bytes behind an [M, K/128] shape
        logical = x_scale.reshape(-1).view(groups, m).t()
    else:
        raise RuntimeError(f"stand-in: unsupported x_scale strides {tuple(x_scale.stride())}")
    y = reference.blockscale_mm(XQ, logical, _standin.unshuffle(WQ), w_scale, dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
