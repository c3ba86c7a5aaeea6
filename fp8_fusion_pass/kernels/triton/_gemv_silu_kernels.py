"""Triton block-FP8 GEMV (M <= ``GEMV_MAX_M``) for the gate/up projection, with the SiLU-and-mul and the 1 x G
group quant of its output in the same launch.

    before: gemv_mm(q, s, W_gate_up) [M, 2I] bf16  ->  silu_mul_group_quant(y, G)  (two launches)
    after:  one launch, the bf16 y never written

Why: at batch 1 the gate/up GEMM is the GEMV (``_gemv_kernels.py``, the TABLE's M = 1 choice on the 8B shapes),
and the swap-AB epilogue kernel (``_small_m_silu_kernels.py``) is 3-8% slower than the GEMV alone there, so the
silu-quant stayed a launch of its own (~1.3 us of a ~90 us layer in a CUDA graph, H200).

Each program owns ``rows`` output columns: their gate weight rows and their up weight rows, loaded as one tile of
2 x ``rows`` rows over the whole K, each summed exactly as ``_gemv_kernel`` sums a row at 2 x ``rows`` rows per
program (``_x_chunk``, ``_chunk_dot``: the same tiles, the same reductions). Then ``_silu_mul`` rounds gate and up
to the out dtype and applies ``silu_and_mul``'s steps.
A quant group of G columns spans ``G / rows`` programs: each stores its fp32 silu_and_mul values to a [M, I]
workspace and takes a ticket on its group's counter (``_last_arrival``: stores -> CTA barrier -> acq_rel
gpu-scope atomic), and the last of them reloads the group from L2 and quantizes it with ``_quant_store``, the
steps of every quant kernel. The amax is a max, exact in any order. So against ``gemv_mm`` on the merged weight
at twice the config's rows, then ``silu_mul_group_quant``, the result is bit for bit the same (the roundings of
the GEMV's store are done in registers by ``round_to``: the hardware's round-to-nearest-even either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch as _arch
from ._blockscale_kernels import SCALE_BLOCK
from ._fp8 import kernel_constexprs
from ._gemv_kernels import GemvConfig, _chunk_dot, _x_chunk
from ._gemv_kernels import unsupported as _gemv_unsupported
from ._small_m_kernels import _last_arrival, tile_counters
from ._small_m_silu_kernels import _TL_DTYPES, _quant_store, _silu_mul


@triton.jit
def _weight_rows_chunk(w_rows, s_rows, k0, K, stride_bsk, K_CHUNK: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """``_gemv_kernels._weight_chunk`` for rows given by their start pointers ``w_rows`` (and their scale rows').
    A twin, not its base: written as ``_weight_chunk``'s body, it changed the plain GEMV's PTX (its address setup,
    Triton 3.6 offline compile), whose TABLE rows were timed on the code as it is."""
    offs_k = tl.arange(0, K_CHUNK)
    k_ok = (k0 + offs_k) < K
    w = tl.load(w_rows[:, None] + (k0 + offs_k)[None, :], mask=k_ok[None, :], other=0.0)
    kb = k0 // SCALE_BLOCK + tl.arange(0, K_CHUNK // SCALE_BLOCK)
    ws = tl.load(s_rows[:, None] + kb[None, :] * stride_bsk, mask=(kb < K // SCALE_BLOCK)[None, :], other=0.0)
    return w.to(tl.float32), ws


# M varies per call: no divisibility specialization for it.
@triton.jit(do_not_specialize=["M"])
def _gemv_silu_quant_kernel(
    a_ptr,  # q [M, K] fp8, K contiguous
    bg_ptr, bu_ptr,  # gate / up weights [I, K] fp8, K contiguous, row stride stride_bn (both)
    q_ptr, s_ptr,  # out: q [M, I] fp8, scale [M, I / G] fp32, contiguous
    y_ptr,  # fp32 silu_and_mul values [M, I] (GROUP_TILES > 1)
    cnt_ptr,  # int32 [I / G] ticket counters (GROUP_TILES > 1), zero before and after the launch
    as_ptr,  # activation scales [M, K / 128]
    bgs_ptr, bus_ptr,  # gate / up weight scales [I / 128, K / 128], strides stride_bsn, stride_bsk (both)
    M, I, K,
    stride_am, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk,
    OUT_DTYPE: tl.constexpr,  # the GEMM's output dtype: the rounding of gate, up and each silu_and_mul step
    G: tl.constexpr,  # the output quant's group
    GROUP_TILES: tl.constexpr,  # programs per quant group (G / ROWS), or 1 where ROWS is a multiple of G
    ROWS: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rn = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # I % ROWS == 0 (unsupported): every row is in range
    offs_m = tl.arange(0, BLOCK_M)
    # The gate rows then the up rows as one [2 ROWS, K_CHUNK] tile: the plain GEMV's loop at 2 ROWS rows, one load
    # and one dot per chunk. As two [ROWS] tiles the loop took 175-255 registers per thread where this one takes
    # 124-128 (sm_90, Triton 3.6) and ran up to 9% slower on the H200 (docs/benchmarks.md, "The SiLU-quant GEMV at
    # one row, again"). Each row is summed exactly as _gemv_kernel sums it at 2 ROWS rows.
    j = tl.arange(0, 2 * ROWS)
    r2 = (pid * ROWS + j % ROWS).to(tl.int64)
    up = j >= ROWS
    w_rows = tl.where(up, bu_ptr + r2 * stride_bn, bg_ptr + r2 * stride_bn)
    s_rows = tl.where(up, bus_ptr + (r2 // SCALE_BLOCK) * stride_bsn, bgs_ptr + (r2 // SCALE_BLOCK) * stride_bsn)
    acc = tl.zeros((2 * ROWS, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, K_CHUNK):
        w, ws = _weight_rows_chunk(w_rows, s_rows, k0, K, stride_bsk, K_CHUNK, SCALE_BLOCK)
        for m in tl.static_range(BLOCK_M):
            x, xs = _x_chunk(a_ptr, as_ptr, tl.minimum(m, M - 1), k0, K, stride_am, stride_asm, stride_ask,
                             K_CHUNK, SCALE_BLOCK, False, bg_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST, PTX)  # fmt: skip
            part = _chunk_dot(w, ws, x, xs, 2 * ROWS, K_CHUNK, SCALE_BLOCK)
            acc = tl.where(offs_m[None, :] == m, acc + part[:, None], acc)
    acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (2, ROWS, BLOCK_M)), (1, 2, 0)))
    y = _silu_mul(acc_g, acc_u, OUT_DTYPE, EMULATE_CAST, PTX)  # [ROWS, BLOCK_M]
    if GROUP_TILES == 1:
        _quant_store(y, q_ptr, s_ptr, pid * ROWS, offs_m, M, I, G, ROWS, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                     EMULATE_CAST, PTX)  # fmt: skip
    else:
        rows = offs_m.to(tl.int64)[None, :] * I
        ok_m = (offs_m < M)[None, :]
        tl.store(y_ptr + rows + rn[:, None], y, mask=ok_m)
        group = pid // GROUP_TILES
        if _last_arrival(cnt_ptr, group, GROUP_TILES):
            g0 = group * G
            # .cg: from L2, never a stale L1 line of the other programs' values
            yg = tl.load(y_ptr + rows + (g0 + tl.arange(0, G))[:, None], mask=ok_m, other=0.0, cache_modifier=".cg")
            _quant_store(yg, q_ptr, s_ptr, g0, offs_m, M, I, G, G, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                         EMULATE_CAST, PTX)  # fmt: skip
            tl.store(cnt_ptr + group, 0)  # ready for the next launch


def unsupported(m: int, k: int, act_group: int, i: int, group_size: int, config: GemvConfig) -> str | None:
    """Why the fused GEMV cannot take this GEMM / config (None when it can)."""
    reason = _gemv_unsupported(m, k, act_group)
    if reason is not None:
        return reason
    if group_size not in (32, 64, 128) or i % group_size:
        return f"output group {group_size} must be 32, 64 or 128 and divide I={i}"
    if config.rows % group_size and group_size % config.rows:
        return f"rows {config.rows} is neither a multiple nor a divisor of the output group {group_size}"
    if i % config.rows:
        return f"rows {config.rows} must divide I={i}"
    return None


def gemv_silu_quant(q, x_scale, w_gate, s_gate, w_up, s_up, out_dtype, group_size: int,
                    config: GemvConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``silu_mul_group_quant(cat([q @ w_gate^T, q @ w_up^T], -1) in out_dtype, group_size)`` in one launch for
    M <= GEMV_MAX_M: ``(q_out [M, I] fp8, scale [M, I / group_size] fp32)``. Inputs validated by the caller
    (``checks.py``); gate and up share a row stride and scale strides. Raises ``ValueError`` for a shape or config
    it cannot take; returns None when the group tickets have no counters now (``tile_counters``): the caller then
    runs the unfused pair."""
    m, k = q.shape
    i = w_gate.shape[0]
    reason = unsupported(m, k, k // x_scale.shape[1], i, group_size, config)
    if reason is None and (w_up.shape[0] != i or w_up.stride() != w_gate.stride() or s_up.stride() != s_gate.stride()):
        reason = "gate and up must have one shape and the same strides"
    if reason is not None:
        raise ValueError(f"SiLU-quant GEMV: {reason}")
    dev = q.device
    q_out = torch.empty((m, i), dtype=_arch.arch_of(dev).fp8_dtype, device=dev)
    s_out = torch.empty((m, i // group_size), dtype=torch.float32, device=dev)
    if m == 0 or i == 0:
        return q_out, s_out
    group_tiles = max(1, group_size // config.rows)
    counters = tile_counters(dev, i // group_size) if group_tiles > 1 else None
    if group_tiles > 1 and counters is None:  # the first call is inside a capture, or too many groups
        return None
    values = torch.empty((m, i), dtype=torch.float32, device=dev) if group_tiles > 1 else s_out
    _gemv_silu_quant_kernel[(i // config.rows,)](
        q, w_gate, w_up, q_out, s_out, values, s_out if counters is None else counters, x_scale, s_gate, s_up,
        m, i, k, q.stride(0), w_gate.stride(0), *x_scale.stride(), *s_gate.stride(),
        OUT_DTYPE=_TL_DTYPES[out_dtype], G=group_size, GROUP_TILES=group_tiles, ROWS=config.rows,
        K_CHUNK=config.k_chunk, BLOCK_M=triton.next_power_of_2(m), SCALE_BLOCK=SCALE_BLOCK, **kernel_constexprs(dev),
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return q_out, s_out
