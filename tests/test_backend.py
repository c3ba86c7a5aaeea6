"""Entry points: backend(), the registered name "fp8_fusion", mode / options pass-through, @fuse and fuse()."""

from __future__ import annotations

import configparser
import importlib
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import fp8_fusion_pass
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass

sys.path.insert(0, str(pathlib.Path(__file__).parent / "patterns"))
from pattern_helpers import NormLinear  # noqa: E402

# the module, not the function fp8_fusion_pass.backend that the package exports under the same name
backend_mod = importlib.import_module("fp8_fusion_pass.backend")
BF16 = torch.bfloat16
NO_CACHE = {"fx_graph_cache": False}  # a cache hit would skip the pass (and its report)


def x3(b=2, s=3):
    return torch.randn(b, s, 256, dtype=BF16, generator=torch.Generator().manual_seed(b * 10 + s))


def compiled_report(fn, *args):
    torch._dynamo.reset()
    report_mod.clear_reports()
    with torch.no_grad():
        out = fn(*args)
    torch._dynamo.reset()
    return out, report_mod.all_reports()


def test_patches_merge_mode_options_and_the_pass():
    p = FP8FusionPass()
    patches = backend_mod._patches(p, "reduce-overhead", {"max_autotune": True}, None, {"fx_graph_cache": False})
    assert patches == {"triton.cudagraphs": True, "max_autotune": True, "fx_graph_cache": False,
                       "post_grad_custom_post_pass": p}
    assert backend_mod._patches(p, "default", None, None, {}) == {"post_grad_custom_post_pass": p}
    with pytest.raises(ValueError, match="post-grad passes off"):
        backend_mod._patches(p, "lite", None, None, {})
    with pytest.raises(ValueError):
        backend_mod._patches(p, None, {"use_post_grad_passes": False}, None, {})


def test_backend_factory_fuses_and_matches_eager():
    m, x = NormLinear(form="hf"), x3()
    be = fp8_fusion_pass.backend(FusionConfig(), **NO_CACHE)
    assert isinstance(be.fusion_pass, FP8FusionPass)
    out, reports = compiled_report(torch.compile(m, backend=be), x)
    assert [r.counts()["norm_quant"] for r in reports] == [1]
    with torch.no_grad():
        assert torch.equal(out, m(x))  # the fused op runs the reference: what eager HF code computes


def test_registered_name_and_mode_pass_through():
    m, x = NormLinear(form="op"), x3()
    assert "fp8_fusion" in torch._dynamo.list_backends()
    _, reports = compiled_report(torch.compile(m, backend="fp8_fusion", options=NO_CACHE), x)
    assert reports[0].counts()["norm_quant"] == 1
    # mode="reduce-overhead" reaches Inductor (CUDA graphs; on the CPU Inductor skips them and says why)
    _, reports = compiled_report(torch.compile(m, backend=fp8_fusion_pass.backend(**NO_CACHE),
                                               mode="reduce-overhead"), x)
    assert reports[0].counts()["norm_quant"] == 1


def test_entry_point_names_the_registered_backend():
    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).resolve().parents[1] / "setup.cfg")
    target = cfg["options.entry_points"]["torch_dynamo_backends"].strip()
    name, _, ref = (s.strip() for s in target.partition("="))
    module, _, attr = ref.partition(":")
    assert name == "fp8_fusion"
    assert getattr(importlib.import_module(module), attr) is backend_mod.registered_backend


def test_installed_entry_point_loads_without_a_duplicate_registration(tmp_path):
    # an installed package: a dist-info declaring the entry point; Dynamo's lookup imports our module through it
    dist = tmp_path / "fp8_fusion_pass_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fp8-fusion-pass-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\nfp8_fusion = fp8_fusion_pass.backend:registered_backend\n")
    root = pathlib.Path(__file__).resolve().parents[1]
    code = ("from torch._dynamo.backends.registry import lookup_backend; "
            "fn = lookup_backend('fp8_fusion'); "  # first, before anything imported fp8_fusion_pass
            "import fp8_fusion_pass.backend as b; "
            "assert fn is b.registered_backend")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_fuse_class_decorator_bare_and_with_config():
    @fp8_fusion_pass.fuse
    class Fused(NormLinear):
        pass

    @fp8_fusion_pass.fuse(config=FusionConfig(norm_quant=False), options=NO_CACHE)
    class Off(NormLinear):
        pass

    x = x3()
    m = Fused(form="op")
    m._compiled_call_impl = None  # same class, same weights, but compile with the cache off for a fresh report
    m.compile(backend=fp8_fusion_pass.backend(**NO_CACHE))
    out, reports = compiled_report(m, x)
    assert reports[0].counts()["norm_quant"] == 1
    _, reports = compiled_report(Off(form="op"), x)
    # the quant the norm left is quant_gemm's candidate, rejected at these 2 x 3 = 6 rows (M > 4)
    assert reports[0].rejection_reasons() == {"disabled_by_config": 1, "m_above_gemv": 1}
    assert Fused(form="op")._compiled_call_impl is not None  # the decorator compiles every instance


def test_fuse_instance_dynamic_keeps_eps_constant():
    m = NormLinear(form="hf")
    fused = fp8_fusion_pass.fuse(m, dynamic=True, options=NO_CACHE)
    torch._dynamo.reset()
    report_mod.clear_reports()
    with torch.no_grad():
        for b, s in [(2, 3), (3, 5), (4, 7)]:
            x = x3(b, s)
            got = fused(x)
            assert got.shape == (b, s, 256) and torch.equal(got, m(x))
    torch._dynamo.reset()
    reports = report_mod.all_reports()
    assert len(reports) == 1 and reports[0].counts()["norm_quant"] == 1, [r.summary_line() for r in reports]


def test_fuse_rejects_non_modules():
    with pytest.raises(TypeError, match="nn.Module"):
        fp8_fusion_pass.fuse(lambda x: x)


def test_bad_arguments_fail_when_given_not_inside_the_first_compile():
    """A wrong config or Inductor key fails at backend() / fuse() / FusionConfig(), with a message that says what
    to pass, instead of a BackendCompilerFailed at the model's first call."""
    with pytest.raises(TypeError, match="FusionConfig or None, got int"):
        fp8_fusion_pass.backend(3)
    with pytest.raises(TypeError, match="FusionConfig or None, got str"):
        fp8_fusion_pass.fuse(config="norm_quant")(NormLinear)  # the class decorator, before any instance
    with pytest.raises(ValueError, match="'mode' is not an Inductor config key.*belong to torch.compile"):
        fp8_fusion_pass.backend(mode="reduce-overhead")
    with pytest.raises(ValueError, match="'no_such_key' is not an Inductor config key"):
        fp8_fusion_pass.backend(no_such_key=1)
    fp8_fusion_pass.backend(max_autotune=False, **{"triton.cudagraphs": False})  # dotted keys are fine
    with pytest.raises(TypeError, match="FusionConfig.norm_quant must be True or False, got 'no'"):
        FusionConfig(norm_quant="no")  # truthy: it would have turned the fusion on
    with pytest.raises(TypeError, match="group_sizes must be a tuple of ints"):
        FusionConfig(group_sizes=128)
    with pytest.raises(ValueError, match="100 not a power of two"):
        FusionConfig(group_sizes=(128, 100))
    assert FusionConfig(group_sizes=[128]).group_sizes == (128,) and hash(FusionConfig(group_sizes=[128]))


def test_fx_graph_cache_hit_adds_a_report_that_says_so(tmp_path, monkeypatch):
    # A cached graph does not run the pass; the backend still reports the compile, marked as a cache hit.
    from fp8_fusion_pass import report
    from fp8_fusion_pass.models import build_model, example_inputs

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = build_model("llama-tiny", form="engine", layers=1)
    inputs = example_inputs(model)
    results = []
    with torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(model, backend=fp8_fusion_pass.backend(fx_graph_cache=True))(*inputs)
            results.append(report.last_report())
    torch._dynamo.reset()
    first, second = results
    assert not first.cache_hit and first.counts()["norm_quant"] == 1
    assert second is not first and second.cache_hit and "FX graph cache" in second.summary_line()
