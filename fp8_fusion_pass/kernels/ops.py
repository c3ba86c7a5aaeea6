"""The op vocabulary, namespace ``fp8_fusion``: functional custom ops with fake implementations.

Unfused ops are what model code calls; fused ops are what the pass swaps in. Each real implementation
validates its inputs (``checks.py``) and dispatches to the backend chosen for the device (``backends.py``);
each fake validates the same way and describes the outputs, so shape errors surface at trace time and
symbolic M works under ``torch.compile(dynamic=True)``.

Outputs (``x [..., K]``, ``g = group_size``; the attention side's ops, RoPE to decode attention, are in
``attention_ops.py``, registered when this module is imported):
  rms_norm(x, w, eps)                                -> y [..., K] (x.dtype)
  add_rms_norm(x, residual, w, eps)                  -> (y, residual_out)
  silu_and_mul(x [..., 2I])                          -> y [..., I]      (gate = first half)
  group_quant(x, g)                                  -> (q [..., K] fp8, scale [..., K/g] fp32, row-major)
  blockscale_mm(q [M,K], x_scale [M,K/g], w_q [N,K], w_scale [N/128,K/128], out_dtype) -> y [M, N]
  blockscale_mm_grouped(q, x_scale, [w_q_i [N_i,K]], [w_scale_i], out_dtype)          -> y [M, sum N_i]
  per_tensor_mm(q [M,K], x_scale [1], w_q [N,K], w_scale [1], out_dtype)              -> y [M, N]
  rms_norm_group_quant(x, w, eps, g)                 -> (q, scale)
  add_rms_norm_group_quant(x, residual, w, eps, g)   -> (q, scale, residual_out)
  silu_mul_group_quant(x [..., 2I], g)               -> (q [..., I], scale [..., I/g])
  blockscale_mm_silu_mul_group_quant(q [M,K], x_scale, [w_q [2I,K]] or [w_gate, w_up], [w_scale_i], out_dtype, g)
                                                     -> (q [M, I], scale [M, I/g])
  group_quant_blockscale_mm(x [M,K], w_q [N,K], w_scale, out_dtype, g)               -> y [M, N]
  dynamic_per_tensor_quant(out!, x, scale!)          -> ()   mutates out (fp8) and scale (fp32 [1])
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

from .. import arch
from . import backends, checks

NS = "fp8_fusion"
DEFAULT_GROUP_SIZE = 128


def _kernel(op: str, x: Tensor):
    return backends.get_kernel(op, x.device)


def _quant_outputs(y_like: Tensor, group_size: int):
    # Fake outputs of a group quant of a tensor shaped like y_like.
    q = torch.empty_like(y_like, dtype=arch.fp8_dtype(y_like.device), memory_format=torch.contiguous_format)
    scale = y_like.new_empty((*y_like.shape[:-1], y_like.shape[-1] // group_size), dtype=torch.float32)
    return q, scale


# ---------------------------------------------------------------- unfused


def _check_norm(op, x, w, residual=None):
    checks.activation(op, "x", x)
    checks.norm_weight(op, x, w)
    if residual is not None:
        checks.same_shape(op, "x", x, "residual", residual)
    checks.same_device(op, x=x, w=w, residual=residual)


@custom_op(f"{NS}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    _check_norm("rms_norm", x, w)
    return _kernel("rms_norm", x)(x, w, eps).contiguous()


def _like(x: Tensor) -> Tensor:
    # Outputs are always contiguous, whatever x's (dense) strides: the Triton kernels allocate them so, and the
    # real implementation below makes the reference agree.
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@rms_norm.register_fake
def _(x, w, eps):
    _check_norm("rms_norm", x, w)
    return _like(x)


@custom_op(f"{NS}::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check_norm("add_rms_norm", x, w, residual)
    y, residual_out = _kernel("add_rms_norm", x)(x, residual, w, eps)
    return y.contiguous(), residual_out.contiguous()


@add_rms_norm.register_fake
def _(x, residual, w, eps):
    _check_norm("add_rms_norm", x, w, residual)
    return _like(x), _like(x)


def _check_silu(op, x):
    checks.activation(op, "x", x)
    checks.even_last_dim(op, x)


@custom_op(f"{NS}::silu_and_mul", mutates_args=())
def silu_and_mul(x: Tensor) -> Tensor:
    _check_silu("silu_and_mul", x)
    return _kernel("silu_and_mul", x)(x)


@silu_and_mul.register_fake
def _(x):
    _check_silu("silu_and_mul", x)
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _check_quant(op, x, group_size, k=None):
    checks.activation(op, "x", x)
    checks.group_size(op, x.shape[-1] if k is None else k, group_size)


@custom_op(f"{NS}::group_quant", mutates_args=())
def group_quant(x: Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[Tensor, Tensor]:
    _check_quant("group_quant", x, group_size)
    return _kernel("group_quant", x)(x, group_size)


@group_quant.register_fake
def _(x, group_size=DEFAULT_GROUP_SIZE):
    _check_quant("group_quant", x, group_size)
    return _quant_outputs(x, group_size)


@custom_op(f"{NS}::blockscale_mm", mutates_args=())
def blockscale_mm(q: Tensor, x_scale: Tensor, w_q: Tensor, w_scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    checks.blockscale_mm_args("blockscale_mm", q, x_scale, w_q, w_scale, out_dtype)
    return _kernel("blockscale_mm", q)(q, x_scale, w_q, w_scale, out_dtype)


@blockscale_mm.register_fake
def _(q, x_scale, w_q, w_scale, out_dtype):
    checks.blockscale_mm_args("blockscale_mm", q, x_scale, w_q, w_scale, out_dtype)
    return q.new_empty((q.shape[0], w_q.shape[0]), dtype=out_dtype)


@custom_op(f"{NS}::blockscale_mm_grouped", mutates_args=())
def blockscale_mm_grouped(q: Tensor, x_scale: Tensor, w_qs: list[Tensor], w_scales: list[Tensor],
                          out_dtype: torch.dtype) -> Tensor:
    """``cat([blockscale_mm(q, x_scale, w, ws) for w, ws in ...], -1)``: GEMMs sharing one activation (HF q/k/v,
    gate/up) in one launch where the backend can (``kernels/triton/blockscale_mm_grouped.py``)."""
    checks.blockscale_mm_grouped_args("blockscale_mm_grouped", q, x_scale, w_qs, w_scales, out_dtype)
    return _kernel("blockscale_mm_grouped", q)(q, x_scale, list(w_qs), list(w_scales), out_dtype)


@blockscale_mm_grouped.register_fake
def _(q, x_scale, w_qs, w_scales, out_dtype):
    checks.blockscale_mm_grouped_args("blockscale_mm_grouped", q, x_scale, w_qs, w_scales, out_dtype)
    return q.new_empty((q.shape[0], sum(w.shape[0] for w in w_qs)), dtype=out_dtype)


@custom_op(f"{NS}::per_tensor_mm", mutates_args=())
def per_tensor_mm(q: Tensor, x_scale: Tensor, w_q: Tensor, w_scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    checks.per_tensor_mm_args("per_tensor_mm", q, x_scale, w_q, w_scale, out_dtype)
    return _kernel("per_tensor_mm", q)(q, x_scale, w_q, w_scale, out_dtype)


@per_tensor_mm.register_fake
def _(q, x_scale, w_q, w_scale, out_dtype):
    checks.per_tensor_mm_args("per_tensor_mm", q, x_scale, w_q, w_scale, out_dtype)
    return q.new_empty((q.shape[0], w_q.shape[0]), dtype=out_dtype)


# ---------------------------------------------------------------- fused


@custom_op(f"{NS}::rms_norm_group_quant", mutates_args=())
def rms_norm_group_quant(x: Tensor, w: Tensor, eps: float,
                         group_size: int = DEFAULT_GROUP_SIZE) -> tuple[Tensor, Tensor]:
    _check_norm("rms_norm_group_quant", x, w)
    _check_quant("rms_norm_group_quant", x, group_size)
    return _kernel("rms_norm_group_quant", x)(x, w, eps, group_size)


@rms_norm_group_quant.register_fake
def _(x, w, eps, group_size=DEFAULT_GROUP_SIZE):
    _check_norm("rms_norm_group_quant", x, w)
    _check_quant("rms_norm_group_quant", x, group_size)
    return _quant_outputs(x, group_size)


@custom_op(f"{NS}::add_rms_norm_group_quant", mutates_args=())
def add_rms_norm_group_quant(
    x: Tensor, residual: Tensor, w: Tensor, eps: float, group_size: int = DEFAULT_GROUP_SIZE
) -> tuple[Tensor, Tensor, Tensor]:
    _check_norm("add_rms_norm_group_quant", x, w, residual)
    _check_quant("add_rms_norm_group_quant", x, group_size)
    q, scale, residual_out = _kernel("add_rms_norm_group_quant", x)(x, residual, w, eps, group_size)
    return q, scale, residual_out.contiguous()


@add_rms_norm_group_quant.register_fake
def _(x, residual, w, eps, group_size=DEFAULT_GROUP_SIZE):
    _check_norm("add_rms_norm_group_quant", x, w, residual)
    _check_quant("add_rms_norm_group_quant", x, group_size)
    return (*_quant_outputs(x, group_size), _like(x))


@custom_op(f"{NS}::silu_mul_group_quant", mutates_args=())
def silu_mul_group_quant(x: Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[Tensor, Tensor]:
    _check_silu("silu_mul_group_quant", x)
    _check_quant("silu_mul_group_quant", x, group_size, k=x.shape[-1] // 2)
    return _kernel("silu_mul_group_quant", x)(x, group_size)


@silu_mul_group_quant.register_fake
def _(x, group_size=DEFAULT_GROUP_SIZE):
    _check_silu("silu_mul_group_quant", x)
    _check_quant("silu_mul_group_quant", x, group_size, k=x.shape[-1] // 2)
    return _quant_outputs(x.new_empty((*x.shape[:-1], x.shape[-1] // 2)), group_size)


@custom_op(f"{NS}::blockscale_mm_silu_mul_group_quant", mutates_args=())
def blockscale_mm_silu_mul_group_quant(q: Tensor, x_scale: Tensor, w_qs: list[Tensor], w_scales: list[Tensor],
                                       out_dtype: torch.dtype, group_size: int = DEFAULT_GROUP_SIZE
                                       ) -> tuple[Tensor, Tensor]:
    """``silu_mul_group_quant(blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype), group_size)``: the
    gate/up GEMM with the down projection's input quant in its epilogue (``kernels/triton/
    blockscale_mm_silu_quant.py``). ``w_qs``: one merged ``[2I, K]`` weight (gate rows first) or gate and up."""
    checks.gate_up_mm_args("blockscale_mm_silu_mul_group_quant", q, x_scale, w_qs, w_scales, out_dtype, group_size)
    return _kernel("blockscale_mm_silu_mul_group_quant", q)(q, x_scale, list(w_qs), list(w_scales), out_dtype,
                                                             group_size)


@blockscale_mm_silu_mul_group_quant.register_fake
def _(q, x_scale, w_qs, w_scales, out_dtype, group_size=DEFAULT_GROUP_SIZE):
    i = checks.gate_up_mm_args("blockscale_mm_silu_mul_group_quant", q, x_scale, w_qs, w_scales, out_dtype,
                               group_size)
    return _quant_outputs(q.new_empty((q.shape[0], i), dtype=out_dtype), group_size)


@custom_op(f"{NS}::group_quant_blockscale_mm", mutates_args=())
def group_quant_blockscale_mm(x: Tensor, w_q: Tensor, w_scale: Tensor, out_dtype: torch.dtype,
                              group_size: int = DEFAULT_GROUP_SIZE) -> Tensor:
    """``blockscale_mm(*group_quant(x, group_size), w_q, w_scale, out_dtype)``: a GEMM that quantizes its own
    high-precision input where that measured faster (``kernels/triton/group_quant_blockscale_mm.py``: the GEMV at
    M <= 4), else the two ops."""
    checks.quant_mm_args("group_quant_blockscale_mm", x, w_q, w_scale, out_dtype, group_size)
    return _kernel("group_quant_blockscale_mm", x)(x, w_q, w_scale, out_dtype, group_size)


@group_quant_blockscale_mm.register_fake
def _(x, w_q, w_scale, out_dtype, group_size=DEFAULT_GROUP_SIZE):
    checks.quant_mm_args("group_quant_blockscale_mm", x, w_q, w_scale, out_dtype, group_size)
    return x.new_empty((x.shape[0], w_q.shape[0]), dtype=out_dtype)


# ---------------------------------------------------------------- mutating (the zero-fill case)


def _check_per_tensor(op, out, x, scale):
    checks.activation(op, "x", x)
    if out.shape != x.shape or out.dtype not in checks.FP8_DTYPES:
        raise ValueError(f"{op}: out must be an fp8 tensor shaped like x {tuple(x.shape)}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(f"{op}: scale must be a one-element fp32 tensor, got {tuple(scale.shape)} {scale.dtype}")
    checks.same_device(op, out=out, x=x, scale=scale)


@custom_op(f"{NS}::dynamic_per_tensor_quant", mutates_args=("out", "scale"))
def dynamic_per_tensor_quant(out: Tensor, x: Tensor, scale: Tensor) -> None:
    """Quantize x into out with one dynamic scale, written to ``scale``. Every backend *overwrites* scale
    (never reads it), so a ``zeros(1)`` before it is dead work that the zero-fill rewrite strips."""
    _check_per_tensor("dynamic_per_tensor_quant", out, x, scale)
    _kernel("dynamic_per_tensor_quant", x)(out, x, scale)


@dynamic_per_tensor_quant.register_fake
def _(out, x, scale):
    _check_per_tensor("dynamic_per_tensor_quant", out, x, scale)


from . import attention_ops  # noqa: E402, F401  (registers the attention side's ops; it reads NS etc. from here)

# The vocabulary split by role; every op registered here or in attention_ops.py is in exactly one
# (tests/kernels/test_ops.py). FUSED is what the pass swaps in: the tensor-parallel audit (models/tp_graph.py) checks
# none of them reads a collective's input.
UNFUSED = ("rms_norm", "add_rms_norm", "silu_and_mul", "group_quant", "blockscale_mm", "per_tensor_mm",
           "dynamic_per_tensor_quant")  # fmt: skip
FUSED = ("rms_norm_group_quant", "add_rms_norm_group_quant", "silu_mul_group_quant", "blockscale_mm_grouped",
         "blockscale_mm_silu_mul_group_quant", "group_quant_blockscale_mm", "rms_norm_rope", "rms_norm_rope_cache",
         "qk_rope", "qk_rope_cache", "decode_attention", "decode_attention_upto", "decode_attention_upto_quant",
         "decode_attention_tokens", "decode_attention_tokens_quant", "rope_decode_attention",
         "rope_decode_attention_tokens", "rope_decode_attention_tokens_quant")  # fmt: skip
