"""``blockscale_mm_silu_mul_group_quant`` on the Triton backend: the gate/up GEMM with the down projection's input
quant in its epilogue, where that measured faster than the two launches it replaces; else exactly those two.

Choice per (arch, M bucket, I, K): ``TABLE`` (measured by ``benchmarks/gemm_silu_quant.py`` on the GPU; a None
entry means the unfused pair won there), else ``default_config`` (reasoned) for M <= ``SMALL_M_MAX``, else the
unfused pair. The fused launch is ``_small_m_silu_kernels.py``; the unfused pair is ``blockscale_mm`` (or
``blockscale_mm_grouped`` for separate gate / up weights) then ``silu_mul_group_quant``, the graph the pass
started from, so a shape the fused kernel cannot take computes the same thing.
"""

from __future__ import annotations

import torch
import triton

from ... import arch as _arch
from .. import checks
from . import blockscale_mm as _bm
from ._blockscale_kernels import SCALE_BLOCK
from ._small_m_kernels import TARGET_PROGRAMS, SmallMConfig
from ._small_m_silu_kernels import small_m_mm_silu_quant, unsupported
from .blockscale_mm_grouped import blockscale_mm_grouped
from .silu_mul_group_quant import silu_mul_group_quant

OP = "blockscale_mm_silu_mul_group_quant"
SMALL_M_MAX = _bm.SMALL_M_MAX

# (arch name, M bucket, I, K) -> the fused launch's config, or None where the unfused pair was faster.
# Filled from ``python benchmarks/gemm_silu_quant.py`` (its printed rows), with the date and GPU.
# fmt: off
TABLE: dict[tuple[str, int, int, int], SmallMConfig | None] = {
}
# fmt: on


def default_config(i: int, k: int, group_size: int) -> SmallMConfig:
    """Reasoned, not measured: 128 output columns per program (256 weight rows per K step, as a 256-wide tile of
    ``_small_m_kernel``), split K toward ``TARGET_PROGRAMS`` / 2 programs (each moves twice a plain tile's
    bytes) keeping >= 4 K tiles per split, 8 warps, 3 stages (3 x 32 KB of weight in flight per program)."""
    block_n = max(128, group_size)
    n_tiles, k_tiles = triton.cdiv(i, block_n), k // SCALE_BLOCK
    split = max(1, min(TARGET_PROGRAMS // 2 // n_tiles, k_tiles // 4))
    return SmallMConfig(block_n=block_n, split_k=split, warps=8, stages=3, reduce="last")


def _gate_up(w_qs, w_scales):
    """(gate, gate scales, up, up scales) as views, or None when the halves of a merged weight share a weight
    block row (I not a multiple of 128) or gate and up are laid out differently."""
    if len(w_qs) == 2:
        parts = (w_qs[0], w_scales[0], w_qs[1], w_scales[1])
    else:
        w, s = w_qs[0], w_scales[0]
        i = w.shape[0] // 2
        if i % SCALE_BLOCK:
            return None
        parts = (w[:i], s[: i // SCALE_BLOCK], w[i:], s[i // SCALE_BLOCK:])
    wg, sg, wu, su = parts
    if wg.stride() != wu.stride() or sg.stride() != su.stride() or wg.stride(1) != 1:
        return None
    return parts


def fused_config(a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, i: int, k: int, group_k: int,
                 group_size: int, out_dtype: torch.dtype) -> SmallMConfig | None:
    """The fused launch's config for this GEMM, or None when the unfused pair runs (measured faster, M above the
    small-M range, or a shape / device the kernel cannot take). Pure: no tensors."""
    if m > SMALL_M_MAX or _bm.unsupported("small_m", a, device_type, fp8, 2 * i, k, group_k, out_dtype):
        return None
    key = (a.name, _bm.m_bucket(m), i, k)
    config = TABLE[key] if key in TABLE else default_config(i, k, group_size)
    if config is None or unsupported(i, group_size, config) is not None:
        return None
    return config


def blockscale_mm_silu_mul_group_quant(q, x_scale, w_qs, w_scales, out_dtype: torch.dtype, group_size: int = 128):
    """``(q_out [M, I] fp8, scale [M, I / group_size] fp32)`` = ``silu_mul_group_quant`` of the gate/up GEMM."""
    i = checks.gate_up_mm_args(OP, q, x_scale, w_qs, w_scales, out_dtype, group_size)
    m, k = q.shape
    config = fused_config(_arch.arch_of(q.device), q.device.type, q.dtype, m, i, k, k // x_scale.shape[1],
                          group_size, out_dtype)  # fmt: skip
    parts = _gate_up(w_qs, w_scales) if config is not None else None
    if parts is not None:
        out = small_m_mm_silu_quant(q, x_scale, *parts, out_dtype, group_size, config)
        if out is not None:
            return out
    if len(w_qs) == 1:
        y = _bm.blockscale_mm(q, x_scale, w_qs[0], w_scales[0], out_dtype)
    else:
        y = blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype)
    return silu_mul_group_quant(y, group_size)
