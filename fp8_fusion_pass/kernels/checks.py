"""Input validation shared by every op: a bad argument gets a ``ValueError`` / ``TypeError`` naming it.

Run in both the real and the fake implementation, so a wrong shape fails at trace time with this message,
never as a Triton compile error or a silent wrong answer.
"""

from __future__ import annotations

import torch

FLOAT_ACTIVATIONS = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def activation(op: str, name: str, x: torch.Tensor, any_strides: bool = False) -> None:
    """A float activation with a non-empty last dim, contiguous there unless ``any_strides`` (a kernel that takes
    every stride: Inductor may hand an op's fake any layout at lowering, so a layout check there is a crash)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_ACTIVATIONS:
        raise TypeError(f"{op}: {name} must be bf16, fp16 or fp32, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: {name} must have a non-empty last dim, got shape {tuple(x.shape)}")
    if not any_strides and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must be contiguous in its last dim, got strides {tuple(x.stride())}")


def power_of_two_group(op: str, group) -> None:
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0 or group & (group - 1):
        raise ValueError(f"{op}: group_size must be a power of two, got {group!r}")


def group_size(op: str, k, group: int) -> None:
    power_of_two_group(op, group)
    if k % group != 0:
        raise ValueError(f"{op}: the last dim ({k}) must be a multiple of group_size ({group})")


def same_device(op: str, **tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op}: all tensors must be on one device, got {listing}")


def norm_weight(op: str, x: torch.Tensor, w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.shape[0] != x.shape[-1]:
        shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{op}: w must be a 1-D tensor of size {x.shape[-1]} (x's last dim), got {shape}")
    if w.dtype != x.dtype:
        # HF computes ``weight * normed.to(x.dtype)``: an fp32 weight would promote the output to fp32, which no
        # fused kernel produces (vLLM's strict kernels crashed on exactly this, #44694). One dtype, checked here.
        raise TypeError(f"{op}: w must have x's dtype {x.dtype}, got {w.dtype}")
    if w.shape[0] > 1 and w.stride(0) != 1:
        raise ValueError(f"{op}: w must be contiguous, got stride {w.stride(0)}")


def same_shape(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"{op}: {b_name} must match {a_name} in shape and dtype, got {tuple(b.shape)} {b.dtype} "
            f"vs {tuple(a.shape)} {a.dtype}"
        )


def even_last_dim(op: str, x: torch.Tensor) -> None:
    if x.shape[-1] % 2:
        raise ValueError(f"{op}: x's last dim must be even ([gate | up]), got {x.shape[-1]}")


def blockscale_mm_args(op, q, x_scale, w_q, w_scale, out_dtype) -> None:
    if q.dtype not in FP8_DTYPES:
        raise TypeError(f"{op}: q must be fp8 (e4m3fn or e4m3fnuz), got {q.dtype}")
    if w_q.dtype != q.dtype:
        raise TypeError(f"{op}: w_q must have q's fp8 dtype {q.dtype}, got {w_q.dtype}")
    if q.dim() != 2 or w_q.dim() != 2:
        raise ValueError(f"{op}: q and w_q must be 2-D, got {tuple(q.shape)} and {tuple(w_q.shape)}")
    m, k = q.shape
    n, kw = w_q.shape
    if kw != k:
        raise ValueError(f"{op}: w_q must be [N, K] with K={k} (q's last dim), got {tuple(w_q.shape)}")
    if x_scale.dtype != torch.float32 or w_scale.dtype != torch.float32:
        raise TypeError(f"{op}: x_scale and w_scale must be fp32, got {x_scale.dtype} and {w_scale.dtype}")
    if x_scale.dim() != 2 or x_scale.shape[0] != m or x_scale.shape[1] == 0 or k % x_scale.shape[1]:
        raise ValueError(f"{op}: x_scale must be [M, K/group] = [{m}, K/group] for K={k}, got {tuple(x_scale.shape)}")
    want = (-(-n // 128), -(-k // 128))
    if tuple(w_scale.shape) != want:
        raise ValueError(f"{op}: w_scale must be [ceil(N/128), ceil(K/128)] = {list(want)}, got {list(w_scale.shape)}")
    if q.stride(-1) != 1 or w_q.stride(-1) != 1:
        raise ValueError(f"{op}: q and w_q must be contiguous in their last dim")
    if out_dtype not in FLOAT_ACTIVATIONS:
        raise TypeError(f"{op}: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    same_device(op, q=q, x_scale=x_scale, w_q=w_q, w_scale=w_scale)


def blockscale_mm_grouped_args(op, q, x_scale, w_qs, w_scales, out_dtype) -> None:
    if len(w_qs) == 0 or len(w_qs) != len(w_scales):
        raise ValueError(f"{op}: w_qs and w_scales must be non-empty lists of one length, got {len(w_qs)} and "
                         f"{len(w_scales)}")
    for w_q, w_scale in zip(w_qs, w_scales):
        blockscale_mm_args(op, q, x_scale, w_q, w_scale, out_dtype)


def gate_up_mm_args(op, q, x_scale, w_qs, w_scales, out_dtype, group: int) -> int:
    """The gate/up GEMM of ``blockscale_mm_silu_mul_group_quant``: one merged ``[2I, K]`` weight or gate and up
    ``[I, K]``, each a valid block-scale GEMM with q; I a multiple of the output group. Returns I."""
    if not isinstance(w_qs, (list, tuple)) or not isinstance(w_scales, (list, tuple)):
        raise TypeError(f"{op}: w_qs and w_scales must be lists of tensors")
    if len(w_qs) not in (1, 2):
        raise ValueError(f"{op}: takes one merged gate_up weight or gate and up, got {len(w_qs)} weights")
    blockscale_mm_grouped_args(op, q, x_scale, w_qs, w_scales, out_dtype)
    ns = [w.shape[0] for w in w_qs]
    if len(ns) == 1 and ns[0] % 2 or len(ns) == 2 and ns[0] != ns[1]:
        raise ValueError(f"{op}: gate and up must have one N (a merged weight an even N), got N = {ns}")
    i = sum(ns) // 2
    group_size(op, i, group)
    return i


def quant_mm_args(op, x, w_q, w_scale, out_dtype, group: int) -> None:
    """``group_quant_blockscale_mm``: a 2-D high-precision activation, K a multiple of the group, and a block-scale
    weight for it (``blockscale_mm_args``' rules for the weight side)."""
    activation(op, "x", x)
    if x.dim() != 2 or w_q.dim() != 2:
        raise ValueError(f"{op}: x and w_q must be 2-D, got {tuple(x.shape)} and {tuple(w_q.shape)}")
    group_size(op, x.shape[1], group)
    if w_q.dtype not in FP8_DTYPES:
        raise TypeError(f"{op}: w_q must be fp8 (e4m3fn or e4m3fnuz), got {w_q.dtype}")
    k = x.shape[1]
    n, kw = w_q.shape
    if kw != k:
        raise ValueError(f"{op}: w_q must be [N, K] with K={k} (x's last dim), got {tuple(w_q.shape)}")
    if w_scale.dtype != torch.float32:
        raise TypeError(f"{op}: w_scale must be fp32, got {w_scale.dtype}")
    want = (-(-n // 128), -(-k // 128))
    if tuple(w_scale.shape) != want:
        raise ValueError(f"{op}: w_scale must be [ceil(N/128), ceil(K/128)] = {list(want)}, got {list(w_scale.shape)}")
    if w_q.stride(-1) != 1:
        raise ValueError(f"{op}: w_q must be contiguous in its last dim")
    if out_dtype not in FLOAT_ACTIVATIONS:
        raise TypeError(f"{op}: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    same_device(op, x=x, w_q=w_q, w_scale=w_scale)


def per_tensor_mm_args(op, q, x_scale, w_q, w_scale, out_dtype) -> None:
    if q.dtype not in FP8_DTYPES or w_q.dtype != q.dtype:
        raise TypeError(f"{op}: q and w_q must share one fp8 dtype, got {q.dtype} and {w_q.dtype}")
    if q.dim() != 2 or w_q.dim() != 2 or q.shape[1] != w_q.shape[1]:
        raise ValueError(f"{op}: q [M, K] and w_q [N, K] must agree on K, got {tuple(q.shape)}, {tuple(w_q.shape)}")
    if x_scale.numel() != 1 or w_scale.numel() != 1:
        raise ValueError(f"{op}: x_scale and w_scale must hold one value each")
    if out_dtype not in FLOAT_ACTIVATIONS:
        raise TypeError(f"{op}: out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    same_device(op, q=q, x_scale=x_scale, w_q=w_q, w_scale=w_scale)
