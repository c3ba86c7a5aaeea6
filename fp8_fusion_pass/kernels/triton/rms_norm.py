"""RMSNorm, with optional residual add and optional fused 1 x G fp8 group quant: one kernel for the norm family.

``rms_norm``, ``add_rms_norm``, ``rms_norm_group_quant`` and ``add_rms_norm_group_quant`` all launch
``_rms_norm_kernel``; constexpr flags pick the residual add and the quant. Sharing one kernel (and one tile
choice, ``_tiles.row_tile``, independent of the flags but for split rows, which sum in the same order) makes the
fused norm and the unfused pair reduce in the same order, so they agree bit for bit; the DESIGN.md bound (one fp8
step on a small fraction) is then slack.

Numerics (``reference.rms_norm``, HF ``Qwen3RMSNorm``):
  s    = (x + residual) rounded to x.dtype              (add variants; stored as residual_out)
  rstd = 1 / sqrt(sum(s^2) / K + eps)                   (fp32; correctly rounded division and sqrt)
  y    = w * (s * rstd rounded to x.dtype)              (rounded to x.dtype; ops.py requires w.dtype == x.dtype)
then ``group_quant_tile(y)`` in the fused variants.

Structure (one-pass tiles, every listed hidden size): a program loads w once into registers, in the layout of its
x tile (same [BLOCK_M, GPC, G] shape: a [1, GPC, G] w against [2, GPC, G] rows made Triton move every value
through shared memory twice per row, 2 of the 7 layout conversions counted in the sm_90 code of the first GPU
round), then walks row blocks blk = pid, pid + P, ... (P = the grid, ``_tiles.programs``) and, with ``PREFETCH``,
issues the next block's loads before normalising the current one, so each resident program keeps one row block
in flight while it computes. Rows of 2^a + 2^b groups (K = 5120: 32 + 8) are a main and a ``TAIL`` tile.
Other rows (K = 7168, K > 8192) take the two-pass loop: column chunks of GPC groups, the second pass re-reading
the row from L2 (``evict_last`` on the first).
``SPLIT`` (a few rows, ``_tiles.SPLIT_ROWS``): one row over SPLIT programs, each summing the whole row's squares
with the one-pass code (bit for bit its rstd) and normalising its own GPS groups, so the per-value work of a
decode step's row is spread over SPLIT SMs instead of one.
``PDL`` (``_pdl.py``, off by default): ``wait_then_launch`` first in every program, before the w load too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from . import _tiles
from ._fp8 import group_quant_tile, kernel_constexprs, round_to, to_fp32
from ._pdl import pdl_kwargs, wait_then_launch

COLUMN_BLOCK = 128  # G of the unquantized norms: the same tiles as the fused norm at group size 128

# Triton code below keeps its arguments grouped by role (one comment per group), so the formatter is off.
# fmt: off


@triton.jit
def _cols(g0, GPC: tl.constexpr, G: tl.constexpr):
    """Column offsets [1, GPC, G] of groups g0 .. g0 + GPC."""
    return (g0 + tl.arange(0, GPC))[None, :, None] * G + tl.arange(0, G)[None, None, :]


@triton.jit
def _ptrs(ptr, rows, stride, cols):
    return ptr + rows.to(tl.int64)[:, None, None] * stride + cols  # int64: M * K overflows int32 at prefill sizes


@triton.jit
def _mask(row_ok, cols, K, EVEN_K: tl.constexpr):
    mask = row_ok[:, None, None]  # EVEN_K: the tiles cover exactly K columns, a per-row predicate (broadcast)
    if not EVEN_K:
        mask = mask & (cols < K)
    return mask


@triton.jit
def _load(ptr, rows, stride, cols, mask, EVICT: tl.constexpr):
    return tl.load(_ptrs(ptr, rows, stride, cols), mask=mask, other=0.0, eviction_policy=EVICT)


@triton.jit
def _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """The x and residual tiles, x.dtype (without a residual the second is x again, unused)."""
    x = _load(x_ptr, rows, stride_x, cols, mask, "evict_first")
    r = x
    if HAS_RESIDUAL:
        r = _load(r_ptr, rows, stride_r, cols, mask, "evict_first")
    return x, r


@triton.jit
def _load_w(w_ptr, cols, K, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr):
    """w as a [BLOCK_M, GPC, G] tile: the shape (so the layout) of the x tile it multiplies; L1 serves the rows."""
    return tl.load(w_ptr + cols + tl.zeros([BLOCK_M, 1, 1], dtype=tl.int32), mask=(cols < K) | EVEN_K, other=0.0)


@triton.jit
def _sum_inputs(x, r, res_out_ptr, rows, cols, mask, K, HAS_RESIDUAL: tl.constexpr, STORE_RESIDUAL: tl.constexpr,
                DTYPE: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """x (+ residual, rounded to x.dtype and stored as residual_out: HF's ``residual + x``) as fp32."""
    if HAS_RESIDUAL:
        x = round_to(to_fp32(x, EMULATE_CAST) + to_fp32(r, EMULATE_CAST), DTYPE, EMULATE_CAST)
        if STORE_RESIDUAL:
            tl.store(_ptrs(res_out_ptr, rows, K, cols), x, mask=mask)
    return to_fp32(x, EMULATE_CAST)


@triton.jit
def _sum_sq(xf, BLOCK_M: tl.constexpr):
    """Per-row sum of squares: [BLOCK_M], or a scalar for one row. A scalar has no layout, so the main and tail
    tiles of K = 5120 (32 and 8 values per thread at 4 warps) keep their own layouts; a [1] vector made Triton
    recompute the main tile in the tail's layout (3 shared-memory round trips of the row per row, sm_90 TTGIR)."""
    s = tl.sum(tl.sum(xf * xf, 2), 1)
    if BLOCK_M == 1:
        s = tl.sum(s, 0)
    return s


@triton.jit
def _rows(v, BLOCK_M: tl.constexpr):
    """A per-row value broadcast against [BLOCK_M, GPC, G] tiles."""
    if BLOCK_M > 1:
        v = v[:, None, None]
    return v


@triton.jit
def _rstd(sum_sq, K, eps):
    var = tl.math.div_rn(sum_sq, tl.cast(K, tl.float32))  # torch: mean = sum / K
    return tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))


@triton.jit
def _normalize_store(xf, w, rstd, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, g0, K, NG,
                     QUANT: tl.constexpr, GPC: tl.constexpr, BLOCK_M: tl.constexpr, DTYPE: tl.constexpr,
                     FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
                     PTX: tl.constexpr):
    normed = round_to(xf * _rows(rstd, BLOCK_M), DTYPE, EMULATE_CAST)  # HF: .to(input_dtype)
    # w * normed in x.dtype (ops.py requires w.dtype == x.dtype): exact product in fp32, one RTNE rounding
    y = round_to(to_fp32(w, EMULATE_CAST) * to_fp32(normed, EMULATE_CAST), DTYPE, EMULATE_CAST)
    if QUANT:
        q, scale = group_quant_tile(to_fp32(y, EMULATE_CAST), q_ptr.dtype.element_ty,
                                    FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
        tl.store(_ptrs(q_ptr, rows, K, cols), q, mask=mask)
        groups = g0 + tl.arange(0, GPC)
        tl.store(s_ptr + rows.to(tl.int64)[:, None] * NG + groups[None, :], scale,
                 mask=row_ok[:, None] & (groups < NG)[None, :])
    else:
        tl.store(_ptrs(y_ptr, rows, K, cols), y, mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr,  # x, residual: [M, K], row strides stride_x, stride_r, unit column stride; w: [K]
    y_ptr, res_out_ptr,  # y (unquantized variants), residual_out (add variants): contiguous [M, K]
    q_ptr, s_ptr,  # q: contiguous fp8 [M, K]; scale: contiguous fp32 [M, cdiv(K, G)] (fused variants)
    M, K, stride_x, stride_r,
    eps,  # pinned to fp32 below (STYLE.md: Inductor-generated calls pass fp64 scalars; Python floats are fp32)
    G: tl.constexpr,  # quant group (fused) or column block (unfused): the last tile axis
    GPC: tl.constexpr,  # groups per step; ONE_PASS: groups of the main tile (all of them when TAIL = 0)
    TAIL: tl.constexpr,  # ONE_PASS: groups of a second tile after the main one (K = 5120: 32 + 8); 0 = none
    BLOCK_M: tl.constexpr,  # rows per block; the grid walks blocks pid, pid + P, ... (P = programs launched)
    ONE_PASS: tl.constexpr, EVEN_K: tl.constexpr,  # EVEN_K: the tiles cover exactly K columns (no column mask)
    PREFETCH: tl.constexpr,  # ONE_PASS: load block i + P before normalising block i
    HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,  # compiling for NVIDIA: saturating fp8 cast (_fp8.kernel_constexprs)
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait_then_launch before any load or store
    SPLIT: tl.constexpr = 1,  # ONE_PASS, BLOCK_M 1: programs per row, each normalising GPS groups of it
    GPS: tl.constexpr = 1,  # SPLIT > 1: groups per program, (GPC + TAIL) / SPLIT, a power of two
):
    wait_then_launch(PDL)
    DTYPE = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NG = tl.cdiv(K, G)
    eps = tl.cast(eps, tl.float32)
    rr = tl.arange(0, BLOCK_M)
    if SPLIT > 1:
        # One row over SPLIT programs (a few rows: decode). Each sums the squares of the whole row with the code of
        # the one-pass path below (the same tiles, so the same order: rstd bit for bit), then normalises and
        # quantizes only its GPS groups, loaded a second time at the start. One program per row spends most of its
        # time in the per-value normalise and quant work of the whole row on one SM; here that is split SPLIT
        # ways and only the sum (a multiply-add per value) is repeated.
        rows = pid // SPLIT + rr
        g0 = (pid % SPLIT) * GPS
        row_ok = rows < M
        cols = _cols(0, GPC, G)
        cols_s = _cols(g0, GPS, G)
        mask = _mask(row_ok, cols, K, EVEN_K)
        mask_s = _mask(row_ok, cols_s, K, EVEN_K)
        xa, ra = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols, mask, HAS_RESIDUAL)
        xs, rs = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols_s, mask_s, HAS_RESIDUAL)
        w_s = _load_w(w_ptr, cols_s, K, BLOCK_M, EVEN_K)
        sum_sq = _sum_sq(_sum_inputs(xa, ra, res_out_ptr, rows, cols, mask, K, HAS_RESIDUAL, False, DTYPE,
                                     EMULATE_CAST), BLOCK_M)
        if TAIL > 0:
            cols_t = _cols(GPC, TAIL, G)
            mask_t = _mask(row_ok, cols_t, K, EVEN_K)
            xt, rt = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols_t, mask_t, HAS_RESIDUAL)
            sum_sq += _sum_sq(_sum_inputs(xt, rt, res_out_ptr, rows, cols_t, mask_t, K, HAS_RESIDUAL, False, DTYPE,
                                          EMULATE_CAST), BLOCK_M)
        rstd = _rstd(sum_sq, K, eps)
        xsf = _sum_inputs(xs, rs, res_out_ptr, rows, cols_s, mask_s, K, HAS_RESIDUAL, True, DTYPE, EMULATE_CAST)
        _normalize_store(xsf, w_s, rstd, y_ptr, q_ptr, s_ptr, rows, row_ok, mask_s, cols_s, g0, K, NG,
                         QUANT, GPS, BLOCK_M, DTYPE, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    elif ONE_PASS:  # rows stay in registers: a main tile of GPC groups (+ a tail tile of TAIL groups)
        cols = _cols(0, GPC, G)
        w = _load_w(w_ptr, cols, K, BLOCK_M, EVEN_K)
        if TAIL > 0:
            cols_t = _cols(GPC, TAIL, G)
            w_t = _load_w(w_ptr, cols_t, K, BLOCK_M, EVEN_K)
        if PREFETCH:  # the first block; the loop loads block i + P while it computes block i
            rows = pid * BLOCK_M + rr
            xa, ra = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols, _mask(rows < M, cols, K, EVEN_K),
                                  HAS_RESIDUAL)
            if TAIL > 0:
                xt, rt = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols_t,
                                      _mask(rows < M, cols_t, K, EVEN_K), HAS_RESIDUAL)
        for blk in range(pid, tl.cdiv(M, BLOCK_M), nprog):
            rows = blk * BLOCK_M + rr
            row_ok = rows < M
            mask = _mask(row_ok, cols, K, EVEN_K)
            if PREFETCH:
                nrows = rows + nprog * BLOCK_M
                xa_c, ra_c = xa, ra
                xa, ra = _load_inputs(x_ptr, r_ptr, nrows, stride_x, stride_r, cols,
                                      _mask(nrows < M, cols, K, EVEN_K), HAS_RESIDUAL)
            else:
                xa_c, ra_c = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols, mask, HAS_RESIDUAL)
            xf = _sum_inputs(xa_c, ra_c, res_out_ptr, rows, cols, mask, K, HAS_RESIDUAL, True, DTYPE, EMULATE_CAST)
            sum_sq = _sum_sq(xf, BLOCK_M)
            if TAIL > 0:
                mask_t = _mask(row_ok, cols_t, K, EVEN_K)
                if PREFETCH:
                    xt_c, rt_c = xt, rt
                    xt, rt = _load_inputs(x_ptr, r_ptr, nrows, stride_x, stride_r, cols_t,
                                          _mask(nrows < M, cols_t, K, EVEN_K), HAS_RESIDUAL)
                else:
                    xt_c, rt_c = _load_inputs(x_ptr, r_ptr, rows, stride_x, stride_r, cols_t, mask_t, HAS_RESIDUAL)
                xtf = _sum_inputs(xt_c, rt_c, res_out_ptr, rows, cols_t, mask_t, K, HAS_RESIDUAL, True, DTYPE,
                                  EMULATE_CAST)
                sum_sq += _sum_sq(xtf, BLOCK_M)
            rstd = _rstd(sum_sq, K, eps)
            _normalize_store(xf, w, rstd, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, 0, K, NG,
                             QUANT, GPC, BLOCK_M, DTYPE, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
            if TAIL > 0:
                _normalize_store(xtf, w_t, rstd, y_ptr, q_ptr, s_ptr, rows, row_ok, mask_t, cols_t, GPC, K, NG,
                                 QUANT, TAIL, BLOCK_M, DTYPE, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    else:
        # One row block per program. Pass 1 reads HBM and keeps the rows in L2 (evict_last); pass 2 re-reads them.
        rows = pid * BLOCK_M + rr
        row_ok = rows < M
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for g0 in range(0, NG, GPC):
            cols = _cols(g0, GPC, G)
            mask = _mask(row_ok, cols, K, EVEN_K)
            xs = _load(x_ptr, rows, stride_x, cols, mask, "evict_last")
            rs = xs  # unused without a residual
            if HAS_RESIDUAL:
                rs = _load(r_ptr, rows, stride_r, cols, mask, "evict_last")
            sum_sq += _sum_sq(_sum_inputs(xs, rs, res_out_ptr, rows, cols, mask, K, HAS_RESIDUAL, True, DTYPE,
                                          EMULATE_CAST), BLOCK_M)
        rstd = _rstd(sum_sq, K, eps)
        for g0 in range(0, NG, GPC):
            cols = _cols(g0, GPC, G)
            mask = _mask(row_ok, cols, K, EVEN_K)
            xs = _load(x_ptr, rows, stride_x, cols, mask, "evict_first")
            rs = xs
            if HAS_RESIDUAL:
                rs = _load(r_ptr, rows, stride_r, cols, mask, "evict_first")
            xf = _sum_inputs(xs, rs, res_out_ptr, rows, cols, mask, K, HAS_RESIDUAL, False, DTYPE, EMULATE_CAST)
            w = _load_w(w_ptr, cols, K, BLOCK_M, EVEN_K)
            _normalize_store(xf, w, rstd, y_ptr, q_ptr, s_ptr, rows, row_ok, mask, cols, g0, K, NG,
                             QUANT, GPC, BLOCK_M, DTYPE, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)


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

    ``tile`` overrides ``_tiles.row_tile`` (tests and ``benchmarks/fused_kernels.py --sweep``)."""
    x2 = _tiles.rows_of(x)
    m, k = x2.shape
    r2 = _tiles.rows_of(residual) if residual is not None else x2
    quant = group_size is not None
    g = group_size if quant else COLUMN_BLOCK
    tile = tile or _tiles.row_tile(m, k, g, residual is not None, quant)
    dev = x.device
    y = x2 if quant else torch.empty((m, k), dtype=x.dtype, device=dev)  # unused pointers get x2
    res_out = torch.empty((m, k), dtype=x.dtype, device=dev) if residual is not None else x2
    q = torch.empty((m, k), dtype=arch.arch_of(dev).fp8_dtype, device=dev) if quant else x2
    scale = torch.empty((m, k // g), dtype=torch.float32, device=dev) if quant else x2
    if m > 0:
        covered = (tile.gpc + tile.tail) * g if tile.one_pass else tile.gpc * g
        even = k == covered if tile.one_pass else k % covered == 0
        pdl = pdl_kwargs(dev)
        key = (tile, residual is not None, quant, x.dtype, g, even, pdl["PDL"])  # one compiled variant of the kernel
        split = {}
        if tile.split > 1:
            _tiles.check_split(tile, k, g)
            split = {"SPLIT": tile.split, "GPS": (tile.gpc + tile.tail) // tile.split}
        grid = m * tile.split if split else _tiles.programs(tile, m, dev, key)
        compiled = _rms_norm_kernel[(grid,)](
            x2, r2, w, y, res_out, q, scale, m, k, x2.stride(0), r2.stride(0), eps,
            G=g, TAIL=tile.tail, ONE_PASS=tile.one_pass, EVEN_K=even, PREFETCH=tile.prefetch and tile.one_pass,
            HAS_RESIDUAL=residual is not None, QUANT=quant, **kernel_constexprs(dev), **tile.as_kwargs(), **pdl,
            **split,
        )  # fmt: skip
        _tiles.note_resident(key, compiled, tile, dev)
    out = (q.view(x.shape), scale.view(*x.shape[:-1], k // g)) if quant else y.view(x.shape)
    return out, (res_out.view(x.shape) if residual is not None else None)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm of x [..., K]; returns a contiguous tensor of x.dtype."""
    return launch(x, w, eps, None, None)[0]
