"""Adversarial numerics through every fused op: fused vs the unfused pair it replaces, on every backend here.

For random shapes (M 1..9, K up to 512, group 64 / 128) carrying random pathologies (``adversarial_data.KINDS``),
random norm weights (ones, noisy, x1e3 so normed values pass fp8 max, half zero) and eps (0 included):

- ``silu_mul_group_quant(x)`` == ``group_quant(silu_and_mul(x))`` bit for bit (DESIGN.md: the SiLU fusion is exact);
- ``rms_norm_group_quant`` / ``add_rms_norm_group_quant`` vs ``group_quant(rms_norm(...))`` / ``add_rms_norm``:
  within the fused-norm bound, ``residual_out`` bit for bit;
- NaN / +inf / -inf on the same positions, and the contract's own promises on the fused outputs: an all-zero group
  gives scale 1e-10 / FP8_MAX and zeros, and a NaN reaches only its own group (silu) or row (norm).

Backends: the reference (the CPU's kernel) and Triton (the CPU interpreter here; CUDA with ``-m gpu``). On the CPU
the reference's fused op is literally the composition, so the Triton runs are where fusion bugs would show.
"""

from __future__ import annotations

import pytest
import torch
from adversarial_data import bit_exact, matrices, norm_weights, within_norm_bound
from fuzz_stats import PROFILE, TALLY, profile
from hypothesis import given, note
from hypothesis import strategies as st

import fp8_fusion_pass.kernels.ops  # noqa: F401  (registers torch.ops.fp8_fusion.*)
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, reference

OPS = torch.ops.fp8_fusion
BF16 = torch.bfloat16
EXAMPLES = {"ci": 40, "long": 300}[PROFILE]  # ~0.1 s each (interpreter, tiny shapes)

TARGETS = [
    pytest.param("cpu", "reference", id="cpu-reference"),
    pytest.param("cpu", "triton", id="cpu-triton-interpreter",
                 marks=pytest.mark.skipif(not arch.triton_interpreting() or torch.cuda.is_available(),
                                          reason="needs TRITON_INTERPRET=1 on a CPU machine")),
    pytest.param("cuda", "triton", id="cuda-triton", marks=pytest.mark.gpu),
]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf etc.


@st.composite
def shapes(draw):
    group = draw(st.sampled_from((64, 128)))
    return draw(st.integers(1, 9)), 128 * draw(st.integers(1, 4)), group


def _on(device, backend, fn, *args):
    with backends.use_backend(backend):
        return fn(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))


def _fp8_max(device) -> float:
    return arch.arch_of(torch.device(device)).fp8_max


def _zero_groups_exact(x_unquantized: torch.Tensor, q, s, group: int, fp8_max: float, what: str) -> None:
    """Contract: a group of zeros gets scale 1e-10 / FP8_MAX and q = 0, never NaN."""
    g = x_unquantized.float().reshape(*x_unquantized.shape[:-1], -1, group)
    zero = (g == 0).all(-1)
    if zero.any():
        floor = torch.tensor(reference.AMAX_FLOOR, dtype=torch.float32) / fp8_max
        assert torch.all(s[zero].cpu() == floor), f"{what}: all-zero group scale is not the floor"
        qg = q.float().reshape(g.shape)
        assert torch.all(qg[zero] == 0), f"{what}: all-zero group quantized to non-zero"
        TALLY["op inputs with an all-zero group"] += 1


@pytest.mark.parametrize("device, backend", TARGETS)
@profile(max_examples=EXAMPLES)
@given(data=st.data())
def test_silu_mul_group_quant_is_bit_exact(device, backend, data):
    m, k, group = data.draw(shapes())
    x = data.draw(matrices(m, 2 * k, group)).to(BF16)
    note(f"x [{m}, {2 * k}] group {group}")
    q, s = _on(device, backend, OPS.silu_mul_group_quant, x, group)
    y = _on(device, backend, OPS.silu_and_mul, x)
    q_unf, s_unf = _on(device, backend, OPS.group_quant, y, group)
    bit_exact(q, q_unf, "silu q")
    bit_exact(s, s_unf, "silu scale")
    # a NaN reaches only its own group's scale
    nan_groups = y.float().isnan().reshape(m, -1, group).any(-1)
    assert torch.equal(s.float().isnan().cpu(), nan_groups.cpu()), "NaN scale outside the NaN's group"
    _zero_groups_exact(y, q, s, group, _fp8_max(device), "silu")
    TALLY[f"op inputs silu_mul_group_quant {backend}"] += 1


@pytest.mark.parametrize("device, backend", TARGETS)
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add_norm"])
@profile(max_examples=EXAMPLES)
@given(data=st.data())
def test_norm_group_quant_within_bound(device, backend, residual, data):
    m, k, group = data.draw(shapes())
    x = data.draw(matrices(m, k, group)).to(BF16)
    r = data.draw(matrices(m, k, group)).to(BF16) if residual else None
    w = data.draw(norm_weights(k)).to(BF16)
    eps = data.draw(st.sampled_from((1e-6, 1e-5, 1e-12, 0.0)))
    note(f"x [{m}, {k}] group {group} eps {eps} residual {residual}")
    if residual:
        q, s, res = _on(device, backend, OPS.add_rms_norm_group_quant, x, r, w, eps, group)
        y, res_unf = _on(device, backend, OPS.add_rms_norm, x, r, w, eps)
        bit_exact(res, res_unf, "residual_out")
        summed = res_unf
    else:
        q, s = _on(device, backend, OPS.rms_norm_group_quant, x, w, eps, group)
        y = _on(device, backend, OPS.rms_norm, x, w, eps)
        summed = x.to(device)
    q_unf, s_unf = _on(device, backend, OPS.group_quant, y, group)
    measured = within_norm_bound(q, s, q_unf, s_unf, f"{'add_' if residual else ''}rms_norm_group_quant")
    # a non-finite input, or a row whose sum of squares overflows, reaches only its own row. With eps = 0 an
    # all-zero (or fully underflowing) row is 0 * rsqrt(0) = NaN by definition, as in HF's RMSNorm: not clean.
    xf = summed.float().cpu()
    clean = torch.isfinite(xf).all(-1) & (xf.abs().amax(-1) < 1e17) & torch.isfinite(w.float()).all() & (eps > 0)
    assert not s.float().isnan().cpu()[clean].any(), "a NaN scale in a row whose input is finite"
    _zero_groups_exact(y, q, s, group, _fp8_max(device), "norm")
    TALLY[f"op inputs {'add_' if residual else ''}rms_norm_group_quant {backend}"] += 1
    if measured["flips"]:
        TALLY[f"op inputs with fp8 flips (norm, {backend})"] += 1
