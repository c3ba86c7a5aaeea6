"""The pass on the tiny block-FP8 Qwen3 / Llama models, HF and engine form: exact fusion counts on their post-grad
graphs, the reasons for what stays unfused, and compiled outputs with vs without the pass."""

from __future__ import annotations

import pytest
import tolerances
import torch
from pattern_helpers import FUSIONS_ONLY, capture, count, ops, run_pass

import fp8_fusion_pass
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.models import build_model, example_inputs

LAYERS = 2
_MODELS: dict = {}


def model(name, form):
    if (name, form) not in _MODELS:
        _MODELS[(name, form)] = build_model(name, form=form, layers=LAYERS)
    return _MODELS[(name, form)]


def logits(out):
    return out if torch.is_tensor(out) else out.logits


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def graphs():
    out = {}
    for name in ("qwen3-tiny", "llama-tiny"):
        for form in ("hf", "engine"):
            m = model(name, form)
            gms = capture(m, *example_inputs(m, 2, 5))
            assert len(gms) == 1, "the tiny models compile in one graph"
            out[(name, form)] = gms[0]
    return out


@pytest.mark.parametrize("form", ["hf", "engine"])
@pytest.mark.parametrize("name", ["qwen3-tiny", "llama-tiny"])
def test_counts_per_layer(graphs, name, form):
    r, gm = run_pass(graphs[(name, form)])
    c = r.counts()
    # 2L norm sites: layer 0's input norm has no residual add before it, the other 2L - 1 do; L silu sites
    assert (c.get("norm_quant"), c.get("add_norm_quant"), c.get("silu_quant")) == (1, 2 * LAYERS - 1, LAYERS), (
        r.render())
    # HF: q/k/v quantize the normed tensor three times, gate/up twice -> 3 quants collapse per layer
    assert c.get("dedup_quant", 0) == (3 * LAYERS if form == "hf" else 0)
    assert not r.errors
    assert count(gm, ops.rms_norm_group_quant.default) == 1
    assert count(gm, ops.add_rms_norm_group_quant.default) == 2 * LAYERS - 1
    assert count(gm, ops.silu_mul_group_quant.default) == LAYERS
    assert count(gm, ops.group_quant.default) == LAYERS  # o_proj's input, from attention
    # q/k/v share one quant: every input-norm fusion feeds the three projections (HF) or the merged qkv (engine)
    gemms = {d.pattern: d.detail for d in r.applied if d.pattern in ("norm_quant", "add_norm_quant")}
    assert f"feeds {3 if form == 'hf' else 1} GEMM(s)" in gemms["norm_quant"]


@pytest.mark.parametrize("form", ["hf", "engine"])
def test_what_stays_unfused_says_why(graphs, form):
    r, _ = run_pass(graphs[("qwen3-tiny", form)])
    reasons = r.rejection_reasons()
    # the final norm feeds the bf16 lm_head; Qwen3's q_norm / k_norm feed RoPE (2 per layer)
    final = [d for d in r.rejected if d.reason == "no_quant_consumer" and "aten.mm" in d.detail]
    assert len(final) == 1 and final[0].pattern == "add_norm_quant", r.render()
    assert reasons == {"no_quant_consumer": 1 + 2 * LAYERS, "producer_not_fusable": LAYERS}, r.render()
    assert all("permute" in d.detail for d in r.rejected if d.reason == "producer_not_fusable")


@pytest.mark.parametrize("form", ["hf", "engine"])
def test_rejections_a_later_rewrite_takes_in_are_superseded(form):
    """With every rewrite on, at decode (one token, batch 1): Qwen3's q / k norms, declined by norm_quant, go into
    norm_rope's launch, and the o_proj's input quant, declined by group_quant, into the attention's launch or the
    quantizing GEMV. ``rejected`` then lists what still runs unfused: the final norm (and, in the HF form, the
    attention's KV copy that gqa_attention keeps at batch 1 with 2 pairs)."""
    m = model("qwen3-tiny", form)
    r, _ = run_pass(capture(m, *example_inputs(m, 1, 1))[0], fp8_fusion_pass.FusionConfig())
    taken = {(s.rejection.pattern, s.rejection.reason, s.taken_by) for s in r.superseded}
    assert ("norm_quant", "no_quant_consumer", "norm_rope") in taken, r.render()
    assert sum(s.taken_by == "norm_rope" for s in r.superseded) == 2 * LAYERS
    assert {s.rejection.pattern for s in r.superseded} <= {"norm_quant", "group_quant"}, r.render()
    assert sum(s.rejection.pattern == "group_quant" for s in r.superseded) == LAYERS, r.render()
    rejected_nodes = {d.node for d in r.rejected}
    assert not rejected_nodes & {s.rejection.node for s in r.superseded}
    assert [d.reason for d in r.rejected if d.pattern in ("norm_quant", "add_norm_quant")] == ["no_quant_consumer"]


def test_a_rejection_stays_when_the_later_rewrite_is_off():
    """norm_rope off: nothing takes the q / k norms, so their norm_quant rejections stand."""
    m = model("qwen3-tiny", "engine")
    on, _ = run_pass(capture(m, *example_inputs(m, 1, 1))[0], fp8_fusion_pass.FusionConfig())
    off, _ = run_pass(capture(m, *example_inputs(m, 1, 1))[0], fp8_fusion_pass.FusionConfig(norm_rope=False))
    assert not any(s.taken_by == "norm_rope" for s in off.superseded)
    assert off.rejection_reasons()["no_quant_consumer"] == on.rejection_reasons()["no_quant_consumer"] + 2 * LAYERS


def test_a_per_tensor_model_says_its_quants_are_per_tensor():
    # a per-tensor model's norms and SiLU feed the per-tensor quant (an op that writes its outputs, so the graph
    # holds it wrapped in auto_functionalized_v2): the report names that op and why no fused kernel takes it
    m = build_model("llama-tiny", form="engine", scheme="per-tensor", layers=LAYERS)
    r, _ = run_pass(capture(m, *example_inputs(m, 2, 5))[0])
    per_tensor = [d for d in r.rejected if "fp8_fusion.dynamic_per_tensor_quant (auto_functionalized_v2" in d.detail]
    assert len(per_tensor) == 3 * LAYERS, r.render()  # the input norm, the post-attention norm, the SiLU per layer
    assert all(d.reason == "no_quant_consumer" and "(a per-tensor quant: the fused kernels take 1 x 128 group "
               "quants" in d.detail for d in per_tensor), r.render()  # fmt: skip
    assert "feeds auto_functionalized_v2" not in r.render()
    final = [d for d in r.rejected if "aten.mm" in d.detail]  # the final norm: the bf16 lm_head, no quant named
    assert len(final) == 1 and "per-tensor" not in final[0].detail, r.render()


def test_llama_has_no_qk_norms(graphs):
    r, _ = run_pass(graphs[("llama-tiny", "hf")])
    assert r.rejection_reasons() == {"no_quant_consumer": 1, "producer_not_fusable": LAYERS}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_and_fp32_models_are_left_unchanged(dtype):
    m = build_model("qwen3-tiny", form="hf", layers=LAYERS, dtype=dtype)
    gm0 = capture(m, *example_inputs(m, 2, 5))[0]
    r, gm = run_pass(gm0)
    assert str(gm.graph) == str(gm0.graph) and not r.applied and not r.errors
    # every norm (input, post-attention, q/k, final) and silu: dtype; o_proj's quant: no fused producer
    assert r.rejection_reasons() == {"dtype_not_bf16": 4 * LAYERS + 1 + LAYERS, "producer_not_fusable": LAYERS}, (
        r.render())


def test_dynamic_hf_model_one_graph_for_all_shapes():
    m = model("qwen3-tiny", "hf")
    calls = [example_inputs(m, 3, 7), example_inputs(m, 4, 6)]
    with torch._dynamo.config.patch(specialize_float=True):  # what fuse(model, dynamic=True) does
        gms = capture(m, *example_inputs(m, 2, 5), dynamic=True, calls=calls)
    assert len(gms) == 1
    r, _ = run_pass(gms[0])
    c = r.counts()
    assert (c["norm_quant"], c["add_norm_quant"], c["silu_quant"], c["dedup_quant"]) == (1, 3, 2, 6), r.render()


# ---------------------------------------------------------------- compiled end to end


@pytest.mark.parametrize("form", ["hf", "engine"])
def test_outputs_with_and_without_the_pass(form):
    m = model("qwen3-tiny", form)
    inputs = example_inputs(m, 2, 5)
    torch._dynamo.reset()
    report_mod.clear_reports()
    with torch.no_grad():
        fused = logits(torch.compile(m, backend=fp8_fusion_pass.backend(fx_graph_cache=False))(*inputs))
        torch._dynamo.reset()
        fusions_only = logits(torch.compile(m, backend=fp8_fusion_pass.backend(FUSIONS_ONLY, fx_graph_cache=False))(
            *inputs))
        torch._dynamo.reset()
        plain = logits(torch.compile(m, backend="inductor")(*inputs))
    torch._dynamo.reset()
    r = fp8_fusion_pass.last_report()
    assert r is not None and r.counts()["add_norm_quant"] == 2 * LAYERS - 1
    err = rel(fused, plain)
    print(f"qwen3-tiny {form}: with vs without the pass, logits rel L2 {err:.4f}")
    if form == "engine":
        # the engine's norms are our ops; on the CPU the fused ops run the reference, i.e. the very code the
        # unfused ops run, so the fusions must not change a single bit
        assert torch.equal(fusions_only, plain)
    # HF: Inductor compiles the unfused plain-torch norm keeping bf16 intermediates in fp32, the fused op rounds
    # like eager; measured 0.041 (2 layers, batch 2 x 5). Engine, defaults: inline_norm hands the leftover norms
    # to Inductor, which may skip the same intermediate rounding.
    assert err < tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR


def test_dynamic_batch_and_sequence_fuse_without_extra_recompiles():
    from torch._dynamo.utils import counters

    m = model("llama-tiny", "engine")
    shapes = [(2, 5), (3, 7), (4, 3)]

    def frames(compiled):
        torch._dynamo.reset()
        counters.clear()
        with torch.no_grad():
            outs = [logits(compiled(*example_inputs(m, b, s))) for b, s in shapes]
        return counters["stats"]["unique_graphs"], outs

    report_mod.clear_reports()
    # FUSIONS_ONLY: the bitwise comparison below holds for the fusions (inline_norm hands norms to Inductor)
    n_fused, outs = frames(fp8_fusion_pass.fuse(m, FUSIONS_ONLY, dynamic=True, options={"fx_graph_cache": False}))
    reports = report_mod.all_reports()
    n_plain, plain = frames(torch.compile(m, backend="inductor", dynamic=True))
    torch._dynamo.reset()
    assert n_fused == n_plain == 1
    assert len(reports) == 1 and reports[0].counts()["silu_quant"] == LAYERS, [x.summary_line() for x in reports]
    for a, b in zip(outs, plain):
        assert torch.equal(a, b)
