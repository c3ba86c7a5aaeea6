"""``silu(gate) * up`` of x [..., 2I] (gate = first half), optionally fused with the 1 x G fp8 group quant.

``silu_and_mul`` and ``silu_mul_group_quant`` both launch ``_silu_and_mul_kernel``; the ``QUANT`` flag hands the
x.dtype-rounded product to ``group_quant.store_group_quant``. The unfused pair stores that same value and
``group_quant`` reloads it unchanged, so fused and unfused are bit-exact by construction.

Numerics (``reference.silu_and_mul``, HF ``act_fn(gate) * up``): s = gate / (1 + exp(-gate)) in fp32, rounded to
x.dtype; y = s * up (exact in fp32 for bf16 inputs), rounded to x.dtype. Equal to torch's up to the last fp32 ulps
of the exp and the division before the bf16 rounding (bit-exact on the CPU interpreter in every test). On NVIDIA
(``PTX``) the exp and the reciprocal are one ``ex2.approx.ftz`` and one ``rcp.approx.ftz`` each (MUFU), what
``tl.exp`` and ``/`` (``div.full.f32``) compute too, minus their subnormal range fix-ups: 5 instructions per value
instead of ~12 (sm_90 SASS, counted offline), in a kernel that was at its issue budget (``_tiles.py``).
``PDL`` (``_pdl.py``, off by default): ``wait_then_launch`` first in every program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from . import _tiles
from ._fp8 import kernel_constexprs, round_to, to_fp32
from ._pdl import pdl_kwargs, wait_then_launch
from .group_quant import store_group_quant

COLUMN_BLOCK = 128  # G of the unquantized op: I need not be a multiple of it (columns are masked)

# Triton code below keeps its arguments grouped by role (one comment per group), so the formatter is off.
# fmt: off


@triton.jit
def _silu(gate, PTX: tl.constexpr):
    """gate / (1 + exp(-gate)) in fp32: F.silu before its rounding to x.dtype.

    PTX: flushing subnormals costs nothing here: exp(-gate) is subnormal only for gate > 87 (then 1 + e = 1 either
    way), 1 + e >= 1 is never subnormal, and 1 + e = inf (gate < -88.7) gives gate * 0 = -0 = gate / inf."""
    if PTX:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [gate * -1.4426950408889634],
                                      dtype=tl.float32, is_pure=True, pack=1)
        rcp = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e],
                                        dtype=tl.float32, is_pure=True, pack=1)
        return gate * rcp
    # The approximate division (div.full.f32, 2 ulp) is hidden by the rounding to x.dtype except within 2 ulp of a
    # bf16 midpoint (~6e-5 of values); div.rn would cost ~10 instructions per value (see _fp8.py).
    return gate / (1.0 + tl.exp(-gate))


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [M, 2I]: row stride stride_x; gate = columns [0, I), up = [I, 2I)
    y_ptr,  # [M, I] contiguous, x.dtype (unquantized variant)
    q_ptr, s_ptr,  # q: fp8 [M, I]; scale: fp32 [M, I/G]; contiguous (fused variant)
    M, I, stride_x,
    G: tl.constexpr, GPC: tl.constexpr, BLOCK_M: tl.constexpr,  # grid (cdiv(M, BLOCK_M), cdiv(cdiv(I, G), GPC))
    QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,  # compiling for NVIDIA: saturating fp8 cast, ex2 / rcp inline asm (_fp8.kernel_constexprs)
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait_then_launch before any load or store
):
    wait_then_launch(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)  # M * 2I overflows int32 at prefill sizes
    g0 = tl.program_id(1) * GPC
    cols = (g0 + tl.arange(0, GPC))[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GPC, G]
    mask = row_ok[:, None, None] & (cols < I)
    gate_ptrs = x_ptr + rows[:, None, None] * stride_x + cols
    gate = to_fp32(tl.load(gate_ptrs, mask=mask, other=0.0, eviction_policy="evict_first"), EMULATE_CAST)
    up = to_fp32(tl.load(gate_ptrs + I, mask=mask, other=0.0, eviction_policy="evict_first"), EMULATE_CAST)
    act = round_to(_silu(gate, PTX), x_ptr.dtype.element_ty, EMULATE_CAST)
    y = round_to(to_fp32(act, EMULATE_CAST) * up, x_ptr.dtype.element_ty, EMULATE_CAST)  # act * up, in x.dtype
    if QUANT:
        store_group_quant(to_fp32(y, EMULATE_CAST), q_ptr, s_ptr, rows, row_ok, cols, mask, g0, I, G, GPC,
                          FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    else:
        tl.store(y_ptr + rows[:, None, None] * I + cols, y, mask=mask)


# fmt: on


def launch(x: torch.Tensor, group_size: int | None, tile: _tiles.Tile | None = None):
    """``group_size=None``: returns y [..., I]; else ``(q [..., I], scale [..., I/group_size])``.

    ``tile`` overrides ``_tiles.elementwise_tile`` (tests and ``benchmarks/fused_kernels.py --sweep``)."""
    x2 = _tiles.rows_of(x)
    m, i = x2.shape[0], x2.shape[1] // 2
    quant = group_size is not None
    g = group_size if quant else COLUMN_BLOCK
    n_groups = triton.cdiv(i, g)
    tile = tile or _tiles.elementwise_tile(m, n_groups, g, "silu_mul")
    dev = x.device
    y = x2 if quant else torch.empty((m, i), dtype=x.dtype, device=dev)  # unused pointers get x2
    q = torch.empty((m, i), dtype=arch.arch_of(dev).fp8_dtype, device=dev) if quant else x2
    scale = torch.empty((m, n_groups), dtype=torch.float32, device=dev) if quant else x2
    if m > 0 and i > 0:
        grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n_groups, tile.gpc))
        _silu_and_mul_kernel[grid](
            x2, y, q, scale, m, i, x2.stride(0), G=g, QUANT=quant, **kernel_constexprs(dev), **tile.as_kwargs(),
            **pdl_kwargs(dev),
        )  # fmt: skip
    lead = x.shape[:-1]
    return (q.view(*lead, i), scale.view(*lead, n_groups)) if quant else y.view(*lead, i)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]``, contiguous, x.dtype."""
    return launch(x, None)
