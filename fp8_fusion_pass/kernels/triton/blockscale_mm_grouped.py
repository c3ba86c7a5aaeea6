"""``blockscale_mm_grouped`` on the Triton backend: GEMMs that share one quantized activation (HF's separate q /
k / v or gate / up projections) in one small-M launch, each reading its own weight (no merged weight copy).

At decode each of those GEMMs is one or two launches of a few microseconds, much of it a fixed ramp and tail
(``_small_m_kernels.py``); one launch over the concatenated N tiles pays that once and has the merged shape's
parallelism. It is used where ``blockscale_mm`` would run the merged shape (N = sum of the N_i) on the small-M
path or the GEMV, with that plan's config (the merged rows of ``blockscale_mm.TABLE``: Qwen3-8B qkv 6144 x 4096,
gate_up 24576 x 4096): the GEMV at one row (``gemv_mm_grouped``: each program's rows lie in one weight, the merged
shape's loop), else the small-M kernel; where the GEMV cannot read the weights in place (a weight before the last
not a whole number of its rows per program, differing strides), the small-M kernel's best config measured beside
the GEMV row (``blockscale_mm.SMALL_M_BEST``). Anything else is ``torch.cat`` of per-weight ``blockscale_mm``
calls: the same values.

Measured on the H200 (2026-12-04, ``benchmarks/grouped_gemm.py --ms 1,2,4,8``, docs/benchmarks.md "The grouped
GEMV, timed"): at one row the grouped GEMV takes what the merged weight's GEMV takes (0.99-1.01x: Qwen3-8B q|k|v
8.74 against 8.86 us, Qwen3-32B gate|up 61.23 / 61.15), 1.03-1.23x faster than the grouped small-M launch it
replaced and 1.08-1.64x faster than the separate GEMVs. At M = 2-8 the grouped small-M launch is 0.98-1.04x the
merged weight's GEMM and 1.05-1.93x faster than the separate launches. In the Llama-3.1-8B HF decode step at batch 1
(same machine, back to back, 3 interleaved rounds each) the grouped GEMV took the pass's step from 3.365 to 3.276 ms:
1.182x -> 1.210x over the compile without the pass, 2.8 us per layer.
"""

from __future__ import annotations

import torch

from ... import arch as _arch
from .. import checks
from . import blockscale_mm as _bm
from ._gemv_kernels import GemvConfig, gemv_mm_grouped, grouped_unsupported
from ._small_m_kernels import MAX_GROUPS, small_m_mm_grouped

OP = "blockscale_mm_grouped"


def _check(q, x_scale, w_qs, w_scales, out_dtype) -> None:
    if not isinstance(w_qs, (list, tuple)) or not isinstance(w_scales, (list, tuple)):
        raise TypeError(f"{OP}: w_qs and w_scales must be lists of tensors, got {type(w_qs).__name__}, "
                        f"{type(w_scales).__name__}")  # fmt: skip
    if not w_qs or len(w_qs) != len(w_scales):
        raise ValueError(f"{OP}: w_qs and w_scales must be non-empty and of one length, got {len(w_qs)} and "
                         f"{len(w_scales)}")  # fmt: skip
    # Each weight against q: one K and one fp8 dtype for all of them follow.
    for i, (w, ws) in enumerate(zip(w_qs, w_scales)):
        checks.blockscale_mm_args(f"{OP} (weight {i})", q, x_scale, w, ws, out_dtype)


def grouped_choice(q, x_scale, w_qs, w_scales, out_dtype) -> _bm.Choice | None:
    """The merged shape's plan when one grouped launch can run it (its GEMV, or its small-M config), else None
    (per-weight GEMMs)."""
    if not 2 <= len(w_qs) <= MAX_GROUPS:
        return None
    m, k = q.shape
    n, group = sum(w.shape[0] for w in w_qs), k // x_scale.shape[1]
    a = _arch.arch_of(q.device)
    merged = _bm.plan(a, q.device.type, q.dtype, m, n, k, group, out_dtype)
    if merged.path == "gemv" and grouped_unsupported(w_qs, w_scales, merged.config or GemvConfig()) is None:
        return merged
    # The merged plan is small-M, or the GEMV cannot read these weights: the small-M config measured beside it.
    return _bm.small_m_plan(a, q.device.type, q.dtype, m, n, k, group, out_dtype)


def blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype: torch.dtype) -> torch.Tensor:
    """``y [M, sum N_i] = cat([blockscale_mm(q, x_scale, w, ws, out_dtype) for w, ws in zip(w_qs, w_scales)],
    -1)`` (fp32 accumulation, per-128-K promotion; not bitwise the separate launches' when the config differs)."""
    _check(q, x_scale, w_qs, w_scales, out_dtype)
    choice = grouped_choice(q, x_scale, w_qs, w_scales, out_dtype)
    if choice is None:
        return torch.cat([_bm.blockscale_mm(q, x_scale, w, ws, out_dtype) for w, ws in zip(w_qs, w_scales)], -1)
    if choice.path == "gemv":
        return gemv_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype, choice.config or GemvConfig())
    return small_m_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype, choice.config)
