"""The next GEMM's weight into L2 from a launch that leaves HBM idle: programs added to that launch issue
``cp.async.bulk.prefetch.L2`` hints for the first bytes of the weight, and the GEMM after it finds them in L2.

Why: at batch 1 a decode step's GEMVs stream their weights near the read floor, and the norm launch before the
qkv and gate_up GEMMs (~2.5 us) reads a few KB. A prefetch is a hint: no register written, nothing to wait for, so
a program issues its share and exits while the bytes are in flight. Nothing is stored, so every output is bit for
bit what it is without it. Measured on the H200 (``benchmarks/l2_prefetch.py``, docs/benchmarks.md): 132 extra
programs of the norm's launch prefetching the first 8 MB took 1.6% off norm + Qwen3-32B gate_up GEMV (68.65 ->
67.57 us) and 2.4% off Qwen3-8B's; a prefetch launch of its own cost more than it saved, and the decode attention
issuing it in its own programs before its key loop made the attention wait behind the prefetch (worse at every size).
sm_90+ only (the bulk prefetch); elsewhere, and in the interpreter, nothing is hinted.
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


def prefetch_bytes(t: torch.Tensor | None, nbytes: int) -> int:
    """How many of the first ``nbytes`` of ``t`` to hint (rounded down to 16, at most its size); 0 where
    nothing can be hinted (``prefetchable``)."""
    if not prefetchable(t):
        return 0
    return min(nbytes, t.numel() * t.element_size()) // ALIGN * ALIGN


@triton.jit
def prefetch_share(pf_ptr, pf_bytes, pid, nprog, LANES: tl.constexpr):
    """Program ``pid`` of ``nprog`` hints its contiguous share of bytes ``[0, pf_bytes)`` of ``pf_ptr`` into L2,
    ``LANES`` bulk prefetches of at most ``ceil(share / LANES)`` bytes (one per thread at LANES = the threads).
    A lane past the end repeats the last 16 bytes (a size-0 prefetch is not allowed; a repeat costs nothing).
    ``pf_bytes``: a positive multiple of 16."""
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
def _prefetch_kernel(pf_ptr, pf_bytes, LANES: tl.constexpr):
    prefetch_share(pf_ptr, pf_bytes, tl.program_id(0), tl.num_programs(0), LANES)


def l2_prefetch(t: torch.Tensor, nbytes: int, programs: int = 132, warps: int = 4) -> None:
    """A launch of its own that hints the first ``nbytes`` of ``t`` into L2 (``benchmarks/l2_prefetch.py``'s
    "launch" variant: slower than the hint inside the norm's launch, which the library uses)."""
    n = prefetch_bytes(t, nbytes)
    if n:
        _prefetch_kernel[(programs,)](t, n, LANES=32 * warps, num_warps=warps)
