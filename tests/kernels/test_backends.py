"""Backend selection: explicit choices raise when unavailable, automatic choices fall back."""

from __future__ import annotations

import pytest
import torch

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends

CPU = torch.device("cpu")


def test_cpu_automatic_choice_is_the_reference():
    assert backends.backend_for("group_quant", CPU) == "reference"


def test_explicit_unavailable_backend_raises_clearly(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with backends.use_backend("triton"), pytest.raises(backends.BackendUnavailable, match="TRITON_INTERPRET=1"):
        backends.get_kernel("group_quant", CPU)
    with backends.use_backend("aiter"), pytest.raises(backends.BackendUnavailable, match="ROCm only"):
        backends.get_kernel("group_quant", CPU)


def test_env_override(monkeypatch):
    monkeypatch.setenv(backends.ENV_BACKEND, "reference")
    assert backends.backend_for("rms_norm", CPU) == "reference"
    monkeypatch.setenv(backends.ENV_BACKEND, "cuda-magic")
    with pytest.raises(ValueError, match="unknown backend"):
        backends.use_backend("cuda-magic").__enter__()


def test_unknown_backend_name_is_rejected():
    with pytest.raises(ValueError, match="known: reference, triton, aiter"):
        backends.set_backend("cutlass")


def test_simulated_gfx942_uses_fnuz_and_240():
    with arch.simulate_arch("gfx942"):
        a = arch.arch_of(CPU)
        assert (a.fp8_dtype, a.fp8_max, a.is_rocm) == (torch.float8_e4m3fnuz, 240.0, True)
        assert backends.preference(CPU)[0] == "aiter"
    assert arch.arch_of(CPU).fp8_dtype == torch.float8_e4m3fn


def test_a_gpu_left_with_the_reference_alone_warns_once(monkeypatch, recwarn):
    """sm80 (no fp8 Triton): every op would run pure torch on the GPU. That is a warning, once per device type,
    naming each skipped backend's reason; the CPU (where the reference is the plan) and a Hopper stay quiet."""
    monkeypatch.setattr(backends, "_warned", set())
    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    cuda = torch.device("cuda")
    with arch.simulate_arch("sm80"):
        with pytest.warns(UserWarning, match=r"no kernel backend runs on this cuda device \(triton: .*sm80"):
            assert backends.chosen_backends(cuda) == ("reference",)
        backends.chosen_backends(cuda)
    assert not [w for w in recwarn if "no kernel backend" in str(w.message)]  # the second call was quiet
    monkeypatch.setattr(backends, "_warned", set())
    assert backends.chosen_backends(torch.device("cpu")) == ("reference",)
    with arch.simulate_arch("sm90"):
        assert backends.chosen_backends(cuda) == ("triton", "reference")  # triton is a test dependency
    assert not [w for w in recwarn if "no kernel backend" in str(w.message)]
