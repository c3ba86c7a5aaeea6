"""Block-FP8 checkpoints in the published layout: write, load (HF and engine form), gfx942, errors, no network."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from interpreter_caps import require_fnuz_interpreter
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from fp8_fusion_pass import arch
from fp8_fusion_pass.checkpoint import load_fp8_checkpoint, write_tiny_fp8_checkpoint
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.models import example_inputs
from fp8_fusion_pass.quantize import BlockFP8Linear


def _logits(model, inputs):
    with torch.no_grad():
        out = model(*inputs)
    return out if torch.is_tensor(out) else out.logits


@pytest.fixture(scope="module")
def qwen3_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-tiny-fp8")
    model = write_tiny_fp8_checkpoint(path, "qwen3-tiny", scale_dtype=torch.bfloat16)
    return path, model


def test_written_layout_is_the_published_one(qwen3_ckpt):
    path, _ = qwen3_ckpt
    config = json.loads((path / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]
    }
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    with safe_open(str(path / "model.safetensors"), framework="pt") as st:
        keys = set(st.keys())
        dtypes = {k: st.get_slice(k).get_dtype() for k in keys}
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == "F8_E4M3"
    assert dtypes["model.layers.0.mlp.down_proj.weight_scale_inv"] == "BF16"  # as Qwen3-FP8 checkpoints store it
    assert dtypes["lm_head.weight"] == "BF16" and "lm_head.weight_scale_inv" not in keys
    assert sum(k.endswith("weight_scale_inv") for k in keys) == 14


@pytest.mark.parametrize("form", ["hf", "engine"])
def test_round_trip_same_outputs(qwen3_ckpt, form):
    path, written = qwen3_ckpt
    loaded = load_fp8_checkpoint(path, form=form)
    assert len(loaded.quantize_summary.converted) == 14
    assert list(loaded.quantize_summary.skipped) == ["lm_head"]
    inputs = example_inputs(written, batch=2, seq=8)  # (input_ids,): both forms take it
    assert torch.equal(_logits(loaded, inputs), _logits(written, inputs))
    if form == "hf":
        lin = loaded.model.layers[1].self_attn.k_proj
        assert isinstance(lin, BlockFP8Linear) and lin.weight_scale_inv.dtype == torch.float32


def test_fp32_scales_deepseek_style(tmp_path):
    written = write_tiny_fp8_checkpoint(tmp_path, "llama-tiny", scale_dtype=torch.float32)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as st:
        assert st.get_slice("model.layers.0.self_attn.q_proj.weight_scale_inv").get_dtype() == "F32"
    loaded = load_fp8_checkpoint(tmp_path)
    inputs = example_inputs(written)
    assert torch.equal(_logits(loaded, inputs), _logits(written, inputs))


def test_gfx942_load_converts_to_fnuz(qwen3_ckpt):
    require_fnuz_interpreter()
    path, written = qwen3_ckpt
    with arch.simulate_arch("gfx942"):
        loaded = load_fp8_checkpoint(path)
        lin, src = loaded.model.layers[0].mlp.gate_proj, written.model.layers[0].mlp.gate_proj
        assert lin.weight.dtype == torch.float8_e4m3fnuz
        assert torch.equal(lin.weight_scale_inv, src.weight_scale_inv * 2)
        assert torch.equal(ref.dequant_weight(lin.weight, lin.weight_scale_inv), src.dequantized_weight())
        out = _logits(loaded, example_inputs(written))
    assert torch.isfinite(out).all()


def test_no_network_is_touched(qwen3_ckpt, monkeypatch):
    path, _ = qwen3_ckpt

    def refuse(*args, **kwargs):
        raise AssertionError("load_fp8_checkpoint tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    load_fp8_checkpoint(path)


def _copy_ckpt(src, dst, config_edit=None, drop=()):
    config = json.loads((src / "config.json").read_text())
    if config_edit:
        config_edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k not in drop}
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_scale_tensor_is_named(qwen3_ckpt, tmp_path):
    key = "model.layers.1.mlp.up_proj.weight_scale_inv"
    bad = _copy_ckpt(qwen3_ckpt[0], tmp_path, drop=(key,))
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight in fp8 but has no .*weight_scale_inv"):
        load_fp8_checkpoint(bad)


def test_missing_plain_tensor_is_named(qwen3_ckpt, tmp_path):
    bad = _copy_ckpt(qwen3_ckpt[0], tmp_path, drop=("model.layers.0.post_attention_layernorm.weight",))
    with pytest.raises(ValueError, match="missing tensor 'model.layers.0.post_attention_layernorm.weight'"):
        load_fp8_checkpoint(bad)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["quantization_config"].update(weight_block_size=[64, 64]), "weight_block_size must be"),
        (lambda c: c["quantization_config"].pop("weight_block_size"), "missing weight_block_size"),
        (lambda c: c["quantization_config"].pop("activation_scheme"), "missing activation_scheme"),
        (lambda c: c["quantization_config"].update(activation_scheme="static"), "activation_scheme must be"),
        (lambda c: c["quantization_config"].update(quant_method="gptq"), "quant_method must be 'fp8'"),
        (lambda c: c.pop("quantization_config"), "no quantization_config"),
        (lambda c: c.pop("model_type"), "missing model_type"),
        (lambda c: c.update(model_type="gpt2"), "unsupported model_type 'gpt2'"),
    ],
)
def test_bad_config_is_refused_clearly(qwen3_ckpt, tmp_path, edit, message):
    bad = _copy_ckpt(qwen3_ckpt[0], tmp_path, config_edit=edit)
    with pytest.raises(ValueError, match=message):
        load_fp8_checkpoint(bad)


def test_wrong_scale_shape_and_missing_files(qwen3_ckpt, tmp_path):
    src = qwen3_ckpt[0]
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"] = torch.ones(1, 1, dtype=torch.bfloat16)
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"o_proj.weight_scale_inv must be .*\[2, 4\]"):
        load_fp8_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_fp8_checkpoint(tmp_path / "nowhere")
