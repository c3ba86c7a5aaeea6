"""Decode attention over a static KV cache in one launch: split-KV flash decoding, GQA rows grouped per kv head.

    o [B, Hkv, R, D] = softmax(where(keep, scale * q @ k_cache^T, -inf)) @ v_cache      (``reference.decode_attention``)

``R`` is the query rows that share a kv head: G query heads x S tokens (the engine form's grouped decode query).

Why: written as plain torch (the engine form, HF's eager attention), a decode step's attention is a score GEMM,
a softmax and a value GEMM: three or four launches and the [B, Hkv, R, T] scores written and read twice. On the
H200 that took 8.8 us per layer at batch 1 and 51.6 us at batch 64 (Qwen3-8B heads, 576 cache slots;
``benchmarks/attention_decode.py``), against 0.5 / 31 us of cache bytes. SDPA's fused kernels were slower at batch
1-8 (19.7 us): they run one program per (batch, kv head), 8 programs at batch 1, each walking all keys.

One program per (batch row, kv head, key split): the split's keys in ``BLOCK_T`` tiles, online softmax in fp32
(running max, sum, and the [R, D] sum of p @ v), so the cache is read once and nothing [R, T]-sized is written.
With more than one split, each program writes its fp32 partial (acc, max, sum), takes a ticket on its (batch row,
kv head) counter (``_small_m_kernels._last_arrival``), and the program that arrives last merges the splits in split
order: the result does not depend on scheduling. ``decode_attention_upto`` (the mask a decode step builds,
``slot <= position``, given as the positions) reads no mask: the key loop ends at ``last[b]``, so a 4096-slot cache
at position 500 reads 501 keys, dealt out to the splits by tile (``SPLIT_VISIBLE``).

``decode_attention_tokens_quant`` (``TOKENS`` > 1, a step verifying draft tokens) takes q as ``[B, Hq, S, D]`` at any
strides and writes ``[B, S, Hq, D]``: row r of a kv head is head r // S at token r % S, each read and written at its
own strides (``_row_offsets``), and each row's key loop stops at its token's position, ``last[b, r % S]``, so the
graph's copies of q and of the output, its [B, 1, G x S, T] mask and the quant launch go.

``rope_decode_attention`` (``ROPE``, the ``rope_attention`` rewrite) starts from the step's q and k before RoPE:
each program RoPEs its kv head's query rows (with ``NORM`` each head RMS-normed first, Qwen3's q / k norms) and the
new k with ``rms_norm_rope``'s roundings, the program whose keys hold the new slot stores k and v there, and after a
barrier its key loop reads them back like any other slot (no other program of that kv head reads the slot; off
NVIDIA, with no barrier promised to order global memory, the loop takes them from registers and the stores come
after it: on NVIDIA that select made decode steps up to 1.10x slower, H200).

Numerics: scores are fp32 dot products of the bf16 / fp16 q and k (exact products, fp32 sums), times ``scale`` in
fp32; softmax in fp32; ``p`` is rounded to the value dtype for the p @ v MMA (fp32 sums), the division by the sum
and the final rounding happen once, at the end. The math form rounds the scores to bf16 (its score GEMM's output)
and the normalised probabilities to bf16; this kernel rounds neither the scores nor the sum, so it is closer to the
fp32 reference than the graph it replaces, not equal to it (the rewrite is off in deterministic mode). A row that
sees no key gives NaN, as softmax over nothing does.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import arch
from ._fp8 import group_quant_tile, kernel_constexprs, round_to, rounded, to_fp32
from ._small_m_kernels import _last_arrival, tile_counters
from .attention_configs import DEFAULT, TABLE, WIDE, AttentionConfig, config_for, launch_config  # noqa: F401

# (TABLE, WIDE and config_for: the configs live in attention_configs.py; callers may read them through here)
MAX_SPLITS = 16  # the merge unrolls over the splits
# The upto forms' splits: True deals the key tiles out in turn (split j takes tiles j, j + SPLITS, ... to the last
# key any row sees; a run of one tile each is the same bits), False gives each split a run of the T slots, as the
# mask form must, idle past ``last``. H100 (``issue7.sh visible``; docs/benchmarks.md, "Inside the attention
# launch"): 501 of 4096 slots 11.3 -> 10.0 us at batch 1, 15.1 -> 10.4 at 8, equal at 32 / 64 and 501 of 576 slots.
SPLIT_VISIBLE = True
ROPE_WIDE_ROWS = 0  # RoPE launches of <= this many rows take WIDE's configs (untimed; 32 rows spill on neither)


@triton.jit
def _mma_operand(x, EMULATE_CAST: tl.constexpr):
    """``x`` as the MMA takes it: as loaded on a GPU; widened to fp32 in the interpreter, whose bf16 is not
    numpy's (the products of bf16 values are exact in fp32 either way)."""
    if EMULATE_CAST:
        return to_fp32(x, EMULATE_CAST)
    return x


@triton.jit
def _mul(a, b, PTX: tl.constexpr):
    """RN_fp32(a * b) that no fma may absorb: ``mul.rn`` is never contracted (PTX); elsewhere the kernel is
    compiled without fp fusion (``_launch``)."""
    if PTX:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True,
                                         pack=1)  # fmt: skip
    return a * b


@triton.jit
def _row_offsets(rows, TOKENS: tl.constexpr, stride_head, stride_token):
    """Where row ``r`` of a kv head's tile lies: query head ``r // TOKENS`` of the kv head's group at token
    ``r % TOKENS`` (``decode_attention_tokens_quant``'s q and output keep heads and tokens apart); one token: row r
    at r times the row stride, as it was."""
    if TOKENS == 1:
        return rows * stride_head
    return (rows // TOKENS) * stride_head + (rows % TOKENS) * stride_token


@triton.jit
def _row(x, rows, i):
    """Row ``i`` of a 16-bit ``[N, D]`` tile, bit for bit: an integer sum of it and zeros (a float sum would make
    -0.0 into 0.0)."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32)
    return tl.sum(tl.where((rows == i)[:, None], bits, 0), 0).to(tl.int16).to(x.dtype, bitcast=True)


@triton.jit
def _owns(slot, lo, per, split, BLOCK_T: tl.constexpr, SPLITS: tl.constexpr, VISIBLE: tl.constexpr):
    """Whether this split stores the new token's k / v at ``slot``: the one whose keys hold it (its ``per`` slots
    from ``lo``; with ``VISIBLE`` its tiles, every SPLITS-th from ``split``), so each slot in the cache has one writer
    and no other program reads it."""
    if VISIBLE:
        return (slot // BLOCK_T) % SPLITS == split
    return (slot >= lo) & (slot < lo + per)


@triton.jit
def _roped(x, x_p, w, w_p, c, s, neg, eps, AXIS: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
           DTYPE: tl.constexpr, EMULATE_CAST: tl.constexpr, PTX: tl.constexpr):
    """``rms_norm_rope``'s steps on heads laid along ``AXIS`` (fp32 ``x``; ``x_p`` / ``w_p`` at each column's RoPE
    partner, ``neg`` where the partner's sign flips): with NORM ``w * (x * rstd)``, each product rounded as eager
    rounds it, then ``y * cos + rotate_half(y) * sin``, each product and the sum rounded; returned in DTYPE."""
    if NORM:
        var = tl.math.div_rn(tl.sum(_mul(x, x, PTX), AXIS, keep_dims=True), tl.cast(D, tl.float32))
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))
        x = rounded(_mul(w, rounded(_mul(x, rstd, PTX), DTYPE, EMULATE_CAST), PTX), DTYPE, EMULATE_CAST)
        x_p = rounded(_mul(w_p, rounded(_mul(x_p, rstd, PTX), DTYPE, EMULATE_CAST), PTX), DTYPE, EMULATE_CAST)
    rot = tl.where(neg, -x_p, x_p)
    return round_to(rounded(_mul(x, c, PTX), DTYPE, EMULATE_CAST) + rounded(_mul(rot, s, PTX), DTYPE, EMULATE_CAST),
                    DTYPE, EMULATE_CAST)  # fmt: skip


@triton.jit
def _store(o, o_ptrs, out_mask, s_ptrs, row_ok, q_ptr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
           EMULATE_CAST: tl.constexpr, QUANT: tl.constexpr, G: tl.constexpr, FP8_MAX: tl.constexpr,
           FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, PTX: tl.constexpr):
    """The fp32 output ``o [BLOCK_R, BLOCK_D]`` rounded to q's dtype; with ``QUANT`` then quantized per G columns
    from those rounded values (``group_quant``'s steps, so bit for bit the op followed by ``group_quant``)."""
    y = round_to(o, q_ptr.dtype.element_ty, EMULATE_CAST)
    if QUANT:  # D == BLOCK_D here (the op checks it): each row is D / G whole groups
        y = tl.where(row_ok[:, None], to_fp32(y, EMULATE_CAST), 0.0)  # rows past R: 0, as group_quant_tile needs
        q, scale = group_quant_tile(tl.reshape(y, [BLOCK_R, BLOCK_D // G, G]), o_ptrs.dtype.element_ty, FP8_MAX,
                                    FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
        tl.store(o_ptrs, tl.reshape(q, [BLOCK_R, BLOCK_D]), mask=out_mask)
        tl.store(s_ptrs[:, None] + tl.arange(0, BLOCK_D // G)[None, :], scale, mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, y, mask=out_mask)


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, keep_ptr, o_ptr, part_ptr, ml_ptr, cnt_ptr, s_ptr,
    HKV, R, T, keys_per_split, scale,
    sqb, sqh, sqr, sqd, skb, skh, skt, skd, svb, svh, svt, svd, smb, smh, smr, smt, sob, soh, sor, sod,
    # TOKENS > 1: q / output / scales rows are (head, token) pairs, the token's stride apart (``_row_offsets``)
    sq_s, so_s, ssb, ssh, ssr, ss_s,
    # ROPE (``rope_decode_attention``): q_ptr is the step's q before RoPE (one token: its [B, 1, Hq, D] as [B, Hkv,
    # R, D] strides), and the new token's k / v go into the caches at pos[b] from here (see the module docstring);
    # with TOKENS > 1 each token's table row, k / v row and position are its stride (``*_s``) apart
    wq_ptr, wk_ptr, kn_ptr, vn_ptr, cos_ptr, sin_ptr, pos_ptr,
    skn_b, skn_h, skn_d, svn_b, svn_h, svn_d, sc_b, sc_d, ss_b, ss_d, sp_b, eps, skn_s, svn_s, sc_s, ssin_s, sp_s,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
    SPLITS: tl.constexpr,  # programs per (batch row, kv head); above 1 they write partials, the last merges them
    UPTO: tl.constexpr,  # keep_ptr is last [B]: row b sees slots 0..last[b] (no mask read; the loop ends there)
    EMULATE_CAST: tl.constexpr,  # the interpreter: bf16 widened / rounded by hand, MMAs on the fp32 values
    QUANT: tl.constexpr,  # o_ptr is fp8 and s_ptr its scales [B, Hkv, R, D / G]: the output rounded, then quantized
    G: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, PTX: tl.constexpr,
    ROPE: tl.constexpr, NORM: tl.constexpr,  # NORM: each head RMS-normed first (Qwen3's q / k norms)
    NEW_FROM_REGISTERS: tl.constexpr,  # ROPE off NVIDIA: the new slot's k / v put into the loaded tiles (below)
    TOKENS: tl.constexpr,  # query tokens per row of heads; above 1 with UPTO, last is [B, S]: row r sees last[b, r % S]
    BLOCK_NEW: tl.constexpr,  # TOKENS rounded up to a power of two: ROPE's tile of the step's new k / v rows
    VISIBLE: tl.constexpr,  # UPTO: split the visible keys (0..last), not the cache's T slots (``SPLIT_VISIBLE``)
    MERGE_R: tl.constexpr,  # the rows the splits' merge runs on: R rounded up, at least one a warp, <= BLOCK_R
):  # fmt: skip
    pair = tl.program_id(0)
    split = tl.program_id(1)
    b = pair // HKV
    h = pair % HKV
    rows = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < R
    col_ok = cols < D
    q_rows = q_ptr + b * sqb + h * sqh + _row_offsets(rows, TOKENS, sqr, sq_s)[:, None]
    q = tl.load(q_rows + cols[None, :] * sqd, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    k_base = k_ptr + b * skb + h * skh
    v_base = v_ptr + b * svb + h * svh
    keep_base = keep_ptr + b * smb + h * smh + rows[:, None] * smr
    if VISIBLE:  # (UPTO) split j takes tiles j, j + SPLITS, ...: the seen ones shared out, however long the cache
        lo = split * BLOCK_T
        hi = T  # then the last key any row sees, below
    else:
        lo = split * keys_per_split
        hi = tl.minimum(lo + keys_per_split, T)
    # the last key before the prologue: its load overlaps the prologue's
    if UPTO and TOKENS == 1:
        last_b = tl.load(keep_ptr + b * smb)
        hi = tl.minimum(hi, (tl.minimum(last_b, T - 1) + 1).to(tl.int32))  # int64 positions: clamped, then narrowed
    if UPTO and TOKENS > 1:  # each row its token's last slot; the loop ends after the last any row sees
        last_r = tl.load(keep_ptr + b * smb + (rows % TOKENS) * smr, mask=row_ok, other=-1)
        hi = tl.minimum(hi, (tl.minimum(tl.max(last_r, 0), T - 1) + 1).to(tl.int32))
    if ROPE:  # D == BLOCK_D (the op checks it): column j's RoPE partner is j + D/2 mod D
        dtype = q_ptr.dtype.element_ty
        partner = (cols + D // 2) % D
        neg = cols < D // 2
        wq, wq_p, wk, wk_p = neg, neg, neg, neg  # unused without NORM
        if NORM:
            wq = to_fp32(tl.load(wq_ptr + cols), EMULATE_CAST)
            wq_p = to_fp32(tl.load(wq_ptr + partner), EMULATE_CAST)
            wk = to_fp32(tl.load(wk_ptr + cols), EMULATE_CAST)
            wk_p = to_fp32(tl.load(wk_ptr + partner), EMULATE_CAST)
        q_p = tl.load(q_rows + partner[None, :] * sqd, mask=row_ok[:, None], other=0.0)
        if TOKENS == 1:  # one table row for every q row, one new k / v row, one slot
            c = to_fp32(tl.load(cos_ptr + b * sc_b + cols * sc_d), EMULATE_CAST)
            s_ = to_fp32(tl.load(sin_ptr + b * ss_b + cols * ss_d), EMULATE_CAST)
            k_row = kn_ptr + b * skn_b + h * skn_h
            k_x, k_xp = tl.load(k_row + cols * skn_d), tl.load(k_row + partner * skn_d)
            v_new = tl.load(vn_ptr + b * svn_b + h * svn_h + cols * svn_d)
            # The new token's slot (negative counts from the end, as indexing does; outside [-T, T) nothing is
            # written). The program whose split holds it stores k / v there and reads them back in its key loop: no
            # other program of this (batch row, kv head) reads that slot, so no load can race the store.
            slot = tl.load(pos_ptr + b * sp_b).to(tl.int64)
            q = _roped(to_fp32(q, EMULATE_CAST), to_fp32(q_p, EMULATE_CAST), wq[None, :], wq_p[None, :], c[None, :],
                       s_[None, :], neg[None, :], eps, 1, D, NORM, dtype, EMULATE_CAST, PTX)  # fmt: skip
            k_new = _roped(to_fp32(k_x, EMULATE_CAST), to_fp32(k_xp, EMULATE_CAST), wk, wk_p, c, s_, neg, eps, 0, D,
                           NORM, dtype, EMULATE_CAST, PTX)  # fmt: skip
            slot = tl.where(slot < 0, slot + T, slot)
            mine = (slot >= 0) & (slot < T) & _owns(slot, lo, keys_per_split, split, BLOCK_T, SPLITS, VISIBLE)
            write = tl.where(mine, col_ok, False)  # (not col_ok & mine: the interpreter makes that int32, not a mask)
            k_dst = k_base + slot * skt + cols * skd
            v_dst = v_base + slot * svt + cols * svd
        else:  # S tokens: q row r takes its token's (r % S) table row; the kv head's S new k / v rows, S slots
            tok = (rows % TOKENS)[:, None]
            c = to_fp32(tl.load(cos_ptr + b * sc_b + tok * sc_s + cols[None, :] * sc_d), EMULATE_CAST)
            s_ = to_fp32(tl.load(sin_ptr + b * ss_b + tok * ssin_s + cols[None, :] * ss_d), EMULATE_CAST)
            q = _roped(to_fp32(q, EMULATE_CAST), to_fp32(q_p, EMULATE_CAST), wq[None, :], wq_p[None, :], c, s_,
                       neg[None, :], eps, 1, D, NORM, dtype, EMULATE_CAST, PTX)  # fmt: skip
            new = tl.arange(0, BLOCK_NEW)
            new_ok = new < TOKENS
            c = to_fp32(tl.load(cos_ptr + b * sc_b + new[:, None] * sc_s + cols[None, :] * sc_d,
                                mask=new_ok[:, None], other=0.0), EMULATE_CAST)  # fmt: skip
            s_ = to_fp32(tl.load(sin_ptr + b * ss_b + new[:, None] * ssin_s + cols[None, :] * ss_d,
                                 mask=new_ok[:, None], other=0.0), EMULATE_CAST)  # fmt: skip
            k_rows = kn_ptr + b * skn_b + h * skn_h + new[:, None] * skn_s
            k_new = _roped(to_fp32(tl.load(k_rows + cols[None, :] * skn_d, mask=new_ok[:, None], other=0.0),
                                   EMULATE_CAST),
                           to_fp32(tl.load(k_rows + partner[None, :] * skn_d, mask=new_ok[:, None], other=0.0),
                                   EMULATE_CAST),
                           wk[None, :], wk_p[None, :], c, s_, neg[None, :], eps, 1, D, NORM, dtype, EMULATE_CAST,
                           PTX)  # fmt: skip
            v_new = tl.load(vn_ptr + b * svn_b + h * svn_h + new[:, None] * svn_s + cols[None, :] * svn_d,
                            mask=new_ok[:, None], other=0.0)  # fmt: skip
            # each token's slot as the one token's above; its owner stores it (two tokens at one slot: either's,
            # as index_put_ with repeated indices leaves either)
            slot = tl.load(pos_ptr + b * sp_b + new * sp_s, mask=new_ok, other=T).to(tl.int64)
            slot = tl.where(slot < 0, slot + T, slot)
            mine = new_ok & (slot >= 0) & (slot < T) & _owns(slot, lo, keys_per_split, split, BLOCK_T, SPLITS, VISIBLE)
            write = tl.where(mine[:, None], col_ok[None, :], False)
            k_dst = k_base + slot[:, None] * skt + cols[None, :] * skd
            v_dst = v_base + slot[:, None] * svt + cols[None, :] * svd
        if not NEW_FROM_REGISTERS:
            tl.store(k_dst, k_new, mask=write)
            tl.store(v_dst, v_new, mask=write)
            # bar.sync: this program's stores are visible to all its threads before the key loop reads the slot
            # back (a select of the registers inside the loop, the first version, measured slower: the module
            # docstring). Off NVIDIA, where no barrier lowering promises that for global memory, the select it is,
            # and the stores come after the loop (not measured).
            tl.debug_barrier()
        new_at = tl.where(mine, slot, -1)
    q = _mma_operand(q, EMULATE_CAST)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for start in range(lo, hi, SPLITS * BLOCK_T if VISIBLE else BLOCK_T):
        t = start + tl.arange(0, BLOCK_T)
        t_ok = t < hi
        if UPTO and TOKENS == 1:
            keep = t_ok[None, :]  # hi is at most last + 1
        elif UPTO:
            keep = t_ok[None, :] & (t[None, :] <= last_r[:, None])
        else:
            keep = tl.load(keep_base + t[None, :] * smt, mask=row_ok[:, None] & t_ok[None, :], other=0) != 0
        # No branch around the loads (it would stop the loop's software pipelining): K and V are issued together.
        k = tl.load(k_base + t[None, :] * skt + cols[:, None] * skd, mask=col_ok[:, None] & t_ok[None, :],
                    other=0.0)  # [BLOCK_D, BLOCK_T]: k^T  # fmt: skip
        v = tl.load(v_base + t[:, None] * svt + cols[None, :] * svd, mask=t_ok[:, None] & col_ok[None, :],
                    other=0.0)  # fmt: skip
        if NEW_FROM_REGISTERS and TOKENS == 1:
            k = tl.where((t == new_at)[None, :], k_new[:, None], k)
            v = tl.where((t == new_at)[:, None], v_new[None, :], v)
        elif NEW_FROM_REGISTERS:  # token by token, in order (a later token's row wins a shared slot)
            for i in tl.static_range(TOKENS):
                at_i = tl.sum(tl.where(new == i, new_at, 0))
                k = tl.where((t == at_i)[None, :], _row(k_new, new, i)[:, None], k)
                v = tl.where((t == at_i)[:, None], _row(v_new, new, i)[None, :], v)
        s = tl.where(keep, tl.dot(q, _mma_operand(k, EMULATE_CAST)) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: every exp below is 0
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p_mma = _mma_operand(round_to(p, v.dtype, EMULATE_CAST), EMULATE_CAST)
        acc = acc * alpha[:, None] + tl.dot(p_mma, _mma_operand(v, EMULATE_CAST))
        m_i = m_new
    if ROPE and NEW_FROM_REGISTERS:  # the loop took the new k / v from registers: the cache gets them now
        tl.store(k_dst, k_new, mask=write)
        tl.store(v_dst, v_new, mask=write)
    if SPLITS == 1:  # a row that saw nothing: 0 / 0 = NaN, as softmax over nothing
        o_ptrs = o_ptr + b * sob + h * soh + _row_offsets(rows, TOKENS, sor, so_s)[:, None] + cols[None, :] * sod
        _store(acc / l_i[:, None], o_ptrs, row_ok[:, None] & col_ok[None, :],
               s_ptr + b * ssb + h * ssh + _row_offsets(rows, TOKENS, ssr, ss_s), row_ok, q_ptr,
               BLOCK_R, BLOCK_D, EMULATE_CAST, QUANT, G, FP8_MAX, FP8_MIN_EXP, FNUZ, PTX)  # fmt: skip
    else:
        part = part_ptr + pair * SPLITS * BLOCK_R * BLOCK_D + rows[:, None] * BLOCK_D + cols[None, :]
        ml = ml_ptr + pair * SPLITS * 2 * BLOCK_R
        tl.store(part + split * BLOCK_R * BLOCK_D, acc, mask=row_ok[:, None])  # the real rows: R of BLOCK_R
        tl.store(ml + split * 2 * BLOCK_R + rows, m_i)
        tl.store(ml + split * 2 * BLOCK_R + BLOCK_R + rows, l_i)
        if _last_arrival(cnt_ptr, pair, SPLITS):
            # Each split's max, sum and partial by row, in split order: elementwise, so no reduction (a barrier
            # each, as before the thirty-eighth session) stands between the splits' loads, and all of them come
            # before any is used. On MERGE_R rows, not the MMA's BLOCK_R: R rounded up, at least a row a warp (a
            # row's reductions in the quant stay in its warp); each row's arithmetic is the whole tile's, so the
            # same bits. Offline sm_90 SASS (Triton 3.6, 9 splits, 8 warps): on 16 rows half the partials' loads
            # waited behind the first exps, a second round trip to L2; on 8 every one is issued first at Qwen3's
            # heads (registers 107 -> 103) and 5 of 9 at Llama's (80 -> 78); 3 splits as before. Timed (H100):
            # the merge 17-26% shorter at 9 splits, Qwen3-32B's batch-1 step 23 us shorter, the same bits.
            mrows = tl.arange(0, MERGE_R)
            m_ok = mrows < R
            m_part = part_ptr + pair * SPLITS * BLOCK_R * BLOCK_D + mrows[:, None] * BLOCK_D + cols[None, :]
            ms, ls, parts = (), (), ()
            for i in tl.static_range(SPLITS):
                ms = ms + (tl.load(ml + i * 2 * BLOCK_R + mrows, cache_modifier=".cg"),)
                ls = ls + (tl.load(ml + i * 2 * BLOCK_R + BLOCK_R + mrows, cache_modifier=".cg"),)
                parts = parts + (tl.load(m_part + i * BLOCK_R * BLOCK_D, m_ok[:, None], 0.0, cache_modifier=".cg"),)
            m_all = tl.full([MERGE_R], float("-inf"), tl.float32)
            for i in tl.static_range(SPLITS):
                m_all = tl.maximum(m_all, ms[i])
            m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
            l_all = tl.zeros([MERGE_R], tl.float32)
            o = tl.zeros([MERGE_R, BLOCK_D], tl.float32)
            for i in tl.static_range(SPLITS):  # whichever program came last
                w_i = tl.exp(ms[i] - m_safe)
                l_all += w_i * ls[i]
                o += w_i[:, None] * parts[i]
            _store(o / l_all[:, None], o_ptr + b * sob + h * soh + _row_offsets(mrows, TOKENS, sor, so_s)[:, None]
                   + cols[None, :] * sod, m_ok[:, None] & col_ok[None, :],
                   s_ptr + b * ssb + h * ssh + _row_offsets(mrows, TOKENS, ssr, ss_s), m_ok, q_ptr,
                   MERGE_R, BLOCK_D, EMULATE_CAST, QUANT, G, FP8_MAX, FP8_MIN_EXP, FNUZ, PTX)  # fmt: skip
            tl.store(cnt_ptr + pair, 0)  # the counter is zero again for the next launch


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few splits, so CI runs the merge
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan(pairs: int, t: int, sms: int, cfg: AttentionConfig = DEFAULT) -> tuple[int, int]:
    """(splits, keys per split): enough programs for ``cfg.programs`` per SM (or ``cfg.splits``), each at least one
    ``BLOCK_T`` tile of keys, at most ``MAX_SPLITS``."""
    tiles = triton.cdiv(max(t, 1), cfg.block_t)
    want = cfg.splits or triton.cdiv(cfg.programs * sms, max(pairs, 1))
    splits = max(1, min(want, tiles, MAX_SPLITS))
    per = triton.cdiv(tiles, splits) * cfg.block_t
    return triton.cdiv(max(t, 1), per), per


def _partials(pairs: int, splits: int, block_r: int, block_d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's fp32 partials: ``acc [pairs, splits, BLOCK_R, BLOCK_D]`` and ``(max, sum) [pairs, splits, 2,
    BLOCK_R]`` (a split that saw no key leaves a sum of 0)."""
    return (torch.empty((pairs, splits, block_r, block_d), dtype=torch.float32, device=device),
            torch.empty((pairs, splits, 2, block_r), dtype=torch.float32, device=device))  # fmt: skip


def decode_attention(q, k_cache, v_cache, keep, scale: float, cfg: AttentionConfig | None = None) -> torch.Tensor:
    """``reference.decode_attention`` in one launch; inputs validated by the op (``attention_ops.py``). ``keep`` may
    broadcast over the batch, the kv heads and the rows (size-1 dims read with stride 0)."""
    b, hkv, r, _ = q.shape
    keep = keep.expand(b, hkv, r, k_cache.shape[2])  # a view: broadcast dims get stride 0
    if keep.dtype == torch.bool:
        keep = keep.view(torch.uint8)  # same bytes; Triton loads bool pointers as int1 from bytes all the same
    return _launch(q, k_cache, v_cache, keep, keep.stride(), scale, cfg, upto=False)


def decode_attention_upto(q, k_cache, v_cache, last, scale: float, cfg: AttentionConfig | None = None) -> torch.Tensor:
    """``reference.decode_attention_upto`` in one launch: the same kernel, reading ``last[b]`` instead of a mask
    and no key after it."""
    return _launch(q, k_cache, v_cache, last, (last.stride(0), 0, 0, 0), scale, cfg, upto=True)


def decode_attention_upto_quant(q, k_cache, v_cache, last, scale: float, group_size: int,
                                cfg: AttentionConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode_attention_upto`` then ``group_quant`` of its output, in its one launch: ``(o_q fp8, scales
    [B, Hkv, R, D / group_size])``."""
    return _launch(q, k_cache, v_cache, last, (last.stride(0), 0, 0, 0), scale, cfg, upto=True,
                   group_size=group_size)  # fmt: skip


def new_from_registers(constexprs: dict) -> bool:
    """The RoPE's new k / v reach the key loop from registers (a select in the loop; the stores after it), not
    stored, a barrier and read back: off NVIDIA (ROCm), where no barrier lowering promises to order global memory
    between a program's threads. The interpreter (one thread a program) takes the NVIDIA path; tests switch it."""
    return not constexprs["PTX"] and not constexprs["EMULATE_CAST"]


def rope_decode_attention(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache, last, scale: float,
                          group_size: int, cfg: AttentionConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rope_decode_attention`` in one launch: the step's q / k (Qwen3: normed) and RoPE'd, k and v
    written into their cache slots, then ``decode_attention_upto`` (with ``group_size``: its quant); inputs validated
    by the op. Returns ``(o, scales)`` (no quant: scales ``[B, Hkv, R, 0]``)."""
    b, _, hq, d = q.shape
    hkv = k_cache.shape[1]
    r = hq // hkv
    # one token: the query rows of kv head h are heads h * R .. h * R + R - 1, at q's head stride
    q_strides = (q.stride(0), r * q.stride(2), q.stride(2), q.stride(3))
    return _launch(q, k_cache, v_cache, last, (last.stride(0), 0, 0, 0), scale, cfg, upto=True,
                   group_size=group_size, shape=(b, hkv, r, d), q_strides=q_strides,
                   rope=_rope_prologue(q, wq, k, wk, eps, cos, sin, v, positions), both=True)  # fmt: skip


def _rope_prologue(q, wq, k, wk, eps, cos, sin, v, positions) -> dict:
    """The RoPE prologue's kernel arguments: weights (q in their place without norms), the step's k / v, tables and
    positions with their strides, a size-1 batch dim (one table or position row for all) read at stride 0."""
    tables = [(t.stride(0) if t.shape[0] > 1 else 0, t.stride(-1)) for t in (cos, sin)]
    pos_b = positions.stride(0) if positions.dim() == 2 and positions.shape[0] > 1 else 0
    norm = wq is not None
    args = (wq if norm else q, wk if norm else q, k, v, cos, sin, positions,
            k.stride(0), k.stride(2), k.stride(3), v.stride(0), v.stride(1), v.stride(3), *tables[0], *tables[1],
            pos_b, float(eps), k.stride(1), v.stride(2), cos.stride(1), sin.stride(1), positions.stride(-1))
    return {"args": args, "NORM": norm}


def decode_attention_tokens_quant(q, k_cache, v_cache, last, scale: float, group_size: int,
                                  cfg: AttentionConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.decode_attention_tokens`` then ``group_quant``, in one launch: q ``[B, Hq, S, D]`` (any strides:
    the RoPE op's output as it is), token s of batch row b seeing the slots ``0..last[b, s]``; returns ``(o_q [B, S,
    Hq, D], scales [B, S, Hq, D / group_size])``, the layout the o_proj's input quant had, so no copy is made on
    either side. Each kv head's G heads x S tokens are one tile of rows, row r = (head r // S, token r % S)."""
    b, hq, s, d = q.shape
    return _launch_tokens(q, (b, hq, s, d), q.stride(), k_cache, v_cache, last, scale, group_size, cfg)


def decode_attention_tokens(q, k_cache, v_cache, last, scale: float, cfg: AttentionConfig | None = None
                            ) -> torch.Tensor:
    """``reference.decode_attention_tokens`` in one launch: ``decode_attention_tokens_quant`` without the quant (an
    o_proj that takes q's dtype, or quantizes per tensor), ``o [B, S, Hq, D]`` in q's dtype."""
    b, hq, s, d = q.shape
    return _launch_tokens(q, (b, hq, s, d), q.stride(), k_cache, v_cache, last, scale, 0, cfg)  # out alone


def rope_decode_attention_tokens_quant(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache, last,
                                       scale: float, group_size: int, cfg: AttentionConfig | None = None
                                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rope_decode_attention_tokens`` then ``group_quant``, in one launch: the step's S tokens' q ``[B,
    S, Hq, D]`` and k ``[B, S, Hk, D]`` (Qwen3: normed) RoPE'd, each token's k and ``v [B, Hk, S, D]`` written into
    its cache slot ``positions[b, s]``, then ``decode_attention_tokens_quant``'s attention and quant; inputs validated
    by the op. Returns ``(o_q [B, S, Hq, D], scales [B, S, Hq, D / group_size])``."""
    rope = _rope_prologue(q, wq, k, wk, eps, cos, sin, v, positions)
    b, s, hq, d = q.shape  # before RoPE: tokens before heads
    strides = (q.stride(0), q.stride(2), q.stride(1), q.stride(3))
    return _launch_tokens(q, (b, hq, s, d), strides, k_cache, v_cache, last, scale, group_size, cfg, rope)


def rope_decode_attention_tokens(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache, last,
                                 scale: float, cfg: AttentionConfig | None = None) -> torch.Tensor:
    """``reference.rope_decode_attention_tokens`` in one launch: ``rope_decode_attention_tokens_quant`` without the
    quant (an o_proj that reads q's dtype), ``o [B, S, Hq, D]`` in q's dtype."""
    return rope_decode_attention_tokens_quant(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last,
                                              scale, 0, cfg)  # group 0: the output alone


def _launch_tokens(q, shape, strides, k_cache, v_cache, last, scale, group_size, cfg, rope=None):
    """The token form's launch; ``shape`` / ``strides``: q's as [B, Hq, S, D] (batch, head, token, dim). Each kv
    head's G heads x S tokens are one tile of rows, row r = (head r // S, token r % S); the outputs are allocated
    [B, S, Hq, D] and their scales [B, S, Hq, D / group_size] (``group_size`` 0: the output in q's dtype, no
    scales)."""
    b, hq, s, d = shape
    sqb, sqh, sqs, sqd = strides
    g = hq // k_cache.shape[1]
    dtype = arch.arch_of(q.device).fp8_dtype if group_size else q.dtype
    out = torch.empty((b, s, hq, d), dtype=dtype, device=q.device)
    scales = torch.empty((b, s, hq, d // group_size if group_size else 0), dtype=torch.float32, device=q.device)

    def grouped(t):  # a [B, S, Hq, X] tensor's strides as (batch, kv head, head of the group, token)
        return (t.stride(0), g * t.stride(2), t.stride(2), t.stride(1))

    return _launch(q, k_cache, v_cache, last, (last.stride(0), 0, last.stride(1), 0), scale, cfg, upto=True,
                   group_size=group_size, shape=(b, k_cache.shape[1], g * s, d), q_strides=(sqb, g * sqh, sqh, sqd),
                   tokens=(s, sqs), rope=rope,
                   outputs=(out, grouped(out) + (out.stride(3),), scales, grouped(scales)))  # fmt: skip


def _launch(q, k_cache, v_cache, seen, seen_strides, scale, cfg, upto: bool, group_size: int = 0, shape=None,
            q_strides=None, rope=None, both: bool = False, tokens=(1, 0), outputs=None):
    """One launch; ``shape`` / ``q_strides``: q's as [B, Hkv, R, D] (default: q's own); ``rope``: the RoPE
    prologue's arguments; ``both``: return ``(out, scales)`` even without the quant; ``tokens``: (S, q's token
    stride) where rows are (head, token) pairs; ``outputs``: (out, its (batch, kv head, row, token, dim) strides,
    scales, their (batch, kv head, row, token) strides), allocated by the caller in its layout."""
    b, hkv, r, d = shape or q.shape
    t = k_cache.shape[2]
    quant = group_size > 0
    if outputs is None:
        out = torch.empty((b, hkv, r, d), dtype=arch.arch_of(q.device).fp8_dtype if quant else q.dtype,
                          device=q.device)  # fmt: skip
        scales = torch.empty((b, hkv, r, d // group_size if quant else 0), dtype=torch.float32, device=q.device)
        outputs = (out, (*out.stride()[:3], 0, out.stride(3)), scales, (*scales.stride()[:3], 0))
    out, out_strides, scales, scale_strides = outputs
    pairs = b * hkv
    cfg = cfg or launch_config(pairs, r, rope is not None, ROPE_WIDE_ROWS)
    if out.numel() == 0:
        return (out, scales) if quant or both else out
    block_r = max(16, triton.next_power_of_2(r))  # the MMA's rows
    block_d = max(16, triton.next_power_of_2(d))
    splits, per = plan(pairs, t, _sm_count(q.device), cfg)
    counters = tile_counters(q.device, pairs) if splits > 1 else None
    if counters is None:  # one split (or no counters to merge with: mid-capture first call) reads all keys itself
        splits, per = 1, max(t, 1)
    part, ml = _partials(pairs, splits, block_r, block_d, q.device) if splits > 1 else (out, out)
    rope_args = rope["args"] if rope else (q,) * 7 + (0,) * 11 + (0.0,) + (0,) * 5
    constexprs = kernel_constexprs(q.device)
    sob, soh, sor, so_s, sod = out_strides
    _decode_attention_kernel[(pairs, splits)](
        q, k_cache, v_cache, seen, out, part, ml, out if counters is None else counters, scales if quant else out,
        hkv, r, t, per, float(scale),
        *(q_strides or q.stride()), *k_cache.stride(), *v_cache.stride(), *seen_strides, sob, soh, sor, sod,
        tokens[1], so_s, *scale_strides,
        *rope_args,
        D=d, BLOCK_R=block_r, BLOCK_D=block_d, BLOCK_T=cfg.block_t, SPLITS=splits,
        UPTO=upto, QUANT=quant, G=group_size if quant else d,
        **constexprs, ROPE=rope is not None, NORM=bool(rope and rope["NORM"]),
        NEW_FROM_REGISTERS=rope is not None and new_from_registers(constexprs), TOKENS=tokens[0],
        BLOCK_NEW=triton.next_power_of_2(tokens[0]), VISIBLE=upto and SPLIT_VISIBLE,
        MERGE_R=min(block_r, max(triton.next_power_of_2(r), cfg.num_warps)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        # RoPE's products are rounded one by one as eager rounds them: no fma may contract one (rms_norm_rope.py);
        # on NVIDIA ``_mul`` sees to that, elsewhere the whole kernel goes without fp fusion
        **({"enable_fp_fusion": False} if rope and not constexprs["PTX"] else {}),
    )  # fmt: skip
    return (out, scales) if quant or both else out
