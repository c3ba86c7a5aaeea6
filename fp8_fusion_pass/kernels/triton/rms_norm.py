"""RMSNorm, with optional residual add and optional fused 1 x G fp8 group quant: one kernel for the norm family.

``rms_norm``, ``add_rms_norm``, ``rms_norm_group_quant`` and ``add_rms_norm_group_quant`` all launch
``_rms_norm_kernel``; constexpr flags pick the residual add and the quant. Sharing one kernel (and one tile
choice, ``_tiles.row_tile``, independent of the flags) makes the fused norm and the unfused pair reduce in the
same order, so they agree bit for bit; the DESIGN.md bound (one fp8 step on a small fraction) is then slack.

Numerics (``reference.rms_norm``, HF ``Qwen3RMSNorm``):
  s    = (x + residual) rounded to x.dtype              (add variants; stored as residual_out)
  rstd = 1 / sqrt(sum(s^2) / K + eps)                   (fp32; correctly rounded division and sqrt)
  y    = w * (s * rstd rounded to x.dtype)              (rounded to x.dtype; ops.py requires w.dtype == x.dtype)
then ``group_quant_tile(y)`` in the fused variants. Each program owns BLOCK_M whole rows and reads x (and the
residual) once from HBM: one-pass tiles keep the rows in registers; the two-pass loop re-reads them from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from . import _tiles
from ._fp8 import fp8_constexprs, group_quant_tile, round_to, to_fp32

COLUMN_BLOCK = 128  # G of the unquantized norms: the same tiles as the fused norm at group size 128

# Triton code below keeps its arguments grouped by role (one comment per group), so the formatter is off.
# fmt: off


@triton.jit
def _load_chunk(x_ptr, r_ptr, res_out_ptr, rows, row_ok, g0, K, stride_x, stride_r,
                HAS_RESIDUAL: tl.constexpr, STORE_RESIDUAL: tl.constexpr, EVICT: tl.constexpr,
                GPC: tl.constexpr, G: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """Columns [g0*G, (g0+GPC)*G) of BLOCK_M rows of x (+ residual) as fp32 [BLOCK_M, GPC, G], mask, columns."""
    cols = (g0 + tl.arange(0, GPC))[None, :, None] * G + tl.arange(0, G)[None, None, :]  # [1, GPC, G]
    mask = row_ok[:, None, None] & (cols < K)
    xs = tl.load(x_ptr + rows[:, None, None] * stride_x + cols, mask=mask, other=0.0, eviction_policy=EVICT)
    if HAS_RESIDUAL:
        rs = tl.load(r_ptr + rows[:, None, None] * stride_r + cols, mask=mask, other=0.0, eviction_policy=EVICT)
        xs = round_to(to_fp32(xs, EMULATE_CAST) + to_fp32(rs, EMULATE_CAST), x_ptr.dtype.element_ty, EMULATE_CAST)
        if STORE_RESIDUAL:  # HF: residual + x in x.dtype
            tl.store(res_out_ptr + rows[:, None, None] * K + cols, xs, mask=mask)
    return to_fp32(xs, EMULATE_CAST), mask, cols


@triton.jit
def _normalize_store(xf, rstd, x_ptr, w_ptr, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, g0, K, NG,
                     QUANT: tl.constexpr, GPC: tl.constexpr, FP8_MAX: tl.constexpr,
                     FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr):
    w = tl.load(w_ptr + cols, mask=cols < K, other=0.0)  # [1, GPC, G], L2-resident (every program reads it)
    normed = round_to(xf * rstd[:, None, None], x_ptr.dtype.element_ty, EMULATE_CAST)  # HF: .to(input_dtype)
    # w * normed in x.dtype (ops.py requires w.dtype == x.dtype): exact product in fp32, one RTNE rounding
    y = round_to(to_fp32(w, EMULATE_CAST) * to_fp32(normed, EMULATE_CAST), x_ptr.dtype.element_ty, EMULATE_CAST)
    if QUANT:
        q, scale = group_quant_tile(to_fp32(y, EMULATE_CAST), q_ptr.dtype.element_ty,
                                    FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST)
        tl.store(q_ptr + rows[:, None, None] * K + cols, q, mask=mask)
        groups = g0 + tl.arange(0, GPC)
        tl.store(s_ptr + rows[:, None] * NG + groups[None, :], scale, mask=row_ok[:, None] & (groups < NG)[None, :])
    else:
        tl.store(y_ptr + rows[:, None, None] * K + cols, y, mask=mask)


@triton.jit
def _rstd(sum_sq, K, eps):
    var = tl.math.div_rn(sum_sq, tl.cast(K, tl.float32))  # torch: mean = sum / K
    return tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr,  # x, residual: [M, K], row strides stride_x, stride_r, unit column stride; w: [K]
    y_ptr, res_out_ptr,  # y (unquantized variants), residual_out (add variants): contiguous [M, K]
    q_ptr, s_ptr,  # q: contiguous fp8 [M, K]; scale: contiguous fp32 [M, cdiv(K, G)] (fused variants)
    M, K, stride_x, stride_r,
    eps,  # pinned to fp32 below (STYLE.md: Inductor-generated calls pass fp64 scalars; Python floats are fp32)
    G: tl.constexpr,  # quant group (fused) or column block (unfused): the last tile axis
    GPC: tl.constexpr,  # groups per step; ONE_PASS: groups of the first tile (all of them when TAIL = 0)
    TAIL: tl.constexpr,  # ONE_PASS: groups of a second tile after the first (K = 5120: 32 + 8); 0 = none
    BLOCK_M: tl.constexpr,  # rows per program; grid (cdiv(M, BLOCK_M),)
    ONE_PASS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)  # M * K overflows int32 at prefill sizes (65536 x 32768)
    NG = tl.cdiv(K, G)
    eps = tl.cast(eps, tl.float32)
    if ONE_PASS:  # the row stays in registers: one tile of GPC groups (+ one of TAIL groups)
        xf, mask, cols = _load_chunk(x_ptr, r_ptr, res_out_ptr, rows, row_ok, 0, K, stride_x, stride_r,
                                     HAS_RESIDUAL, True, "evict_first", GPC, G, EMULATE_CAST)
        sum_sq = tl.sum(tl.sum(xf * xf, 2), 1)
        if TAIL > 0:
            xt, mask_t, cols_t = _load_chunk(x_ptr, r_ptr, res_out_ptr, rows, row_ok, GPC, K, stride_x, stride_r,
                                             HAS_RESIDUAL, True, "evict_first", TAIL, G, EMULATE_CAST)
            sum_sq += tl.sum(tl.sum(xt * xt, 2), 1)
        rstd = _rstd(sum_sq, K, eps)
        _normalize_store(xf, rstd, x_ptr, w_ptr, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, 0, K, NG,
                         QUANT, GPC, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST)
        if TAIL > 0:
            _normalize_store(xt, rstd, x_ptr, w_ptr, y_ptr, q_ptr, s_ptr, rows, row_ok, mask_t, cols_t, GPC, K, NG,
                             QUANT, TAIL, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST)
    else:
        # Pass 1 reads HBM and keeps the rows in L2 (evict_last); pass 2 re-reads them from there.
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for g0 in range(0, NG, GPC):
            xf, mask, cols = _load_chunk(x_ptr, r_ptr, res_out_ptr, rows, row_ok, g0, K, stride_x, stride_r,
                                         HAS_RESIDUAL, True, "evict_last", GPC, G, EMULATE_CAST)
            sum_sq += tl.sum(tl.sum(xf * xf, 2), 1)
        rstd = _rstd(sum_sq, K, eps)
        for g0 in range(0, NG, GPC):
            xf, mask, cols = _load_chunk(x_ptr, r_ptr, res_out_ptr, rows, row_ok, g0, K, stride_x, stride_r,
                                         HAS_RESIDUAL, False, "evict_first", GPC, G, EMULATE_CAST)
            _normalize_store(xf, rstd, x_ptr, w_ptr, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, g0, K, NG,
                             QUANT, GPC, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST)


# fmt: on


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    group_size: int | None,
    tile: _tiles.Tile | None = None,
):
    """Run the norm family. ``group_size=None``: unquantized. Returns ``(y or (q, scale), residual_out or None)``.

    ``tile`` overrides ``_tiles.row_tile`` (tests and ``benchmarks/kernels.py --sweep``)."""
    x2 = _tiles.rows_of(x)
    m, k = x2.shape
    r2 = _tiles.rows_of(residual) if residual is not None else x2
    quant = group_size is not None
    g = group_size if quant else COLUMN_BLOCK
    tile = tile or _tiles.row_tile(m, k, g)
    dev = x.device
    y = x2 if quant else torch.empty((m, k), dtype=x.dtype, device=dev)  # unused pointers get x2
    res_out = torch.empty((m, k), dtype=x.dtype, device=dev) if residual is not None else x2
    q = torch.empty((m, k), dtype=arch.arch_of(dev).fp8_dtype, device=dev) if quant else x2
    scale = torch.empty((m, k // g), dtype=torch.float32, device=dev) if quant else x2
    if m > 0:
        _rms_norm_kernel[(triton.cdiv(m, tile.block_m),)](
            x2, r2, w, y, res_out, q, scale, m, k, x2.stride(0), r2.stride(0), eps,
            G=g, ONE_PASS=tile.one_pass, TAIL=tile.tail, HAS_RESIDUAL=residual is not None, QUANT=quant,
            **fp8_constexprs(dev), **tile.as_kwargs(),
        )  # fmt: skip
    out = (q.view(x.shape), scale.view(*x.shape[:-1], k // g)) if quant else y.view(x.shape)
    return out, (res_out.view(x.shape) if residual is not None else None)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm of x [..., K]; returns a contiguous tensor of x.dtype."""
    return launch(x, w, eps, None, None)[0]
