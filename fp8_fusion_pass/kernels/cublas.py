"""Thin wrappers over ``torch._scaled_mm`` (v1) and ``F.scaled_mm`` (v2, ``torch._scaled_mm_v2``), with the
layout rules found on the H200 (torch 2.11, cuBLASLt 13.0; ``research/inductor_api.md`` §0.8 and §5):

Block-wise (1x128 activation x 128x128 weight; SM90 only, never ROCm: ``_check_deepseek_support``):
- ``scale_a`` must be *outer-dim-major*: ``[M, K/128]`` with strides ``(1, M)``; row-major was rejected.
- ``M`` must be a multiple of 4 (M in {1, 3, 5, 17}: ``CUBLAS_STATUS_NOT_SUPPORTED``): pad with zero rows,
  slice back.
- **v1 with (K/128) % 4 != 0 silently returns wrong results** (K=384: relative error 0.32) and rejects the
  padded scale layout. v2 takes ``scale_b`` padded to ``[round_up(K/128, 4), N/128]`` with strides
  ``(1, round_up(K/128, 4))`` and is correct (2.8e-3). So: v1 only when (K/128) % 4 == 0, else v2, else
  the caller's Triton path. ``blockwise_mm`` refuses v1 on such K itself, whoever asks.
- N, K multiples of 128 (ceil blocks were never verified on cuBLAS: Triton path), bf16 output (the only
  output dtype verified), e4m3fn (e4m3fnuz: "Cannot convert ScalarType Float8_e4m3fnuz to cudaDataType").

``F.scaled_mm`` breaks the Dynamo graph on torch 2.11 / 2.12. It is only ever called here, from the real
implementation of the ``fp8_fusion::blockscale_mm`` custom op, which Dynamo does not trace (it sees the fake);
``tests/kernels/test_blockscale_mm.py`` checks that with ``fullgraph=True``.

Per-tensor (sm89+ and ROCm hipBLASLt): one fp32 scale each; ``K`` and ``N`` multiples of 16
(``_scaled_mm_out_cuda``); ``M`` is free.

Weight scales are not cached: v1 uses ``w_scale.t()`` (a view, no work), and the v2 pad is one tiny kernel
(ceil(N/128) x round_up(K/128, 4) floats) that only K/128 % 4 != 0 shapes pay. A cache keyed by
``data_ptr`` would go stale when weights are reloaded in place, and one on the tensor object would miss
whenever a compiled graph passes a fresh alias; neither is worth it for a 2 KB pad.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import arch as _arch

BLOCK = 128
VARIANTS = ("v1", "v2")


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def has_v2() -> bool:
    """``F.scaled_mm`` with explicit recipes exists (torch >= 2.10, PR #164141)."""
    return hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")


def blockwise_variant(k: int) -> str | None:
    """Which API computes a K-long block-wise GEMM correctly: v1 needs (K/128) % 4 == 0 (else it is silently
    wrong), v2 handles any K/128 with padded weight scales; None when neither is safe."""
    if (k // BLOCK) % 4 == 0:
        return "v1"
    return "v2" if has_v2() else None


def blockwise_unsupported(
    a: _arch.Arch, device_type: str, fp8: torch.dtype, n: int, k: int, group: int, out_dtype: torch.dtype,
    variant: str | None = None,
) -> str | None:
    """Why cuBLAS block-wise cannot compute this GEMM correctly (None when it can). Pure: tests call it with
    a simulated arch. ``variant`` None means "the one ``blockwise_variant`` picks"."""
    if device_type != "cuda" or not a.blockwise_scaled_mm:
        return f"cuBLASLt block-wise scaling needs CUDA SM90 (device is {a.name})"
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    if fp8 != torch.float8_e4m3fn:
        return f"cuBLASLt takes float8_e4m3fn, got {fp8}"
    if group != BLOCK:
        return f"cuBLASLt block-wise needs 1x128 activation groups, got 1x{group}"
    if n % BLOCK or k % BLOCK:
        return f"N={n} and K={k} must be multiples of 128 (ceil blocks go to Triton)"
    if out_dtype != torch.bfloat16:
        return f"only bf16 output was verified for block-wise cuBLASLt, got {out_dtype}"
    if variant is not None and variant not in VARIANTS:
        return f"unknown variant {variant!r}"
    if variant is None:
        variant = blockwise_variant(k)
        if variant is None:
            return f"K/128={k // BLOCK} is not a multiple of 4 (v1 is silently wrong) and F.scaled_mm is missing"
    if variant == "v1" and (k // BLOCK) % 4:
        return f"torch._scaled_mm (v1) silently returns wrong results when K/128={k // BLOCK} is not a multiple of 4"
    if variant == "v2" and not has_v2():
        return "this torch has no torch.nn.functional.scaled_mm"
    return None


def _pad_rows_fp8(q: torch.Tensor, rows: int) -> torch.Tensor:
    # Pad through a uint8 view: constant-pad kernels need not support fp8, and byte 0 is +0.0 in every flavour.
    return F.pad(q.view(torch.uint8), (0, 0, 0, rows)).view(q.dtype)


def _outer_dim_major(x_scale: torch.Tensor, m_pad: int) -> torch.Tensor:
    """``x_scale [M, K/128]`` as ``[m_pad, K/128]`` with strides ``(1, m_pad)``; padding rows get scale 0 (their
    q rows are zero anyway). Zero-copy when it already has that layout."""
    m, kb = x_scale.shape
    if m == m_pad and (x_scale.stride(0) == 1 and (x_scale.stride(1) == m or kb == 1)):
        return x_scale
    # Built explicitly: F.pad with a zero pad keeps the input's (transposed) strides, which cuBLAS rejects.
    out = x_scale.new_empty((kb, m_pad))
    out[:, :m].copy_(x_scale.t())
    if m_pad > m:
        out[:, m:].zero_()
    return out.t()


def blockwise_mm(q, x_scale, w_q, w_scale, out_dtype, variant: str | None = None) -> torch.Tensor:
    """``y [M, N] = (q, x_scale) @ (w_q, w_scale)^T`` through cuBLASLt, honouring every rule above.

    Raises ``ValueError`` (never calls cuBLAS) when the shapes break a rule, v1 at (K/128) % 4 != 0 included."""
    m, k = q.shape
    n = w_q.shape[0]
    group = k // x_scale.shape[1] if x_scale.shape[1] else 0
    reason = blockwise_unsupported(_arch.arch_of(q.device), q.device.type, q.dtype, n, k, group, out_dtype, variant)
    if reason is not None:
        raise ValueError(f"blockscale_mm (cuBLAS): {reason}")
    variant = variant or blockwise_variant(k)
    if m == 0:
        return q.new_empty((0, n), dtype=out_dtype)
    m_pad = _round_up(m, 4)
    a = q.contiguous() if m_pad == m else _pad_rows_fp8(q.contiguous(), m_pad - m)
    scale_a = _outer_dim_major(x_scale, m_pad)
    b = w_q.contiguous().t()  # [K, N] column-major
    kb = k // BLOCK
    ws = w_scale.contiguous()  # [N/128, K/128] row-major; its .t() is the layout both APIs check
    if variant == "v1":
        y = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=ws.t(), out_dtype=out_dtype)
    else:
        kb4 = _round_up(kb, 4)
        scale_b = (ws if kb4 == kb else F.pad(ws, (0, kb4 - kb))).t()  # [kb4, N/128], strides (1, kb4)
        st = F.ScalingType
        y = F.scaled_mm(a, b, scale_a, st.BlockWise1x128, scale_b, st.BlockWise128x128, output_dtype=out_dtype)
    return y if m_pad == m else y[:m]


def per_tensor_unsupported(a: _arch.Arch, device_type: str, n: int, k: int, out_dtype: torch.dtype) -> str | None:
    """Why per-tensor ``torch._scaled_mm`` cannot run this GEMM (None when it can)."""
    if device_type != "cuda" or not a.per_tensor_scaled_mm:
        return f"per-tensor torch._scaled_mm needs CUDA sm89+ or ROCm MI300+ (device is {a.name})"
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    if n % 16 or k % 16:
        return f"N={n} and K={k} must be multiples of 16"
    if a.is_rocm and out_dtype != torch.bfloat16:
        return f"only bf16 output is relied on for hipBLASLt, got {out_dtype}"
    return None


def per_tensor_mm(q, x_scale, w_q, w_scale, out_dtype) -> torch.Tensor:
    """``y = (q * x_scale) @ (w_q * w_scale)^T`` with one fp32 scale per tensor."""
    m, k = q.shape
    n = w_q.shape[0]
    reason = per_tensor_unsupported(_arch.arch_of(q.device), q.device.type, n, k, out_dtype)
    if reason is not None:
        raise ValueError(f"per_tensor_mm (cuBLAS): {reason}")
    if m == 0:
        return q.new_empty((0, n), dtype=out_dtype)
    sa = x_scale.reshape(()).to(torch.float32)
    sb = w_scale.reshape(()).to(torch.float32)
    return torch._scaled_mm(q.contiguous(), w_q.contiguous().t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
