"""Triton backend: one op per file, each a private ``_<op>_kernel`` plus a public launcher that validates,
allocates and computes the grid. Runs on CUDA sm89+, ROCm Triton, and the CPU under ``TRITON_INTERPRET=1``
(CI checks every kernel's numerics that way).
"""

from __future__ import annotations


def kernels() -> dict:
    # Imported here, not at package import: importing triton costs time and is not needed on the reference path.
    from .add_rms_norm import add_rms_norm
    from .blockscale_mm import blockscale_mm
    from .blockscale_mm_grouped import blockscale_mm_grouped
    from .blockscale_mm_silu_quant import blockscale_mm_silu_mul_group_quant
    from .decode_attention import (
        decode_attention,
        decode_attention_tokens,
        decode_attention_tokens_quant,
        decode_attention_upto,
        decode_attention_upto_quant,
        rope_decode_attention,
        rope_decode_attention_tokens,
        rope_decode_attention_tokens_quant,
    )
    from .dynamic_per_tensor_quant import dynamic_per_tensor_quant
    from .group_quant import group_quant
    from .group_quant_blockscale_mm import group_quant_blockscale_mm
    from .per_tensor_mm import per_tensor_mm
    from .rms_norm import rms_norm
    from .rms_norm_group_quant import add_rms_norm_group_quant, rms_norm_group_quant
    from .rms_norm_rope import qk_rope, qk_rope_cache, rms_norm_rope, rms_norm_rope_cache
    from .silu_and_mul import silu_and_mul
    from .silu_mul_group_quant import silu_mul_group_quant

    return {
        "rms_norm": rms_norm,
        "add_rms_norm": add_rms_norm,
        "silu_and_mul": silu_and_mul,
        "group_quant": group_quant,
        "blockscale_mm": blockscale_mm,
        "blockscale_mm_grouped": blockscale_mm_grouped,
        "per_tensor_mm": per_tensor_mm,
        "rms_norm_group_quant": rms_norm_group_quant,
        "add_rms_norm_group_quant": add_rms_norm_group_quant,
        "silu_mul_group_quant": silu_mul_group_quant,
        "blockscale_mm_silu_mul_group_quant": blockscale_mm_silu_mul_group_quant,
        "group_quant_blockscale_mm": group_quant_blockscale_mm,
        "rms_norm_rope": rms_norm_rope,
        "rms_norm_rope_cache": rms_norm_rope_cache,
        "qk_rope": qk_rope,
        "qk_rope_cache": qk_rope_cache,
        "dynamic_per_tensor_quant": dynamic_per_tensor_quant,
        "decode_attention": decode_attention,
        "decode_attention_upto": decode_attention_upto,
        "decode_attention_upto_quant": decode_attention_upto_quant,
        "decode_attention_tokens": decode_attention_tokens,
        "decode_attention_tokens_quant": decode_attention_tokens_quant,
        "rope_decode_attention": rope_decode_attention,
        "rope_decode_attention_tokens": rope_decode_attention_tokens,
        "rope_decode_attention_tokens_quant": rope_decode_attention_tokens_quant,
    }
