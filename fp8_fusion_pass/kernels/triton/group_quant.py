"""1 x G dynamic fp8 group quant of x [..., K]: ``q [..., K]`` fp8 and ``scale [..., K/G]`` fp32, row-major.

Each program quantizes a [BLOCK_M, GPC, G] tile (``_tiles.elementwise_tile``) with ``_fp8.group_quant_tile``,
the step every fused kernel shares, so this kernel is the "unfused" half of every fused-vs-unfused comparison.
``PDL`` (``_pdl.py``, off by default): ``wait_then_launch`` first in every program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from . import _tiles
from ._fp8 import group_quant_tile, kernel_constexprs, to_fp32
from ._pdl import pdl_kwargs, wait_then_launch

# Triton code below keeps its arguments grouped by role (one comment per group), so the formatter is off.
# fmt: off


@triton.jit
def store_group_quant(y, q_ptr, s_ptr, rows, row_ok, cols, mask, g0, K, G: tl.constexpr, GPC: tl.constexpr,
                      FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr,
                      EMULATE_CAST: tl.constexpr, PTX: tl.constexpr):
    """Quantize fp32 y [BLOCK_M, GPC, G] (masked lanes 0); store q [M, K] and scale [M, K/G], both contiguous."""
    q, scale = group_quant_tile(y, q_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    tl.store(q_ptr + rows[:, None, None] * K + cols, q, mask=mask)
    groups = g0 + tl.arange(0, GPC)
    n_groups = K // G
    tl.store(s_ptr + rows[:, None] * n_groups + groups[None, :], scale,
             mask=row_ok[:, None] & (groups < n_groups)[None, :])


@triton.jit
def _group_quant_kernel(
    x_ptr,  # [M, K]: row stride stride_x, unit column stride
    q_ptr, s_ptr,  # q: fp8 [M, K]; scale: fp32 [M, K/G]; contiguous
    M, K, stride_x,
    G: tl.constexpr, GPC: tl.constexpr, BLOCK_M: tl.constexpr,  # grid (cdiv(M, BLOCK_M), cdiv(K/G, GPC))
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,  # compiling for NVIDIA: saturating fp8 cast (_fp8.kernel_constexprs)
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait_then_launch before any load or store
):
    wait_then_launch(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)  # M * K overflows int32 at prefill sizes
    g0 = tl.program_id(1) * GPC
    cols = (g0 + tl.arange(0, GPC))[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GPC, G]
    mask = row_ok[:, None, None] & (cols < K)
    x = tl.load(x_ptr + rows[:, None, None] * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    store_group_quant(to_fp32(x, EMULATE_CAST), q_ptr, s_ptr, rows, row_ok, cols, mask, g0, K, G, GPC,
                      FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)


# fmt: on


def launch(x: torch.Tensor, group_size: int, tile: _tiles.Tile | None = None):
    """``tile`` overrides ``_tiles.elementwise_tile`` (tests and ``benchmarks/fused_kernels.py --sweep``)."""
    x2 = _tiles.rows_of(x)
    m, k = x2.shape
    n_groups = k // group_size
    tile = tile or _tiles.elementwise_tile(m, n_groups, group_size, "group_quant")
    q = torch.empty((m, k), dtype=arch.arch_of(x.device).fp8_dtype, device=x.device)
    scale = torch.empty((m, n_groups), dtype=torch.float32, device=x.device)
    if m > 0:
        grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n_groups, tile.gpc))
        _group_quant_kernel[grid](
            x2, q, scale, m, k, x2.stride(0), G=group_size, **kernel_constexprs(x.device), **tile.as_kwargs(),
            **pdl_kwargs(x.device),
        )  # fmt: skip
    return q.view(x.shape), scale.view(*x.shape[:-1], n_groups)


def group_quant(x: torch.Tensor, group_size: int = 128):
    """Returns ``(q [..., K] fp8, scale [..., K/group_size] fp32)``; bit-exact with ``reference.group_quant``."""
    return launch(x, group_size)
