"""Stand-in of ``aiter/ops/triton/quant/fused_fp8_quant.py`` (HEAD path; before v0.1.10 the file was
``aiter/ops/triton/fused_fp8_quant.py``, which HEAD still resolves through ``_BACKWARD_COMPAT_MAP``)."""

from __future__ import annotations

import torch

from aiter import _standin
from aiter.utility import dtypes


def fused_rms_fp8_group_quant(
    inp1,
    inp1_weight,
    inp1_epsilon,
    inp2=None,
    inp2_weight=None,
    inp2_epsilon=None,
    group_size=128,
    dtype_quant=None,  # real default: aiter.dtypes.fp8, bound at import; here read at call time
    res1=None,
    output_unquantized_inp1=False,
    transpose_scale=False,
    is_x_scale_strided: bool = False,
):
    """``x = inp1 (+ res1)`` in fp32; ``out_res1 = x.to(inp1.dtype)``; ``norm = x * rsqrt(sum(x*x)/N + eps) * w``
    in fp32 (no rounding to inp1.dtype before the quant); ``_fp8_quant_op(norm)`` per group.

    Returns ``((out1_fp8 [M, N1], out1_bs fp32 [M, cdiv(N1, group_size)]), out1, out2, out_res1)``.
    """
    dtype_quant = dtypes.fp8 if dtype_quant is None else dtype_quant
    M, N1 = inp1.shape  # the real launcher unpacks the same way: 2-D only
    if inp2 is not None:
        raise NotImplementedError("stand-in: the second (unquantized) RMSNorm input is not modelled")
    if inp1_weight.dim() != 1 or inp1_weight.shape[0] < N1 or inp1_weight.stride(0) != 1:
        raise RuntimeError(f"stand-in: inp1_weight is read as weight1_ptr + n (contiguous, >= {N1}), got "
                           f"{tuple(inp1_weight.shape)} strides {tuple(inp1_weight.stride())}")
    _standin.check_fp8("fused_rms_fp8_group_quant", dtype_quant)
    x = inp1.to(torch.float32)
    out_res1 = None
    if res1 is not None:
        Mr, Nr = res1.shape
        assert M == Mr and N1 == Nr, "The shape should be identical between inp1 and res1"
        x = x + res1.to(torch.float32)
        out_res1 = x.to(inp1.dtype)
    norm = x * torch.rsqrt((x * x).sum(-1, keepdim=True) / N1 + inp1_epsilon) * inp1_weight[:N1].to(torch.float32)
    out1 = norm.to(inp1.dtype) if output_unquantized_inp1 else None
    out1_fp8, out1_bs = _standin.triton_group_quant(norm, group_size, dtype_quant)
    if transpose_scale:  # written column-major into a [G, M] buffer, then re-presented as (M, G)
        col = out1_bs.t().contiguous()
        out1_bs = col.t() if is_x_scale_strided else col.view(M, -1)
    return (out1_fp8, out1_bs), out1, None, out_res1
