"""Timing helpers shared by the benchmarks: the copy bandwidth a roofline divides by, and CUDA-graph medians.

``dry_run=True`` replaces the GPU measurements by a wall clock on the CPU, so a script can be checked end to end
under the Triton interpreter; its numbers mean nothing.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

ROTATE_BYTES = 150e6  # 3x the H200's 50 MB L2


def rotating_copies(nbytes: float, dry_run: bool = False, least: int = 2, most: int | None = None) -> int:
    """How many copies of a call's inputs (``nbytes`` each) a timing loop cycles through: enough to exceed
    ``ROTATE_BYTES``, so each call reads them from HBM as a decode step does, within [``least``, ``most``];
    ``least`` on a dry run, whose times mean nothing (hundreds of quantized weight copies take seconds on a CPU)."""
    if dry_run:
        return least
    copies = max(least, math.ceil(ROTATE_BYTES / max(nbytes, 1)))
    return copies if most is None else min(most, copies)


def cache_copies(k_cache: torch.Tensor, v_cache: torch.Tensor, dry_run: bool = False) -> list[tuple[torch.Tensor,
                                                                                                   torch.Tensor]]:
    """Copies of an attention's (k, v) caches to rotate through (``rotating_copies`` of their bytes), so each call
    reads its cache from HBM, as a decode step does, where every layer's weights pass through L2 between two reads
    of its cache."""
    each = k_cache.numel() * k_cache.element_size() + v_cache.numel() * v_cache.element_size()
    return [(k_cache.clone(), v_cache.clone()) for _ in range(rotating_copies(each, dry_run))]


def copy_bandwidth(dry_run: bool = False) -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write counted): the roofline's denominator."""
    if dry_run:
        return 1e10
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (start.elapsed_time(end) / 1e3)


def time_graph(call, copies: int, dry_run: bool = False) -> float:
    """Median microseconds per call of ``call(i)`` (i cycles through the weight copies) over CUDA-graph replays."""
    if dry_run:  # wall clock of one call, only to exercise the script
        t0 = time.perf_counter()
        call(0)
        return (time.perf_counter() - t0) * 1e6
    for i in range(copies):  # compile, autotune nothing, warm the allocator
        call(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(3):
        call(i % copies)
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) / 3 * 1e6
    reps = max(copies, min(200, int(3000 / max(eager_us, 1.0))))  # ~3 ms of work per replay
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(reps):
            call(r % copies)
    graph.replay()
    times = []
    for _ in range(10 if eager_us < 2000 else 4):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    del graph
    return statistics.median(times)


def checked_time(what: str, call, copies: int, rel_err, limit: float, repeats: int = 0, same=torch.equal,
                 log=print, dry_run: bool = False) -> float | str:  # fmt: skip
    """Microseconds per ``call(i)`` (i cycles through ``copies`` input copies) once its output is checked, else why
    not: "n/a" (it cannot run the shape: it raised, or returned None), "WRONG" (``rel_err(out)`` over ``limit``) or
    "RACY" (one of ``repeats`` more calls not ``same`` as the first, where the output must repeat bit for bit).

    A timing of an unchecked kernel is worth nothing: a fast wrong config would win the sweep. On a dry run the time
    is the checked call's wall clock (``time_graph`` would run the interpreter once more for a number that means
    nothing)."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    try:
        t0 = time.perf_counter()
        out = call(0)
        first_us = (time.perf_counter() - t0) * 1e6
        again = [call(0) for _ in range(repeats)]
    except (ValueError, RuntimeError, OutOfResources, CompilationError) as e:  # a shape or config it cannot run
        log(f"  {what}: n/a ({str(e).splitlines()[0][:100]})")
        return "n/a"
    if out is None:
        return "n/a"
    err = rel_err(out)
    if not err <= limit:
        log(f"  {what}: WRONG (rel err {err:.3g})")
        return "WRONG"
    if not all(same(out, o) for o in again):
        log(f"  {what}: RACY (repeated calls differ)")
        return "RACY"
    return first_us if dry_run else time_graph(call, copies)
