"""Triton small-M (decode) block-FP8 GEMM: swap-AB split-K, its split-K sum in the same launch or a second one.

At M <= 64 a block-FP8 GEMM is bound by its N*K fp8 weight bytes (qkv of Qwen3-8B: 25 MB, 5.9 us at the H200's
4.29 TB/s copy bandwidth). One kernel, ``_small_m_kernel``, with compile-time variants (``SmallMConfig``):
- swap-AB: the weight tile [BLOCK_N, BLOCK_K] is the MMA's M operand, the few activation rows its N operand
  (padded to 16), so N=4096 in 64-wide tiles is 64 programs; split-K multiplies that to fill 132 SMs.
- split-K sum (``reduce``): "kernel" writes fp32 partials that ``_splitk_reduce_kernel`` adds in a second launch;
  "last": every program writes its partial, then takes a ticket on its output tile's counter (one atomic); the
  program that arrives last adds the tile's partials and writes the output. Both add the same partials in the same
  order (split 0, 1, ...), so they are *bitwise equal* and deterministic (fp32 ``tl.atomic_add`` into the output
  would not be: its order depends on scheduling, and it needs a zeroed buffer and a cast kernel). The counters
  are one int32 per output tile in a per-device buffer that the last program resets to 0, so it is zeroed once,
  not per call. Memory order: stores -> CTA barrier -> acq_rel gpu-scope ticket (CUTLASS's semaphore pattern);
  the last program reads partials with ``.cg`` (L2, never a stale L1 line).
- ``k_unroll``: K tiles (one weight-scale block each) per loop iteration: 2 = a 256-wide K step, two promotions.
- ``swap`` False (tuning idea 20): the activation rows are the MMA's M operand (64 rows, padded) and the weight
  tile its N operand. The promotion then needs two activation scales per thread per K tile instead of one per
  accumulator column, and one weight scale per tile (a tile of <= 128 rows lies in one 128-row scale block). The
  swap-AB promotion's activation-scale loads cost up to a fifth of the GEMM at M = 64 (``small_m_ablation.py``).
- ``tma``: both operand tiles loaded by the copy engine from tensor descriptors (sm90+; one weight, fp8 input);
  a launch that cannot take them (several weights, a bf16 input, an unaligned base, no TMA) loads the same tiles
  through pointers, with the same output bit for bit.
- ``fma``: for M <= ``FMA_MAX_M`` a GEMV without tensor cores: fp32 products and a sum over K in registers.
- ``small_m_mm_bf16``: the activation is bf16 and quantized inside the GEMM (``_fp8.group_quant_tile``, bit-exact
  with ``reference.group_quant``), as the seed PR's small-M GEMM does: no group-quant launch before the GEMM.
- ``PDL`` (``_pdl.py``, ``FP8_FUSION_PDL=1``, off by default): the launch may start while the previous kernel
  runs; each program first issues one ``cp.async.bulk.prefetch.L2`` per weight row of the first
  ``PREFETCH_TILES`` K tiles of its slab (``PREFETCH``: the weight is constant, so it may be read early), waits
  for the previous grid, runs the loop unchanged, and lets the next PDL grid launch after the loop. The split-K
  sum kernel waits (then triggers) at its top. Same results, bit for bit (``tests/kernels/test_pdl_gpu.py``).

The counters are shared by the launches of one stream: two launches running at once on two streams and sharing
counters take each other's tickets and sum wrong (on the H200 most outputs of two streams repeating a GEMM at once
were: ``tests/kernels/test_tickets_streams_gpu.py``), while launches on one stream are ordered. So there is one
buffer per (device, stream), made by the first call outside a capture on that stream (cudagraph trees warm up on
the stream they capture on), for up to ``MAX_STREAM_BUFFERS`` streams. A capture on a stream without one takes the
device's first buffer: its replays are then ordered only against that buffer's other users by whoever replays
them, and never run concurrently with them in cudagraph trees (which replay one graph at a time).
``FP8_FUSION_TICKETS=0`` (read at each launch, so at capture for a CUDA graph) gives every launch "kernel" instead:
no shared state at all. A call with more tiles than ``COUNTER_SLOTS``, a stream past ``MAX_STREAM_BUFFERS``, or a
capture before any buffer exists, uses "kernel" too (same result).

Tuning: every idea tried on this kernel, its prediction and its measurement (H200, ``benchmarks/gemm.py``), is
in ``docs/small_m_tuning.md`` (ideas 1-20); code comments cite it as "tuning idea N".
"""

from __future__ import annotations

import dataclasses
import os
import threading

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import arch as _arch
from . import _pdl
from ._blockscale_kernels import SCALE_BLOCK, promotion_block
from ._fp8 import amax_nan, cast_fp8, div_by_scale, fp8_constexprs, reciprocal_of, round_to, scale_of, to_fp32
from ._pdl import prefetch_l2, wait_then_launch

REDUCES = ("kernel", "last")
FMA_MAX_M = 4  # the GEMV holds a [BLOCK_N, 128, BLOCK_M] fp32 product: 64 x 128 x 4 is 256 values per thread
COUNTER_SLOTS = 1 << 15  # output tiles per launch with "last": N=51200 / 16 x 4 row tiles = 12800 fits
# With PDL: K tiles per weight row that a program prefetches into L2 before its wait (docs/small_m_tuning.md, idea 10).
PREFETCH_TILES = tl.constexpr(2)
# Shapes without a TABLE row keep the two-launch sum: "last" (correct under CUDA graphs and cudagraph trees on
# the H200) was no faster at the default config on median (0.81-1.28x, 48 points); TABLE rows pick it per shape.
DEFAULT_REDUCE = "kernel"


@dataclasses.dataclass(frozen=True)
class SmallMConfig:
    block_n: int = 64
    split_k: int = 4
    warps: int = 4
    stages: int = 4
    reduce: str = DEFAULT_REDUCE  # "kernel" | "last": how split-K partials are summed (see the module docstring)
    k_unroll: int = 1  # K tiles per loop iteration: 1 or 2 (``_k_loop`` carries that many tiles' scales ahead)
    fma: bool = False  # GEMV without tensor cores (M <= FMA_MAX_M)
    tma: bool = False  # operand tiles by TMA (tuning idea 13); launches it cannot take run the same kernel without it
    block_m: int = 0  # activation rows per program: 16, 32 or 64 (tuning idea 15); 0: M up to 64 (small_m_block_m)
    swap: bool = True  # weight rows on the MMA's M side (swap-AB); False: the activation rows (tuning idea 20)

    def __post_init__(self):
        if self.reduce not in REDUCES:
            raise ValueError(f"SmallMConfig.reduce must be one of {REDUCES}, got {self.reduce!r}")
        if self.k_unroll not in (1, 2):
            raise ValueError(f"SmallMConfig.k_unroll must be 1 or 2, got {self.k_unroll}")
        for name in ("block_n", "warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"SmallMConfig.{name} must be a power of two, got {v}")
        if self.tma and self.fma:
            raise ValueError("SmallMConfig: tma loads tiles for the tensor cores; fma has none")
        if self.split_k < 1 or self.stages < 1:
            raise ValueError(f"SmallMConfig: split_k and stages must be >= 1, got {self.split_k}, {self.stages}")
        if self.block_m not in (0, 16, 32, 64) or (self.block_m and self.fma):
            raise ValueError(f"SmallMConfig.block_m must be 0, or 16, 32 or 64 for the tensor cores, got {self}")
        if not self.swap and (self.fma or self.block_n > SCALE_BLOCK):
            raise ValueError(f"SmallMConfig.swap False needs the tensor cores and block_n <= {SCALE_BLOCK} (one "
                             f"weight scale per tile), got {self}")  # fmt: skip


@triton.jit
def _x_tile(raw, x_s, fp8_dtype: tl.constexpr, QUANT_A: tl.constexpr, FP8_MAX: tl.constexpr,
            FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr):  # fmt: skip
    """The activation tile ``[BLOCK_K, BLOCK_M]`` fp8 and its scales ``[BLOCK_M]`` from the loaded tile ``raw``:
    as loaded (``x_s`` loaded a tile ahead by ``_k_loop``), or (QUANT_A) quantized here from the high-precision
    tile, one group per column (GROUP_K == BLOCK_K; ``x_s`` is then unused).

    The quant is ``_fp8.group_quant_tile``'s steps along axis 0 of the transposed tile: the tile is loaded as
    the MMA wants it, with no ``tl.reshape`` / ``tl.trans``."""
    if QUANT_A:
        y = to_fp32(raw, EMULATE_CAST)
        scale = scale_of(amax_nan(y, 0, EMULATE_CAST), FP8_MAX)
        r, scale_fin = reciprocal_of(scale)
        x = cast_fp8(div_by_scale(y, scale_fin[None, :], r[None, :]), fp8_dtype, FP8_MAX, FP8_MIN_EXP, FNUZ,
                     EMULATE_CAST)  # fmt: skip
    else:
        x, scale = raw, x_s
    # One return: with two, Triton types both even though the constexpr branch is pruned, and a bf16 a_ptr
    # makes the loaded branch bf16 ("Return type mismatch", the CompilationError seen on Triton 3.6 and 3.9).
    return x, scale


@triton.jit
def _scales(ws_ptrs, xs_ptrs, kt, stride_bsk, stride_ask, GROUP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
            BLOCK_K: tl.constexpr, QUANT_A: tl.constexpr):  # fmt: skip
    """K tile ``kt``'s weight scales ``[rows]`` and activation scales ``[BLOCK_M]`` (QUANT_A: no activation scale
    tensor; the weight scales stand in, unused)."""
    k0 = kt * BLOCK_K
    w_s = tl.load(ws_ptrs + (k0 // SCALE_BLOCK) * stride_bsk)
    if QUANT_A:
        x_s = w_s
    else:
        x_s = tl.load(xs_ptrs + (k0 // GROUP_K) * stride_ask)
    return w_s, x_s


@triton.jit
def _k_loop(acc, w_ptrs, ws_ptrs, x_ptrs, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask, fp8_dtype: tl.constexpr,
            GROUP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
            FMA: tl.constexpr, QUANT_A: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
            FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr, TMA: tl.constexpr = False, n0=0, m0=0,
            SWAP: tl.constexpr = True):  # fmt: skip
    """``acc [rows, BLOCK_M]`` += the weight rows' K tiles ``[kt_start, kt_end)`` times the activation's, each
    tile's product promoted by its weight-scale and activation-scale pair (the GEMM's one K loop, shared by
    ``_small_m_kernel`` and the SiLU-quant epilogue kernel, ``_small_m_silu_kernels.py``).

    ``TMA``: ``w_ptrs`` / ``x_ptrs`` are tensor descriptors of the weight ``[N, K]`` and the activation ``[M, K]``
    (blocks ``[rows, BLOCK_K]`` / ``[BLOCK_M, BLOCK_K]``), the tiles at rows ``n0`` / ``m0`` loaded by the copy
    engine (rows past the end read as zeros), the activation's transposed in shared memory as the MMA wants it.

    ``SWAP`` False: ``acc`` is ``[BLOCK_M, rows]``, the activation tile the MMA's first operand, ``x_ptrs`` its
    ``[BLOCK_M, BLOCK_K]`` tile and ``ws_ptrs`` one scale per K tile (a scalar pointer); the same products and
    promotion order, the MMA's operands swapped (tuning idea 20).

    The scales are loaded one K tile ahead (docs/small_m_tuning.md, idea 12): Triton pipelines only the loads that
    feed the MMA, so a scale load in the tile's own iteration was a round trip on every iteration's critical
    path. The last iteration re-loads its own tile's scales (an in-range address, no mask)."""
    kt_last = kt_end - K_UNROLL
    w_next, x_next = _scales(ws_ptrs, xs_ptrs, kt_start, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK, BLOCK_K,
                             QUANT_A)  # fmt: skip
    if K_UNROLL == 2:
        w_next1, x_next1 = _scales(ws_ptrs, xs_ptrs, kt_start + 1, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK,
                                   BLOCK_K, QUANT_A)  # fmt: skip
    else:
        w_next1, x_next1 = w_next, x_next
    for kt in range(kt_start, kt_end, K_UNROLL):
        w_s0, x_s0, w_s1, x_s1 = w_next, x_next, w_next1, x_next1
        kt_ahead = tl.minimum(kt + K_UNROLL, kt_last)
        w_next, x_next = _scales(ws_ptrs, xs_ptrs, kt_ahead, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK,
                                 BLOCK_K, QUANT_A)  # fmt: skip
        if K_UNROLL == 2:
            w_next1, x_next1 = _scales(ws_ptrs, xs_ptrs, kt_ahead + 1, stride_bsk, stride_ask, GROUP_K,
                                       SCALE_BLOCK, BLOCK_K, QUANT_A)  # fmt: skip
        for u in tl.static_range(K_UNROLL):
            if TMA:
                w = w_ptrs.load([n0, (kt + u) * BLOCK_K])
                raw = x_ptrs.load([m0, (kt + u) * BLOCK_K])
                if SWAP:
                    raw = raw.T
            else:
                w = tl.load(w_ptrs + u * BLOCK_K)
                raw = tl.load(x_ptrs + u * BLOCK_K)
            w_s = w_s0 if u == 0 else w_s1
            x, x_s = _x_tile(raw, x_s0 if u == 0 else x_s1, fp8_dtype, QUANT_A, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST)  # fmt: skip
            if FMA:
                part = tl.sum(w.to(tl.float32)[:, :, None] * x.to(tl.float32)[None, :, :], axis=1)
            elif SWAP:
                part = tl.dot(w, x)
            else:
                part = tl.dot(x, w.T)
            if SWAP:
                acc += part * w_s[:, None] * x_s[None, :]
            else:
                acc += part * w_s * x_s[:, None]
        if not TMA:
            w_ptrs += K_UNROLL * BLOCK_K
            x_ptrs += K_UNROLL * BLOCK_K
    return acc


@triton.jit
def _last_arrival(cnt_ptr, idx, count):
    """True in the program that arrives last of the ``count`` programs sharing counter ``idx``: then every store
    the others made before their ticket is visible. Memory order: this program's stores -> CTA barrier -> acq_rel
    gpu-scope ticket (see the docstring). The winner must reset it to 0 for the next launch."""
    tl.debug_barrier()  # every thread's stores are done before the ticket releases them
    ticket = tl.atomic_add(cnt_ptr + idx, 1, sem="acq_rel", scope="gpu")
    return ticket == count - 1


@triton.jit
def _last_split(cnt_ptr, tile):
    """True in the program that arrives last among its output tile's splits: then every partial is visible."""
    return _last_arrival(cnt_ptr, tile, tl.num_programs(1))


@triton.jit
def _sum_partials(p_ptrs, mask, mn, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """The sum of the tile's ``num_programs(1)`` fp32 partials (``p_ptrs`` at split 0, ``mn`` apart), in split
    order, as ``_splitk_reduce_kernel`` adds them: the two sums are bitwise equal."""
    split = tl.num_programs(1)
    total = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    # Four partials' loads in flight before their adds (one L2 round trip, ~0.6 us, per four splits instead of
    # per split); the adds keep _splitk_reduce_kernel's order: ((0 + p0) + p1) + ..., and a missing split adds
    # +0.0, which changes no sum. Loads are .cg: from L2, never a stale L1 line.
    for s in range(0, split, 4):
        sv = s + tl.zeros((ROWS, BLOCK_M), dtype=tl.int32)  # a tensor: the interpreter mis-types a block mask &
        # a scalar condition (int, "mask has unsupported dtype")
        p0 = tl.load(p_ptrs + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
        p1 = tl.load(p_ptrs + (s + 1) * mn, mask=mask & (sv + 1 < split), other=0.0, cache_modifier=".cg")
        p2 = tl.load(p_ptrs + (s + 2) * mn, mask=mask & (sv + 2 < split), other=0.0, cache_modifier=".cg")
        p3 = tl.load(p_ptrs + (s + 3) * mn, mask=mask & (sv + 3 < split), other=0.0, cache_modifier=".cg")
        total = (((total + p0) + p1) + p2) + p3
    return total


@triton.jit
def _group_of(pid_n, b0, bs0, n0, sbn0, sbsn0, sbsk0, b1, bs1, n1, sbn1, sbsn1, sbsk1,
              b2, bs2, n2, sbn2, sbsn2, sbsk2, GROUPS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The N tile ``pid_n``'s group: its weight / scale pointers, N and strides, its first output column and
    its first tile. Selects (``tl.where``), not branches: a runtime ``if`` would need both arms' types equal,
    and a stride of 1 is specialized to a constant in one group but not another."""
    t1 = tl.cdiv(n0, BLOCK_N)  # group 1's first tile
    in1 = pid_n >= t1
    b, bs, n = tl.where(in1, b1, b0), tl.where(in1, bs1, bs0), tl.where(in1, n1, n0)
    sbn, sbsn, sbsk = tl.where(in1, sbn1, sbn0), tl.where(in1, sbsn1, sbsn0), tl.where(in1, sbsk1, sbsk0)
    col0, tile0 = tl.where(in1, n0, 0), tl.where(in1, t1, 0)
    if GROUPS == 3:
        t2 = t1 + tl.cdiv(n1, BLOCK_N)
        in2 = pid_n >= t2  # an empty group 1 (t2 == t1) is skipped: its tiles are group 2's
        b, bs, n = tl.where(in2, b2, b), tl.where(in2, bs2, bs), tl.where(in2, n2, n)
        sbn, sbsn, sbsk = tl.where(in2, sbn2, sbn), tl.where(in2, sbsn2, sbsn), tl.where(in2, sbsk2, sbsk)
        col0, tile0 = tl.where(in2, n0 + n1, col0), tl.where(in2, t2, tile0)
    return b, bs, n, sbn, sbsn, sbsk, col0, tile0


# M and the split's K range vary per call: specializing on their divisibility by 16 would compile one variant per
# value class for no gain (they only index rows and split slabs).
@triton.jit(do_not_specialize=["M", "k_tiles_per_split"])
def _small_m_kernel(
    a_ptr,  # q [M, K] fp8, or (QUANT_A) x [M, K] bf16 / fp16 / fp32; K contiguous
    b_ptr,  # w_q [N, K] fp8, K contiguous
    c_ptr,  # out [M, N], row stride stride_cm
    p_ptr,  # fp32 partials [SPLIT, M, N] contiguous (MODE 1, 2)
    cnt_ptr,  # int32 [tiles] counters, zero before and after the launch (MODE 2)
    as_ptr,  # activation scales, element (m, k // GROUP_K) at m * stride_asm + (k // GROUP_K) * stride_ask
    bs_ptr,  # weight scales, element (n // 128, k // 128)
    M, N, K,
    stride_am, stride_bn, stride_cm, stride_asm, stride_ask, stride_bsn, stride_bsk,
    k_tiles_per_split,  # a multiple of K_UNROLL; grid (sum of the groups' cdiv(N_g, BLOCK_N), SPLIT, cdiv(M, BLOCK_M))
    # Groups 1 and 2 (GROUPS > 1): their own weights / scales, N and strides; the output is [M, N + N1 + N2].
    b1_ptr, bs1_ptr, N1, stride_bn1, stride_bsn1, stride_bsk1,
    b2_ptr, bs2_ptr, N2, stride_bn2, stride_bsn2, stride_bsk2,
    a_desc, b_desc,  # TMA: tensor descriptors of q [M, K] and w_q [N, K] (otherwise a_ptr / b_ptr again, unused)
    GROUP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,  # activation rows (the MMA's N operand: >= 16 unless FMA; with SWAP False its M)
    BLOCK_N: tl.constexpr,  # weight rows (the MMA's M operand; with SWAP False its N)
    BLOCK_K: tl.constexpr,  # the promotion step: one K tile, one scale pair
    K_UNROLL: tl.constexpr,
    MODE: tl.constexpr,  # 0: write out (SPLIT 1); 1: write partials; 2: partials, the last program sums them
    GROUPS: tl.constexpr,  # GEMMs sharing the activation in this launch (1, 2 or 3)
    FMA: tl.constexpr, QUANT_A: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait for the previous grid before the loop
    PREFETCH: tl.constexpr,  # PDL: prefetch the first weight tiles into L2 before the wait (16-byte aligned rows)
    TMA: tl.constexpr,  # operand tiles by the copy engine (GROUPS 1, fp8 input, tensor cores; _k_loop)
    SWAP: tl.constexpr,  # weight rows on the MMA's M side; False: the activation rows (fp8 input; tuning idea 20)
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    if GROUPS == 1:
        row0 = pid_n * BLOCK_N  # the tile's first weight row
        n_out = N
    else:
        # Each group's N is padded to whole tiles, so a tile belongs to one group; from here on b_ptr, bs_ptr,
        # N and the strides are the tile's group's, offs_n its rows in that group, cols its output columns.
        n_out = N + N1 + N2
        b_ptr, bs_ptr, N, stride_bn, stride_bsn, stride_bsk, col0, tile0 = _group_of(
            pid_n, b_ptr, bs_ptr, N, stride_bn, stride_bsn, stride_bsk,
            b1_ptr, bs1_ptr, N1, stride_bn1, stride_bsn1, stride_bsk1,
            b2_ptr, bs2_ptr, N2, stride_bn2, stride_bsn2, stride_bsk2, GROUPS, BLOCK_N)  # fmt: skip
        row0 = (pid_n - tile0) * BLOCK_N
    offs_n = row0 + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows / columns wrap onto valid ones, so loads need no mask; stores mask them.
    rn = offs_n % N
    rm = offs_m % M
    kt_start = pid_s * k_tiles_per_split
    kt_end = tl.minimum(kt_start + k_tiles_per_split, tl.cdiv(K, BLOCK_K))
    k_first = kt_start * BLOCK_K
    w_ptrs = b_ptr + rn.to(tl.int64)[:, None] * stride_bn + (k_first + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    if SWAP:
        x_ptrs = a_ptr + rm.to(tl.int64)[None, :] * stride_am + (k_first + offs_k)[:, None]  # [BLOCK_K, BLOCK_M]
        ws_ptrs = bs_ptr + (rn // SCALE_BLOCK) * stride_bsn
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # the out^T tile
    else:
        x_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + (k_first + offs_k)[None, :]  # [BLOCK_M, BLOCK_K]
        # One scale per K tile: the tile's rows (BLOCK_N <= SCALE_BLOCK, from a multiple of BLOCK_N) lie in one
        # scale block; rows past N (wrapped) are never stored.
        ws_ptrs = bs_ptr + (row0 // SCALE_BLOCK) * stride_bsn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the out tile
    xs_ptrs = as_ptr + rm * stride_asm
    if PDL:
        if PREFETCH:  # no kernel writes the weight: it may be read while the previous grid still runs
            prefetch_l2(b_ptr + rn.to(tl.int64) * stride_bn + k_first,
                        tl.minimum(kt_end - kt_start, PREFETCH_TILES) * BLOCK_K)  # fmt: skip
        tl.extra.cuda.gdc_wait()  # before the first activation load and any store

    if TMA:
        acc = _k_loop(acc, b_desc, ws_ptrs, a_desc, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask,
                      b_ptr.dtype.element_ty, GROUP_K, SCALE_BLOCK, BLOCK_K, K_UNROLL, FMA, QUANT_A, FP8_MAX,
                      FP8_MIN_EXP, FNUZ, EMULATE_CAST, True, pid_n * BLOCK_N, pid_m * BLOCK_M, SWAP)  # fmt: skip
    else:
        acc = _k_loop(acc, w_ptrs, ws_ptrs, x_ptrs, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask,
                      b_ptr.dtype.element_ty, GROUP_K, SCALE_BLOCK, BLOCK_K, K_UNROLL, FMA, QUANT_A, FP8_MAX,
                      FP8_MIN_EXP, FNUZ, EMULATE_CAST, SWAP=SWAP)  # fmt: skip
    if not SWAP:
        acc = tl.trans(acc)  # the out^T tile the stores below address (one layout change per program)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # after the loop, not at the top (measured: tuning idea 10)

    if GROUPS == 1:
        cols = offs_n
    else:
        cols = col0 + offs_n
    c_ptrs = c_ptr + offs_m.to(tl.int64)[None, :] * stride_cm + cols[:, None]
    mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    if MODE == 0:  # round_to: the interpreter's own bf16 cast truncates (_fp8.py); on a GPU it is the same cast
        tl.store(c_ptrs, round_to(acc, c_ptr.dtype.element_ty, EMULATE_CAST), mask=mask)
    else:
        mn = M.to(tl.int64) * n_out  # partials span the concatenated output
        p_ptrs = p_ptr + offs_m.to(tl.int64)[None, :] * n_out + cols[:, None]
        tl.store(p_ptrs + pid_s * mn, acc, mask=mask)
        if MODE == 2:
            tile = pid_m * tl.num_programs(0) + pid_n
            if _last_split(cnt_ptr, tile):
                total = _sum_partials(p_ptrs, mask, mn, BLOCK_N, BLOCK_M)
                tl.store(c_ptrs, round_to(total, c_ptr.dtype.element_ty, EMULATE_CAST), mask=mask)
                tl.store(cnt_ptr + tile, 0)  # ready for the next launch (stream order makes it visible)


@triton.jit
def _splitk_reduce_kernel(
    p_ptr,  # fp32 partials [SPLIT, M * N], contiguous
    c_ptr,  # out [M * N], contiguous
    MN,
    SPLIT,
    BLOCK: tl.constexpr,
    EMULATE_CAST: tl.constexpr,  # interpreting: round_to does the bf16 rounding (_fp8.py)
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py)
):
    wait_then_launch(PDL)  # the partials are the previous grid's
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):  # fixed order: the result does not depend on scheduling
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, round_to(acc, c_ptr.dtype.element_ty, EMULATE_CAST), mask=mask)


# ---------------------------------------------------------------- launch helpers

# Programs a small-M launch aims at: three per SM of an H200 (132 SMs; arch.py does not carry the SM count yet).
# Round 1 (benchmarks/gemm.py --quick, H200): the best 64-wide configs launched 384 (qkv 6144x4096, split 4:
# 11.6 us) and 320 programs (Qwen3-32B down 5120x25600 M=16, split 4: 39.1 us), where the old target of 264 gave
# 192 (13.5 us) and 240 (41.4 us). 396 // tiles reproduces both winners' splits.
TARGET_PROGRAMS = 396


def default_small_m_config(n: int, k: int, block_k: int = SCALE_BLOCK, a: _arch.Arch | None = None) -> SmallMConfig:
    """Split K until the launch has about ``TARGET_PROGRAMS`` programs, keeping >= 4 K tiles per program so
    the pipeline prologue is amortised: N=6144, K=4096 -> 96 N tiles x split 4 (8 tiles each). Four stages keep
    three 10 KB tiles in flight per program on NVIDIA; ROCm Triton pipelines two."""
    block_n = 64
    n_tiles = triton.cdiv(n, block_n)
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min(TARGET_PROGRAMS // n_tiles, k_tiles // 4))
    return SmallMConfig(block_n=block_n, split_k=split, warps=4, stages=2 if a is not None and a.is_rocm else 4)


def small_m_block_m(m: int, fma: bool = False, cap: int = 0, swap: bool = True) -> int:
    """Activation rows per program: the next power of two; with tensor cores at least 16 (the smallest MMA
    operand) and at most 64, or at most ``cap`` (``SmallMConfig.block_m``) where one is given. With ``swap`` False
    the rows are the MMA's M side: ``cap``, else 64 (Hopper's warpgroup MMA; rows past M are never stored)."""
    if not swap:
        return cap or 64
    if fma:
        return triton.next_power_of_2(m)
    return min(cap or 64, max(16, triton.next_power_of_2(m)))


def split_plan(k_tiles: int, split_k: int, k_unroll: int) -> tuple[int, int, int]:
    """(splits, K tiles per split, unroll actually used): no split gets an empty K range, each a multiple of the
    unroll (an unroll that does not divide the K tiles falls back to 1)."""
    unroll = k_unroll if k_tiles % k_unroll == 0 else 1
    per_split = triton.cdiv(k_tiles, max(1, min(split_k, k_tiles)))
    per_split = triton.cdiv(per_split, unroll) * unroll
    return triton.cdiv(k_tiles, per_split), per_split, unroll


_counters: dict[tuple[torch.device, int], torch.Tensor] = {}  # (device, stream handle; 0 off CUDA) -> counters
TICKETS_ENV = "FP8_FUSION_TICKETS"  # "0": no shared counters at all (see the module docstring)
# Streams per device with their own counters (128 KB each; PyTorch pools 32 streams per priority): a process that
# makes streams without end gets the ticket-free path on the ones past this, not a buffer and a sync for each.
MAX_STREAM_BUFFERS = 64


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The zeroed int32 ticket counters of ``device``'s current stream, or None when "last" cannot be used or
    ``FP8_FUSION_TICKETS=0`` forbids shared counters (see the module docstring): every caller then has a ticket-free
    path (the two-launch split-K sum, the unfused pair, one split of the decode attention)."""
    if tiles > COUNTER_SLOTS or os.environ.get(TICKETS_ENV, "1") == "0":
        return None
    device = torch.device(device)
    if device.type != "cuda":  # the interpreter: one buffer per device
        if (device, 0) not in _counters:
            _counters[(device, 0)] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
        return _counters[(device, 0)]
    key = (device, _stream_handle(device))
    buf = _counters.get(key)
    if buf is not None:
        return buf
    if torch.cuda.is_current_stream_capturing():
        # allocated inside a capture it would live in the graph's private pool: the device's first buffer, if any
        return next((b for (d, _), b in _counters.items() if d == device), None)
    if sum(d == device for d, _ in _counters) >= MAX_STREAM_BUFFERS:
        return None  # a new stream per call (external streams): no buffer each, the ticket-free path instead
    buf = _allocate_off_thread(device)
    if buf is None:
        return None  # the thread failed (its error is printed by threading); the two-launch sum is the same
    _counters[key] = buf
    return buf


def _stream_handle(device: torch.device) -> int:
    """The cudaStream_t of ``device``'s current stream (its own function: the CPU tests stand in for it)."""
    return torch.cuda.current_stream(device).cuda_stream


def _allocate_off_thread(device: torch.device) -> torch.Tensor | None:
    """Zeroed counters made on a helper thread: cudagraph trees route every allocation *of the current thread* to
    their graph pool during warmup runs (torch._C._cuda_beginAllocateCurrentThreadToPool, torch 2.11-2.13), and a
    pool block that is not a graph output fails the tree's "tensor(s) in the cudagraph pool not tracked as
    outputs" check (a side stream on this thread did not escape it: measured on the H200). Another thread's
    allocation comes from the default pool and lives as long as the process; it is zeroed and synchronized before
    it is used. None if the thread failed."""
    box: list[torch.Tensor] = []

    def allocate() -> None:
        with torch.cuda.device(device):
            box.append(torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device))
            torch.cuda.synchronize(device)

    worker = threading.Thread(target=allocate, name="fp8_fusion_counters")
    worker.start()
    worker.join()
    return box[0] if box else None


def _tma_ready(t: torch.Tensor) -> bool:
    """A TMA descriptor's layout rules: 16-byte aligned base and row stride, contiguous rows."""
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def tma_usable(cfg: SmallMConfig, *tensors: torch.Tensor) -> bool:
    """``cfg`` asks for TMA tiles, the device has TMA (or the interpreter runs), and a descriptor can address each
    of ``tensors``: the test both small-M kernels make before building their descriptors."""
    has_tma = _arch.triton_interpreting() or _arch.arch_of(tensors[0].device).tma
    return cfg.tma and has_tma and all(_tma_ready(t) for t in tensors)


def _descriptors(a, groups, cfg: SmallMConfig, block_m: int, block_k: int, quant_a: bool):
    """The TMA descriptors of the activation and the weight for ``cfg.tma``, or ``(a, weight)`` where the launch
    cannot take them (a GPU without TMA, several weights, a bf16 input, a layout TMA cannot address): the
    kernel then loads the same tiles through pointers, with the same result bit for bit."""
    w = groups[0][0]
    if quant_a or len(groups) != 1 or not tma_usable(cfg, a, w):
        return a, w
    return (TensorDescriptor(a, list(a.shape), list(a.stride()), [block_m, block_k]),
            TensorDescriptor(w, list(w.shape), list(w.stride()), [cfg.block_n, block_k]))  # fmt: skip


MAX_GROUPS = 3  # GEMMs one launch can hold (q / k / v); the kernel has argument slots for three


def _launch(a, a_scale, w_qs, w_scales, out_dtype, group_k: int, cfg: SmallMConfig | None, quant_a: bool):
    """One launch (two with the "kernel" split-K sum) for ``cat([a @ w^T for w in w_qs], -1)``."""
    m, k = a.shape
    n = sum(w.shape[0] for w in w_qs)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    # Empty groups add no columns: dropping them keeps every other group's column offset.
    groups = [(w, s) for w, s in zip(w_qs, w_scales) if w.shape[0]]
    if m == 0 or n == 0:
        return out
    if len(groups) > MAX_GROUPS:
        raise ValueError(f"small-M GEMM: at most {MAX_GROUPS} weights per launch, got {len(groups)}")
    block_k = promotion_block(group_k)
    cfg = cfg or default_small_m_config(n, k, block_k, _arch.arch_of(a.device))
    if cfg.fma and m > FMA_MAX_M:
        raise ValueError(f"small-M GEMV (fma) takes M <= {FMA_MAX_M}, got M={m}")
    split, per_split, unroll = split_plan(k // block_k, cfg.split_k, cfg.k_unroll)
    if not cfg.swap and quant_a:
        raise ValueError(f"small-M GEMM: a bf16 input is quantized along the swap-AB tile; swap False takes fp8, "
                         f"got {cfg}")  # fmt: skip
    block_m = small_m_block_m(m, cfg.fma, cfg.block_m, cfg.swap)
    grid = (sum(triton.cdiv(w.shape[0], cfg.block_n) for w, _ in groups), split, triton.cdiv(m, block_m))
    mode = 0 if split == 1 else 2 if cfg.reduce == "last" else 1
    counters = tile_counters(a.device, grid[0] * grid[2]) if mode == 2 else None
    if mode == 2 and counters is None:
        mode = 1
    partials = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if mode else out
    xs, xs_strides = (out, (0, 0)) if quant_a else (a_scale, a_scale.stride())  # QUANT_A: no scale tensor
    # Each group's (weight, scales, N, strides); an unused slot has group 0's tensors (never read) and N = 0 (the
    # kernel's output width is N + N1 + N2).
    slots = [(w, s, w.shape[0], w.stride(0), *s.stride()) for w, s in groups]
    slots += [(slots[0][0], slots[0][1], 0, *slots[0][3:])] * (MAX_GROUPS - len(slots))
    a_desc, b_desc = _descriptors(a, groups, cfg, block_m, block_k, quant_a)
    pdl = _pdl.pdl_enabled(a.device)
    # cp.async.bulk.prefetch wants 16-byte aligned addresses: every row start and K slab of every weight.
    prefetch = pdl and _pdl.prefetch_enabled() and all(w.data_ptr() % 16 == 0 and w.stride(0) % 16 == 0
                                                       for w, _ in groups)  # fmt: skip
    _small_m_kernel[grid](
        a, slots[0][0], out, partials, out if counters is None else counters, xs, slots[0][1],
        m, slots[0][2], k,
        a.stride(0), slots[0][3], out.stride(0), *xs_strides, *slots[0][4:],
        per_split, *slots[1], *slots[2], a_desc, b_desc,
        GROUP_K=group_k, SCALE_BLOCK=SCALE_BLOCK, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        K_UNROLL=unroll, MODE=mode, GROUPS=len(groups), FMA=cfg.fma, QUANT_A=quant_a, **fp8_constexprs(a.device),
        PDL=pdl, PREFETCH=prefetch, TMA=a_desc is not a, SWAP=cfg.swap, num_warps=cfg.warps, num_stages=cfg.stages,
        **_pdl.launch_kwargs(pdl),
    )  # fmt: skip
    if mode == 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](partials, out, m * n, split, BLOCK=block,
                                                            EMULATE_CAST=_arch.triton_interpreting(), PDL=pdl,
                                                            num_warps=4, **_pdl.launch_kwargs(pdl))  # fmt: skip
    return out


def small_m_mm(q, x_scale, w_q, w_scale, out_dtype, config: SmallMConfig | None = None) -> torch.Tensor:
    """Swap-AB split-K GEMM for decode-sized M (block scales; inputs validated by ``checks.py``)."""
    return _launch(q, x_scale, [w_q], [w_scale], out_dtype, q.shape[1] // x_scale.shape[1], config, quant_a=False)


def small_m_mm_bf16(x, w_q, w_scale, out_dtype, group_size: int = 128, config: SmallMConfig | None = None):
    """``blockscale_mm(*group_quant(x, group_size), w_q, w_scale)`` with the activation quant inside the GEMM:
    ``x [M, K]`` bf16 / fp16 / fp32, K contiguous; the group must be a K tile (32, 64 or 128)."""
    k = x.shape[1]
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.stride(1) != 1:
        raise ValueError(f"x must be a K-contiguous bf16 / fp16 / fp32 [M, K] tensor, got {x.dtype} {x.stride()}")
    if group_size not in (32, 64, 128) or k % group_size or w_q.shape[1] != k:
        raise ValueError(f"group {group_size} must be 32, 64 or 128 and divide K={k} (= w_q's K {w_q.shape[1]})")
    return _launch(x, None, [w_q], [w_scale], out_dtype, group_size, config, quant_a=True)


def small_m_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype, config: SmallMConfig | None = None) -> torch.Tensor:
    """``cat([small_m_mm(q, x_scale, w, s) for w, s in zip(w_qs, w_scales)], -1)`` in one launch (up to
    ``MAX_GROUPS`` weights of one K, each read in place: no merged weight copy). ``config`` is the merged
    shape's (N = sum of the N_i); each group's N is padded to whole ``block_n`` tiles."""
    return _launch(q, x_scale, list(w_qs), list(w_scales), out_dtype, q.shape[1] // x_scale.shape[1], config,
                   quant_a=False)  # fmt: skip
