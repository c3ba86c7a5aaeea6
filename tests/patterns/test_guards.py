"""Guards as pure functions over fake / meta tensors: each reason code reachable, none raising."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from fp8_fusion_pass import arch, guards
from fp8_fusion_pass.config import FusionConfig

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guards.md"


def meta(*shape, dtype=torch.bfloat16, strides=None):
    t = torch.empty(*shape, dtype=dtype, device="meta")
    return t if strides is None else t.as_strided(shape, strides)


def test_every_reason_is_documented():
    text = DOCS.read_text()
    headings = set(re.findall(r"^### `([a-z0-9_]+)`", text, flags=re.M))
    assert headings == set(guards.REASONS), (set(guards.REASONS) ^ headings)


def test_unknown_reason_becomes_an_error_code_not_an_exception():
    v = guards.reject("no_such_code", "x")
    assert not v.ok and v.reason == "replacement_failed" and "no_such_code" in v.detail


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dtype_not_bf16(dtype):
    assert guards.can_dtype(meta(4, 256, dtype=dtype)).reason == "dtype_not_bf16"
    assert guards.can_dtype(meta(4, 256), residual=meta(4, 256, dtype=dtype)).reason == "dtype_not_bf16"


def test_weight_dtype_mismatch_and_ok():
    assert guards.can_dtype(meta(4, 256), w=meta(256, dtype=torch.float32)).reason == "weight_dtype_mismatch"
    assert guards.can_dtype(meta(4, 256), w=meta(256), residual=meta(4, 256)).ok
    assert guards.can_dtype(None).reason == "dtype_not_bf16"  # unknown metadata: rejected, not raised


@pytest.mark.parametrize("k,g,sizes,reason", [
    (256, 128, (128, 64), ""),
    (192, 64, (128, 64), ""),
    (192, 64, (128,), "group_size_not_configured"),
    (200, 128, (128,), "k_not_multiple_of_group"),
    (torch.SymInt, 128, (128,), "k_dynamic"),
])
def test_can_group(k, g, sizes, reason):
    if k is torch.SymInt:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        k = ShapeEnv().create_unbacked_symint()
    assert guards.can_group(k, g, sizes).reason == reason


def test_layout():
    assert guards.can_layout(x=meta(4, 256)).ok
    assert guards.can_layout(x=meta(256, 4).t()).reason == "last_dim_not_contiguous"
    assert guards.can_layout(x=None, r=meta(4, 1, strides=(1, 4))).ok  # a size-1 last dim has any stride


def test_runtime_gates():
    on = FusionConfig()
    assert guards.can_run_fusion("norm_quant", False, on, (), False).ok
    assert guards.can_run_fusion("norm_quant", False, FusionConfig(norm_quant=False), (), False).reason == (
        "disabled_by_config")
    assert guards.can_run_fusion("norm_quant", False, on, {"norm_quant"}, False).reason == "disabled_by_env"
    assert guards.can_run_fusion("norm_quant", False, on, (), True).reason == "deterministic_mode"
    assert guards.can_run_fusion("silu_quant", True, on, (), True).ok  # bit-exact: stays on


def test_eps():
    assert guards.can_eps(1e-6).ok and guards.can_eps(1).ok
    assert guards.can_eps(object()).reason == "eps_graph_input"
    assert guards.can_eps(True).reason == "eps_graph_input"


def test_structure_summaries():
    assert guards.can_feed_gemms([]).ok
    assert guards.can_feed_gemms(["q -> graph output"]).reason == "consumer_not_blockscale_mm"
    assert guards.can_own_output([], 1).ok
    assert guards.can_own_output([], 3).reason == "multiple_quants"
    assert guards.can_own_output(["aten.mm (mm)"], 1).reason == "extra_consumer"


def test_kernel_exists_on_cpu_and_not_on_a_gpu_without_fp8_triton():
    assert guards.can_run_kernel("rms_norm_group_quant", torch.device("cpu")).ok
    # sm80 has no fp8 in Triton: only the pure-torch reference would run there (slower than Inductor's fusion)
    with arch.simulate_arch("sm80"):
        v = guards.can_run_kernel("rms_norm_group_quant", torch.device("cuda", 0))
    assert v.reason == "no_fused_kernel", v


def test_explicit_unavailable_backend_is_rejected(monkeypatch):
    monkeypatch.setenv("FP8_FUSION_BACKEND", "aiter")  # not on ROCm: BackendUnavailable, caught
    v = guards.can_run_kernel("rms_norm_group_quant", torch.device("cpu"))
    assert v.reason == "no_fused_kernel" and "aiter" in v.detail


def test_small_m_table():
    # gfx950 Qwen3-1.7B qkv_proj (N=4096, K=2048) prefers bf16 up to 16 rows (kernels/small_m.py)
    assert guards.should_fuse_small_m("gfx950", 16, [(4096, 2048)]).reason == "small_m_prefers_bf16"
    assert guards.should_fuse_small_m("gfx950", 17, [(4096, 2048)]).ok
    assert guards.should_fuse_small_m("gfx950", None, [(4096, 2048)]).ok  # symbolic M never matches
    assert guards.should_fuse_small_m("sm90", 1, [(4096, 2048)]).ok  # empty on NVIDIA


def test_small_m_missing_table_means_no_entry(monkeypatch):
    monkeypatch.setattr(guards, "_small_m_table", lambda: None)
    assert guards.should_fuse_small_m("gfx950", 1, [(4096, 2048)]).ok


def test_static_rows():
    assert guards.static_rows(meta(2, 5, 256)) == 10
    assert guards.static_rows(None) is None


def test_first_failure_is_lazy():
    calls = []
    v = guards.first_failure(lambda: guards.reject("k_dynamic"), lambda: calls.append(1) or guards.OK)
    assert v.reason == "k_dynamic" and not calls


def test_bit_exact_only_on_backends_that_keep_the_roundings(monkeypatch):
    from fp8_fusion_pass.kernels import backends

    cpu = torch.device("cpu")
    assert guards.is_bit_exact(True, "silu_mul_group_quant", cpu)  # reference on the CPU
    assert not guards.is_bit_exact(False, "rms_norm_group_quant", cpu)
    # aiter's fused kernels skip the bf16 rounding: deterministic mode must then keep the silu fusion off too
    monkeypatch.setattr(backends, "backend_for", lambda op, device: "aiter")
    assert not guards.is_bit_exact(True, "silu_mul_group_quant", cpu)
    verdict = guards.can_run_fusion("silu_quant", guards.is_bit_exact(True, "silu_mul_group_quant", cpu),
                                    FusionConfig(), (), deterministic=True)
    assert verdict.reason == "deterministic_mode"
