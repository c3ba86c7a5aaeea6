"""Dynamic per-tensor fp8 quant ``dynamic_per_tensor_quant(out!, x, scale!)``: one scale for the whole tensor.

The kernel **overwrites** ``scale`` and never reads it. That is the contract the zero-fill rewrite relies on
(DESIGN.md: ``zeros(1)`` before this op is dead work only if the op overwrites its scale). Kernels that
``atomic_max`` into the caller's scale (aiter's Triton per-tensor quant, vLLM's CUDA one; kernels.md §0.4) need
that buffer zeroed first; here the per-program maxima go into a fresh internal buffer instead, and the second
kernel reduces them and stores the scale, so any incoming value (+-inf, NaN, 1e30) is irrelevant.

Two launches when the tensor is large: ``_amax_kernel`` (P <= 264 programs, grid-stride over x) writes partial
maxima, then ``_per_tensor_quant_kernel`` (one tile per program) reduces the P partials (1 KB from L2 per
program), quantizes its tile, and program 0 writes the scale. Up to ``SINGLE_PROGRAM_MAX`` elements one program
does both in one launch: at that size the second launch (~3 us) costs more than the serial work.
Numerics: ``reference.per_tensor_quant``: amax NaN-propagating, scale = max(amax, 1e-10) / FP8_MAX,
q = clamp(x / scale) cast RTNE; bit-exact (correctly rounded divisions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch
from ._fp8 import amax_nan, cast_fp8, div_by_scale, kernel_constexprs, max_nan, reciprocal_of, scale_of, to_fp32

BLOCK = 4096  # elements per program step: 8 KB of bf16, 16 values / thread at 8 warps (see _tiles.py)
NUM_WARPS = 8
MAX_PARTIALS = 256  # amax programs: ~2 per SM on a 132-SM H200; each quant program re-reads them (1 KB)
SINGLE_PROGRAM_MAX = 4 * BLOCK  # decode-sized tensors: one launch


# Triton code below keeps its arguments grouped by role (one comment per group), so the formatter is off.
# fmt: off


@triton.jit
def _amax_kernel(x_ptr, partial_ptr, N, ITERS, BLOCK: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """partial[pid] = max |x| over tiles pid, pid + P, pid + 2P, ... (NaN-propagating)."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = (pid + i * tl.num_programs(0)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < N, other=0.0, eviction_policy="evict_last")  # re-read by pass 2
        acc = max_nan(acc, tl.abs(to_fp32(x, EMULATE_CAST)))
    tl.store(partial_ptr + pid, amax_nan(acc, 0, EMULATE_CAST))


@triton.jit
def _quant_tile(x_ptr, out_ptr, offs, N, scale_fin, r, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
                FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr, PTX: tl.constexpr):
    x = to_fp32(tl.load(x_ptr + offs, mask=offs < N, other=0.0, eviction_policy="evict_first"), EMULATE_CAST)
    q = cast_fp8(div_by_scale(x, scale_fin, r), out_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ,
                 EMULATE_CAST, PTX)
    tl.store(out_ptr + offs, q, mask=offs < N)


@triton.jit
def _per_tensor_quant_kernel(
    x_ptr, out_ptr,  # x: contiguous [N]; out: contiguous fp8 [N]
    partial_ptr, P,  # P partial maxima from _amax_kernel (unused when SINGLE_PROGRAM)
    scale_ptr,  # fp32 [1]: written by program 0, never read
    N,
    BLOCK: tl.constexpr, P_BLOCK: tl.constexpr,  # tile per program; next_power_of_2(P)
    SINGLE_PROGRAM: tl.constexpr,  # one program computes the amax itself and quantizes all of x
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,  # compiling for NVIDIA: saturating fp8 cast (_fp8.kernel_constexprs)
):
    pid = tl.program_id(0)
    if SINGLE_PROGRAM:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc = max_nan(acc, tl.abs(to_fp32(tl.load(x_ptr + offs, mask=offs < N, other=0.0), EMULATE_CAST)))
        amax = amax_nan(acc, 0, EMULATE_CAST)
    else:
        parts = tl.load(partial_ptr + tl.arange(0, P_BLOCK), mask=tl.arange(0, P_BLOCK) < P, other=0.0)
        amax = amax_nan(parts, 0, EMULATE_CAST)
    scale = scale_of(amax, FP8_MAX)
    if pid == 0:
        tl.store(scale_ptr, scale)
    r, scale_fin = reciprocal_of(scale)
    if SINGLE_PROGRAM:
        for start in range(0, N, BLOCK):
            _quant_tile(x_ptr, out_ptr, start + tl.arange(0, BLOCK), N, scale_fin, r,
                        FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    else:
        _quant_tile(x_ptr, out_ptr, pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK), N, scale_fin, r,
                    FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)


# fmt: on


def dynamic_per_tensor_quant(out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor) -> None:
    """Quantize x into ``out`` (fp8, x's shape) with one dynamic scale written to ``scale`` (fp32, one element)."""
    fp8 = arch.arch_of(x.device).fp8_dtype
    xf = x.reshape(-1)  # a copy only when x's leading dims are not dense
    n = xf.numel()
    # Write straight into out when it is a dense buffer of the device's fp8; else into a temporary, then copy_
    # (the reference also computes in the device's fp8 dtype and copies into out).
    direct = out.is_contiguous() and out.dtype == fp8
    q = out.view(-1) if direct else torch.empty(n, dtype=fp8, device=x.device)
    s = scale.view(1) if scale.is_contiguous() else torch.empty(1, dtype=torch.float32, device=x.device)
    consts = kernel_constexprs(x.device)
    if n <= SINGLE_PROGRAM_MAX:
        _per_tensor_quant_kernel[(1,)](xf, q, s, 0, s, n, BLOCK=BLOCK, P_BLOCK=16, SINGLE_PROGRAM=True,
                                       num_warps=NUM_WARPS, **consts)  # fmt: skip
    else:
        tiles = triton.cdiv(n, BLOCK)
        p = min(tiles, MAX_PARTIALS)
        partials = torch.empty(p, dtype=torch.float32, device=x.device)  # fresh: nothing stale to read
        _amax_kernel[(p,)](xf, partials, n, triton.cdiv(tiles, p), BLOCK=BLOCK, num_warps=NUM_WARPS,
                           EMULATE_CAST=consts["EMULATE_CAST"])  # fmt: skip
        _per_tensor_quant_kernel[(tiles,)](xf, q, partials, p, s, n, BLOCK=BLOCK, P_BLOCK=triton.next_power_of_2(p),
                                           SINGLE_PROGRAM=False, num_warps=NUM_WARPS, **consts)  # fmt: skip
    if not direct:
        out.copy_(q.view(out.shape))
    if s.data_ptr() != scale.data_ptr():
        scale.copy_(s.view(scale.shape))
