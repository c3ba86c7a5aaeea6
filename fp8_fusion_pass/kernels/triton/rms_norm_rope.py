"""Qwen3's per-head q / k RMSNorms and the RoPE after them, both tensors in one launch.

    q_out = rope(rms_norm(q [B, S, Hq, D], wq, eps).transpose(1, 2), cos, sin)    [B, Hq, S, D]
    k_out = rope(rms_norm(k [B, S, Hk, D], wk, eps).transpose(1, 2), cos, sin)    [B, Hk, S, D]

Why: at decode these are small (Qwen3-8B at batch 1: 40 rows of 128 values) and launch-bound. With the pass,
``inline_norm`` hands the norms to Inductor, which fuses each into its RoPE kernel: two launches (the k one also
writes the KV cache), 1.4 + 1.9 us per layer at batch 1 and 2.5-3.5 + 2.0 us at batch 64 on the H200, where the
q kernel's time varied between compiles (``docs/benchmarks.md``, "Re-run with the TMA SiLU-quant GEMM rows").
Here one launch does both: 1.7 us at batch 1, 2.2 us at batch 64 on the H200, with the k-cache
write left to Inductor (1.1 us). With ``CACHE`` (``rms_norm_rope_cache``, ``patterns/rope_cache.py``) the same launch
stores k into its static-cache slot and copies v into its own: 1.8 us at batch 1 and 2.8 us at batch 64 for what
took 1.75 + 1.1 + 1.0 and 2.2 + 1.5 us in three launches. ``NORM`` off is Llama's RoPE alone (``qk_rope``).
At prefill sizes (``benchmarks/rope_kernels.py``, the tiles of ``TILES``): 14.0 us for Qwen3-8B's q / k at 2048
tokens (Inductor's fusion of the same code: 103 us), 1.08x a plain read of the bytes.

Each program takes ``ROWS`` rows of D values (one head of one token): rows ``[0, B*S*Hq)`` are q's, the rest
k's (with ``CACHE``, k's then v's: a v row is loaded and stored as it is); a row picks its tensor, weight and
strides with selects, so one launch needs no branch. The numerics are
``reference.rms_norm_rope``'s, step by step: ``rstd = 1 / sqrt(sum(x^2) / D + eps)`` in fp32 (correctly rounded, as
``rms_norm.py``), ``y = w * (x * rstd rounded)`` rounded, then ``y * cos``, ``rotate_half(y) * sin`` and their sum,
each rounded to the activation dtype as eager rounds them (the products of two bf16 values are exact in fp32,
so one rounding each is eager's). Each row is loaded as its two halves, columns ``[0, D/2)`` and ``[D/2, D)``:
RoPE pairs column j with j + D/2, so each half's partner is the other half, already in registers, and nothing is
loaded or normalised twice. Only the order of the sum of squares differs from the reference's: an output may
differ from it by an ulp, rarely.

The launch turns off Triton's fp fusion (``enable_fp_fusion=False``). With it on, the GPU compiler contracts
``round(y * cos) + round(y_rot * sin)`` into an fma on the rounded-to-bf16 values, which skips one product's
rounding: on the H200 18% of the outputs were an ulp off eager's (the CPU interpreter, which never fuses, was
bit-exact). Eager runs the two products and the sum as three kernels, so three roundings is the contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from ._fp8 import round_to, rounded, to_fp32

# (rows per program, warps) by the launch's row count: ``benchmarks/rope_kernels.py --sweep --tp 1,8`` on the H200
# (2026-12-02, torch 2.11, Triton 3.6; 120 points x 15 candidates, each candidate's geometric mean of time over
# each point's best, the two-halves kernel):
#   rows < 512 (decode):  (4, 4) 1.013x, (8, 4) 1.025x, (8, 2) 1.077x; a launch takes 1.4-2.1 us
#   512 - 2047:           (8, 4) 1.026x, (4, 4) 1.078x
#   2048 - 16383:         (4, 1) 1.043x, (8, 2) 1.047x, (8, 4) 1.068x, (4, 4) 1.320x
#   16384 and more:       (8, 2) 1.008x, (16, 4) 1.010x, (8, 4) 1.219x, (4, 4) 1.977x (prefill: 8 values, one
#                         16-byte load, per thread and half-row, and 2 warps so more programs fit an SM)
# Before this table every launch took (4, 4): 1.26-1.87x slower than the best candidate at 2048-8192 tokens.
TILES = ((512, (4, 4)), (2048, (8, 4)), (None, (8, 2)))  # (below this many rows, tile); None: any more


def tile_for(n_rows: int, head_dim: int) -> tuple[int, int]:
    """(rows per program, warps) for a launch of ``n_rows`` rows of ``head_dim`` values (measured at 128; other
    head sizes keep the same number of values per program)."""
    rows, warps = next(tile for below, tile in TILES if below is None or n_rows < below)
    scale = max(1, head_dim // 128)  # a bigger head: fewer rows per program, as many values
    return max(1, rows // scale), warps


@triton.jit
def _rms_norm_rope_kernel(
    q_ptr, k_ptr,  # [B, S, H, D] views, any strides
    wq_ptr, wk_ptr,  # norm weights [D]
    cos_ptr, sin_ptr,  # [B or 1, S, D], any strides (batch stride 0 when shared; HF's tables are D-strided)
    qo_ptr, ko_ptr,  # out [B, H, S, D] contiguous; CACHE: ko_ptr is the k cache [B, HK, T, D]
    v_ptr, vc_ptr, pos_ptr,  # CACHE only: v [B, HK, S, D], the v cache [B, HK, T, D], positions [B or 1, S]
    S, HQ, HK, n_q_rows, n_rows, T,
    sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sc_b, sc_s, sc_d, ss_b, ss_s, ss_d,
    sv_b, sv_h, sv_s, sv_d, sko_b, sko_h, sko_t, sko_d, svc_b, svc_h, svc_t, svc_d, sp_b, sp_s,
    eps,
    D: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr, CACHE: tl.constexpr,
    UNIT_D: tl.constexpr,  # every q / k / v (and cache) D stride is 1: contiguous rows, vector loads and stores
    EMULATE_CAST: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = r < n_rows
    r = tl.minimum(r, n_rows - 1)  # a tail row re-reads the last row; its store is masked
    is_k = r >= n_q_rows  # CACHE: k and then v rows
    rr = tl.where(is_k, r - n_q_rows, r)
    heads = tl.where(is_k, HK, HQ)
    is_v = r < 0  # no v rows ...
    if CACHE:  # ... unless the caches are written: then the second half of the rows after q's are v's
        n_k_rows = (n_rows - n_q_rows) // 2
        is_v = is_k & (rr >= n_k_rows)
        rr = tl.where(is_v, rr - n_k_rows, rr)
    h = (rr % heads).to(tl.int64)
    s = ((rr // heads) % S).to(tl.int64)
    b = (rr // (heads * S)).to(tl.int64)
    x_row = tl.where(is_k, k_ptr + b * sk_b + s * sk_s + h * sk_h, q_ptr + b * sq_b + s * sq_s + h * sq_h)
    x_d = tl.where(is_k, sk_d, sq_d)
    if CACHE:  # a v row reads v (same element type as q / k: the op checks it)
        x_row = tl.where(is_v, v_ptr + b * sv_b + s * sv_s + h * sv_h, x_row)
        x_d = tl.where(is_v, sv_d, x_d)
    # The row as its two halves: RoPE pairs column j with j + D/2, so each half's rotation partner is the other
    # half, in the same thread's registers (no second load of the row, no norm computed twice).
    half = tl.arange(0, D // 2)[None, :]
    if UNIT_D:
        x_lo_ptrs = x_row[:, None] + half
        x_hi_ptrs = x_lo_ptrs + D // 2
    else:
        x_lo_ptrs = x_row[:, None] + half * x_d[:, None]
        x_hi_ptrs = x_lo_ptrs + (D // 2) * x_d[:, None]
    x_lo_raw = tl.load(x_lo_ptrs)
    x_hi_raw = tl.load(x_hi_ptrs)
    x_lo = to_fp32(x_lo_raw, EMULATE_CAST)
    x_hi = to_fp32(x_hi_raw, EMULATE_CAST)
    dtype = q_ptr.dtype.element_ty
    if NORM:
        w_row = tl.where(is_k, wk_ptr, wq_ptr)[:, None] + half
        w_lo = to_fp32(tl.load(w_row), EMULATE_CAST)
        w_hi = to_fp32(tl.load(w_row + D // 2), EMULATE_CAST)
        var = tl.math.div_rn(tl.sum(x_lo * x_lo, 1) + tl.sum(x_hi * x_hi, 1), tl.cast(D, tl.float32))  # mean
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))[:, None]
        y_lo = rounded(w_lo * rounded(x_lo * rstd, dtype, EMULATE_CAST), dtype, EMULATE_CAST)
        y_hi = rounded(w_hi * rounded(x_hi * rstd, dtype, EMULATE_CAST), dtype, EMULATE_CAST)
    else:  # RoPE alone (Llama): the activation as it is
        y_lo, y_hi = x_lo, x_hi
    tab_c = cos_ptr + b[:, None] * sc_b + s[:, None] * sc_s + half * sc_d
    tab_s = sin_ptr + b[:, None] * ss_b + s[:, None] * ss_s + half * ss_d
    c_lo = to_fp32(tl.load(tab_c), EMULATE_CAST)
    c_hi = to_fp32(tl.load(tab_c + (D // 2) * sc_d), EMULATE_CAST)
    s_lo = to_fp32(tl.load(tab_s), EMULATE_CAST)
    s_hi = to_fp32(tl.load(tab_s + (D // 2) * ss_d), EMULATE_CAST)
    # y * cos + cat(-y_hi, y_lo) * sin, each product and the sum rounded as eager rounds them
    out_lo = round_to(rounded(y_lo * c_lo, dtype, EMULATE_CAST) + rounded(-y_hi * s_lo, dtype, EMULATE_CAST),
                      dtype, EMULATE_CAST)  # fmt: skip
    out_hi = round_to(rounded(y_hi * c_hi, dtype, EMULATE_CAST) + rounded(y_lo * s_hi, dtype, EMULATE_CAST),
                      dtype, EMULATE_CAST)  # fmt: skip
    q_row = qo_ptr + ((b * HQ + h) * S + s) * D
    if CACHE:
        # k / v rows go to their cache slot: position p of batch row b (negative counts from the end, as
        # indexing does); a position outside [-T, T) writes nothing rather than out of bounds.
        p = tl.load(pos_ptr + b * sp_b + s * sp_s).to(tl.int64)
        p = tl.where(p < 0, p + T, p)
        ok = ok & ((~is_k) | ((p >= 0) & (p < T)))
        out_lo = tl.where(is_v[:, None], x_lo_raw, out_lo)  # v is copied as it is
        out_hi = tl.where(is_v[:, None], x_hi_raw, out_hi)
        k_row = ko_ptr + b * sko_b + h * sko_h + p * sko_t
        v_row = vc_ptr + b * svc_b + h * svc_h + p * svc_t
        o_row = tl.where(is_k, tl.where(is_v, v_row, k_row), q_row)
        if UNIT_D:
            o_lo = o_row[:, None] + half
            o_hi = o_lo + D // 2
        else:
            o_d = tl.where(is_k, tl.where(is_v, svc_d, sko_d), 1)[:, None]
            o_lo = o_row[:, None] + half * o_d
            o_hi = o_lo + (D // 2) * o_d
    else:
        o_lo = tl.where(is_k, ko_ptr + ((b * HK + h) * S + s) * D, q_row)[:, None] + half
        o_hi = o_lo + D // 2
    tl.store(o_lo, out_lo, mask=ok[:, None])
    tl.store(o_hi, out_hi, mask=ok[:, None])


def unsupported(head_dim: int) -> str | None:
    """Why the kernel cannot take this head size (None when it can): one power-of-two tile per row."""
    if head_dim < 2 or head_dim & (head_dim - 1) or head_dim > 1024:
        return f"head_dim {head_dim} must be a power of two from 2 to 1024"
    return None


def _launch(q, wq, k, wk, eps: float, cos, sin, q_out, k_out, cache=None, tile=None) -> None:
    """One launch: q / k normed (unless ``wq`` is None: RoPE alone) and rotated into ``q_out`` / ``k_out`` ([B, H,
    S, D] contiguous), or with ``cache = (v, positions, k_cache, v_cache)`` k into k_cache (``k_out`` is then
    k_cache) and v into v_cache. ``tile``: (rows per program, warps), else ``tile_for``'s choice."""
    b, s, hq, d = q.shape
    hk = k.shape[2]
    reason = unsupported(d)
    if reason is not None:
        raise ValueError(f"rms_norm_rope: {reason}")
    n_q, n = b * s * hq, b * s * (hq + hk * (2 if cache is not None else 1))
    if n == 0:
        return
    # cos / sin [1, S, D] serve every batch row: batch stride 0. Their D stride is not always 1: transformers'
    # rotary embedding builds them from a transposed matmul, so on the H200 Inductor passed HF's cos as strides
    # (S * D, 1, S) (Triton specializes a stride of 1, so the engine's contiguous tables lose nothing).
    table_strides = [(t.stride(0) if t.shape[0] > 1 else 0, t.stride(1), t.stride(2)) for t in (cos, sin)]
    if cache is None:
        v, positions, v_cache, t = q, q, q, 1  # unused (CACHE=False): any valid pointer
        v_strides, ko_strides, vc_strides, pos_strides = (0,) * 4, (0,) * 4, (0,) * 4, (0, 0)
    else:
        v, positions, k_out, v_cache = cache  # k goes straight into its cache
        t = k_out.shape[2]
        v_strides, ko_strides, vc_strides = v.stride(), k_out.stride(), v_cache.stride()
        # [S] (HF's cache_position) is shared by every batch row: batch stride 0, as for the tables
        pos_strides = (0, positions.stride(0)) if positions.dim() == 1 else (
            positions.stride(0) if positions.shape[0] > 1 else 0, positions.stride(1))
    norm = wq is not None
    if not norm:
        wq = wk = q  # never read (NORM=False): any valid pointer
    rows, warps = tile or tile_for(n, d)
    rows_in = (q, k) if cache is None else (q, k, v, k_out, v_cache)
    unit_d = all(t.stride(-1) == 1 for t in rows_in)
    _rms_norm_rope_kernel[(triton.cdiv(n, rows),)](
        q, k, wq, wk, cos, sin, q_out, k_out, v, v_cache, positions, s, hq, hk, n_q, n, t,
        *q.stride(), *k.stride(), *table_strides[0], *table_strides[1],
        *v_strides, *ko_strides, *vc_strides, *pos_strides,
        eps, D=d, ROWS=rows, NORM=norm, CACHE=cache is not None, UNIT_D=unit_d,
        EMULATE_CAST=arch.triton_interpreting(),
        num_warps=warps,
        enable_fp_fusion=False,  # see the module docstring: no fma may swallow a product's rounding
    )  # fmt: skip


def rms_norm_rope(q, wq, k, wk, eps: float, cos, sin, tile=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rms_norm_rope`` in one launch; inputs validated by the op (``attention_ops.py``). ValueError for a
    head size the kernel cannot take."""
    b, s, hq, d = q.shape
    q_out = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((b, k.shape[2], s, d), dtype=k.dtype, device=k.device)
    _launch(q, wq, k, wk, eps, cos, sin, q_out, k_out, tile=tile)
    return q_out, k_out


def rms_norm_rope_cache(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache,
                        tile=None) -> torch.Tensor:
    """``reference.rms_norm_rope_cache`` in one launch: k and v written into their cache slots in place, q
    returned; inputs validated by the op. A position outside ``[-T, T)`` writes nothing (eager indexing raises)."""
    b, s, hq, d = q.shape
    q_out = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    _launch(q, wq, k, wk, eps, cos, sin, q_out, None, (v, positions, k_cache, v_cache), tile)
    return q_out


def qk_rope(q, k, cos, sin, tile=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.qk_rope`` (Llama's q / k RoPE, no norms) in one launch; inputs validated by the op."""
    b, s, hq, d = q.shape
    q_out = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((b, k.shape[2], s, d), dtype=k.dtype, device=k.device)
    _launch(q, None, k, None, 0.0, cos, sin, q_out, k_out, tile=tile)
    return q_out, k_out


def qk_rope_cache(q, k, cos, sin, v, positions, k_cache, v_cache, tile=None) -> torch.Tensor:
    """``reference.qk_rope_cache``: ``qk_rope`` with the k / v cache writes, in one launch (as
    ``rms_norm_rope_cache``)."""
    b, s, hq, d = q.shape
    q_out = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    _launch(q, None, k, None, 0.0, cos, sin, q_out, None, (v, positions, k_cache, v_cache), tile)
    return q_out
