"""Model conversion: block-FP8 and per-tensor linears, the summary, dtype safety, the fnuz re-encoding."""

from __future__ import annotations

import pytest
import torch
from interpreter_caps import require_fnuz_interpreter
from tolerances import MODEL_FP8_VS_BF16_REL_ERR
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from fp8_fusion_pass import arch, quantize
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.models import build_model, example_inputs
from fp8_fusion_pass.quantize import (
    BlockFP8Linear,
    PerTensorFP8Linear,
    e4m3fn_to_e4m3fnuz,
    quantize_block_fp8,
    quantize_fp8_per_tensor,
)

# Per-linear bound (module's own table): a 128x128 block quantized with scale = amax / 448 is off by at most half
# an fp8 step of the top binade [256, 448], i.e. 16 scale units, for every element of the block (reached exactly
# at ties, hence the fp32 ulp margin).
WEIGHT_MAX_ERR_IN_SCALES = 16.0 * (1 + 2**-20)


def _logits(out):
    return out if torch.is_tensor(out) else out.logits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def _run(model, inputs):
    with torch.no_grad():
        return _logits(model(*inputs))


@pytest.fixture(scope="module")
def bf16_models():
    return {name: build_model(name, form="hf", scheme="bf16") for name in ("qwen3-tiny", "llama-tiny")}


@pytest.mark.parametrize("name", ["qwen3-tiny", "llama-tiny"])
def test_block_fp8_close_to_bf16_and_broken_quantizer_is_caught(name, bf16_models):
    bf16 = bf16_models[name]
    inputs = example_inputs(bf16, batch=2, seq=8)
    want = _run(bf16, inputs)
    fp8 = build_model(name, form="hf", scheme="block")
    err = rel_err(_run(fp8, inputs), want)
    print(f"{name}: block-FP8 vs bf16 logits rel L2 error {err:.4f}")
    assert 0 < err < MODEL_FP8_VS_BF16_REL_ERR
    # The same weights, with each linear's block scales rolled by one block row: what a transposed or
    # misaligned scale layout does. The bound must catch it.
    for mod in fp8.modules():
        if isinstance(mod, BlockFP8Linear):
            mod.weight_scale_inv = mod.weight_scale_inv.roll(1, dims=0).flip(1)
    broken = rel_err(_run(fp8, inputs), want)
    print(f"{name}: with rolled block scales {broken:.4f}")
    assert broken > MODEL_FP8_VS_BF16_REL_ERR


def test_conversion_summary_counts_and_same_weights_as_bf16():
    model = build_model("qwen3-tiny", form="hf", scheme="bf16")
    reference_w = model.model.layers[1].mlp.down_proj.weight.detach().clone()
    summary = quantize_block_fp8(model)
    # 2 layers x (q, k, v, o, gate, up, down); lm_head skipped by name
    assert len(summary.converted) == 14
    assert summary.skipped == {"lm_head": "in skip list ('lm_head')"}
    assert sum(isinstance(m, BlockFP8Linear) for m in model.modules()) == 14
    down = model.model.layers[1].mlp.down_proj
    assert down.weight.dtype == torch.float8_e4m3fn and tuple(down.weight_scale_inv.shape) == (2, 6)
    err = (down.dequantized_weight() - reference_w.float()).abs()
    bound = WEIGHT_MAX_ERR_IN_SCALES * down.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert (err <= bound).all()
    assert err.max() > 0  # fp8 really rounds


def test_skipped_linears_are_listed_with_reason():
    model = nn.Sequential(nn.Linear(256, 384), nn.Linear(384, 100), nn.Linear(100, 128), nn.Linear(128, 256))
    model = model.to(torch.bfloat16)
    summary = quantize_block_fp8(model, skip=("3",))
    assert summary.converted == ["0"]
    assert set(summary.skipped) == {"1", "2", "3"}
    assert "N=100 is not a multiple of 128" in summary.skipped["1"]
    assert "K=100 is not a multiple of 128" in summary.skipped["2"]
    assert "skip list" in summary.skipped["3"]
    assert "3 skipped" in summary.render()
    assert isinstance(model[0], BlockFP8Linear) and isinstance(model[1], nn.Linear)
    # bias is kept and applied
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = model[0](x)
    assert rel_err(y, x.float() @ model[0].dequantized_weight().t() + model[0].bias.float()) < 0.05


def test_no_eligible_linear_raises_clearly():
    with pytest.raises(ValueError, match="no eligible nn.Linear.*N=100 is not a multiple"):
        quantize_block_fp8(nn.Sequential(nn.Linear(128, 100)))
    with pytest.raises(ValueError, match="has no nn.Linear"):
        quantize_block_fp8(nn.Sequential(nn.ReLU()))
    model = nn.Sequential(nn.Linear(128, 128))
    quantize_block_fp8(model)
    with pytest.raises(ValueError, match="already FP8"):
        quantize_block_fp8(model)
    with pytest.raises(ValueError, match="block_size"):
        quantize_block_fp8(nn.Sequential(nn.Linear(128, 128)), block_size=(64, 64))
    for group in (100, 0):  # at conversion, not at the first forward's group_quant
        with pytest.raises(ValueError, match=f"group_size must be a power of two.*got {group}"):
            quantize_block_fp8(nn.Sequential(nn.Linear(128, 128)), group_size=group)
    with pytest.raises(TypeError, match="expected an nn.Module to convert, got dict"):
        quantize_block_fp8({"linear": nn.Linear(128, 128)})


def test_a_single_skip_name_is_a_name_not_its_letters():
    model = nn.Sequential()
    model.add_module("body", nn.Linear(128, 128))
    model.add_module("lm_head", nn.Linear(128, 128))
    summary = quantize_block_fp8(model, skip="lm_head")
    assert type(model.lm_head) is nn.Linear and type(model.body) is not nn.Linear, summary


def _fp8_calls(mod: nn.Module, x: torch.Tensor) -> list[str]:
    gm = make_fx(mod)(x)
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_forward_is_the_pattern_shape():
    """group_quant -> blockscale_mm on a 2-D view, in that order: what patterns/ match."""
    model = nn.Sequential(nn.Linear(256, 128, bias=False).bfloat16())
    quantize_block_fp8(model)
    lin = model[0]
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    ops = [c for c in _fp8_calls(lin, x) if "fp8_fusion" in c]
    assert ops == ["fp8_fusion.group_quant.default", "fp8_fusion.blockscale_mm.default"], ops
    q, s = ref.group_quant(x.reshape(-1, 256), 128, torch.float8_e4m3fn, 448.0)
    want = ref.blockscale_mm(q, s, lin.weight, lin.weight_scale_inv, torch.bfloat16).reshape(2, 3, 128)
    assert torch.equal(lin(x), want)


def test_fp8_dtype_survives_model_to_bf16():
    model = nn.Sequential(nn.Linear(128, 128))
    quantize_block_fp8(model)
    scale = model[0].weight_scale_inv.clone()
    model.to(torch.bfloat16)
    assert model[0].weight.dtype == torch.float8_e4m3fn
    assert model[0].weight_scale_inv.dtype == torch.float32 and torch.equal(model[0].weight_scale_inv, scale)
    assert model[0].bias.dtype == torch.bfloat16


def test_converted_dtype_follows_arch():
    require_fnuz_interpreter()
    with arch.simulate_arch("gfx942"):
        model = nn.Sequential(nn.Linear(128, 256, bias=False).bfloat16())
        w = model[0].weight.detach().float().clone()
        quantize_block_fp8(model)
        lin = model[0]
        assert lin.weight.dtype == torch.float8_e4m3fnuz
        # fnuz max is 240: the largest |q| in each block is 240
        assert lin.weight.float().abs().amax().item() == 240.0
        assert (lin.dequantized_weight() - w).abs().max() <= WEIGHT_MAX_ERR_IN_SCALES * lin.weight_scale_inv.max()
        y = lin(torch.randn(4, 128, dtype=torch.bfloat16))
        assert y.shape == (4, 256) and torch.isfinite(y).all()


def test_per_tensor_conversion_and_forward_code_shape():
    model = build_model("qwen3-tiny", form="hf", scheme="bf16")
    inputs = example_inputs(model)
    want = _run(model, inputs)
    summary = quantize_fp8_per_tensor(model)
    assert len(summary.converted) == 14 and list(summary.skipped) == ["lm_head"]
    lin = model.model.layers[0].self_attn.q_proj
    assert isinstance(lin, PerTensorFP8Linear) and lin.weight_scale.shape == (1,)
    err = rel_err(_run(model, inputs), want)
    print(f"qwen3-tiny: per-tensor FP8 vs bf16 logits rel L2 error {err:.4f}")
    assert 0 < err < MODEL_FP8_VS_BF16_REL_ERR
    calls = _fp8_calls(lin, torch.randn(3, 256, dtype=torch.bfloat16))
    zeros = next(i for i, c in enumerate(calls) if "zeros" in c)
    quant = calls.index("fp8_fusion.dynamic_per_tensor_quant.default")
    assert zeros < quant < calls.index("fp8_fusion.per_tensor_mm.default")


def test_per_tensor_skips_unaligned():
    summary = quantize_fp8_per_tensor(nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 40)))
    assert summary.converted == ["0"] and "multiples of 16" in summary.skipped["1"]


def test_fnuz_conversion_exact_on_all_256_bytes():
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    fn = bits.view(torch.float8_e4m3fn)
    scale = torch.tensor([0.375, 3.0e-3], dtype=torch.float32)
    fnuz, scale_uz = e4m3fn_to_e4m3fnuz(fn, scale)
    assert fnuz.dtype == torch.float8_e4m3fnuz and torch.equal(scale_uz, scale * 2)
    a, b = fn.float(), fnuz.float() * 2  # fnuz bits read as half the fn value; the scale doubles back
    finite = ~torch.isnan(a)
    assert torch.equal(a[finite], b[finite])  # -0 (0x80) -> +0 compares equal too
    assert fnuz.view(torch.uint8)[0x80].item() == 0  # 0x80 is NaN in fnuz: must be gone
    assert torch.isnan(b[~finite]).all() and int((~finite).sum()) == 2  # fn NaN 0x7f / 0xff stay NaN
    assert not torch.isnan(b[finite]).any()
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        e4m3fn_to_e4m3fnuz(fnuz, scale)


def test_fnuz_conversion_of_a_quantized_weight_dequantizes_identically():
    w = torch.randn(256, 128)
    w_q, w_s = ref.quantize_weight_blockwise(w, (128, 128), torch.float8_e4m3fn, 448.0)
    uz, uz_s = e4m3fn_to_e4m3fnuz(w_q, w_s)
    assert torch.equal(ref.dequant_weight(uz, uz_s), ref.dequant_weight(w_q, w_s))


def test_skip_patterns():
    assert quantize._matches("model.layers.0.mlp.down_proj", ["down_proj"]) == "down_proj"
    assert quantize._matches("model.layers.0.mlp.down_proj", ["model.layers.0.*"]) == "model.layers.0.*"
    assert quantize._matches("model.layers.0.mlp.down_proj", ["up_proj", "layers"]) is None


def _hf_fp8_linear(w: torch.Tensor, block=(128, 128), bias=None):
    finegrained = pytest.importorskip("transformers.integrations.finegrained_fp8")
    lin = finegrained.FP8Linear(w.shape[1], w.shape[0], block_size=block, has_bias=bias is not None)
    w_q, w_s = ref.quantize_weight_blockwise(w, (128, 128), torch.float8_e4m3fn, 448.0)
    with torch.no_grad():
        lin.weight.copy_(w_q)
        if block is not None:
            lin.weight_scale_inv.copy_(w_s)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


@pytest.mark.parametrize("simulated", ["cpu", "gfx942"])
def test_transformers_fp8linear_is_adopted_not_requantized(simulated):
    if simulated == "gfx942":
        require_fnuz_interpreter()
    w, b = torch.randn(256, 384), torch.randn(256)
    with arch.simulate_arch(simulated):
        model = nn.Sequential(_hf_fp8_linear(w, bias=b), _hf_fp8_linear(w[:, :256], block=None))
        summary = quantize_block_fp8(model)
        assert summary.converted == ["0"] and "block_size None" in summary.skipped["1"]
        lin = model[0]
        assert isinstance(lin, BlockFP8Linear)
        assert lin.weight.dtype == arch.arch_of("cpu").fp8_dtype and lin.bias.dtype == torch.bfloat16
        w_q, w_s = ref.quantize_weight_blockwise(w, (128, 128), torch.float8_e4m3fn, 448.0)
        assert torch.equal(lin.dequantized_weight(), ref.dequant_weight(w_q, w_s))  # same values, no requant
        x = torch.randn(5, 384, dtype=torch.bfloat16)
        assert torch.isfinite(lin(x)).all()
    with pytest.raises(ValueError, match="already fp8"):
        quantize_fp8_per_tensor(nn.Sequential(_hf_fp8_linear(w)))
