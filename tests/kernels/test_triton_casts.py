"""The emulated fp8 / bf16 casts, the division by the scale and the scale itself (``_fp8``), on the CPU interpreter.

``cast_fp8`` and ``round_to`` against torch's casts on every bf16 value and random fp32 (e4m3fn and e4m3fnuz);
``div_by_scale`` and ``scale_of`` against the CPU's IEEE division, bit for bit. The checks live in
``elementwise_checks.py``; ``TestCuda`` in ``test_triton_elementwise.py`` runs them on the GPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton
import triton.language as tl
from elementwise_checks import KERNEL_TEST_MARKS, check_casts, check_division, check_scale, cpu_only
from interpreter_caps import interpreter_holds_fnuz, require_fnuz_interpreter

from fp8_fusion_pass.kernels.triton._fp8 import fma32

pytestmark = KERNEL_TEST_MARKS


# ---------------------------------------------------------------- the emulated casts (interpreter workarounds)


@cpu_only
def test_division_by_the_scale_is_exact():
    check_division("cpu")


@cpu_only
def test_scale_is_the_correctly_rounded_quotient():
    check_scale("cpu")


@cpu_only
def test_the_fnuz_skip_is_only_where_the_interpreter_lacks_it():
    # The gfx942 simulations skip where the interpreter cannot hold e4m3fnuz (Triton 3.7.1). From Triton 3.8 on it
    # can, so there the check must say so, or those tests would skip silently (CI runs Triton 3.9).
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    if (major, minor) >= (3, 8):
        assert interpreter_holds_fnuz()


@cpu_only
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=["e4m3fn", "e4m3fnuz"])
def test_emulated_casts_match_torch(fp8):
    if fp8 == torch.float8_e4m3fnuz:
        require_fnuz_interpreter()
    check_casts(fp8, "cpu", emulate=True)


# ---------------------------------------------------------------- the fma the exact divisions rest on


@triton.jit
def _fma_kernel(a_ptr, b_ptr, c_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, fma32(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i)))


def _rn32(exact) -> float:
    """``exact`` (a Fraction) rounded to the nearest fp32, ties to even: the fp32 neighbours of its fp64 rounding
    compared exactly, so no double rounding."""
    from fractions import Fraction

    import numpy as np

    f = np.float32(float(exact))
    cands = [f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))]
    dist = [abs(Fraction(float(c)) - exact) for c in cands]
    best = min(dist)
    ties = [c for c, d in zip(cands, dist) if d == best]
    return float(min(ties, key=lambda c: int(np.array(c).view(np.int32)) & 1))


@cpu_only
def test_fma32_rounds_once():
    # Markstein's steps need a true fma. Triton 3.8's interpreter (torch 2.14's) rounds a * b and then the sum, so
    # under the interpreter fma32 computes it in fp64 with the sum rounded to odd. Checked against the exact value on
    # cancellations (c ~ -a * b), on sums that sit just off an fp32 midpoint by less than fp64 can hold (where plain
    # fp64 rounding rounds twice: that version of fma32 failed here), and on random triples.
    from fractions import Fraction

    g = torch.Generator().manual_seed(0)
    n = 512
    a = torch.exp2(torch.empty(n).uniform_(-20, 20, generator=g)) * (torch.rand(n, generator=g) + 1)
    b = torch.exp2(torch.empty(n).uniform_(-20, 20, generator=g)) * (torch.rand(n, generator=g) - 0.5)
    c_rand = torch.exp2(torch.empty(n).uniform_(-40, 40, generator=g)) * (torch.rand(n, generator=g) - 0.5)
    c_cancel = -(a.double() * b.double()).float()  # the residual of a product: what Markstein's first fma takes
    # Double-rounding traps: c = (1 + 2^-23) 2^e and a b = +-(2^-24 - 2^(-24-2s)) 2^e, so the exact sum sits 2^(-24-2s)
    # 2^e (below half an fp64 ulp) off the fp32 midpoint (1 + 2^-24 or 1 + 3 x 2^-24) 2^e: RN_fp64 lands on the
    # midpoint and RN_fp32 then ties to even, away from the correct c.
    a_mid, b_mid, c_mid = [], [], []
    for e in range(-20, 21, 4):
        for s in (15, 18, 21, 23):
            for sign in (1.0, -1.0):
                a_mid.append(sign * 2.0**-12 * (1 + 2.0**-s) * 2.0**e)
                b_mid.append(2.0**-12 * (1 - 2.0**-s))
                c_mid.append((1 + 2.0**-23) * 2.0**e)
    a_mid, b_mid, c_mid = (torch.tensor(v, dtype=torch.float32) for v in (a_mid, b_mid, c_mid))
    a_all = torch.cat([a, a, a_mid, torch.tensor([1.0, float("inf"), 0.0, 3.0])])
    b_all = torch.cat([b, b, b_mid, torch.tensor([float("nan"), 2.0, float("inf"), -0.0])])
    c_all = torch.cat([c_rand, c_cancel, c_mid, torch.tensor([1.0, 1.0, 1.0, 0.0])])
    out = torch.empty(2048)
    pad = 2048 - a_all.numel()
    args = [torch.cat([t, torch.zeros(pad)]) for t in (a_all, b_all, c_all)]
    _fma_kernel[(1,)](*args, out, N=2048)
    bad = []
    for i in range(a_all.numel() - 4):
        x, y, z = (float(t[i]) for t in (a_all, b_all, c_all))
        want = _rn32(Fraction(x) * Fraction(y) + Fraction(z))
        if float(out[i]) != want:
            bad.append((x, y, z, float(out[i]), want))
    assert not bad, f"{len(bad)} of {a_all.numel() - 4} fmas off, e.g. {bad[:3]}"
    special = out[a_all.numel() - 4 : a_all.numel()]
    assert special[0].isnan() and special[1] == float("inf") and special[2].isnan() and special[3] == 0.0
