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

Hazard of "last": the counters are shared by all launches on a device; two such GEMMs running *concurrently on
two streams* could take each other's tickets. Launches on one stream (CUDA graphs included) are ordered and safe.
The buffer is allocated by the first eager call; a call made while a CUDA graph is being captured before that,
or with more tiles than ``COUNTER_SLOTS``, uses "kernel" instead (same result).

Notes: each idea's prediction, then the measurement (``benchmarks/gemm.py``, H200, CUDA-graph medians).
First round (2026-11-29, "kernel" reduce only): qkv 6144x4096 M=1 11.6 us = 1.97x roofline, M=64 15.5 us = 2.53x;
Qwen3-32B down 5120x25600 M=1 38.7 us = 1.27x, M=64 49.5 us = 1.59x; best block_n 64/128, split 3-4, 4 warps,
4 stages.
1. reduce "last" vs "kernel": saves the second launch and its graph gap, predicted -2 to -3 us wherever split > 1
   (qkv M=1 11.6 -> ~9 us; 32B down M=1 38.7 -> ~36.5 us). Measured (2026-12-01, 48 points, with / without at
   the best config): 0.75-1.07x; it helps where split > 1 at M <= 16 (qkv M=1 0.91x, o M=1 0.89x, k|v M=16
   0.75x), is neutral at split 1 (gate_up) and up to 1.07x slower at M = 64. Smaller than predicted: ~1 us.
2. k_unroll 2 (two scale groups per iteration, 16 KB of weight per stage at block_n 64): twice the bytes in
   flight per stage, half the loop-carried waits; predicted <= 5% (the 4-stage pipeline already keeps 24 KB in
   flight per program, about what an SM needs at 32 GB/s per SM x ~0.8 us latency). Measured: 0.96-1.38x,
   slower at almost every point.
3. stages 6 vs 4: predicted +-3% (round 1: 4 won). warps 8: only helps block_n >= 128. Measured: stages 6
   0.86-1.42x, warps 8 0.83-1.34x; each wins some shapes, which the TABLE rows record.
4. block_n 128 / 256 at M = 32..64: every N tile re-reads the activation (64 x 4096 = 256 KB at M=64, 96 tiles:
   25 MB of L2 reads, as much as the weight); 128 / 256 halves / quarters that. Predicted qkv M=64 15.5 -> ~12 us.
   Measured: 256 is slower at 47 of 48 points (0.95-4.8x); 128 vs 64 is mixed (0.70-1.42x). Prediction wrong.
5. fma GEMV (M <= 4) vs ``tl.dot`` padded to 16 rows: the MMA's wasted work is free at this intensity; the GEMV
   saves the shared-memory round trip but Triton may not pipeline loads that feed no dot, so latency is hidden
   by occupancy only. Predicted within +-10% at M=1, slower at M=4 (4x the fp32 work). Measured: 1.7-5.6x slower
   at every point: not used.
6. bf16 input quantized inside (``small_m_mm_bf16``): every N tile re-quantizes its K slice of the rows (96x
   redundant at qkv, ~40 ALU ops per value) and reads 2-byte values; predicted +0.3-1 us over the fp8-input
   GEMM at M <= 16, so never faster than a fused norm+quant feeding the fp8 GEMM (no "worth it" entry on H200),
   but faster than group_quant + GEMM by that launch (~2-3 us) where the producer cannot fuse the quant
   (o_proj after attention). Measured (it compiles on Triton 3.6 since ``_x_tile`` has one return): never
   faster than the fp8-input GEMM (1.02-3.66x); faster than group_quant + GEMM at 11 of 48 points, by at most
   11% (k|v M=1) and by 2% for o_proj at M=16. So the NVIDIA "worth it" table stays empty and no rewrite of
   quant + GEMM into it is worth a pattern.
7. Persistent grid (132 x k programs looping over tiles): here it is the same as choosing split so that the
   launch has ~132 x k programs, which the sweep does (targets 132, 264, 396, 528); not built. 16-byte loads: the
   loads are already 16 B (K % 16 == 0 is specialized), nothing to gain. The whole activation block in shared
   memory: Triton gives no explicit shared memory, and at M <= 16 the x tile is 2 KB against 8 KB of weight.
8. The last program's sum loads four partials before adding them (one L2 round trip per four splits, not per
   split): predicted -0.5 to -1 us at split 4 on the tile that finishes last. Not measured separately.
9. Default split aims at 396 programs (was 264): reproduces round 1's best splits, predicted qkv M=1 13.5 ->
   11.6 us and 32B down M=16 41.4 -> 39.1 us with the two-launch sum. Measured in round 1 (the TABLE's M = 4 / 32
   rows); the 2026-12-01 sweep's winners launched 96-400 programs (median 256) per row block.
10. PDL (``benchmarks/pdl.py``, H200, torch 2.11, Triton 3.6, TABLE configs, Qwen3-8B qkv / o / gate_up / down
    at M = 1, 16, 64; medians, ~5% apart between runs): predicted -1 to -2 us per GEMM (the launch and
    ramp hidden behind the previous kernel). Measured, as first built (the whole K slab prefetched, the trigger
    right after the wait): slower everywhere, the GEMM alone 1.03-1.61x and norm / silu quant -> GEMM 1.06-1.47x
    (likely, not profiled: 25-100 MB prefetched while the previous kernel streams its own thrash the 50 MB L2).
    Prefetching 2 or 4 tiles per row instead: the same as no prefetch (+-3%), but back to back the GEMM was still
    1.1-1.3x slower at M <= 16 (likely: the next grid's programs resident early, spinning in their wait). Triggering
    after the loop (two runs, 2 tiles prefetched): the GEMM alone 0.93-1.05x (o M=64 1.22x); quant -> GEMM
    0.88-0.89x at qkv / o M=1 (-1.2 to -1.5 us), 0.90x qkv M=64, 0.96-0.99x gate_up, 0.92x down M=64, but
    1.07-1.11x down M <= 16 and 1.19x o M=64. The prefetch itself was within noise of none. Off by default.
11. The 256-row tile at M < 16 (the sweep had skipped it there): predicted no better (idea 4). Measured: the best
    config for Qwen3-32B's 51200 x 5120 gate_up at M = 1, 66.9 us against 72.5 (``benchmarks/gemm.py --ms 1,16
    --only gate_up``); the 8B gate_up shapes keep the 128-row tile.
12. The scales a K tile ahead (``_k_loop``). Nsight Compute on the H200 (``ncu --set full``, qkv 6144 x 4096 at M =
    64, TABLE config): DRAM 40% and L2 53% of peak, 0.32 instructions issued per scheduler cycle, 164 registers per
    thread (3 programs per SM, by registers and shared memory alike), and 43% of the stall cycles waiting on
    L1TEX loads whose sectors were 4 of 32 bytes used: the weight / activation scale loads, which Triton does not
    pipeline (in the TTGIR they sat after the stage's wait, on every iteration's critical path). Loading them one
    iteration ahead puts them before the wait; predicted a large part of those stalls. Measured (same configs,
    the old and new kernel in one run, 64 points, a one-off script): 0.96-0.99x at M = 4-32, 0.99-1.04x at
    M = 64; bit-identical. So the stalls were mostly overlapped with the MMA wait already; kept, as it never lost
    by more than noise.
13. TMA tiles (``tma``): no per-thread address arithmetic or ``cp.async`` per 16 bytes, the copy engine fills the
    stage and signals an mbarrier. First measured as a prototype (an uncommitted script) at the best of a sweep
    against the TABLE config: 0.85-0.97x at M = 64 (down 4096 x 12288 26.0 -> 22.3 us), 0.95-1.0x at M = 16. In
    the sweep of ``benchmarks/gemm.py`` ("tma" idea: best TMA config over best pointer config): 0.83-0.96x at
    M = 64, 0.89-1.02x at M = 16 / 32, and 1.00-1.10x on the 1024-row k|v weights, which keep pointer loads. It
    took 33 of the 48 TABLE rows at M = 16-64 (cuBLAS kept 2). At M = 1 it also wins the three down projections
    (2026-12-03: Qwen3-32B's 37.6 -> 34.5 us, 1.03x a plain read of its weight), and Llama-3.1-8B's at M = 4.
14. More, lighter programs, and a register-light split-K sum (probe ddeb781, withdrawn). Offline sm_90 compiles
    (Triton 3.6, ``cuobjdump -res-usage``, TMA configs) showed the last program's sum, four [BLOCK_N, BLOCK_M]
    partials in flight, setting the whole kernel's registers: 128 per thread at 16 rows where the kernel without
    it takes 53; 255 and 16 B spilled at 32 rows (86 without); 255 and 856 B spilled at 64 rows (153). Summing one
    partial at a time: 66 / 138 / 246, nothing spilled. Predicted: more programs resident per SM, and with them
    GEMV-shaped launches (16-64 weight rows, 1-2 warps, up to 12 programs per SM) that the sweep's 1-4 per SM never
    tried. Measured (``gemm.py --ms 16,32,64 --small-only`` with those families, 48 points, H200, 2026-12-03): the
    1-2 warp launches 1.01-1.57x slower than the 4-warp ones at every point; the one-at-a-time sum at the TABLE's
    families 0.984-1.0x the committed rows re-timed in the same run, the spread two identical configs showed
    (0.986-0.998x): no effect. Occupancy is not what holds these launches back. Withdrawn.
15. The activation rows split over programs (``block_m`` 16 / 32 where M has more; 2026-12-03): at M = 64 the
    qkv row ran 96 programs (6144 / 64 weight tiles, split 1) on 132 SMs, and split-K, the other way to more
    programs, adds partials and their sum. Here the programs of one weight tile each take a share of the rows and
    read the same weight tile (from L2 after the first). Predicted: faster where split 1 had won at M = 64.
    Measured (``gemm.py --ms 32,64 --small-only``, 32 points, the "rows split" idea column): 0.83-0.84x at the
    1024-row k|v weights at M = 64 (7.94 -> 6.58 us), 0.96x at Qwen3-8B qkv M = 64 (14.85 -> 14.19), 0.97-0.98x
    at the k|v at M = 32; 1.0-1.07x at o, down, q_proj, and 1.2-1.9x slower on the wide gate_up weights (not
    profiled). Four TABLE rows took it.
Still off the weight-bytes roofline where that roofline is a few microseconds (qkv and o 1.7-2.7x, the 4 MB k|v
5-7x). This was put down to a fixed per-launch cost; ``benchmarks/launch_floor.py`` measured an empty launch at
0.6 us in the harness, so most of the 4-5 us is the ramp that any kernel pays: a plain read of 4 / 16 / 25 MB takes
2.9 / 6.1 / 8.2 us there, 1.4-3.1x its roofline. At M = 1 the GEMV (``_gemv_kernels.py``) is 1-14% faster, within
0.94-1.16x of that read for all but the 4 MB k|v, and took those TABLE rows. At M = 64, with TMA, this kernel is
1.35-1.64x the read on qkv, o, down and q_proj (was 1.42-1.75x): the room left at decode sizes. ncu's picture
there (12 warps per SM, latency-bound at 40% of DRAM bandwidth) points at occupancy: fewer registers per thread
or a warp-specialized loader, neither of which Triton 3.6 exposes for this loop.
"""

from __future__ import annotations

import dataclasses
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
# With PDL: K tiles per weight row that a program prefetches into L2 before its wait (module docstring, 10).
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
    tma: bool = False  # operand tiles by TMA (idea 13); launches it cannot take run the same kernel without it
    block_m: int = 0  # activation rows per program (16, 32 or 64; idea 15); 0: all of M up to 64 (small_m_block_m)

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
            FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr, TMA: tl.constexpr = False, n0=0, m0=0):  # fmt: skip
    """``acc [rows, BLOCK_M]`` += the weight rows' K tiles ``[kt_start, kt_end)`` times the activation's, each
    tile's product promoted by its weight-scale and activation-scale pair (the GEMM's one K loop, shared by
    ``_small_m_kernel`` and the SiLU-quant epilogue kernel, ``_small_m_silu_kernels.py``).

    ``TMA``: ``w_ptrs`` / ``x_ptrs`` are tensor descriptors of the weight ``[N, K]`` and the activation ``[M, K]``
    (blocks ``[rows, BLOCK_K]`` / ``[BLOCK_M, BLOCK_K]``), the tiles at rows ``n0`` / ``m0`` loaded by the copy
    engine (rows past the end read as zeros), the activation's transposed in shared memory as the MMA wants it.

    The scales are loaded one K tile ahead (module docstring, idea 12): Triton pipelines only the loads that
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
                raw = x_ptrs.load([m0, (kt + u) * BLOCK_K]).T
            else:
                w = tl.load(w_ptrs + u * BLOCK_K)
                raw = tl.load(x_ptrs + u * BLOCK_K)
            w_s = w_s0 if u == 0 else w_s1
            x, x_s = _x_tile(raw, x_s0 if u == 0 else x_s1, fp8_dtype, QUANT_A, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST)  # fmt: skip
            if FMA:
                part = tl.sum(w.to(tl.float32)[:, :, None] * x.to(tl.float32)[None, :, :], axis=1)
            else:
                part = tl.dot(w, x)
            acc += part * w_s[:, None] * x_s[None, :]
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
    BLOCK_M: tl.constexpr,  # activation rows (the MMA's N operand: >= 16 unless FMA)
    BLOCK_N: tl.constexpr,  # weight rows (the MMA's M operand)
    BLOCK_K: tl.constexpr,  # the promotion step: one K tile, one scale pair
    K_UNROLL: tl.constexpr,
    MODE: tl.constexpr,  # 0: write out (SPLIT 1); 1: write partials; 2: partials, the last program sums them
    GROUPS: tl.constexpr,  # GEMMs sharing the activation in this launch (1, 2 or 3)
    FMA: tl.constexpr, QUANT_A: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait for the previous grid before the loop
    PREFETCH: tl.constexpr,  # PDL: prefetch the first weight tiles into L2 before the wait (16-byte aligned rows)
    TMA: tl.constexpr,  # operand tiles by the copy engine (GROUPS 1, fp8 input, tensor cores; _k_loop)
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    if GROUPS == 1:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_out = N
    else:
        # Each group's N is padded to whole tiles, so a tile belongs to one group; from here on b_ptr, bs_ptr,
        # N and the strides are the tile's group's, offs_n its rows in that group, cols its output columns.
        n_out = N + N1 + N2
        b_ptr, bs_ptr, N, stride_bn, stride_bsn, stride_bsk, col0, tile0 = _group_of(
            pid_n, b_ptr, bs_ptr, N, stride_bn, stride_bsn, stride_bsk,
            b1_ptr, bs1_ptr, N1, stride_bn1, stride_bsn1, stride_bsk1,
            b2_ptr, bs2_ptr, N2, stride_bn2, stride_bsn2, stride_bsk2, GROUPS, BLOCK_N)  # fmt: skip
        offs_n = (pid_n - tile0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows / columns wrap onto valid ones, so loads need no mask; stores mask them.
    rn = offs_n % N
    rm = offs_m % M
    kt_start = pid_s * k_tiles_per_split
    kt_end = tl.minimum(kt_start + k_tiles_per_split, tl.cdiv(K, BLOCK_K))
    k_first = kt_start * BLOCK_K
    w_ptrs = b_ptr + rn.to(tl.int64)[:, None] * stride_bn + (k_first + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = a_ptr + rm.to(tl.int64)[None, :] * stride_am + (k_first + offs_k)[:, None]  # [BLOCK_K, BLOCK_M]
    ws_ptrs = bs_ptr + (rn // SCALE_BLOCK) * stride_bsn
    xs_ptrs = as_ptr + rm * stride_asm
    if PDL:
        if PREFETCH:  # no kernel writes the weight: it may be read while the previous grid still runs
            prefetch_l2(b_ptr + rn.to(tl.int64) * stride_bn + k_first,
                        tl.minimum(kt_end - kt_start, PREFETCH_TILES) * BLOCK_K)  # fmt: skip
        tl.extra.cuda.gdc_wait()  # before the first activation load and any store

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # the out^T tile
    if TMA:
        acc = _k_loop(acc, b_desc, ws_ptrs, a_desc, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask,
                      b_ptr.dtype.element_ty, GROUP_K, SCALE_BLOCK, BLOCK_K, K_UNROLL, FMA, QUANT_A, FP8_MAX,
                      FP8_MIN_EXP, FNUZ, EMULATE_CAST, True, pid_n * BLOCK_N, pid_m * BLOCK_M)  # fmt: skip
    else:
        acc = _k_loop(acc, w_ptrs, ws_ptrs, x_ptrs, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask,
                      b_ptr.dtype.element_ty, GROUP_K, SCALE_BLOCK, BLOCK_K, K_UNROLL, FMA, QUANT_A, FP8_MAX,
                      FP8_MIN_EXP, FNUZ, EMULATE_CAST)  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # after the loop, not at the top (measured: module docstring, 10)

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


def small_m_block_m(m: int, fma: bool = False, cap: int = 0) -> int:
    """Activation rows per program: the next power of two; with tensor cores at least 16 (the smallest MMA
    operand) and at most 64, or at most ``cap`` (``SmallMConfig.block_m``) where one is given."""
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


_counters: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed int32 ticket counters, or None when "last" cannot be used (see the module docstring)."""
    if tiles > COUNTER_SLOTS:
        return None
    buf = _counters.get(device)
    if buf is None and device.type != "cuda":
        buf = _counters[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    elif buf is None:
        if torch.cuda.is_current_stream_capturing():
            return None  # allocated inside a capture it would live in the graph's private pool
        # Allocated on a helper thread: cudagraph trees route every allocation *of the current thread* to their
        # graph pool during warmup runs (torch._C._cuda_beginAllocateCurrentThreadToPool, torch 2.11-2.13), and a
        # pool block that is not a graph output fails the tree's "tensor(s) in the cudagraph pool not tracked as
        # outputs" check (a side stream on this thread did not escape it: measured on the H200). Another thread's
        # allocation comes from the default pool and lives as long as the process.
        box: list[torch.Tensor] = []

        def allocate() -> None:
            with torch.cuda.device(device):
                box.append(torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device))
                torch.cuda.synchronize(device)

        worker = threading.Thread(target=allocate, name="fp8_fusion_counters")
        worker.start()
        worker.join()
        if not box:
            return None  # the thread failed (its error is printed by threading); the two-launch sum is the same
        buf = _counters[device] = box[0]
    return buf


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
    block_m = small_m_block_m(m, cfg.fma, cfg.block_m)
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
        PDL=pdl, PREFETCH=prefetch, TMA=a_desc is not a, num_warps=cfg.warps, num_stages=cfg.stages,
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
