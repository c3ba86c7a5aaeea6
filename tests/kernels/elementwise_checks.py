"""Shared by the Triton elementwise-kernel tests (``test_triton_elementwise.py``, ``test_triton_casts.py``,
``test_triton_tiles.py``); not a test module itself.

Holds: the tolerance table (every bound those tests assert); the input builders (random, adversarial); poisoned
outputs (kernel outputs start as NaN) and the exact CPU oracles of the pure quant kernels; the comparison helpers;
the ``check_*`` functions that the CPU interpreter tests and the GPU run (``TestCuda``) both call; the small Triton
kernels that probe the emulated fp8 / bf16 casts, the division by the scale and the scale itself, with
``check_casts``, ``check_division`` and ``check_scale``; and the ``cpu_only`` marker.
"""

from __future__ import annotations

import contextlib
import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import tolerances
import triton
import triton.language as tl

import fp8_fusion_pass.kernels.ops  # noqa: F401  (registers torch.ops.fp8_fusion)
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels import reference_backend as refb
from fp8_fusion_pass.kernels.triton import _fp8

# Every test module of these kernels: runs on a GPU or under the interpreter; numpy under the interpreter warns on
# the adversarial values (inf * 0, exp overflow, all-NaN groups), which is intended.
KERNEL_TEST_MARKS = [
    pytest.mark.skipif(
        not (torch.cuda.is_available() or arch.triton_interpreting()), reason="needs CUDA or TRITON_INTERPRET=1"
    ),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

# ---------------------------------------------------------------- tolerance table: every bound asserted below
# Fused vs unfused norm (DESIGN.md numerics contract): at most one fp8 step, on at most 5% of values (the seed PR's
# bound, tolerances.py), scales within the two bf16 roundings of the normalised value (2^-6 relative). Fused and
# unfused norms share one kernel but may get other tiles (another reduction order): on the H200 at M = 4097 their
# scales differed by up to 0.0067 relative.
NORM_FUSED_MAX_STEPS = tolerances.NORM_FUSED_MAX_FP8_STEPS  # 1
NORM_FUSED_MAX_FLIP_FRACTION = tolerances.NORM_FUSED_MAX_FLIP_FRACTION  # 0.05
NORM_FUSED_SCALE_REL = tolerances.SCALE_REL_TOL  # 2^-6: two bf16 roundings (tolerances.py)
# Kernel vs reference where the kernel computes the norm / silu: the sum-of-squares order, rsqrt and exp may move
# a value by one ulp before its bf16 rounding; that rounding can then land one bf16 step (2^-7 relative at a
# binade's bottom) away, which moves the group's scale by <= 2^-7 and a q by one fp8 step. Dequantized values
# stay within one fp8 step (2^-3 relative) plus one scale unit (tolerances.DEQUANT_*).
KERNEL_SCALE_REL = tolerances.SCALE_REL_TOL  # two bf16 steps of the amax: the value is rounded twice
# Such a one-ulp slip lands within one ulp of a bf16 rounding boundary with probability ~2 * 2^-16 per value, so
# flips stay far below 0.5% (the CPU interpreter matched the reference bit for bit on every case here); dropping
# the bf16 rounding of the normalised value, the classic fusion bug, flips ~2% (Inductor, inductor_api.md §6).
KERNEL_MAX_FLIP_FRACTION = 0.005
DEQUANT_RTOL = tolerances.DEQUANT_RTOL  # 0.125: one fp8 step at the bottom of a binade
DEQUANT_ATOL_IN_SCALES = tolerances.DEQUANT_ATOL_IN_SCALES  # 1.0 scale unit for values near zero
BF16_OUT_RTOL = 2.0**-6  # unquantized norm / silu output: two roundings to x.dtype (normed, then w * normed)
# Pure quant kernels (group_quant, dynamic_per_tensor_quant): EXACT on every device, against the contract computed
# on the CPU (``_oracle_*``). Not against torch on CUDA: it divides by a Python scalar as a multiplication by its fp32
# reciprocal (BinaryDivTrueKernel.cu, "may lose one bit of precision"), so ``amax / 448.0`` there is one ulp off
# the IEEE quotient in 59% of groups and 0.12% of fp8 values flip (first GPU round: exactly 0.12121% on
# group_quant (4096, 1024), the number the CPU reproduces with amax * float32(1/448)). The kernels divide with
# ``div_rn`` (and the exact one-reciprocal-per-group scheme of ``_fp8.div_by_scale``), as the CPU does.

OPS = torch.ops.fp8_fusion
BF16 = torch.bfloat16
EPS = 1e-6
HIDDEN = (1024, 2048, 4096, 5120)  # Qwen3-0.6B, Qwen3-1.7B, Qwen3-8B / Llama-3.1-8B, Qwen3-32B
INTERMEDIATE = (12288, 14336, 25600)  # Qwen3-8B, Llama-3.1-8B, Qwen3-32B (silu, M = 1 only: interpreter time)
LEADS = ((1,), (17,), (3, 1))  # decode M = 1, odd M, a 3-D input


def _on_cpu_interpreter() -> bool:
    return arch.triton_interpreting() and not torch.cuda.is_available()


cpu_only = pytest.mark.skipif(not _on_cpu_interpreter(), reason="the CPU interpreter run (CUDA: TestCuda)")


# ---------------------------------------------------------------- inputs


def _randn(*shape, device="cpu", dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def _adversarial(m: int, k: int, device="cpu", seed=0) -> torch.Tensor:
    """[m >= 9, k >= 256] bf16: one pathology per row, the rest of each row random."""
    x = _randn(m, k, seed=seed, dtype=torch.float32)
    x[1, :128] = 0  # an all-zero group
    x[2, 3], x[2, 130] = float("inf"), float("-inf")  # +-inf (in two groups)
    x[3, 200] = float("nan")  # NaN: its group only
    x[4, 5], x[4, 140] = 1e30, -1e30  # far beyond fp8 max (and x^2 overflows fp32)
    x[5, :128] = 1e-39 * torch.sign(x[5, :128])  # bf16 denormals, a whole group
    x[5, 128:256] *= 1e-38  # denormals next to tiny normals
    x[6] *= 1e-3
    x[6, ::128] = 1e4  # one huge outlier per group
    x[7, :8] = torch.tensor([448.0, -448.0, 464.0, 480.0, -1000.0, 240.0, 241.0, 239.0])  # at / beyond fp8 max
    x[8] = 0  # an all-zero row (norm: rstd = 1/sqrt(eps))
    return x.to(device=device, dtype=BF16)


# ---------------------------------------------------------------- poisoned outputs and the exact oracle

_EMPTY = torch.empty
_FP8_NAN_BYTE = {torch.float8_e4m3fn: 0x7F, torch.float8_e4m3fnuz: 0x80}


def _poisoned_empty(*args, **kwargs):
    t = _EMPTY(*args, **kwargs)
    if t.dtype in _FP8_NAN_BYTE:
        t.view(torch.uint8).fill_(_FP8_NAN_BYTE[t.dtype])
    elif t.is_floating_point():
        t.fill_(float("nan"))
    return t


@contextlib.contextmanager
def _poisoned_outputs():
    """Kernel outputs start as NaN, so a value the kernel never stores is a NaN where the reference has a number.

    Plain ``torch.empty`` hides unwritten outputs: the CPU allocator hands a freed block of the same size straight
    back, often holding the previous launch's (correct) answer. A tile whose tail groups are never stored passed
    that way; on the GPU it showed as scales off by exactly 1 (fresh zeroed memory) or residual values of 7e27.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty", _poisoned_empty)
        yield


def _oracle_group_quant(x: torch.Tensor, g: int):
    """``reference.group_quant`` computed on the CPU (IEEE division), for x's device fp8 facts, on x's device."""
    a = arch.arch_of(x.device)
    q, s = ref.group_quant(x.cpu(), g, a.fp8_dtype, a.fp8_max)
    return q.to(x.device), s.to(x.device)


def _oracle_per_tensor_quant(x: torch.Tensor):
    a = arch.arch_of(x.device)
    q, s = ref.per_tensor_quant(x.cpu(), a.fp8_dtype, a.fp8_max)
    return q.to(x.device), s.to(x.device)


# ---------------------------------------------------------------- comparisons


def _codes(q: torch.Tensor) -> torch.Tensor:
    """fp8 bytes as signed step counts (sign-magnitude -> integer), so |a - b| counts fp8 steps across zero."""
    b = q.view(torch.uint8).to(torch.int32)
    mag = b & 0x7F
    return torch.where(b >= 0x80, -mag, mag)


def _same_specials(a: torch.Tensor, b: torch.Tensor, what: str):
    a, b = a.float(), b.float()
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN positions differ"
    assert torch.equal(a.isinf() & (a > 0), b.isinf() & (b > 0)), f"{what}: +inf positions differ"
    assert torch.equal(a.isinf() & (a < 0), b.isinf() & (b < 0)), f"{what}: -inf positions differ"


def _assert_exact(a: torch.Tensor, b: torch.Tensor, what: str):
    assert (a.shape, a.dtype) == (b.shape, b.dtype), what
    _same_specials(a, b, what)
    fa, fb = a.float(), b.float()
    finite = ~fa.isnan()
    assert torch.equal(fa[finite], fb[finite]), f"{what}: {(fa[finite] != fb[finite]).sum()} values differ"


def _assert_quant_close(q, s, q_ref, s_ref, *, scale_rel: float, max_flip: float, max_steps: int | None, what: str):
    """q / scale vs a reference: same specials, scales within scale_rel, fp8 flips bounded, dequantized close."""
    assert (q.shape, q.dtype, s.shape, s.dtype) == (q_ref.shape, q_ref.dtype, s_ref.shape, s_ref.dtype), what
    _same_specials(s, s_ref, f"{what} scale")
    _same_specials(q, q_ref, f"{what} q")
    fin = torch.isfinite(s) & torch.isfinite(s_ref)
    rel = ((s[fin] - s_ref[fin]).abs() / s_ref[fin].abs().clamp_min(1e-30)).max().item() if fin.any() else 0.0
    assert rel <= scale_rel, f"{what}: scale relative difference {rel:.3g} > {scale_rel:.3g}"
    ok = ~q.float().isnan()
    steps = (_codes(q) - _codes(q_ref)).abs()[ok]
    flipped = (steps > 0).float().mean().item() if steps.numel() else 0.0
    assert flipped <= max_flip, f"{what}: {flipped:.2%} of fp8 values differ (bound {max_flip:.2%})"
    if max_steps is not None and steps.numel():
        assert steps.max().item() <= max_steps, f"{what}: {steps.max().item()} fp8 steps apart (bound {max_steps})"
    d, dr = ref.dequant_activation(q, s), ref.dequant_activation(q_ref, s_ref)
    sr = s_ref.repeat_interleave(q.shape[-1] // s.shape[-1], -1)
    fin = torch.isfinite(d) & torch.isfinite(dr)
    bound = DEQUANT_RTOL * dr.abs() + DEQUANT_ATOL_IN_SCALES * sr
    assert torch.all((d - dr).abs()[fin] <= bound[fin]), f"{what}: dequantized values differ by more than a step"


def _assert_kernel_quant(q, s, q_ref, s_ref, what, *, pure_quant: bool):
    """Kernel vs reference: the pure quant bit-exact against ``_oracle_*`` (any device), the table otherwise."""
    if pure_quant:
        _assert_exact(q, q_ref, f"{what} q")
        _assert_exact(s, s_ref, f"{what} scale")
    else:
        _assert_quant_close(q, s, q_ref, s_ref, scale_rel=KERNEL_SCALE_REL,
                            max_flip=KERNEL_MAX_FLIP_FRACTION, max_steps=None, what=what)  # fmt: skip


def _assert_activation_close(y, y_ref, what):
    assert (y.shape, y.dtype) == (y_ref.shape, y_ref.dtype), what
    _same_specials(y, y_ref, what)
    a, b = y.float(), y_ref.float()
    fin = torch.isfinite(a) & torch.isfinite(b)
    assert torch.all((a - b).abs()[fin] <= BF16_OUT_RTOL * b.abs()[fin] + 1e-30), f"{what}: beyond two bf16 steps"
    if y.dtype != torch.float32:  # rounded outputs differ rarely; fp32 ones carry every ulp of rstd along the row
        assert (a[fin] != b[fin]).float().mean().item() <= KERNEL_MAX_FLIP_FRACTION, f"{what}: too many differ"


def _assert_norm_fused_vs_unfused(q, s, q_unf, s_unf, what):
    """DESIGN.md: at most one fp8 step on a small fraction of values, scales within one bf16 rounding."""
    _assert_quant_close(q, s, q_unf, s_unf, scale_rel=NORM_FUSED_SCALE_REL, max_flip=NORM_FUSED_MAX_FLIP_FRACTION,
                        max_steps=NORM_FUSED_MAX_STEPS, what=what)  # fmt: skip


# ---------------------------------------------------------------- the checks (shared by the CPU and CUDA runs)


def _with_triton(fn, *args):
    with backends.use_backend("triton"), _poisoned_outputs():
        return fn(*args)


def check_group_quant(x, g):
    q, s = _with_triton(OPS.group_quant, x, g)
    q_ref, s_ref = _oracle_group_quant(x, g)
    _assert_kernel_quant(q, s, q_ref, s_ref, f"group_quant {tuple(x.shape)} g={g}", pure_quant=True)


def check_rms_norm_group_quant(x, w, g, residual=None):
    what = f"{'add_' if residual is not None else ''}rms_norm_group_quant {tuple(x.shape)} g={g}"
    if residual is None:
        q, s = _with_triton(OPS.rms_norm_group_quant, x, w, EPS, g)
        q_ref, s_ref = refb.rms_norm_group_quant(x, w, EPS, g)
        y = _with_triton(OPS.rms_norm, x, w, EPS)
        _assert_activation_close(y, ref.rms_norm(x, w, EPS), f"rms_norm {tuple(x.shape)}")
    else:
        q, s, res = _with_triton(OPS.add_rms_norm_group_quant, x, residual, w, EPS, g)
        q_ref, s_ref, res_ref = refb.add_rms_norm_group_quant(x, residual, w, EPS, g)
        _assert_exact(res, res_ref, f"{what} residual_out")  # one fp32 add, one RTNE rounding: exact everywhere
        y, res_unf = _with_triton(OPS.add_rms_norm, x, residual, w, EPS)
        _assert_exact(res_unf, res_ref, f"add_rms_norm {tuple(x.shape)} residual_out")
        _assert_activation_close(y, ref.add_rms_norm(x, residual, w, EPS)[0], f"add_rms_norm {tuple(x.shape)}")
    _assert_kernel_quant(q, s, q_ref, s_ref, what, pure_quant=False)
    q_unf, s_unf = _with_triton(OPS.group_quant, y, g)  # the unfused pair: Triton norm, then Triton group quant
    _assert_norm_fused_vs_unfused(q, s, q_unf, s_unf, f"{what} fused vs unfused")


def check_silu_mul_group_quant(x, g):
    what = f"silu_mul_group_quant {tuple(x.shape)} g={g}"
    q, s = _with_triton(OPS.silu_mul_group_quant, x, g)
    q_ref, s_ref = refb.silu_mul_group_quant(x, g)
    _assert_kernel_quant(q, s, q_ref, s_ref, what, pure_quant=False)
    y = _with_triton(OPS.silu_and_mul, x)
    _assert_activation_close(y, ref.silu_and_mul(x), f"silu_and_mul {tuple(x.shape)}")
    q_unf, s_unf = _with_triton(OPS.group_quant, y, g)
    _assert_exact(q, q_unf, f"{what} fused vs unfused q")  # DESIGN.md: SiLU-mul fusion is bit-exact
    _assert_exact(s, s_unf, f"{what} fused vs unfused scale")


def check_per_tensor_quant(x):
    fp8 = arch.arch_of(x.device).fp8_dtype
    out_ref, scale_ref = _oracle_per_tensor_quant(x)
    for poison in (float("nan"), float("inf"), -1e30, 0.0):  # the op overwrites its scale: the old value is moot
        out = _poisoned_empty(x.shape, dtype=fp8, device=x.device)
        scale = torch.full((1,), poison, device=x.device)
        _with_triton(OPS.dynamic_per_tensor_quant, out, x, scale)
        _assert_kernel_quant(out.view(1, -1), scale, out_ref.view(1, -1), scale_ref,
                             f"dynamic_per_tensor_quant {tuple(x.shape)} poison={poison}", pure_quant=True)  # fmt: skip


# ---------------------------------------------------------------- the emulated casts (interpreter workarounds)


@triton.jit
def _cast_kernel(x_ptr, q_ptr, b_ptr, N, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
                 FNUZ: tl.constexpr, PTX: tl.constexpr, EMULATE_CAST: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    q = _fp8.cast_fp8(x, q_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)
    tl.store(q_ptr + offs, q, mask=offs < N)
    tl.store(b_ptr + offs, _fp8.round_to(x, tl.bfloat16, EMULATE_CAST), mask=offs < N)


def check_casts(fp8: torch.dtype, device: str, emulate: bool):
    """cast_fp8 == torch's clamp-then-.to(fp8) on every bf16 value (in range and beyond, +-inf, NaN) and on 2^17
    random fp32 values; round_to(bf16) == torch's .to(bf16). Byte for byte; NaN: any NaN encoding, except that the
    emulation under the interpreter also reproduces torch's NaN byte."""
    fp8_max = arch.fp8_max_of(fp8)
    every_bf16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(BF16).float()
    g = torch.Generator().manual_seed(1)
    scales = torch.exp2(torch.randint(-30, 12, (2**17,), generator=g).float())  # subnormal fp8 to beyond max
    rand = torch.randn(2**17, generator=g) * scales
    beyond = [fp8_max + 8, fp8_max + 16, fp8_max + 32, -1e30, float("inf"), float("-inf"), 3e38]  # saturate
    ties = torch.tensor([1.0625, 1.1875, -1.0625, 2**-9 * 1.5, 2**-10, 0.0, -0.0, 126.56, 447.9, float("nan"), *beyond])
    x = torch.cat([every_bf16, rand, ties]).to(device)  # NOT clamped: saturation is cast_fp8's job
    q = torch.empty(x.shape, dtype=fp8, device=device)
    b = torch.empty(x.shape, dtype=BF16, device=device)
    block = 1 << 16 if device == "cpu" else 1024  # interpreter: few big programs; GPU: a normal tile
    # emulate: the interpreter's software path; else the device's (on NVIDIA the saturating hardware cast, PTX)
    ptx = not emulate and _fp8.kernel_constexprs(torch.device(device))["PTX"]
    _cast_kernel[(triton.cdiv(x.numel(), block),)](
        x, q, b, x.numel(), BLOCK=block, FP8_MAX=fp8_max, FP8_MIN_EXP=arch.fp8_min_normal_exp(fp8),
        FNUZ=fp8 == torch.float8_e4m3fnuz, PTX=ptx, EMULATE_CAST=emulate,
    )  # fmt: skip
    want = x.clamp(-fp8_max, fp8_max).to(fp8)  # clamp keeps NaN
    nan = x.isnan()
    bad = (q.view(torch.uint8) != want.view(torch.uint8)) & ~nan | (q.float().isnan() != nan)
    assert not bad.any(), f"{int(bad.sum())} fp8 bytes differ, e.g. {x[bad][:5].tolist()}"
    if emulate and device == "cpu":
        # Under the interpreter numpy's max/min keep a NaN's sign bit, and the emulation writes torch's byte
        # (0xFF for -NaN). On the GPU the clamp's max.NaN returns the canonical +NaN first (0x7F), so there the
        # emulated bytes (a path only the interpreter takes in production) are checked as "a NaN" like the hardware's.
        assert torch.equal(q.view(torch.uint8)[nan], want.view(torch.uint8)[nan])
    finite = x.abs() < 3e38  # bf16 rounding: values beyond bf16 max overflow to inf in both
    wrong_bf16 = (b.view(torch.int16) != x.to(BF16).view(torch.int16)) & ~nan & finite | (b.isnan() != nan)
    assert not wrong_bf16.any(), f"bf16 rounding differs at {x[wrong_bf16][:5].tolist()}"


@triton.jit
def _div_kernel(y_ptr, s_ptr, q_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(y_ptr + offs, mask=offs < N, other=1.0)
    s = tl.load(s_ptr + offs, mask=offs < N, other=1.0)
    r, s_fin = _fp8.reciprocal_of(s)
    tl.store(q_ptr + offs, _fp8.div_by_scale(y, s_fin, r), mask=offs < N)


@triton.jit
def _scale_kernel(a_ptr, s_ptr, N, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(s_ptr + offs, _fp8.scale_of(tl.load(a_ptr + offs, mask=offs < N, other=1.0), FP8_MAX), mask=offs < N)


def check_scale(device: str):
    """scale_of (a constant reciprocal and two fmas) == max(amax, 1e-10) / FP8_MAX divided on the CPU, bit for bit:
    every non-negative bf16 value (0, subnormals, inf, NaN included) and 2^18 random fp32 ones, both fp8 flavours."""
    g = torch.Generator().manual_seed(3)
    every_bf16 = torch.arange(0, 2**15, dtype=torch.int32).to(torch.int16).view(BF16).float()
    rand = torch.exp2(torch.empty(1 << 18).uniform_(-149, 128, generator=g)) * (1 + torch.rand(1 << 18, generator=g))
    amax = torch.cat([every_bf16, rand, torch.tensor([0.0, 1e-10, float("inf"), float("nan"), 3.4e38])])
    for fp8_max in (448.0, 240.0):
        want = amax.clamp(min=ref.AMAX_FLOOR) / fp8_max  # CPU: IEEE division
        got = torch.empty(amax.shape, device=device)
        block = 1 << 14 if device == "cpu" else 1024
        _scale_kernel[(triton.cdiv(amax.numel(), block),)](amax.to(device), got, amax.numel(), BLOCK=block,
                                                           FP8_MAX=fp8_max)  # fmt: skip
        got = got.cpu()
        same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
        assert same.all(), f"FP8_MAX={fp8_max}: {int((~same).sum())} scales differ, e.g. amax={amax[~same][:3]}"


def check_division(device: str):
    """div_by_scale (one reciprocal per group, two fmas per value) == torch's IEEE y / scale, bit for bit: on random
    groups, on quotients planted next to fp32 rounding midpoints (the hard cases), and on the special values."""
    g = torch.Generator().manual_seed(2)
    n = 1 << 18
    amax = torch.exp2(torch.empty(n).uniform_(-40, 40, generator=g))
    scale = amax / 448.0
    y = (torch.rand(n, generator=g) * 2 - 1) * amax
    # Hard cases: the exact quotient sits within a few fp32 ulps of a midpoint between two fp32 values.
    q_mid = (torch.rand(n, generator=g) * 448).view(torch.int32) | 1  # odd mantissa ...
    q_mid = (q_mid.view(torch.float32).double() * (1 + 2.0**-24)).float()  # ... nudged by half an ulp
    y_hard = (q_mid.double() * scale.double()).float()
    special_y = torch.tensor([0.0, -0.0, 1e-39, -1e-39, 3.0, float("inf"), -3.0, float("nan"), 5.0, 1e-10])
    special_s = torch.tensor(
        [1.0, 1.0, 1e-3, 2.2e-13, float("inf"), float("inf"), float("inf"), 1.0, float("nan"), 2.2e-13]
    )
    ys = torch.cat([y, y_hard, special_y]).to(device)
    ss = torch.cat([scale, scale, special_s]).to(device)
    q = torch.empty_like(ys)
    block = 1 << 14 if device == "cpu" else 1024
    _div_kernel[(triton.cdiv(ys.numel(), block),)](ys, ss, q, ys.numel(), BLOCK=block)
    want = ys.cpu() / ss.cpu()  # IEEE division (tensor by tensor); byte-compared, so the sign of zero counts
    q = q.cpu()
    same = (q.view(torch.int32) == want.view(torch.int32)) | (q.isnan() & want.isnan())
    assert same.all(), (
        f"{int((~same).sum())} quotients differ, e.g. y={ys[~same][:3].tolist()} s={ss[~same][:3].tolist()}"
    )
