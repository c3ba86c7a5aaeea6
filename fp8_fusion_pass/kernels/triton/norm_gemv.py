"""``add_rms_norm_group_quant`` then the block-FP8 GEMV at one row, in one launch: the norm made inside the grid.

    (q, scale), residual_out = add_rms_norm_group_quant(x, residual, w_norm, eps, 128)
    out = blockscale_mm(q, scale, w_q, w_scale)                                    (``reference``)

Why: at batch 1 the norm before the qkv and gate_up GEMVs is its own launch (~2.5 us at Qwen3-32B for 10 KB of
row, plus the ~0.3 us gap between launches), while the GEMV that follows spends its first microseconds waiting on
HBM for weights that do not depend on the norm at all. A GEMV program cannot norm the row itself: quantizing the
activation in every program already made the GEMV slower at these shapes (``quant_gemm``'s table, 32B o_proj
19.3 us against 16.6 for the two launches). Here one program makes the norm, once, and the others wait for it
while their first weight chunk is in flight:

- every program issues its first weight chunk's loads, then takes a ticket (one relaxed atomic); the program that
  gets ticket 0 (it is running, so no program waits on one that cannot start) adds the residual, norms and
  quantizes the row and stores ``residual_out``, ``q`` and the scales, then a CTA barrier and a release store of
  the flag (CUTLASS's semaphore pattern);
- one thread of each program polls the flag with ``ld.acquire.gpu`` and a short ``nanosleep`` between reads (one
  poller per program, not per thread: the flag's L2 line is shared by every resident program), the others wait at
  a CTA barrier; then the program reads ``q`` and the scales through L2 (``.cg``) and runs the GEMV loop;
- each program counts itself out at its end; the last one resets the ticket, the flag and the count to 0 for the
  next launch (every program has taken its ticket and passed its wait by then).

Numerics: the norm's steps are ``rms_norm.py``'s (sum rounded to x.dtype, fp32 sum of squares, correctly rounded
division and sqrt, ``w * (s * rstd rounded)`` rounded, ``group_quant_tile``), but its sum of squares runs in
``K_CHUNK`` pieces, not in the norm kernel's row tile: rstd may differ in its last bit, so q may differ from the two
launches' by an fp8 step on rare values. The GEMV part is ``_gemv_kernels``' (same config, same sums).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from ._blockscale_kernels import SCALE_BLOCK
from ._fp8 import group_quant_tile, kernel_constexprs, round_to, to_fp32
from ._gemv_kernels import GemvConfig, _chunk_dot, _weight_chunk


LINES = 32  # the flag and the count, each spread over this many 128-byte lines (program p uses line p % LINES)
WORDS = 2 * LINES * 32  # int32 words of the sync buffer


def _reset_asm() -> str:
    """PTX for program 0's thread 0: poll until the LINES counts sum to $3, then zero the flags and the counts."""
    loads = "\n".join(f"ld.acquire.gpu.global.b32 %v, [$2+{i * 128}]; add.u32 %s, %s, %v;" for i in range(LINES))
    zeros = "\n".join(f"st.relaxed.gpu.global.b32 [$1+{i * 128}], 0; st.relaxed.gpu.global.b32 [$2+{i * 128}], 0;"
                      for i in range(LINES))
    return ("{ .reg .pred %pn, %pw; .reg .b32 %t, %v, %s; mov.u32 %t, %tid.x; setp.ne.u32 %pn, %t, 0; "
            "@%pn bra DONE${:uid}; POLL${:uid}: mov.u32 %s, 0;\n" + loads + "\nsetp.ne.s32 %pw, %s, $3; "
            "@%pw nanosleep.u32 200; @%pw bra POLL${:uid};\n" + zeros + "\nDONE${:uid}: mov.b32 $0, 0; }")


RESET_ASM = _reset_asm()


@triton.jit
def _wait_and_arrive(flag_ptr, arrived_ptr, PTX: tl.constexpr):
    """Until ``*flag_ptr != 0``; then every thread of the program sees what the setter stored before it. On NVIDIA
    thread 0 polls (``ld.acquire.gpu``, a short ``nanosleep`` between reads) and then counts the program in
    (``red``: no return, nothing waits for it), while the other threads wait at the barrier."""
    if PTX:
        tl.inline_asm_elementwise(
            """{
            .reg .pred %pn, %pw;
            .reg .b32 %t, %v;
            mov.u32 %t, %tid.x;
            setp.ne.u32 %pn, %t, 0;
            @%pn bra DONE${:uid};
            POLL${:uid}:
            ld.acquire.gpu.global.b32 %v, [$1];
            setp.eq.s32 %pw, %v, 0;
            @%pw nanosleep.u32 20;
            @%pw bra POLL${:uid};
            red.relaxed.gpu.global.add.u32 [$2], 1;
            DONE${:uid}:
            mov.b32 $0, 0;
            }""",
            "=r,l,l", [flag_ptr + tl.zeros([1], tl.int32), arrived_ptr + tl.zeros([1], tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)  # fmt: skip
        tl.debug_barrier()
    else:  # the interpreter runs programs one after another, program 0 (the setter) first
        while tl.load(flag_ptr, volatile=True) == 0:
            pass


@triton.jit
def _reset_after_all(flag_ptr, arrived_ptr, others, ASM: tl.constexpr):
    """Program 0, at its end: once the ``others`` programs have all passed their wait, the flags and the counts
    back to 0 for the next launch. It holds one program slot until then; the others need none of its."""
    tl.inline_asm_elementwise(ASM, "=r,l,l,r", [flag_ptr + tl.zeros([1], tl.int32), arrived_ptr + tl.zeros([1], tl.int32),
                              others + tl.zeros([1], tl.int32)], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _load_row(x_ptr, r_ptr, wn_ptr, start: tl.constexpr, WIDTH: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """Columns ``[start, start + WIDTH)``: (x + residual) rounded to x.dtype (HF's ``residual + x``) and the norm
    weight, both x.dtype (two values per register while the row waits for its rstd)."""
    cols = start + tl.arange(0, WIDTH)
    h = round_to(to_fp32(tl.load(x_ptr + cols), EMULATE_CAST) + to_fp32(tl.load(r_ptr + cols), EMULATE_CAST),
                 x_ptr.dtype.element_ty, EMULATE_CAST)  # fmt: skip
    return h, tl.load(wn_ptr + cols)


@triton.jit
def _quant_store(h, w, res_ptr, q_ptr, s_ptr, rstd, start: tl.constexpr, WIDTH: tl.constexpr, G: tl.constexpr,
                 FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
                 PTX: tl.constexpr):  # fmt: skip
    """residual_out, then ``w * (h * rstd rounded)`` rounded and group-quantized: q and the scales stored."""
    dtype = h.dtype
    cols = start + tl.arange(0, WIDTH)
    tl.store(res_ptr + cols, h)
    normed = round_to(to_fp32(h, EMULATE_CAST) * rstd, dtype, EMULATE_CAST)
    y = round_to(to_fp32(w, EMULATE_CAST) * to_fp32(normed, EMULATE_CAST), dtype, EMULATE_CAST)
    q, scale = group_quant_tile(tl.reshape(to_fp32(y, EMULATE_CAST), (1, WIDTH // G, G)), q_ptr.dtype.element_ty,
                                FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
    tl.store(q_ptr + cols, tl.reshape(q, (WIDTH,)))
    tl.store(s_ptr + start // G + tl.arange(0, WIDTH // G), tl.reshape(scale, (WIDTH // G,)))


@triton.jit
def _norm_row(x_ptr, r_ptr, wn_ptr, res_ptr, q_ptr, s_ptr, eps, MAIN: tl.constexpr, TAIL: tl.constexpr,
              G: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr,
              EMULATE_CAST: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """``add_rms_norm_group_quant`` of one row of MAIN + TAIL columns (powers of two; K = 5120: 4096 + 1024): every
    load first (one L2 round trip; no store before them, which the compiler would not move a load across), the
    row kept in registers, then residual_out, q and the scales stored."""
    h, w = _load_row(x_ptr, r_ptr, wn_ptr, 0, MAIN, EMULATE_CAST)
    hf = to_fp32(h, EMULATE_CAST)
    sum_sq = tl.sum(hf * hf, 0)
    if TAIL > 0:
        ht, wt = _load_row(x_ptr, r_ptr, wn_ptr, MAIN, TAIL, EMULATE_CAST)
        htf = to_fp32(ht, EMULATE_CAST)
        sum_sq += tl.sum(htf * htf, 0)
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(sum_sq, tl.cast(MAIN + TAIL, tl.float32)) + eps))
    _quant_store(h, w, res_ptr, q_ptr, s_ptr, rstd, 0, MAIN, G, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    if TAIL > 0:
        _quant_store(ht, wt, res_ptr, q_ptr, s_ptr, rstd, MAIN, TAIL, G, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST,
                     PTX)  # fmt: skip


@triton.jit
def _norm_gemv_kernel(
    x_ptr, r_ptr, wn_ptr,  # the row [K] before the norm, the residual [K], the norm weight [K] (x.dtype)
    res_ptr, q_ptr, s_ptr,  # made here: residual_out [K], q [K] fp8, scales [K / 128] fp32
    b_ptr, bs_ptr, c_ptr,  # the GEMV: w_q [N, K] fp8, weight scales, out [N]
    sync_ptr,  # int32 [WORDS]: LINES flags then LINES counts, 32 words apart; 0 between launches
    N, stride_bn, stride_bsn, stride_bsk, eps,
    K: tl.constexpr, MAIN: tl.constexpr,  # MAIN: K's largest power-of-two part (the rest must be one too)
    ROWS: tl.constexpr, K_CHUNK: tl.constexpr, SCALE_BLOCK: tl.constexpr, LINES: tl.constexpr, RESET: tl.constexpr,
    MODE: tl.constexpr,  # probe: 0 the kernel; 1 no norm (the flag set at once); 2 no wait either
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rn_ok = rn < N
    rn = tl.minimum(rn, N - 1).to(tl.int64)
    # the first weight chunk: in flight while the norm is made (loaded as fp8, widened only after the wait)
    offs_k = tl.arange(0, K_CHUNK)
    w0 = tl.load(b_ptr + rn[:, None] * stride_bn + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
    kb0 = tl.arange(0, K_CHUNK // SCALE_BLOCK)
    ws0 = tl.load(bs_ptr + (rn // SCALE_BLOCK)[:, None] * stride_bsn + kb0[None, :] * stride_bsk,
                  mask=(kb0 < K // SCALE_BLOCK)[None, :], other=0.0)  # fmt: skip
    pid = tl.program_id(0)
    line = (pid % LINES) * 32
    if MODE < 2:
        if pid == 0:
            if MODE == 0:
                _norm_row(x_ptr, r_ptr, wn_ptr, res_ptr, q_ptr, s_ptr, tl.cast(eps, tl.float32), MAIN, K - MAIN,
                          SCALE_BLOCK, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
            tl.debug_barrier()  # every thread's stores before the release
            tl.atomic_xchg(sync_ptr + tl.arange(0, LINES) * 32, tl.full([LINES], 1, tl.int32), sem="release",
                           scope="gpu")  # fmt: skip
        else:
            _wait_and_arrive(sync_ptr + line, sync_ptr + LINES * 32 + line, PTX)
    # chunk 0 from the loads issued before the wait, then the GEMV's own loop (no branch in it: it pipelines)
    x = tl.load(q_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    kb = tl.arange(0, K_CHUNK // SCALE_BLOCK)
    xs = tl.load(s_ptr + kb, mask=kb < K // SCALE_BLOCK, other=0.0)
    acc = _chunk_dot(w0.to(tl.float32), ws0, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)
    for k0 in range(K_CHUNK, K, K_CHUNK):
        w, ws = _weight_chunk(b_ptr, bs_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK, SCALE_BLOCK)
        kb = k0 // SCALE_BLOCK + tl.arange(0, K_CHUNK // SCALE_BLOCK)
        x = tl.load(q_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)
        xs = tl.load(s_ptr + kb, mask=kb < K // SCALE_BLOCK, other=0.0)
        acc += _chunk_dot(w, ws, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)
    tl.store(c_ptr + rn, round_to(acc, c_ptr.dtype.element_ty, EMULATE_CAST), mask=rn_ok)
    if MODE < 2:
        if PTX:
            if pid == 0:
                _reset_after_all(sync_ptr, sync_ptr + LINES * 32, tl.num_programs(0) - 1, RESET)
        elif pid == tl.num_programs(0) - 1:  # the interpreter: every other program has run
            tl.store(sync_ptr + tl.arange(0, LINES) * 32, tl.zeros([LINES], tl.int32))


_sync: dict[torch.device, torch.Tensor] = {}


def sync_words(device: torch.device) -> torch.Tensor:
    """The device's two zeroed int32 words; allocated by the first (eager) call, outside any CUDA graph."""
    buf = _sync.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("norm_gemv: call it once eagerly before capturing a CUDA graph")
        buf = _sync[device] = torch.zeros(WORDS, dtype=torch.int32, device=device)
    return buf


def add_rms_norm_quant_gemv(x, residual, w_norm, eps: float, w_q, w_scale, out_dtype,
                            config: GemvConfig | None = None, maxnreg: int | None = None, mode: int = 0):  # fmt: skip
    """``(out [1, N], q [1, K], scale [1, K / 128], residual_out [1, K])``: one row, groups of 128. ``maxnreg``
    caps the registers per thread (the norm's path needs more than the GEMV's; capped, it spills instead of
    taking programs off each SM)."""
    config = config or GemvConfig()
    m, k = x.shape
    n = w_q.shape[0]
    main = 1 << (k.bit_length() - 1)
    tail = k - main
    if m != 1 or k % SCALE_BLOCK or (tail & (tail - 1)):
        raise ValueError(f"norm_gemv: one row of K = 2^a (+ 2^b) columns, K % {SCALE_BLOCK} == 0; got {tuple(x.shape)}")
    dev = x.device
    res = torch.empty_like(x)
    q = torch.empty((1, k), dtype=arch.arch_of(dev).fp8_dtype, device=dev)
    s = torch.empty((1, k // SCALE_BLOCK), dtype=torch.float32, device=dev)
    out = torch.empty((1, n), dtype=out_dtype, device=dev)
    _norm_gemv_kernel[(triton.cdiv(n, config.rows),)](
        x, residual, w_norm, res, q, s, w_q, w_scale, out, sync_words(dev), n, w_q.stride(0), *w_scale.stride(),
        float(eps), K=k, MAIN=main, ROWS=config.rows, K_CHUNK=config.k_chunk, SCALE_BLOCK=SCALE_BLOCK, LINES=LINES, RESET=RESET_ASM, MODE=mode, **kernel_constexprs(dev),
        num_warps=config.warps, num_stages=config.stages, **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip
    return out, q, s, res
