"""Shared Triton helpers: NaN-propagating amax, the fp8 cast, and the 1 x G group-quant step.

Every quant kernel calls ``group_quant_tile`` so that all of them round identically to ``reference.group_quant``:
  amax  = max |y| over the group (NaN propagates: a NaN anywhere gives that group a NaN scale, nothing else)
  scale = max(amax, 1e-10) / FP8_MAX                      (correctly rounded division, as torch's ``/`` on the CPU)
  q     = cast_fp8(clamp(y / scale, -FP8_MAX, FP8_MAX))   (correctly rounded division, RTNE cast)
Bit-exact with the reference computed on the CPU. (torch on CUDA divides by a Python scalar as a multiplication by
its fp32 reciprocal, one ulp off in 59% of groups; plain Triton ``/`` lowers to the approximate ``div.full.f32``.)
Both divisions are exact by Markstein's theorem, the final step of CUDA's own ``div.rn``: with r = RN(1/b) and
q0 = RN(a * r) (within one ulp), the residual a - q0 * b is exact in an fma and RN(q0 + r * residual) = RN(a / b).
For the scale b = FP8_MAX is a constant, so r is too: 3 instructions instead of a ``div.rn`` (~10 SASS with a slow
path). Per value, ``div_by_scale`` is one multiply and two fmas against one ``div.rn`` reciprocal per *group*.
Counted from sm_90 SASS (Triton 3.6, offline ``ptxas``; see ``_tiles.py``), the quant step went from ~11 to ~5
instructions per value: no select for zero quotients (the residual's sign order keeps -0) and, with ``PTX``, no
software clamp (``cvt.rn.satfinite.e4m3x2`` saturates +-inf and out-of-range values to +-FP8_MAX, NaN to NaN).

The CPU interpreter (``TRITON_INTERPRET=1``, triton 3.9) casts fp32 -> fp8 wrongly; verified here on 16 values:
126.56 -> 64 (a mantissa carry is lost), 1.0625 -> 1.125 (ties round away, not to even), 0.0019531 -> 0 (fp8
subnormals below the grid flush), NaN -> 384 / 192 (NaN is lost). So when ``EMULATE`` is set (launchers set it
from ``arch.triton_interpreting()``) the helper never asks Triton to convert a value: it rounds to the e4m3 grid in
fp32 arithmetic (exponent from the bits, step = 2^(max(e, E_MIN) - 3), magic-number RTNE) and assembles the fp8
byte itself, then bitcasts. On a GPU the flag is False and the hardware cast (``cvt.rn.satfinite``) runs.
The interpreter's bf16 conversions are wrong too (fp16 is right): fp32 -> bf16 truncates (48% of 1024 random
values differ from torch's RTNE) and both directions mangle subnormals (1e-39 -> 4.4e-39). So every bf16
conversion goes through ``round_to`` / ``to_fp32``, which move the bits with integer shifts under the same flag.
Markstein's steps need a fused multiply-add, and Triton 3.8's interpreter (torch 2.14's pin) computes
``tl.math.fma`` as a rounded product plus a sum: 50,439 of 524,298 quotients of ``check_division`` came out wrong
there. So under the interpreter ``fma32`` rounds once itself, in fp64 (``_INTERPRETING``); on a GPU it is the fma.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import arch

# reference.AMAX_FLOOR: an all-zero group gets scale 1e-10 / FP8_MAX and zeros, never NaN.
AMAX_FLOOR = tl.constexpr(1e-10)
# 2^23: in fp32, (y + 2^23) - 2^23 rounds 0 <= y < 2^22 to an integer, ties to even.
_RNE_MAGIC = tl.constexpr(8388608.0)
# Kernels run by the CPU interpreter (read once, at import: conftest and the benchmarks' --dry-run set it first).
_INTERPRETING = tl.constexpr(arch.triton_interpreting())


def fp8_constexprs(device: torch.device) -> dict:
    """Constexpr kwargs describing the device's fp8 flavour, for every quant kernel launch."""
    a = arch.arch_of(device)
    return {
        "FP8_MAX": a.fp8_max,
        "FP8_MIN_EXP": a.fp8_min_normal_exp,
        "FNUZ": a.fp8_dtype == torch.float8_e4m3fnuz,
        "EMULATE_CAST": arch.triton_interpreting(),
    }


def kernel_constexprs(device: torch.device) -> dict:
    """``fp8_constexprs`` plus ``PTX``: compiling for an NVIDIA GPU (not the interpreter, not ROCm), so the
    saturating fp8 cast and PTX inline assembly (``silu_and_mul``'s approximate exp / reciprocal) are available.
    Kernels that take ``PTX`` pass it to ``cast_fp8`` / ``group_quant_tile`` (default False: clamp in software)."""
    return {**fp8_constexprs(device), "PTX": arch.arch_of(device).platform == "cuda" and not arch.triton_interpreting()}


@triton.jit
def max_nan(a, b):
    """max that propagates NaN (tl.max / tl.maximum default to maxnum, which drops it: verified, 3.0865 vs nan)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def amax_nan(v, axis: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """max |v| along ``axis``, NaN if any element is NaN (torch's ``amax``).

    On the GPU one ``max.NaN`` reduction. The interpreter runs a custom-combine ``tl.reduce`` element by element
    in Python (a 17 x 5120 group quant took 31 s, 30 s of it there), so under ``EMULATE_CAST`` (set exactly when
    interpreting) it takes numpy's max, which drops NaN, and adds a sum that is NaN iff a NaN is present.
    """
    if EMULATE_CAST:
        return tl.max(tl.abs(v), axis) + tl.sum(tl.where(v != v, v, 0.0), axis)  # noqa: PLR0124
    return tl.reduce(tl.abs(v), axis, max_nan)


@triton.jit
def round_to(v, dtype: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """fp32 ``v`` rounded to nearest even in ``dtype`` (bf16 / fp16 / fp32): what torch's ``.to(dtype)`` does."""
    if EMULATE_CAST and dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # RTNE on the top 16 bits; inf stays inf
        rounded = tl.where(v != v, bits, rounded)  # noqa: PLR0124 - NaN: adding could carry into the sign
        return (rounded >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v.to(dtype)


@triton.jit
def to_fp32(v, EMULATE_CAST: tl.constexpr):
    """``v`` (bf16 / fp16 / fp32) widened to fp32, exactly (bf16: its 16 bits on top of an fp32)."""
    if EMULATE_CAST and v.dtype == tl.bfloat16:
        return (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def rounded(v, DTYPE: tl.constexpr, EMULATE_CAST: tl.constexpr):
    """fp32 ``v`` rounded to the activation dtype and widened back: one eager op's output."""
    return to_fp32(round_to(v, DTYPE, EMULATE_CAST), EMULATE_CAST)


@triton.jit
def _emulated_fp8_code(v, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr):
    """The e4m3 byte of fp32 ``v`` (already clamped to +-FP8_MAX, or NaN), rounded to nearest even, in integer
    and exact fp32 arithmetic only.

    With e = max(exponent(v), E_MIN) and step = 2^(e - 3), n = rint(|v| / step) counts grid steps (0..16); the byte
    magnitude is (e - E_MIN) * 8 + n. That one formula covers subnormals (e = E_MIN, n < 8), normals (8 <= n < 16)
    and the carry of a round-up into the next binade (n = 16 equals the next exponent's n = 8).
    """
    bits = v.to(tl.int32, bitcast=True)
    nan = v != v  # noqa: PLR0124 - the NaN test
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, FP8_MIN_EXP)
    e = tl.where(nan, 0, e)  # keep the scaling finite for NaN lanes; their byte is overwritten below
    inv_step = ((127 + 3 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3 - e): exact power of two
    y = tl.where(nan, 0.0, tl.abs(v)) * inv_step  # exact: scaling by a power of two, no underflow for e >= E_MIN
    n = ((y + _RNE_MAGIC) - _RNE_MAGIC).to(tl.int32)
    code = (e - FP8_MIN_EXP) * 8 + n
    if FNUZ:
        # e4m3fnuz: no negative zero (0x80 is its only NaN), so -0 -> 0x00, NaN -> 0x80.
        code = tl.where((bits < 0) & (code != 0), code | 0x80, code)
        code = tl.where(nan, 0x80, code)
    else:
        # e4m3fn: sign bit as is (-0 -> 0x80, as torch); NaN -> 0x7F with its sign, torch's encoding.
        code = tl.where(nan, 0x7F, code)
        code = tl.where(bits < 0, code | 0x80, code)
    return code.to(tl.uint8)


@triton.jit
def cast_fp8(
    v,
    out_dtype: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    FNUZ: tl.constexpr,
    EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr = False,
):
    """clamp(v, +-FP8_MAX) cast to fp8 with round-to-nearest-even; NaN stays NaN (propagating clamp)."""
    if PTX:  # cvt.rn.satfinite.e4m3x2.f32: the clamp is part of the instruction (checked byte-exact on the GPU)
        return v.to(out_dtype)
    # max/min with NaN propagation (max.NaN / min.NaN), the same ops as the amax reduction.
    v = tl.minimum(max_nan(v, -FP8_MAX), FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    if EMULATE_CAST:
        return _emulated_fp8_code(v, FP8_MIN_EXP, FNUZ).to(out_dtype, bitcast=True)
    return v.to(out_dtype)


@triton.jit
def fma32(a, b, c):
    """RN_fp32(a * b + c), rounded once: the hardware fma on a GPU. Under the interpreter, in fp64: a * b is exact
    there, the sum is RN_fp64 with its exact error from TwoSum, and rounding that sum to odd (an inexact result
    takes the neighbour with an odd last bit) before RN_fp32 removes the double rounding (53 >= 24 + 2 bits)."""
    if _INTERPRETING:
        p = tl.cast(a, tl.float64) * tl.cast(b, tl.float64)  # tl.cast: an operand may be a constexpr
        c64 = tl.cast(c, tl.float64)
        s = p + c64
        back = s - p
        err = (p - (s - back)) + (c64 - back)  # s + err == p + c exactly (TwoSum); NaN for inf / NaN inputs
        bits = s.to(tl.int64, bitcast=True)
        inexact_even = (err == err) & (err != 0.0) & ((bits & 1) == 0)  # noqa: PLR0124 - err == err: not NaN
        away = (err > 0.0) == (s > 0.0)  # the exact value lies beyond s in magnitude
        bits = tl.where(inexact_even, tl.where(away, bits + 1, bits - 1), bits)
        return bits.to(tl.float64, bitcast=True).to(tl.float32)
    return tl.math.fma(a, b, c)


@triton.jit
def scale_of(amax, FP8_MAX: tl.constexpr):
    """RN(max(amax, 1e-10) / FP8_MAX) exactly, for amax >= 0 / inf / NaN, with a constant reciprocal (Markstein)."""
    a = max_nan(amax, AMAX_FLOOR)
    rcp: tl.constexpr = 1.0 / FP8_MAX  # RN_fp32(RN_fp64(1 / FP8_MAX)) = RN_fp32(1 / FP8_MAX): 53 >= 2 * 24 + 2 bits
    q0 = a * rcp
    s = fma32(fma32(q0, -FP8_MAX, a), rcp, q0)
    return tl.where(a == float("inf"), a, s)  # inf: the residual inf - inf is NaN; NaN stays NaN either way


@triton.jit
def reciprocal_of(scale):
    """The per-group half of ``div_by_scale``: (RN(1 / scale), scale with inf replaced by 1).

    For scale = inf (a group holding +-inf), r = 0 and the stand-in 1 keeps the residual finite, so finite y give
    +-0 (= y / inf, sign kept) and y = +-inf gives inf * 0 = NaN (= inf / inf)."""
    return tl.math.div_rn(1.0, scale), tl.where(scale == float("inf"), 1.0, scale)


@triton.jit
def div_by_scale(y, scale_fin, r):
    """RN(y / scale) for y [..., G] and ``reciprocal_of(scale)`` broadcast against it, equal to IEEE division.

    q0 = RN(y * r); the residual is taken as RN(q0 * scale - y) (exact) and subtracted: for y = -0 that is
    -0 - (+0) * r = -0, so the sign of a zero quotient survives without a select. Quotients below fp32's normal
    range (fp32 inputs holding subnormals next to a group max >= 2^-40) may end up +-0 with either sign; their fp8
    value is 0 regardless."""
    q0 = y * r
    return fma32(fma32(q0, scale_fin, y * -1.0) * -1.0, r, q0)


@triton.jit
def group_quant_tile(
    y,
    out_dtype: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    FNUZ: tl.constexpr,
    EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr = False,
):
    """Quantize fp32 ``y [BM, GPC, G]`` per group (the last axis). Returns ``(q [BM, GPC, G] fp8, scale [BM, GPC])``.

    Masked-out lanes must hold 0 (they then give amax 0 and are not stored by the caller).
    """
    scale = scale_of(amax_nan(y, 2, EMULATE_CAST), FP8_MAX)
    r, scale_fin = reciprocal_of(scale)
    q = div_by_scale(y, scale_fin[:, :, None], r[:, :, None])
    return cast_fp8(q, out_dtype, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX), scale
