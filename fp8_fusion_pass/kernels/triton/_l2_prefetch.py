"""The next GEMM's weight into L2 from a kernel that leaves HBM idle: every program issues its share of
``cp.async.bulk.prefetch.L2`` hints at its start, and the GEMM after it finds that much of its weight in L2.

Why: at batch 1 a decode step's GEMVs stream their weights near the read floor, and the launches between them
(the attention, 7.75 us at Qwen3-32B for 2 MB of cache) read almost nothing from HBM. A prefetch is a hint: no
register written, nothing to wait for, so the program goes on at once and may exit while the bytes are in flight;
the kernel's own loads queue behind them. Nothing is stored, so the outputs are bit for bit those without it.
sm_90+ only (the bulk prefetch); elsewhere (and in the interpreter) ``PREFETCH`` is False and the branch is pruned
at compile time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from ._pdl import prefetch_l2

ALIGN = 16  # the bulk prefetch takes 16-byte aligned addresses and sizes


def prefetchable(t: torch.Tensor | None) -> bool:
    """``t`` is a CUDA tensor on an sm_90+ GPU, contiguous, 16-byte aligned, outside the interpreter."""
    if t is None or t.device.type != "cuda" or arch.triton_interpreting() or not t.is_contiguous():
        return False
    return arch.arch_of(t.device).pdl and t.data_ptr() % ALIGN == 0


def prefetch_args(t: torch.Tensor | None, nbytes: int) -> tuple[dict, tuple]:
    """(constexprs, (pointer, bytes)) for a kernel taking ``pf_ptr, pf_bytes`` and ``PREFETCH``: the first
    ``nbytes`` of ``t`` (rounded down to 16, at most its size), or PREFETCH off with a dummy pointer."""
    if not prefetchable(t) or nbytes < ALIGN:
        return {"PREFETCH": False}, (t if t is not None else torch.empty(0), 0)
    size = t.numel() * t.element_size()
    return {"PREFETCH": True}, (t, min(nbytes, size) // ALIGN * ALIGN)


@triton.jit
def prefetch_share(pf_ptr, pf_bytes, pid, nprog, LANES: tl.constexpr):
    """Program ``pid`` of ``nprog`` hints its contiguous share of bytes ``[0, pf_bytes)`` of ``pf_ptr`` into L2,
    ``LANES`` bulk prefetches of at most ``ceil(share / LANES)`` bytes (one per thread at LANES = the threads).
    A lane past the end repeats the last 16 bytes (a size-0 prefetch is not allowed; a repeat costs nothing)."""
    units = pf_bytes // 16  # 16-byte units
    per_prog = tl.cdiv(units, nprog)
    per_lane = tl.cdiv(per_prog, LANES)
    lane = tl.arange(0, LANES)
    start = pid * per_prog + lane * per_lane
    end = tl.minimum(tl.minimum(start + per_lane, (pid + 1) * per_prog), units)
    ok = end > start
    start = tl.where(ok, start, units - 1).to(tl.int64)
    size = tl.where(ok, end - start, 1).to(tl.int32) * 16
    base = pf_ptr.to(tl.pointer_type(tl.uint8))
    prefetch_l2(base + start * 16, size)


@triton.jit
def prefetch_lines(pf_ptr, pf_bytes, pid, nprog, LANES: tl.constexpr):
    """``prefetch_share`` by ``prefetch.global.L2`` of each 128-byte line (no bulk copy engine involved): the
    program's share in steps of LANES lines, one per thread per step."""
    lines = tl.cdiv(pf_bytes, 128)
    per_prog = tl.cdiv(lines, nprog)
    lo = pid * per_prog
    hi = tl.minimum(lo + per_prog, lines)
    base = pf_ptr.to(tl.pointer_type(tl.uint8))
    for first in range(lo, hi, LANES):
        line = tl.minimum(first + tl.arange(0, LANES), hi - 1).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [base + line * 128],
                                  dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _prefetch_kernel(pf_ptr, pf_bytes, LANES: tl.constexpr, LINES: tl.constexpr):
    if LINES:
        prefetch_lines(pf_ptr, pf_bytes, tl.program_id(0), tl.num_programs(0), LANES)
    else:
        prefetch_share(pf_ptr, pf_bytes, tl.program_id(0), tl.num_programs(0), LANES)


def l2_prefetch(t: torch.Tensor, nbytes: int, programs: int = 132, warps: int = 4, lines: bool = False) -> None:
    """A launch of its own that hints the first ``nbytes`` of ``t`` into L2 (a probe for ``benchmarks/
    l2_prefetch.py``); ``lines``: by ``prefetch.global.L2`` per line instead of the bulk prefetch."""
    constexprs, (ptr, n) = prefetch_args(t, nbytes)
    if constexprs["PREFETCH"]:
        _prefetch_kernel[(programs,)](ptr, n, LANES=32 * warps, LINES=lines, num_warps=warps)
