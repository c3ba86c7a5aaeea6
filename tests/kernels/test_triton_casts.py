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
from elementwise_checks import KERNEL_TEST_MARKS, check_casts, check_division, check_scale, cpu_only


pytestmark = KERNEL_TEST_MARKS


# ---------------------------------------------------------------- the emulated casts (interpreter workarounds)


@cpu_only
def test_division_by_the_scale_is_exact():
    check_division("cpu")


@cpu_only
def test_scale_is_the_correctly_rounded_quotient():
    check_scale("cpu")


@cpu_only
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=["e4m3fn", "e4m3fnuz"])
def test_emulated_casts_match_torch(fp8):
    check_casts(fp8, "cpu", emulate=True)
