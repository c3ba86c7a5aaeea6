"""Triton block-FP8 GEMV for M <= ``GEMV_MAX_M``: many small programs that each stream a few whole weight rows.

Why: the swap-AB small-M GEMM took 5.5 / 8.3 / 10.5 us for the 4 / 16 / 25 MB k|v, o and qkv weights at M = 1
(H200), 4-5 us over their rooflines, where an empty launch costs 0.6 us in the same harness
(``benchmarks/launch_floor.py``). A streaming-read kernel is the recipe: 4-8 programs per SM, each issuing its
loads at once and reducing them, no split-K partials and no second launch. Measured (``benchmarks/gemm.py --ms
1,4``): 1-14% faster than the small-M GEMM at M = 1 on 13 of 16 shapes, 1.7-2.3x slower at M = 4.

Here each program owns ``rows`` output columns and the whole K: it loads ``[rows, k_chunk]`` fp8 weight tiles
(16-byte loads along the row), multiplies them by the activation row(s) in fp32, sums each 128-value block and
promotes it by the weight-scale x activation-scale pair, as every path computes (``reference.blockscale_mm``:
fp32 accumulation, per-128-K promotion; the order of the sums within a block differs from the MMA's, so the
result is within the GEMM tolerance of the others, not bitwise equal). With N = 4096 and ``rows`` 4 that is 1024
programs, ~8 per SM, each with a few KB in flight: parallel programs, not a deep pipeline, hide the latency.
Activation groups of 128 only (one scale per weight block); M rows are a static loop reusing the weight tile.

Configs: the first sweep (``benchmarks/gemm.py``'s ``SWEEP_GEMV``: 2-8 rows, 512 / 1024-value chunks, 4 warps)
chose 8 x 1024 or 8 x 512 on most shapes. The wide sweep (``--gemv-wide``, 80 configs with 2 / 8 warps, 256 /
2048-value chunks and 16 rows; H200, 2026-12-03) found 4 rows x 2048 values on 2 warps best on most shapes,
2-22% faster than those rows, within 0.89-1.04x a plain read of the weight at M = 1 (``blockscale_mm.TABLE``,
GEMV_WIDE). Why, by offline sm_90 compiles (Triton 3.6, ``cuobjdump -res-usage``): 4 x 2048 on 2 warps takes 206
registers per thread, so 4 programs fit per SM by registers, each with an 8 KB chunk in flight: 32 KB per SM,
where 8 x 1024 on 4 warps (198 registers, 2 programs) kept 16 KB. The bytes in flight per SM, set by registers
per program, are what the streaming read needed (not profiled beyond that).

Grouped (``gemv_mm_grouped``, ``GROUPS`` 2-3): HF's separate q / k / v or gate / up weights in one launch, each
read in place. Every weight but the last holds a whole number of ``rows`` rows, so a program's rows lie in one
weight: it picks that weight's pointers once and runs the loop above, each row summed as ``gemv_mm`` sums it.
Measured on the H200 (``benchmarks/grouped_gemm.py``): 0.99-1.01x the merged weight's GEMV at one row.

Ruled out (probe d9fc647, withdrawn): loading the weight chunks one or two steps ahead of the one being summed
(loop-carried fp8 tiles, 1 register byte per byte in flight, where the summed fp32 chunk costs ~12). Offline sm_90
compiles (Triton 3.6) put the committed rows 8 x 1024 at 198 registers, 2 programs per SM, 16 KB in flight per SM
between sums; predicted: more bytes in flight, closer to the read floor. Measured (``benchmarks/gemm.py --ms 1
--small-only`` with 1 / 2 chunks ahead beside the plain sweep, H200, 16 shapes): the best chunks-ahead config was
1.13-1.32x slower than the best plain one at 14 shapes and 1.00-1.03x at the two 1024-row k|v weights.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ._blockscale_kernels import SCALE_BLOCK
from ._fp8 import group_quant_tile, kernel_constexprs, round_to, to_fp32

GEMV_MAX_M = 4


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    rows: int = 4  # output columns (weight rows) per program
    k_chunk: int = 1024  # K values per load step (a multiple of 128)
    warps: int = 4
    stages: int = 1  # num_stages of the K loop (Triton may pipeline its loads)

    def __post_init__(self):
        if self.rows < 1 or self.rows & (self.rows - 1) or self.k_chunk % SCALE_BLOCK or self.k_chunk & (
                self.k_chunk - 1):
            raise ValueError(f"GemvConfig: rows and k_chunk must be powers of two, k_chunk >= 128; got {self}")


@triton.jit
def _weight_chunk(b_ptr, bs_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK: tl.constexpr,
                  SCALE_BLOCK: tl.constexpr):  # fmt: skip
    """Weight rows ``rn`` (int64), K values ``[k0, k0 + K_CHUNK)``, in fp32, and their scales
    ``[ROWS, K_CHUNK / 128]``; K beyond the end reads 0."""
    offs_k = tl.arange(0, K_CHUNK)
    k_ok = (k0 + offs_k) < K
    w = tl.load(b_ptr + rn[:, None] * stride_bn + (k0 + offs_k)[None, :], mask=k_ok[None, :], other=0.0)
    kb = k0 // SCALE_BLOCK + tl.arange(0, K_CHUNK // SCALE_BLOCK)
    ws = tl.load(bs_ptr + (rn // SCALE_BLOCK)[:, None] * stride_bsn + kb[None, :] * stride_bsk,
                 mask=(kb < K // SCALE_BLOCK)[None, :], other=0.0)  # fmt: skip
    return w.to(tl.float32), ws


@triton.jit
def _x_chunk(a_ptr, as_ptr, m, k0, K, stride_am, stride_asm, stride_ask, K_CHUNK: tl.constexpr,
             SCALE_BLOCK: tl.constexpr, QUANT_A: tl.constexpr, fp8_dtype: tl.constexpr, FP8_MAX: tl.constexpr,
             FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
             PTX: tl.constexpr):  # fmt: skip
    """Activation row ``m``'s K values ``[k0, k0 + K_CHUNK)`` as fp8 values in fp32, and their scales
    ``[K_CHUNK / 128]``: loaded, or (QUANT_A) quantized here from the bf16 / fp16 / fp32 row in groups of 128 with
    ``group_quant_tile``, the steps of the group-quant kernel (so bit for bit its q and scales)."""
    offs_k = tl.arange(0, K_CHUNK)
    k_ok = (k0 + offs_k) < K
    if QUANT_A:  # a K tail beyond K loads 0: its groups get the floor scale and zeros, times zero weights
        y = to_fp32(tl.load(a_ptr + m * stride_am + k0 + offs_k, mask=k_ok, other=0.0), EMULATE_CAST)
        q, scale = group_quant_tile(tl.reshape(y, (1, K_CHUNK // SCALE_BLOCK, SCALE_BLOCK)), fp8_dtype, FP8_MAX,
                                    FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
        x = tl.reshape(q.to(tl.float32), (K_CHUNK,))
        xs = tl.reshape(scale, (K_CHUNK // SCALE_BLOCK,))
    else:
        kb = k0 // SCALE_BLOCK + tl.arange(0, K_CHUNK // SCALE_BLOCK)
        x = tl.load(a_ptr + m * stride_am + k0 + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        xs = tl.load(as_ptr + m * stride_asm + kb * stride_ask, mask=kb < K // SCALE_BLOCK, other=0.0)
    return x, xs  # one return: see _small_m_kernels._x_tile


@triton.jit
def _chunk_dot(w, ws, x, xs, ROWS: tl.constexpr, K_CHUNK: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """``[ROWS]``: each row's sum over the chunk, each 128-value block's sum promoted by its scale pair."""
    blocks = tl.sum(tl.reshape(w * x[None, :], (ROWS, K_CHUNK // SCALE_BLOCK, SCALE_BLOCK)), 2)
    return tl.sum(blocks * ws * xs[None, :], 1)


# M and N vary per call: no divisibility specialization for them.
@triton.jit(do_not_specialize=["M", "N", "N1", "N2"])
def _gemv_kernel(
    a_ptr,  # q [M, K] fp8, K contiguous
    b_ptr,  # w_q [N, K] fp8, K contiguous (GROUPS > 1: the first weight, [N1, K])
    c_ptr,  # out [M, N], row stride stride_cm
    as_ptr,  # activation scales [M, K / 128]
    bs_ptr,  # weight scales [ceil(N / 128), K / 128]
    b2_ptr, b3_ptr, bs2_ptr, bs3_ptr,  # GROUPS > 1: the other weights and their scales, strides as the first's
    M, N, K,
    N1, N2,  # GROUPS > 1: the first weights' rows, multiples of ROWS (N: all of them)
    stride_am, stride_bn, stride_cm, stride_asm, stride_ask, stride_bsn, stride_bsk,
    ROWS: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    QUANT_A: tl.constexpr,  # a_ptr is the high-precision activation, quantized here (as_ptr unused)
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
    GROUPS: tl.constexpr = 1,  # weights in this launch (HF's q / k / v); each program's rows lie in one of them
):  # fmt: skip
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    if GROUPS > 1:  # the weight holding this program's rows: its pointers, its first output column, its rows
        row0 = tl.program_id(0) * ROWS
        in2 = row0 >= N1
        in3 = row0 >= N1 + N2  # never with two weights (N2 = N - N1)
        b_ptr = tl.where(in3, b3_ptr, tl.where(in2, b2_ptr, b_ptr))
        bs_ptr = tl.where(in3, bs3_ptr, tl.where(in2, bs2_ptr, bs_ptr))
        first = tl.where(in3, N1 + N2, tl.where(in2, N1, 0))
        c_ptr += first
        rn -= first
        N = tl.where(in3, N - N1 - N2, tl.where(in2, N2, N1))
    rn_ok = rn < N
    rn = tl.minimum(rn, N - 1).to(tl.int64)  # out-of-range rows read row N - 1; their stores are masked
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, K_CHUNK):
        w, ws = _weight_chunk(b_ptr, bs_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK, SCALE_BLOCK)
        for m in tl.static_range(BLOCK_M):
            x, xs = _x_chunk(a_ptr, as_ptr, tl.minimum(m, M - 1), k0, K, stride_am, stride_asm, stride_ask,
                             K_CHUNK, SCALE_BLOCK, QUANT_A, b_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST, PTX)  # fmt: skip
            part = _chunk_dot(w, ws, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)
            acc = tl.where(offs_m[None, :] == m, acc + part[:, None], acc)
    c_ptrs = c_ptr + offs_m[None, :] * stride_cm + rn[:, None]
    tl.store(c_ptrs, round_to(acc, c_ptr.dtype.element_ty, EMULATE_CAST),
             mask=rn_ok[:, None] & (offs_m < M)[None, :])  # fmt: skip


def unsupported(m: int, k: int, group: int) -> str | None:
    """Why the GEMV cannot take this GEMM (None when it can)."""
    if m > GEMV_MAX_M:
        return f"the GEMV takes M <= {GEMV_MAX_M}, got M={m}"
    if group != SCALE_BLOCK or k % SCALE_BLOCK:
        return f"the GEMV takes activation groups of {SCALE_BLOCK} and K % {SCALE_BLOCK} == 0 (group {group}, K={k})"
    return None


def _launch(a, a_scale, w_qs, w_scales, out_dtype, config: GemvConfig, quant_a: bool) -> torch.Tensor:
    m, k = a.shape
    ns = [w.shape[0] for w in w_qs]
    n = sum(ns)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    groups = len(w_qs)
    # the second and third weight slots (b2, b3, then their scales); a slot with no weight repeats the first, unread
    more = [*w_qs[1:], *[w_qs[0]] * (3 - groups), *w_scales[1:], *[w_scales[0]] * (3 - groups)]
    n2 = ns[1] if groups > 2 else n - ns[0]  # with two weights the second holds the rest
    _gemv_kernel[(triton.cdiv(n, config.rows),)](
        a, w_qs[0], out, a_scale, w_scales[0], *more, m, n, k, ns[0], n2,
        a.stride(0), w_qs[0].stride(0), out.stride(0), *a_scale.stride(), *w_scales[0].stride(),
        ROWS=config.rows, K_CHUNK=config.k_chunk, BLOCK_M=triton.next_power_of_2(m), SCALE_BLOCK=SCALE_BLOCK,
        QUANT_A=quant_a, **kernel_constexprs(a.device), GROUPS=groups, num_warps=config.warps,
        num_stages=config.stages,
    )  # fmt: skip
    return out


def grouped_unsupported(w_qs, w_scales, config: GemvConfig) -> str | None:
    """Why one GEMV launch cannot read these weights in place (None when it can): at most three, one layout, and
    every weight but the last a whole number of ``config.rows`` rows (a program's rows lie in one weight)."""
    if not 1 <= len(w_qs) <= 3:
        return f"the GEMV takes 1 to 3 weights, got {len(w_qs)}"
    if len({w.stride() for w in w_qs}) != 1 or len({s.stride() for s in w_scales}) != 1:
        return "the weights (or their scales) are laid out differently (strides)"
    if any(w.shape[0] % config.rows for w in w_qs[:-1]):
        return f"a weight before the last has rows that are not a multiple of the config's {config.rows}"
    return None


def gemv_mm(q, x_scale, w_q, w_scale, out_dtype, config: GemvConfig | None = None) -> torch.Tensor:
    """``blockscale_mm`` for M <= GEMV_MAX_M (inputs validated by ``checks.py``); ValueError where it cannot."""
    m, k = q.shape
    reason = unsupported(m, k, k // x_scale.shape[1])
    if reason is not None:
        raise ValueError(f"blockscale GEMV: {reason}")
    return _launch(q, x_scale, [w_q], [w_scale], out_dtype, config or GemvConfig(), False)


def gemv_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype, config: GemvConfig) -> torch.Tensor:
    """``cat([gemv_mm(q, x_scale, w, s, out_dtype, config) for w, s in zip(w_qs, w_scales)], -1)`` in one launch,
    each weight read in place, bit for bit (each row summed as ``gemv_mm`` sums it at ``config``). Inputs validated
    by the caller (``checks.py``); ValueError where it cannot (``unsupported``, ``grouped_unsupported``)."""
    m, k = q.shape
    reason = unsupported(m, k, k // x_scale.shape[1]) or grouped_unsupported(w_qs, w_scales, config)
    if reason is not None:
        raise ValueError(f"blockscale GEMV (grouped): {reason}")
    return _launch(q, x_scale, list(w_qs), list(w_scales), out_dtype, config, False)


def gemv_mm_bf16(x, w_q, w_scale, out_dtype, config: GemvConfig | None = None) -> torch.Tensor:
    """``blockscale_mm(*group_quant(x, 128), w_q, w_scale)`` for M <= GEMV_MAX_M in one launch: every program
    quantizes the activation row(s) itself, chunk by chunk (at M <= 4 a few KB read from L2 per program), so no
    group-quant launch runs before it. Bit for bit ``gemv_mm`` at the same config on ``group_quant(x, 128)``.
    ``x [M, K]`` bf16 / fp16 / fp32, K contiguous (validated by the caller); ValueError where it cannot."""
    m, k = x.shape
    reason = unsupported(m, k, SCALE_BLOCK)
    if reason is not None:
        raise ValueError(f"blockscale GEMV: {reason}")
    return _launch(x, w_scale, [w_q], [w_scale], out_dtype, config or GemvConfig(), True)  # a_scale unused
