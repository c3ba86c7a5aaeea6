"""Triton block-FP8 GEMV (M <= ``GEMV_MAX_M``) for the gate/up projection, with the SiLU-and-mul and the 1 x G
group quant of its output in the same launch.

    before: gemv_mm(q, s, W_gate_up) [M, 2I] bf16  ->  silu_mul_group_quant(y, G)  (two launches)
    after:  one launch, the bf16 y never written

Why: at batch 1 the gate/up GEMM is the GEMV (``_gemv_kernels.py``, the TABLE's M = 1 choice on the 8B shapes),
and the swap-AB epilogue kernel (``_small_m_silu_kernels.py``) is 3-8% slower than the GEMV alone there, so the
silu-quant stayed a launch of its own (~1.3 us of a ~90 us layer in a CUDA graph, H200).

Each program owns ``rows`` output columns: their gate weight rows and their up weight rows, over the whole K, each
summed exactly as ``_gemv_kernel`` sums a row (``_weight_chunk``, ``_x_chunk``, ``_chunk_dot``: the same tiles,
the same reductions). Then ``_silu_mul`` rounds gate and up to the out dtype and applies ``silu_and_mul``'s steps.
A quant group of G columns spans ``G / rows`` programs: each stores its fp32 silu_and_mul values to a [M, I]
workspace and takes a ticket on its group's counter (``_last_arrival``: stores -> CTA barrier -> acq_rel
gpu-scope atomic), and the last of them reloads the group from L2 and quantizes it with ``_quant_store``, the
steps of every quant kernel. The amax is a max, exact in any order. So against ``gemv_mm`` on the merged weight
at the same config, then ``silu_mul_group_quant``, the result is bit for bit the same (the roundings of the GEMV's
store are done in registers by ``round_to``: the hardware's round-to-nearest-even either way).
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
from ._small_m_kernels import _last_arrival, persistent_zeros, tile_counters
from ._small_m_silu_kernels import _TL_DTYPES, _quant_store, _silu_mul

TAG = tl.constexpr(1 << 32)  # a slot word's high half once its value is written (``_tagged``); a zeroed slot is empty
TAG_SLOTS = 1 << 17  # slot words per device (1 MiB): M x I up to 4 x 32768


@triton.jit
def _weight_rows_chunk(w_rows, s_rows, k0, K, stride_bsk, K_CHUNK: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """``_gemv_kernels._weight_chunk`` for rows given by their start pointers ``w_rows`` (and their scale rows')."""
    offs_k = tl.arange(0, K_CHUNK)
    k_ok = (k0 + offs_k) < K
    w = tl.load(w_rows[:, None] + (k0 + offs_k)[None, :], mask=k_ok[None, :], other=0.0)
    kb = k0 // SCALE_BLOCK + tl.arange(0, K_CHUNK // SCALE_BLOCK)
    ws = tl.load(s_rows[:, None] + kb[None, :] * stride_bsk, mask=(kb < K // SCALE_BLOCK)[None, :], other=0.0)
    return w.to(tl.float32), ws


@triton.jit
def _tagged(y):
    """fp32 values -> int64 slot words: the value's bits in the low half, ``TAG`` in the high half."""
    return (y.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | TAG


@triton.jit
def _store_slots(ptrs, words, ok, PTX: tl.constexpr):
    """Each word in one 8-byte store. On NVIDIA a relaxed gpu-scope store: single-copy atomic and morally strong, so
    a reader's volatile load sees either the empty slot or the whole word. Elsewhere (the interpreter) a plain store."""
    if PTX:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.relaxed.gpu.global.b64 [$1], $2; }"
                                  " mov.u32 $0, 0;", "=r,l,l,r", [ptrs, words, ok.to(tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)  # fmt: skip
    else:
        tl.store(ptrs, words, mask=ok)


# M varies per call: no divisibility specialization for it.
@triton.jit(do_not_specialize=["M"])
def _gemv_silu_quant_kernel(
    a_ptr,  # q [M, K] fp8, K contiguous
    bg_ptr, bu_ptr,  # gate / up weights [I, K] fp8, K contiguous, row stride stride_bn (both)
    q_ptr, s_ptr,  # out: q [M, I] fp8, scale [M, I / G] fp32, contiguous
    y_ptr,  # the group's values (GROUP_TILES > 1): int64 slot words [M, I] (TAGGED, zero between launches), or
            # fp32 [M, I]
    cnt_ptr,  # int32 [I / G] ticket counters (GROUP_TILES > 1, not TAGGED), zero before and after the launch
    as_ptr,  # activation scales [M, K / 128]
    bgs_ptr, bus_ptr,  # gate / up weight scales [I / 128, K / 128], strides stride_bsn, stride_bsk (both)
    M, I, K,
    stride_am, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk,
    OUT_DTYPE: tl.constexpr,  # the GEMM's output dtype: the rounding of gate, up and each silu_and_mul step
    G: tl.constexpr,  # the output quant's group
    GROUP_TILES: tl.constexpr,  # programs per quant group (G / ROWS), or 1 where ROWS is a multiple of G
    TAGGED: tl.constexpr,  # GROUP_TILES > 1: the group's last program waits for tagged slot words, else a ticket
    ROWS: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rn = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # I % ROWS == 0 (unsupported): every row is in range
    offs_m = tl.arange(0, BLOCK_M)
    # The gate rows then the up rows, one [2 ROWS, K_CHUNK] tile: the plain GEMV's loop at 2 ROWS rows (one load
    # and one dot per chunk; as two [ROWS] tiles it ran 1.4-9% slower on the H200: docs/benchmarks.md, "The SiLU-
    # quant GEMV without its ticket"). Each row is summed exactly as _gemv_kernel sums it at 2 ROWS.
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
        group = pid // GROUP_TILES
        g0 = group * G
        group_ptrs = y_ptr + rows + (g0 + tl.arange(0, G))[:, None]  # [G, BLOCK_M]
        if TAGGED:
            # No ticket: each program stores its values as tagged words and leaves; the group's last program
            # (programs start in index order, so the group's others are running or done) reads the group until
            # every word is tagged, then empties the slots for the next launch. A ticket's round trip held every
            # program 1-5 us on the H200 before it could leave. Each slot is written once per launch, and emptied
            # only after its word was seen, so no late write can leave a tag for the next launch.
            _store_slots(y_ptr + rows + rn[:, None], _tagged(y), ok_m & (rn[:, None] >= 0), PTX)
            if pid % GROUP_TILES == GROUP_TILES - 1:
                words = tl.load(group_ptrs, mask=ok_m, other=TAG, volatile=True)
                while tl.min((words >> 32).to(tl.int32)) == 0:
                    words = tl.load(group_ptrs, mask=ok_m, other=TAG, volatile=True)
                yg = (words & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
                _quant_store(yg, q_ptr, s_ptr, g0, offs_m, M, I, G, G, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST, PTX)  # fmt: skip
                tl.store(group_ptrs, tl.zeros((G, BLOCK_M), dtype=tl.int64), mask=ok_m)
        else:
            tl.store(y_ptr + rows + rn[:, None], y, mask=ok_m)
            if _last_arrival(cnt_ptr, group, GROUP_TILES):
                # .cg: from L2, never a stale L1 line of the other programs' values
                yg = tl.load(group_ptrs, mask=ok_m, other=0.0, cache_modifier=".cg")
                _quant_store(yg, q_ptr, s_ptr, g0, offs_m, M, I, G, G, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST, PTX)  # fmt: skip
                tl.store(cnt_ptr + group, 0)  # ready for the next launch


def tagged_slots(device: torch.device) -> bool:
    """Does a quant group over several programs meet in tagged slot words (NVIDIA, where the relaxed 8-byte store
    is PTX; and the interpreter, whose programs run one after another) rather than by a ticket (elsewhere)?"""
    return kernel_constexprs(device)["PTX"] or device.type == "cpu"


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
    constexprs = kernel_constexprs(dev)
    group_tiles = max(1, group_size // config.rows)
    tagged = tagged_slots(dev)
    values = counters = None
    if group_tiles > 1 and tagged:
        values = persistent_zeros(dev, "gemv_silu_slots", TAG_SLOTS, torch.int64) if m * i <= TAG_SLOTS else None
    elif group_tiles > 1:
        counters = tile_counters(dev, i // group_size)
        values = torch.empty((m, i), dtype=torch.float32, device=dev) if counters is not None else None
    if group_tiles > 1 and values is None:  # the first call is inside a capture, or too many groups / slots
        return None
    _gemv_silu_quant_kernel[(i // config.rows,)](
        q, w_gate, w_up, q_out, s_out, s_out if values is None else values, s_out if counters is None else counters,
        x_scale, s_gate, s_up, m, i, k, q.stride(0), w_gate.stride(0), *x_scale.stride(), *s_gate.stride(),
        OUT_DTYPE=_TL_DTYPES[out_dtype], G=group_size, GROUP_TILES=group_tiles, TAGGED=tagged, ROWS=config.rows,
        K_CHUNK=config.k_chunk, BLOCK_M=triton.next_power_of_2(m), SCALE_BLOCK=SCALE_BLOCK, **constexprs,
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return q_out, s_out
