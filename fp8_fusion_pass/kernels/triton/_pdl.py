"""Programmatic dependent launch (PDL) for our Triton kernels on sm90+: a switch, off by default.

Why: in a decode step's CUDA graph every kernel pays a launch and a ramp of ~1-2 us before its first load, and
the small-M GEMM then waits on HBM for weights that no earlier kernel writes. With PDL (Triton 3.6+:
``kernel[grid](..., launch_pdl=True)`` sets CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) a kernel may
start while the one before it still runs, once every program of that one has called ``gdc_launch_dependents()``
(or exited); ``gdc_wait()`` then blocks until the previous grid has completed and its memory is flushed. The GEMM
uses the gap to prefetch its first weight tiles into L2 (``prefetch_l2``).

The rule, in every PDL kernel: ``gdc_wait()`` first, then ``gdc_launch_dependents()``. Before the wait only loads
of constant data (weights, weight scales) may run: no load of anything another kernel writes, and no store at all
(an earlier kernel may still read or write that memory: the caching allocator hands a freed buffer to the next op
in stream order). The elementwise kernels and the split-K sum do both at their top (``wait_then_launch``); the
small-M GEMM triggers after its K loop (``_small_m_kernels.py`` note 10: at the top, back-to-back GEMMs were
1.1-1.3x slower, the next grid's programs resident early and spinning).
Hazard: "the previous grid is complete" is transitive only if *every* program of every PDL kernel calls
``gdc_wait()`` before it stores or loads dependent data and before it exits. A program that skipped it could let
its grid complete before its predecessor did, and the kernel after it would read stale data.
Order measured (a probe on the H200, torch 2.11, Triton 3.6: a copy kernel feeding a GEMV; CUDA graph capture
with ``launch_pdl`` works and gave correct results): triggering *before* the wait made chains slower, each later
kernel became resident early and spun in its wait (a cascade), so the trigger comes after the wait.

Switch: ``FP8_FUSION_PDL=1`` in the environment, read at each launch (so a benchmark can compare both in one
process); PDL also needs a CUDA device of capability >= 9 and no ``TRITON_INTERPRET``.
``FP8_FUSION_PDL_PREFETCH=0`` keeps PDL but drops the GEMM's L2 prefetch (``benchmarks/pdl.py`` times the two
apart). Off by default: on the H200 it saved ~1.3 us on M=1 norm_quant -> GEMM chains and cost as much elsewhere
(``_small_m_kernels.py`` note 10); on whole decode steps (``benchmarks/decode.py`` with ``FP8_FUSION_PDL=1``,
engine form, all layers) Qwen3-8B / Llama-3.1-8B with the pass ran 3.383 / 3.140 ms at batch 1 against 3.401 /
3.148 without PDL in the run before, and 5.794 / 5.275 against 5.859 / 5.368 at batch 64: under 2%, about the
spread between runs. Measured in interleaved rounds within one run, Qwen3-32B at batch 1 was 1.2% slower with it
(docs/benchmarks.md, "The o_proj quant at batch 1"), and 1.1% slower with PDL on the launches that are not GEMMs
alone ("PDL for the launches that are not GEMMs"). With the switch off every kernel compiles
to the same code as before (the ``PDL`` branches are pruned at compile time: identical sm_90 PTX, checked) and
launches without the attribute.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

import torch
import triton
import triton.language as tl

from ... import arch as _arch

ENV = "FP8_FUSION_PDL"
PREFETCH_ENV = "FP8_FUSION_PDL_PREFETCH"


def pdl_enabled(device: torch.device | str) -> bool:
    """True when ``FP8_FUSION_PDL=1``, ``device`` is CUDA with capability >= 9, and Triton is not interpreting."""
    if os.environ.get(ENV, "0") != "1" or _arch.triton_interpreting() or torch.device(device).type != "cuda":
        return False
    return _arch.arch_of(device).pdl


def prefetch_enabled() -> bool:
    """With PDL: the small-M GEMM prefetches its first weight tiles into L2 before its wait (env PREFETCH_ENV)."""
    return os.environ.get(PREFETCH_ENV, "1") != "0"


def launch_kwargs(pdl: bool) -> dict:
    """The Triton launch option: ``{"launch_pdl": True}`` with PDL, else nothing (launches stay as before)."""
    return {"launch_pdl": True} if pdl else {}


def pdl_kwargs(device: torch.device | str) -> dict:
    """``PDL`` constexpr plus the launch option, for a kernel whose only PDL code is ``wait_then_launch``."""
    pdl = pdl_enabled(device)
    return {"PDL": pdl, **launch_kwargs(pdl)}


def switched(on: bool, prefetch: bool = True) -> AbstractContextManager:
    """The launches inside see these switches. Tests and benchmarks only: it sets the process environment (and
    restores it on exit)."""
    from unittest import mock  # not at import time: only tests and benchmarks switch

    return mock.patch.dict(os.environ, {ENV: "1" if on else "0", PREFETCH_ENV: "1" if prefetch else "0"})


@triton.jit
def wait_then_launch(PDL: tl.constexpr):
    """With PDL: wait for the previous grid (complete, memory flushed), then let the next PDL grid launch.
    Every program of a PDL kernel must call it before any store and any load of data another kernel writes."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes):
    """``cp.async.bulk.prefetch.L2`` of ``nbytes`` from each address of ``ptrs``: a hint, no registers written,
    nothing to wait for. Each address must be 16-byte aligned and ``nbytes`` a multiple of 16 (sm_90+)."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
