"""The reference backend: ``reference.py`` bound to the device's fp8 dtype and fp8 max.

Every backend's kernels share these signatures (the op vocabulary's, minus nothing):
``group_quant(x, group_size)``, ``rms_norm(x, w, eps)``, ``blockscale_mm(q, x_scale, w_q, w_scale, out_dtype)``, ...
The fp8 facts come from ``arch.py`` for the input's device.
"""

from __future__ import annotations

import torch

from .. import arch
from . import reference as ref


def _fp8(x: torch.Tensor):
    a = arch.arch_of(x.device)
    return a.fp8_dtype, a.fp8_max


def group_quant(x, group_size):
    return ref.group_quant(x, group_size, *_fp8(x))


def rms_norm_group_quant(x, w, eps, group_size):
    return ref.rms_norm_group_quant(x, w, eps, group_size, *_fp8(x))


def add_rms_norm_group_quant(x, residual, w, eps, group_size):
    return ref.add_rms_norm_group_quant(x, residual, w, eps, group_size, *_fp8(x))


def silu_mul_group_quant(x, group_size):
    return ref.silu_mul_group_quant(x, group_size, *_fp8(x))


def blockscale_mm_silu_mul_group_quant(q, x_scale, w_qs, w_scales, out_dtype, group_size):
    return ref.blockscale_mm_silu_mul_group_quant(q, x_scale, w_qs, w_scales, out_dtype, group_size, *_fp8(q))


def group_quant_blockscale_mm(x, w_q, w_scale, out_dtype, group_size):
    return ref.group_quant_blockscale_mm(x, w_q, w_scale, out_dtype, group_size, *_fp8(x))


def decode_attention_upto_quant(q, k_cache, v_cache, last, scale, group_size):
    return group_quant(ref.decode_attention_upto(q, k_cache, v_cache, last, scale), group_size)


def decode_attention_tokens_quant(q, k_cache, v_cache, last, scale, group_size):
    return group_quant(ref.decode_attention_tokens(q, k_cache, v_cache, last, scale), group_size)


def rope_decode_attention(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale, group_size):
    o = ref.rope_decode_attention(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale)
    if group_size:
        return group_quant(o, group_size)
    return o, o.new_empty((*o.shape[:3], 0), dtype=torch.float32)


def rope_decode_attention_tokens_quant(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale,
                                       group_size):
    o = ref.rope_decode_attention_tokens(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale)
    return group_quant(o, group_size)


def dynamic_per_tensor_quant(out, x, scale):
    # Overwrites ``scale`` (never reads it): the scale-semantics registry records this op as "overwrites".
    q, s = ref.per_tensor_quant(x, *_fp8(x))
    out.copy_(q)
    scale.copy_(s)


def kernels() -> dict:
    return {
        "rms_norm": ref.rms_norm,
        "add_rms_norm": ref.add_rms_norm,
        "silu_and_mul": ref.silu_and_mul,
        "group_quant": group_quant,
        "blockscale_mm": ref.blockscale_mm,
        "blockscale_mm_grouped": ref.blockscale_mm_grouped,
        "per_tensor_mm": ref.per_tensor_mm,
        "rms_norm_group_quant": rms_norm_group_quant,
        "add_rms_norm_group_quant": add_rms_norm_group_quant,
        "silu_mul_group_quant": silu_mul_group_quant,
        "blockscale_mm_silu_mul_group_quant": blockscale_mm_silu_mul_group_quant,
        "group_quant_blockscale_mm": group_quant_blockscale_mm,
        "rms_norm_rope": ref.rms_norm_rope,
        "rms_norm_rope_cache": ref.rms_norm_rope_cache,
        "qk_rope": ref.qk_rope,
        "qk_rope_cache": ref.qk_rope_cache,
        "dynamic_per_tensor_quant": dynamic_per_tensor_quant,
        "decode_attention": ref.decode_attention,
        "decode_attention_upto": ref.decode_attention_upto,
        "decode_attention_upto_quant": decode_attention_upto_quant,
        "decode_attention_tokens": ref.decode_attention_tokens,
        "decode_attention_tokens_quant": decode_attention_tokens_quant,
        "rope_decode_attention": rope_decode_attention,
        "rope_decode_attention_tokens": ref.rope_decode_attention_tokens,
        "rope_decode_attention_tokens_quant": rope_decode_attention_tokens_quant,
    }
