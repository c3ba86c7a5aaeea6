"""Triton small-M gate/up GEMM with the SiLU-and-mul and the 1 x G group quant in its epilogue.

    before: y = blockscale_mm(q, s, W_gate_up)  [M, 2I] bf16   ->  silu_mul_group_quant(y, G)  (two launches)
    after:  silu_mul_group_quant(blockscale_mm(...), G) in one launch, y never written

At decode the down projection's input quant is a launch of its own after the gate/up GEMM (~1.3 us in a CUDA graph
on the H200, of a ~90 us Llama-3.1-8B layer: ``benchmarks/gemm_silu_quant.py``). Here the GEMM's programs finish
the job: each program owns ``BLOCK_N`` output columns and computes *both* their gate rows
and their up rows, as one ``[2 * BLOCK_N, BLOCK_K]`` weight tile per K step (gate rows on top, the up rows below:
one MMA, the K loop of ``_small_m_kernel`` unchanged). With split-K the partials of both halves go through the
same ticket as "last" (``_last_split``, ``_sum_partials``); the program holding the tile's whole sum then rounds
gate and up to the GEMM's out dtype, applies ``silu_and_mul``'s steps (``_silu``: fp32, rounded to the out dtype,
times up, rounded) and quantizes groups of G consecutive columns with ``_fp8``'s helpers, the steps of every quant
kernel. With ``BLOCK_N % G == 0`` a group never spans two programs. With ``BLOCK_N`` = G / 2 or G / 4
(``GROUP_TILES`` 2 or 4) the weight tile is the plain GEMM's 128 or 64 rows, not 256. Then each program stores its
silu_and_mul values (fp32, [M, I]) and takes a ticket on its group's counter, and the last of the group's programs
quantizes the whole group. The amax is a max, exact in any order, so this is bit for bit the one-program group.
Measured on the H200 (``benchmarks/gemm_silu_quant.py``): with ``BLOCK_N`` = G the 256-row tile cost ~1.3 us on
the 8B shapes, what the saved launch saves; with ``BLOCK_N`` 64 / 32 the fused launch is within 2% of the pair
there (0.98-1.00x at M = 4-32): the group's fp32 store, ticket and reload cost about what the tile saved. On
Qwen3-32B block_n 64 won at M = 4 / 16 (0.95x), the TABLE's rows.

``SmallMConfig.swap`` False (tuning idea 20; TMA tiles only): the activation rows are the MMA's M side (64, padded)
and each of the gate and up tiles its N side, one weight scale each per K tile, both sums transposed once after the
loop for the same epilogue. A launch that cannot build the descriptors runs the swap-AB tile instead (the same
products; the MMA's operand order differs, so the sums may differ in the last bit). Measured on the H200 at
M = 64: 0.95-0.98x the unfused pair (Qwen3-8B, Llama-3.1-8B, Qwen3-32B gate_up), where the swap-AB tile lost.

TMA (``SmallMConfig.tma``, sm90+): a descriptor addresses one weight, so the gate and the up rows come as two
``[BLOCK_N, BLOCK_K]`` tiles and two MMAs per K step on one activation tile (``_k_loop_pair``), bit for bit the
pointer path's single tile. Measured (``benchmarks/gemm_silu_quant.py --ms 4,16,32,64``, H200): the best fused
config at Llama-3.1-8B M = 4-64 and Qwen3-32B M = 16 / 64, 1-3 us faster than the pointer tile at M = 64; on
Qwen3-8B at M = 64 it still lost to the pair (35.0 against 32.0 us: block_n 64 is 192 programs of 128 weight rows,
where the pair's GEMM runs 384 programs of 64).

Numerics: the GEMM part sums the same products as ``_small_m_kernel`` at the same config (split, K tiles), and
the epilogue is ``silu_mul_group_quant``'s, so against the unfused pair at the same GEMM config the only
difference is the rounding of the GEMM output, done here in registers (``round_to``) instead of by a store; on the
GPU both are the hardware's round-to-nearest-even. The unfused GEMM may run another config (its own TABLE row),
whose sum order differs: then bf16 GEMM outputs may differ by an ulp, and a quantized value by one fp8 step.

Weights: gate and up are two ``[I, K]`` tensors (two HF projections) or the two halves of one merged
``[2I, K]`` weight (``gate_up_proj``, I a multiple of the 128-row weight block so the halves' scale rows do
not straddle), read in place either way.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import arch as _arch
from . import _pdl
from ._blockscale_kernels import SCALE_BLOCK, promotion_block
from ._fp8 import amax_nan, cast_fp8, div_by_scale, kernel_constexprs, reciprocal_of, round_to, scale_of, to_fp32
from ._small_m_kernels import (
    SmallMConfig,
    _k_loop,
    _last_arrival,
    _last_split,
    _scales,
    _sum_partials,
    small_m_block_m,
    split_plan,
    tile_counters,
    tma_usable,
)
from .silu_and_mul import _silu


@triton.jit
def _halves(acc, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """``acc [2 * BLOCK_N, BLOCK_M]`` (gate^T rows on top of up^T rows) -> its gate and up halves."""
    return tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N, BLOCK_M)), (1, 2, 0)))


@triton.jit
def _silu_mul(gate, up, OUT_DTYPE: tl.constexpr, EMULATE_CAST: tl.constexpr, PTX: tl.constexpr):
    """The gate and up GEMMs' fp32 sums -> ``silu_and_mul``'s output, each step rounded to the out dtype as the
    unfused pair rounds it (the GEMM's store, then ``silu_and_mul``), held in fp32."""
    gate = to_fp32(round_to(gate, OUT_DTYPE, EMULATE_CAST), EMULATE_CAST)  # the GEMM's output, as stored
    up = to_fp32(round_to(up, OUT_DTYPE, EMULATE_CAST), EMULATE_CAST)
    act = to_fp32(round_to(_silu(gate, PTX), OUT_DTYPE, EMULATE_CAST), EMULATE_CAST)
    return to_fp32(round_to(act * up, OUT_DTYPE, EMULATE_CAST), EMULATE_CAST)


@triton.jit
def _quant_store(y, q_ptr, s_ptr, n0, offs_m, M, I, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
                 PTX: tl.constexpr):  # fmt: skip
    """``y [BLOCK_N, BLOCK_M]`` (columns ``[n0, n0 + BLOCK_N)``, n0 a multiple of G, BLOCK_N of G) -> q [M, I] fp8
    and scale [M, I / G] fp32 for those columns and rows ``offs_m``: groups of G consecutive columns."""
    y3 = tl.reshape(y, (BLOCK_N // G, G, BLOCK_M))  # [BN, BM] -> [BN / G, G, BM], the quant along axis 1
    scale = scale_of(amax_nan(y3, 1, EMULATE_CAST), FP8_MAX)  # [BN / G, BM]
    r, scale_fin = reciprocal_of(scale)
    qv = cast_fp8(div_by_scale(y3, scale_fin[:, None, :], r[:, None, :]), q_ptr.dtype.element_ty, FP8_MAX,
                  FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
    rows = offs_m.to(tl.int64)
    cols = (n0 + tl.arange(0, BLOCK_N // G)[:, None] * G + tl.arange(0, G)[None, :])[:, :, None]
    ok_m = (offs_m < M)[None, None, :]
    tl.store(q_ptr + rows[None, None, :] * I + cols, qv, mask=ok_m & (cols < I))
    groups = n0 // G + tl.arange(0, BLOCK_N // G)
    n_groups = I // G
    tl.store(s_ptr + rows[None, :] * n_groups + groups[:, None], scale,
             mask=(offs_m < M)[None, :] & (groups < n_groups)[:, None])


@triton.jit
def _epilogue(gate, up, q_ptr, s_ptr, y_ptr, cnt_ptr, pid_n, pid_m, offs_m, M, I, OUT_DTYPE: tl.constexpr,
              G: tl.constexpr, GROUP_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
              FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
              PTX: tl.constexpr):  # fmt: skip
    """The tile's whole gate and up sums (``[BLOCK_N, BLOCK_M]`` each) -> silu_and_mul -> the quant of its groups.
    With ``GROUP_TILES`` > 1 a quant group spans that many programs' columns: each stores its silu_and_mul values
    to ``y_ptr`` ([M, I] fp32) and takes a ticket on its group's counter (after the split-K counters); the last to
    arrive quantizes the whole group."""
    y = _silu_mul(gate, up, OUT_DTYPE, EMULATE_CAST, PTX)
    if GROUP_TILES == 1:
        _quant_store(y, q_ptr, s_ptr, pid_n * BLOCK_N, offs_m, M, I, G, BLOCK_N, BLOCK_M, FP8_MAX, FP8_MIN_EXP,
                     FNUZ, EMULATE_CAST, PTX)  # fmt: skip
    else:
        rows = offs_m.to(tl.int64)[None, :] * I
        ok_m = (offs_m < M)[None, :]
        tl.store(y_ptr + rows + (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[:, None], y, mask=ok_m)
        groups_per_row = tl.num_programs(0) // GROUP_TILES  # I % G == 0, so the column tiles fill whole groups
        group = pid_m * groups_per_row + pid_n // GROUP_TILES
        counter = tl.num_programs(0) * tl.num_programs(2) + group  # after the split-K tile counters
        if _last_arrival(cnt_ptr, counter, GROUP_TILES):
            g0 = (pid_n // GROUP_TILES) * G
            # .cg: from L2, never a stale L1 line of the other programs' values (as _sum_partials loads)
            yg = tl.load(y_ptr + rows + (g0 + tl.arange(0, G))[:, None], mask=ok_m, other=0.0, cache_modifier=".cg")
            _quant_store(yg, q_ptr, s_ptr, g0, offs_m, M, I, G, G, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                         EMULATE_CAST, PTX)  # fmt: skip
            tl.store(cnt_ptr + counter, 0)  # ready for the next launch


@triton.jit
def _k_loop_pair(g_desc, u_desc, gs_ptrs, us_ptrs, x_desc, xs_ptrs, kt_start, kt_end, stride_bsk, stride_ask, n0, m0,
                 GROUP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, SWAP: tl.constexpr = True):  # fmt: skip
    """``_k_loop`` with TMA tiles for the gate rows and the up rows at once: ``(gate, up)``, each ``[BLOCK_N,
    BLOCK_M]`` fp32. A descriptor loads one weight's rows, so the pointer path's single ``[2 * BLOCK_N, BLOCK_K]``
    tile (gate rows on top of up rows) becomes two tiles and two MMAs per K step on one activation tile: the same
    products summed in the same order per output, the same promotion (``(dot * w_s) * x_s``), scales a tile ahead.
    Rows past ``I`` read as zeros (their outputs are masked). ``SWAP`` False: the activation tile is the MMA's first
    operand, ``gs_ptrs`` / ``us_ptrs`` one scale each per K tile, and the sums are transposed after the loop."""
    # the up rows share the activation's scales: _scales with QUANT_A True loads only their weight scales
    g_next, x_next = _scales(gs_ptrs, xs_ptrs, kt_start, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK, BLOCK_K, False)
    u_next, _ = _scales(us_ptrs, xs_ptrs, kt_start, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK, BLOCK_K, True)
    if SWAP:
        gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        g_s, u_s, x_s = g_next, u_next, x_next
        ahead = tl.minimum(kt + 1, kt_end - 1)  # the last iteration re-loads its own scales (in range)
        g_next, x_next = _scales(gs_ptrs, xs_ptrs, ahead, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK, BLOCK_K,
                                 False)  # fmt: skip
        u_next, _ = _scales(us_ptrs, xs_ptrs, ahead, stride_bsk, stride_ask, GROUP_K, SCALE_BLOCK, BLOCK_K, True)
        if SWAP:
            x = x_desc.load([m0, kt * BLOCK_K]).T
            gate += tl.dot(g_desc.load([n0, kt * BLOCK_K]), x) * g_s[:, None] * x_s[None, :]
            up += tl.dot(u_desc.load([n0, kt * BLOCK_K]), x) * u_s[:, None] * x_s[None, :]
        else:
            x = x_desc.load([m0, kt * BLOCK_K])
            gate += tl.dot(x, g_desc.load([n0, kt * BLOCK_K]).T) * g_s * x_s[:, None]
            up += tl.dot(x, u_desc.load([n0, kt * BLOCK_K]).T) * u_s * x_s[:, None]
    if not SWAP:
        gate, up = tl.trans(gate), tl.trans(up)  # the [BLOCK_N, BLOCK_M] tiles the epilogue takes
    return gate, up


# M and the split's K range vary per call (as in _small_m_kernel): no divisibility specialization for them.
@triton.jit(do_not_specialize=["M", "k_tiles_per_split"])
def _small_m_silu_quant_kernel(
    a_ptr,  # q [M, K] fp8, K contiguous
    bg_ptr, bu_ptr,  # gate / up weights [I, K] fp8, K contiguous, row stride stride_bn (both)
    q_ptr, s_ptr,  # out: q [M, I] fp8, scale [M, I / G] fp32, contiguous
    p_ptr,  # fp32 partials [SPLIT, M, 2I] (MODE 2): gate columns [0, I), up columns [I, 2I)
    y_ptr,  # fp32 silu_and_mul values [M, I] (GROUP_TILES > 1): a quant group's columns from its programs
    cnt_ptr,  # int32 ticket counters, [tiles] then [groups] (GROUP_TILES > 1), zero before and after the launch
    as_ptr,  # activation scales, element (m, k // GROUP_K) at m * stride_asm + (k // GROUP_K) * stride_ask
    bgs_ptr, bus_ptr,  # gate / up weight scales, element (n // 128, k // 128), strides stride_bsn, stride_bsk
    a_desc, bg_desc, bu_desc,  # TMA: descriptors of q [M, K], gate and up [I, K] (else a_ptr, bg_ptr, bu_ptr: unused)
    M, I, K,
    stride_am, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk,
    k_tiles_per_split,  # grid (cdiv(I, BLOCK_N), SPLIT, cdiv(M, BLOCK_M))
    GROUP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    OUT_DTYPE: tl.constexpr,  # the GEMM's output dtype: the rounding of gate, up and each silu_and_mul step
    G: tl.constexpr,  # the output quant's group: BLOCK_N % G == 0, or G == GROUP_TILES * BLOCK_N
    GROUP_TILES: tl.constexpr,  # column tiles per quant group (1: each program quantizes its own groups)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr,
    MODE: tl.constexpr,  # 0: SPLIT 1, the epilogue runs in every program; 2: partials, the last program's epilogue
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait before the loop, trigger after it
    TMA: tl.constexpr,  # gate, up and activation tiles by the copy engine (_k_loop_pair; else pointer loads)
    SWAP: tl.constexpr,  # weight rows on the MMA's M side; False (TMA only): the activation rows (tuning idea 20)
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rm = offs_m % M
    kt_start = pid_s * k_tiles_per_split
    kt_end = tl.minimum(kt_start + k_tiles_per_split, tl.cdiv(K, BLOCK_K))
    xs_ptrs = as_ptr + rm * stride_asm
    if PDL:
        tl.extra.cuda.gdc_wait()  # before the first activation load and any store
    tl.static_assert(SWAP or TMA, "swap False takes TMA tiles")
    if TMA:
        if SWAP:
            rh = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % I  # the tile's weight rows (out-of-range ones wrap)
        else:  # one scale per K tile: the tile's rows (BLOCK_N <= SCALE_BLOCK, from a multiple of it) share a block
            rh = pid_n * BLOCK_N
        gate, up = _k_loop_pair(bg_desc, bu_desc, bgs_ptr + (rh // SCALE_BLOCK) * stride_bsn,
                                bus_ptr + (rh // SCALE_BLOCK) * stride_bsn, a_desc, xs_ptrs, kt_start, kt_end,
                                stride_bsk, stride_ask, pid_n * BLOCK_N, pid_m * BLOCK_M, GROUP_K, SCALE_BLOCK,
                                BLOCK_N, BLOCK_M, BLOCK_K, SWAP)  # fmt: skip
    else:
        r = tl.arange(0, 2 * BLOCK_N)
        is_up = r >= BLOCK_N
        rn = (pid_n * BLOCK_N + r % BLOCK_N) % I  # weight row of each tile row (out-of-range columns wrap)
        offs_k = tl.arange(0, BLOCK_K)
        k_first = kt_start * BLOCK_K
        w_rows = tl.where(is_up, bu_ptr, bg_ptr) + rn.to(tl.int64) * stride_bn  # [2 * BLOCK_N] row starts
        w_ptrs = w_rows[:, None] + (k_first + offs_k)[None, :]
        ws_ptrs = tl.where(is_up, bus_ptr, bgs_ptr) + (rn // SCALE_BLOCK) * stride_bsn
        x_ptrs = a_ptr + rm.to(tl.int64)[None, :] * stride_am + (k_first + offs_k)[:, None]
        acc = _k_loop(tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32), w_ptrs, ws_ptrs, x_ptrs, xs_ptrs,
                      kt_start, kt_end, stride_bsk, stride_ask, bg_ptr.dtype.element_ty, GROUP_K, SCALE_BLOCK,
                      BLOCK_K, K_UNROLL, False, False, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST)  # fmt: skip
        gate, up = _halves(acc, BLOCK_N, BLOCK_M)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 0:
        _epilogue(gate, up, q_ptr, s_ptr, y_ptr, cnt_ptr, pid_n, pid_m, offs_m, M, I, OUT_DTYPE, G, GROUP_TILES,
                  BLOCK_N, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
    else:
        mn = M.to(tl.int64) * 2 * I
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # the gate partials' columns; the up ones' are I further
        mask = (offs_m[None, :] < M) & (cols < I)[:, None]
        p_ptrs = p_ptr + offs_m.to(tl.int64)[None, :] * (2 * I) + cols[:, None]
        tl.store(p_ptrs + pid_s * mn, gate, mask=mask)
        tl.store(p_ptrs + I + pid_s * mn, up, mask=mask)
        tile = pid_m * tl.num_programs(0) + pid_n
        if _last_split(cnt_ptr, tile):
            gate_sum = _sum_partials(p_ptrs, mask, mn, BLOCK_N, BLOCK_M)
            up_sum = _sum_partials(p_ptrs + I, mask, mn, BLOCK_N, BLOCK_M)
            tl.store(cnt_ptr + tile, 0)  # ready for the next launch
            _epilogue(gate_sum, up_sum, q_ptr, s_ptr, y_ptr, cnt_ptr, pid_n, pid_m, offs_m, M, I, OUT_DTYPE, G,
                      GROUP_TILES, BLOCK_N, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def unsupported(i: int, group_size: int, config: SmallMConfig) -> str | None:
    """Why the fused launch cannot take this shape / config (None when it can)."""
    if group_size not in (32, 64, 128) or i % group_size:
        return f"output group {group_size} must be 32, 64 or 128 and divide I={i}"
    if config.block_n < 16:  # the MMA's M operand is the 2 * block_n gate and up rows
        return f"block_n {config.block_n} must be at least 16"
    if config.block_n % group_size and group_size % config.block_n:
        return f"block_n {config.block_n} is neither a multiple nor a divisor of the output group {group_size}"
    if config.fma or config.reduce != "last" and config.split_k > 1:
        return "the fused epilogue needs tensor cores and, with split-K, the in-launch sum ('last')"
    if config.tma and config.k_unroll != 1:
        return "with tma the gate and up tiles are loaded one K tile per step (k_unroll 1)"
    if not config.swap and not config.tma:
        return "with swap False the gate and up tiles come by TMA (tma True)"
    return None


def _descriptors(q, w_gate, w_up, config: SmallMConfig, block_m: int, block_k: int) -> tuple:
    """TMA descriptors of ``q``, gate and up for ``config.tma``, or the tensors themselves where the launch
    cannot take them (no TMA on this GPU, a layout TMA cannot address): then the tiles load through pointers,
    with the same result bit for bit."""
    if not tma_usable(config, q, w_gate, w_up):
        return q, w_gate, w_up
    weights = [TensorDescriptor(w, list(w.shape), list(w.stride()), [config.block_n, block_k]) for w in (w_gate, w_up)]
    return TensorDescriptor(q, list(q.shape), list(q.stride()), [block_m, block_k]), *weights


def small_m_mm_silu_quant(q, x_scale, w_gate, s_gate, w_up, s_up, out_dtype, group_size: int,
                          config: SmallMConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``silu_mul_group_quant(cat([q @ w_gate^T, q @ w_up^T], -1) in out_dtype, group_size)`` in one launch:
    ``(q_out [M, I] fp8, scale [M, I / group_size] fp32)``. Inputs validated by the caller (``checks.py``); gate and
    up share a row stride and scale strides. Raises ``ValueError`` for a shape or config it cannot take; returns
    None when split-K has no ticket counters now (``tile_counters``): the caller then runs the unfused pair."""
    m, k = q.shape
    i = w_gate.shape[0]
    reason = unsupported(i, group_size, config)
    if reason is None and (w_up.shape[0] != i or w_up.stride() != w_gate.stride() or s_up.stride() != s_gate.stride()):
        reason = "gate and up must have one shape and the same strides"
    if reason is not None:
        raise ValueError(f"small-M SiLU-quant GEMM: {reason}")
    dev = q.device
    fp8 = _arch.arch_of(dev).fp8_dtype
    q_out = torch.empty((m, i), dtype=fp8, device=dev)
    s_out = torch.empty((m, i // group_size), dtype=torch.float32, device=dev)
    if m == 0 or i == 0:
        return q_out, s_out
    group_k = k // x_scale.shape[1]
    block_k = promotion_block(group_k)
    if not config.swap and not tma_usable(config, q, w_gate, w_up):  # no descriptors: the swap-AB tile instead
        config = dataclasses.replace(config, swap=True, block_m=0)
    split, per_split, unroll = split_plan(k // block_k, config.split_k, config.k_unroll)
    block_m = small_m_block_m(m, cap=config.block_m, swap=config.swap)
    grid = (triton.cdiv(i, config.block_n), split, triton.cdiv(m, block_m))
    group_tiles = max(1, group_size // config.block_n)
    tiles = grid[0] * grid[2]
    tickets = split > 1 or group_tiles > 1
    counters = tile_counters(dev, tiles + (tiles // group_tiles if group_tiles > 1 else 0)) if tickets else None
    if tickets and counters is None:  # no counters: the first call is inside a capture, or too many tiles
        return None
    partials = torch.empty((split, m, 2 * i), dtype=torch.float32, device=dev) if split > 1 else s_out
    values = torch.empty((m, i), dtype=torch.float32, device=dev) if group_tiles > 1 else s_out
    pdl = _pdl.pdl_enabled(dev)
    descs = _descriptors(q, w_gate, w_up, config, block_m, block_k)
    _small_m_silu_quant_kernel[grid](
        q, w_gate, w_up, q_out, s_out, partials, values, s_out if counters is None else counters, x_scale, s_gate, s_up,
        *descs, m, i, k, q.stride(0), w_gate.stride(0), *x_scale.stride(), *s_gate.stride(), per_split,
        GROUP_K=group_k, SCALE_BLOCK=SCALE_BLOCK, OUT_DTYPE=_TL_DTYPES[out_dtype], G=group_size,
        GROUP_TILES=group_tiles,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k, K_UNROLL=unroll, MODE=0 if split == 1 else 2,
        **kernel_constexprs(dev), PDL=pdl, TMA=descs[0] is not q, SWAP=config.swap, num_warps=config.warps,
        num_stages=config.stages,
        **_pdl.launch_kwargs(pdl),
    )  # fmt: skip
    return q_out, s_out
