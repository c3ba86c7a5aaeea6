"""Presets by name: tiny ones build and run, real shapes build on the meta device with the published GEMM shapes."""

from __future__ import annotations

import socket

import pytest
import torch

from fp8_fusion_pass.models import PRESETS, build_model, example_inputs, get_preset
from fp8_fusion_pass.models.build import hf_config
from fp8_fusion_pass.quantize import BlockFP8Linear

REQUIRED = ("qwen3-tiny", "llama-tiny", "qwen3-0.6b", "qwen3-8b", "qwen3-32b", "llama3.1-8b", "llama3.1-70b")

# Merged engine GEMM shapes (N x K) from ../shared/research/kernels.md §4.4 (computed there from the configs).
ENGINE_SHAPES = {
    "qwen3-8b": {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
                 "down_proj": (4096, 12288)},
    "qwen3-32b": {"qkv_proj": (10240, 5120), "o_proj": (5120, 8192), "gate_up_proj": (51200, 5120),
                  "down_proj": (5120, 25600)},
    "llama3.1-8b": {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                    "down_proj": (4096, 14336)},
    "llama3.1-70b": {"qkv_proj": (10240, 8192), "o_proj": (8192, 8192), "gate_up_proj": (57344, 8192),
                     "down_proj": (8192, 28672)},
    "qwen3-0.6b": {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024),
                   "down_proj": (1024, 3072)},
}


def test_required_presets_exist():
    assert set(REQUIRED) <= set(PRESETS)
    assert get_preset("qwen3-8b").layers == 36 and get_preset("llama3.1-70b").layers == 80


def test_unknown_names_list_the_known_ones():
    for call in (lambda: build_model("qwen9-huge"), lambda: example_inputs("qwen9-huge"), lambda: get_preset("x")):
        with pytest.raises(ValueError, match="unknown model preset .*known: qwen3-tiny, llama-tiny"):
            call()
    with pytest.raises(ValueError, match="unknown form"):
        build_model("qwen3-tiny", form="onnx")
    with pytest.raises(ValueError, match="unknown scheme"):
        build_model("qwen3-tiny", scheme="int4")
    with pytest.raises(ValueError, match="layers must be >= 1"):
        hf_config("qwen3-tiny", layers=0)


@pytest.mark.parametrize("name", sorted(ENGINE_SHAPES))
def test_real_shapes_on_meta(name):
    engine = build_model(name, form="engine", scheme="block", layers=2, device="meta")
    layer = engine.model.layers[1]
    got = {
        "qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj,
        "gate_up_proj": layer.mlp.gate_up_proj, "down_proj": layer.mlp.down_proj,
    }
    for key, (n, k) in ENGINE_SHAPES[name].items():
        lin = got[key]
        assert isinstance(lin, BlockFP8Linear), key
        assert tuple(lin.weight.shape) == (n, k) and tuple(lin.weight_scale_inv.shape) == (n // 128, k // 128), key
    assert len(engine.quantize_summary.converted) == 2 * 7


def test_full_depth_qwen3_8b_on_meta():
    model = build_model("qwen3-8b", form="hf", scheme="block", device="meta")
    assert len(model.model.layers) == 36
    assert len(model.quantize_summary.converted) == 36 * 7
    assert list(model.quantize_summary.skipped) == ["lm_head"]


def test_real_preset_one_layer_on_cpu_runs_with_tied_embeddings():
    model = build_model("qwen3-0.6b", form="hf", scheme="block", layers=1)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # Qwen3-0.6B ties them
    assert model.model.rotary_emb.inv_freq.device.type == "cpu"
    with torch.no_grad():
        out = model(*example_inputs(model, batch=1, seq=4)).logits
    assert out.shape == (1, 4, 151936) and torch.isfinite(out).all()


def test_same_seed_same_weights_and_seed_matters():
    a = build_model("llama-tiny", form="hf", scheme="bf16", seed=3)
    b = build_model("llama-tiny", form="hf", scheme="bf16", seed=3)
    c = build_model("llama-tiny", form="hf", scheme="bf16", seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert not a.training and not any(p.requires_grad for p in a.parameters())
    # norm weights are 1 + noise, so q_norm and k_norm differ (a swap would show)
    assert not torch.equal(a.model.layers[0].input_layernorm.weight, a.model.layers[0].post_attention_layernorm.weight)


def test_example_inputs():
    (ids,) = example_inputs("qwen3-tiny", batch=3, seq=5)
    assert ids.shape == (3, 5) and ids.max() < 512
    engine = build_model("qwen3-tiny", form="engine", scheme="bf16")
    ids2, pos = example_inputs(engine, batch=3, seq=5)
    assert torch.equal(ids, ids2) and pos.tolist() == [list(range(5))] * 3


def test_building_never_touches_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("build_model tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for form in ("hf", "engine"):
        build_model("mistral-tiny", form=form, scheme="block", layers=1)
