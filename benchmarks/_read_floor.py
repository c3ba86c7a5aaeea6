"""What a plain streaming read of N bytes costs in the benchmarks' harness: a measured floor beside the roofline.

The roofline (bytes / copy bandwidth) has no ramp: a 2 GiB copy reaches 4.28 TB/s on the H200, but a kernel
that reads 4-25 MB spends much of its time ramping up and draining (``launch_floor.py``: 16 MB in 6.1 us, 2.6
TB/s). ``ReadFloor.us(nbytes)`` times the fastest of a few launch shapes of ``_read_kernel`` on a buffer of
``nbytes``, rotating copies beyond 3x the 50 MB L2 as the other benchmarks' inputs do, so "time / read floor"
says how far a kernel is from what any kernel that must read those bytes pays here. It is a yardstick, not a
bound: the kernels it is set beside also write (their outputs are a fraction of the bytes), and below ~1 MB the
read is launch-bound (at most ``MAX_COPIES`` copies, so tiny buffers stay in L2, as the tiny inputs do).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from _timing import rotating_copies, time_graph

SMS = 132  # H200
DRY_RUN_SMS = 2  # a dry run's "SMs": the CPU interpreter runs one program at a time (~10 ms each), 1452 a size
MAX_COPIES = 256
WORD = 4  # bytes per int32 word
# (programs per SM, block): launch_floor.py's winners (8 / SM from 4 MB up, 2 / SM at 1 MB) and 1 / SM below.
LAUNCHES = ((1, 512), (2, 512), (8, 512))


@triton.jit
def _read_kernel(src, dst, words, per_program, BLOCK: tl.constexpr):
    """Sum this program's ``per_program`` int32 words (the last slab ends at ``words``), store one word."""
    start = tl.program_id(0).to(tl.int64) * per_program
    end = tl.minimum(start + per_program, words)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < end, other=0)
    tl.store(dst + tl.program_id(0), tl.sum(acc, 0))


def read_plan(words: int, programs: int) -> int:
    """Words per program so that ``programs`` slabs cover all ``words`` (the last one shorter)."""
    return -(-words // programs)


def read_call(bufs, out, programs: int, block: int):
    words = bufs[0].numel()
    per = read_plan(words, programs)
    return lambda i: _read_kernel[(programs,)](bufs[i % len(bufs)], out, words, per, BLOCK=block, num_warps=4)


class ReadFloor:
    """``us(nbytes)``: the best measured time of a streaming read of ``nbytes``, cached per word count."""

    def __init__(self, device: str = "cuda", dry_run: bool = False, launches=LAUNCHES) -> None:
        self.device, self.dry_run, self.launches = device, dry_run, launches
        # a dry run's times mean nothing: the same launches over a few programs check the code path
        self.sms = DRY_RUN_SMS if dry_run else SMS
        self.out = torch.zeros(8 * self.sms, dtype=torch.int32, device=device)
        self.cache: dict[int, float] = {}

    def us(self, nbytes: int) -> float:
        words = max(1, -(-int(nbytes) // WORD))
        if words not in self.cache:
            copies = rotating_copies(words * WORD, self.dry_run, most=MAX_COPIES)
            bufs = [torch.ones(words, dtype=torch.int32, device=self.device) for _ in range(copies)]
            self.cache[words] = min(time_graph(read_call(bufs, self.out, self.sms * k, block), copies, self.dry_run)
                                    for k, block in self.launches)  # fmt: skip
            del bufs
        return self.cache[words]
