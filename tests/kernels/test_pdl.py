"""``_pdl.pdl_enabled``: on only with ``FP8_FUSION_PDL=1``, on CUDA sm90+, outside the interpreter; and what the
launchers pass when it is on (``PDL``, ``PREFETCH`` for 16-byte aligned weights, ``launch_pdl``), seen by spying
on the kernels, since no PDL kernel can run here (the compiled code is checked in ``test_triton_sm90_compile.py``,
the results on the GPU in ``test_pdl_gpu.py``)."""

from __future__ import annotations

import os

import pytest
import torch
from gemm_helpers import make_inputs

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels.triton import _pdl
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import group_quant as gq
from fp8_fusion_pass.kernels.triton import rms_norm as rn
from fp8_fusion_pass.kernels.triton import silu_and_mul as sm
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig


@pytest.fixture
def compiled_gpu(monkeypatch):
    """The switch on and Triton compiling (not interpreting); the arch is simulated per test."""
    monkeypatch.setenv(_pdl.ENV, "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("name, device, want", [
    ("sm90", "cuda:0", True),
    ("sm100", "cuda", True),
    ("sm89", "cuda:0", False),  # Ada: no griddepcontrol
    ("sm80", "cuda:0", False),
    ("gfx942", "cuda:0", False),  # ROCm (torch calls its devices "cuda" too)
    ("sm90", "cpu", False),  # a CPU tensor under a simulated sm90
])  # fmt: skip
def test_enabled_only_on_cuda_sm90_plus(compiled_gpu, name, device, want):
    with arch.simulate_arch(name):
        assert _pdl.pdl_enabled(device) is want
        assert _pdl.pdl_kwargs(device) == ({"PDL": True, "launch_pdl": True} if want else {"PDL": False})


@pytest.mark.parametrize("value", [None, "0", "", "true"])
def test_off_without_the_switch(compiled_gpu, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(_pdl.ENV)
    else:
        monkeypatch.setenv(_pdl.ENV, value)
    with arch.simulate_arch("sm90"):
        assert not _pdl.pdl_enabled("cuda:0")


def test_off_under_the_interpreter(compiled_gpu, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with arch.simulate_arch("sm90"):
        assert not _pdl.pdl_enabled("cuda:0")


def test_off_on_this_machine(monkeypatch):
    monkeypatch.setenv(_pdl.ENV, "1")  # the switch alone does not turn it on for a CPU tensor
    assert not _pdl.pdl_enabled("cpu")
    assert not _pdl.pdl_enabled(torch.device("cpu"))
    assert _pdl.launch_kwargs(False) == {} and _pdl.launch_kwargs(True) == {"launch_pdl": True}


def test_switched_restores_the_environment(monkeypatch):
    monkeypatch.delenv(_pdl.ENV, raising=False)
    monkeypatch.setenv(_pdl.PREFETCH_ENV, "1")
    with _pdl.switched(True, prefetch=False):
        assert (os.environ[_pdl.ENV], os.environ[_pdl.PREFETCH_ENV]) == ("1", "0") and not _pdl.prefetch_enabled()
        with arch.simulate_arch("sm90"), pytest.MonkeyPatch.context() as m:
            m.delenv("TRITON_INTERPRET", raising=False)
            assert _pdl.pdl_enabled("cuda:0")
    assert _pdl.ENV not in os.environ and os.environ[_pdl.PREFETCH_ENV] == "1"


class Spy:
    """Stands in for a Triton kernel: records each launch's keyword arguments, runs nothing."""

    def __init__(self):
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(kwargs)


@pytest.fixture
def pdl_on(monkeypatch):
    monkeypatch.setattr(_pdl, "pdl_enabled", lambda device: True)


@pytest.mark.parametrize("reduce, launches", [("last", 1), ("kernel", 2)])
def test_small_m_launch_passes_pdl_and_prefetch(pdl_on, monkeypatch, reduce, launches):
    spies = {name: Spy() for name in ("_small_m_kernel", "_splitk_reduce_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(smk, name, spy)
    q, xs, w_q, w_s = make_inputs(1, 128, 512)
    smk.small_m_mm(q, xs, w_q, w_s, torch.bfloat16, SmallMConfig(64, 2, reduce=reduce))
    gemm = spies["_small_m_kernel"].launches[-1]
    assert (gemm["PDL"], gemm["PREFETCH"], gemm["launch_pdl"]) == (True, True, True)
    reduce_launches = spies["_splitk_reduce_kernel"].launches
    assert len(reduce_launches) == launches - 1
    assert all(r["PDL"] and r["launch_pdl"] for r in reduce_launches)
    # Weight rows off a 16-byte boundary keep PDL but not the bulk prefetch: a row stride of 520 bytes, and a
    # view starting 8 bytes into its buffer.
    for width, start in [(520, 0), (528, 8)]:
        w_odd = torch.zeros(128, width, dtype=w_q.dtype)[:, start : start + 512]
        smk.small_m_mm(q, xs, w_odd, w_s, torch.bfloat16, SmallMConfig(64, 1))
        odd = spies["_small_m_kernel"].launches[-1]
        assert (odd["PDL"], odd["PREFETCH"], odd["launch_pdl"]) == (True, False, True), (width, start)


def test_small_m_prefetch_switch(pdl_on, monkeypatch):
    spy = Spy()
    monkeypatch.setattr(smk, "_small_m_kernel", spy)
    monkeypatch.setenv(_pdl.PREFETCH_ENV, "0")
    q, xs, w_q, w_s = make_inputs(1, 128, 512)
    smk.small_m_mm(q, xs, w_q, w_s, torch.bfloat16, SmallMConfig(64, 1))
    assert (spy.launches[-1]["PDL"], spy.launches[-1]["PREFETCH"]) == (True, False)


def test_small_m_launch_without_pdl_is_unchanged(monkeypatch):
    spy = Spy()
    monkeypatch.setattr(smk, "_small_m_kernel", spy)
    monkeypatch.setenv(_pdl.ENV, "1")  # on a CPU tensor the switch changes nothing
    q, xs, w_q, w_s = make_inputs(1, 128, 512)
    smk.small_m_mm(q, xs, w_q, w_s, torch.bfloat16, SmallMConfig(64, 1))
    assert (spy.launches[-1]["PDL"], spy.launches[-1]["PREFETCH"]) == (False, False)
    assert "launch_pdl" not in spy.launches[-1]


@pytest.mark.parametrize("module, kernel, call", [
    (rn, "_rms_norm_kernel", lambda x: rn.launch(x, torch.ones(256, dtype=x.dtype), 1e-6, None, 128)),
    (sm, "_silu_and_mul_kernel", lambda x: sm.launch(x, 128)),
    (gq, "_group_quant_kernel", lambda x: gq.launch(x, 128)),
])  # fmt: skip
def test_elementwise_launches_pass_pdl(pdl_on, monkeypatch, module, kernel, call):
    spy = Spy()
    monkeypatch.setattr(module, kernel, spy)
    call(torch.randn(2, 256, dtype=torch.bfloat16))
    assert spy.launches[-1]["PDL"] is True and spy.launches[-1]["launch_pdl"] is True
