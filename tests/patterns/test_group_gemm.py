"""group_gemm: blockscale_mms of one quantized activation become one blockscale_mm_grouped
(FusionConfig(group_gemm=True))."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, count, run_pass

from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.models import build_model, example_inputs

ops = torch.ops.fp8_fusion
LAYERS = 2
GROUP = dataclasses.replace(FUSIONS_ONLY, group_gemm=True)  # this rewrite alone on top of the fusions


@pytest.fixture(scope="module")
def hf_graph():
    m = build_model("qwen3-tiny", form="hf", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    return gm


def test_on_by_default_and_nothing_without_it(hf_graph):
    r, gm = run_pass(hf_graph, FusionConfig())
    assert r.counts()["group_gemm"] == 2 * LAYERS, r.render()
    r, gm = run_pass(hf_graph, FUSIONS_ONLY)
    assert "group_gemm" not in r.counts()
    assert count(gm, ops.blockscale_mm.default) == 7 * LAYERS and count(gm, ops.blockscale_mm_grouped.default) == 0


def test_hf_projections_of_one_input_are_grouped(hf_graph):
    r, gm = run_pass(hf_graph, GROUP)
    c = r.counts()
    # per layer: q/k/v (after dedup_quant and the norm fusion share one quant) and gate/up; o and down stay alone
    assert c["group_gemm"] == 2 * LAYERS, r.render()
    assert count(gm, ops.blockscale_mm_grouped.default) == 2 * LAYERS
    assert count(gm, ops.blockscale_mm.default) == 2 * LAYERS
    # the fusions before it are unchanged
    assert (c["norm_quant"], c["add_norm_quant"], c["silu_quant"]) == (1, 2 * LAYERS - 1, LAYERS)
    # the silu fusion's [gate | up] concat of the two GEMM outputs is the grouped output itself: folded
    _, plain = run_pass(hf_graph)
    assert count(gm, torch.ops.aten.cat.default) == count(plain, torch.ops.aten.cat.default) - LAYERS
    folded = [d for d in r.applied if d.pattern == "group_gemm" and "concat(s) of its slices folded" in d.detail]
    assert len(folded) == LAYERS
    details = sorted({d.detail.split(": ")[1].split(";")[0] for d in r.applied if d.pattern == "group_gemm"})
    cfg = build_model("qwen3-tiny", form="hf", layers=1).config
    head = cfg.head_dim
    qkv = f"N = {cfg.num_attention_heads * head} + {cfg.num_key_value_heads * head} + {cfg.num_key_value_heads * head}"
    gate_up = f"N = {cfg.intermediate_size} + {cfg.intermediate_size}"
    assert details == sorted([qkv, gate_up])
    assert not r.errors and not r.notes


def test_engine_form_has_nothing_to_group():
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    r, _ = run_pass(gm, GROUP)
    assert "group_gemm" not in r.counts()  # qkv_proj and gate_up_proj are merged already


def test_deterministic_mode_keeps_it_off(hf_graph):
    torch.use_deterministic_algorithms(True)
    try:
        r, _ = run_pass(hf_graph, GROUP)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "group_gemm" not in r.counts()


def test_whole_model_outputs_are_unchanged_on_the_reference_backend():
    # On the CPU the grouped op is the concatenation of the same reference GEMMs: the logits must be bit-identical.
    m = build_model("qwen3-tiny", form="hf", layers=LAYERS)
    inputs = example_inputs(m, 2, 5)
    plain, counts = compile_model(m, inputs, FUSIONS_ONLY)
    assert "group_gemm" not in counts
    grouped, counts = compile_model(m, inputs, GROUP)
    assert counts["group_gemm"] == 2 * LAYERS
    assert torch.equal(grouped, plain)


def test_grouped_op_checks_its_inputs():
    q = torch.zeros(2, 256, dtype=torch.float8_e4m3fn)
    s = torch.ones(2, 2)
    w = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    ws = torch.ones(1, 2)
    with pytest.raises(ValueError, match="non-empty lists of one length"):
        ops.blockscale_mm_grouped(q, s, [w, w], [ws], torch.bfloat16)
    with pytest.raises(ValueError, match="K=256"):
        ops.blockscale_mm_grouped(q, s, [w, torch.zeros(128, 128, dtype=torch.float8_e4m3fn)], [ws, ws],
                                  torch.bfloat16)
    y = ops.blockscale_mm_grouped(q, s, [w, w[:64]], [ws, ws], torch.bfloat16)
    assert y.shape == (2, 192)


@pytest.mark.parametrize("order, folds", [((0, 4, 8), True), ((4, 8, 0), False), ((0, 4, 6), False)])
def test_only_an_in_order_concat_of_all_slices_folds(order, folds):
    from torch.fx.experimental.proxy_tensor import make_fx

    from fp8_fusion_pass.patterns import group_gemm

    a, b, c = order
    end = {0: 4, 4: 8, 8: 12}

    def f(y):
        parts = [y[:, a:end[a]], y[:, b:end[b]]] + ([y[:, c:end[c]]] if c != 6 else [y[:, 8:10]])
        return torch.cat([p.reshape(2, 3, -1) for p in parts], -1)

    y = torch.randn(6, 12)
    gm = make_fx(f)(y)
    want = f(y)
    (y_node,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert group_gemm.fold_concats(gm.graph, y_node, 12) == int(folds)
    gm.graph.lint()
    gm.recompile()
    assert torch.equal(gm(y), want)
    assert (count(gm, torch.ops.aten.cat.default) == 0) == folds


def test_static_prefill_graphs_keep_separate_gemms():
    from fp8_fusion_pass import guards
    from fp8_fusion_pass.kernels.triton import blockscale_mm

    assert guards.SMALL_M_MAX == blockscale_mm.SMALL_M_MAX
    m = build_model("qwen3-tiny", form="hf", layers=1)
    (gm,) = capture(m, *example_inputs(m, 1, 65))  # 65 rows: above the small-M range
    r, out = run_pass(gm, GROUP)
    assert "group_gemm" not in r.counts() and count(out, ops.blockscale_mm_grouped.default) == 0
    assert [(d.pattern, d.reason) for d in r.rejected if d.pattern == "group_gemm"] == [
        ("group_gemm", "m_above_small_m")] * 2, r.render()  # q/k/v and gate/up of its one layer
    assert all("M=65 is above" in d.detail for d in r.rejected if d.pattern == "group_gemm")


def test_compiled_model_runs_the_grouped_triton_kernel(monkeypatch):
    # The Triton backend (on the CPU: the interpreter) runs each group as one small-M launch inside the compiled
    # model; at these sizes (K = 256: split-K 1 for every shape) it is bitwise the separate GEMMs.
    from fp8_fusion_pass.kernels import backends
    from fp8_fusion_pass.kernels.triton import _small_m_kernels, blockscale_mm_grouped

    launches = []
    real = blockscale_mm_grouped.small_m_mm_grouped
    monkeypatch.setattr(blockscale_mm_grouped, "small_m_mm_grouped",
                        lambda *a, **k: launches.append(len(a[2])) or real(*a, **k))
    assert _small_m_kernels.MAX_GROUPS == 3
    m = build_model("qwen3-tiny", form="hf", layers=1)
    inputs = example_inputs(m, 1, 1)
    outs = {}
    with torch.no_grad(), backends.use_backend("triton"):
        for config in (FUSIONS_ONLY, GROUP):
            torch._dynamo.reset()
            opts = {"post_grad_custom_post_pass": FP8FusionPass(config), "fx_graph_cache": False}
            outs[config.group_gemm] = torch.compile(m, options=opts)(*inputs).logits
    torch._dynamo.reset()
    assert sorted(launches) == [2, 3]  # gate/up and q/k/v, one launch each
    assert torch.equal(outs[True], outs[False])


@pytest.mark.parametrize("name", ["group_gemm", "inline_norm"])
def test_a_failing_whole_graph_rewrite_is_recorded_and_leaves_the_graph(hf_graph, name):
    from fp8_fusion_pass.fusion_pass import inject_failure

    config = FusionConfig(group_gemm=True, inline_norm=True)
    with inject_failure("replacement", name):
        r, gm = run_pass(hf_graph, config)
    assert [e.pattern for e in r.errors] == [name] and name not in r.counts()
    assert r.counts()["silu_quant"] == LAYERS  # the other rewrites still ran


def test_a_backend_without_a_grouped_kernel_keeps_separate_gemms(hf_graph, monkeypatch):
    # ROCm: the separate GEMMs are aiter's, which has no grouped kernel; the grouped op would fall to Triton's
    from fp8_fusion_pass.kernels import backends

    real = backends.backend_for
    monkeypatch.setattr(backends, "backend_for",
                        lambda op, dev: "aiter" if op == "blockscale_mm" else real(op, dev))
    r, gm = run_pass(hf_graph, GROUP)
    assert "group_gemm" not in r.counts() and count(gm, ops.blockscale_mm_grouped.default) == 0
    rejected = [d for d in r.rejected if d.pattern == "group_gemm"]
    assert [d.reason for d in rejected] == ["no_fused_kernel"] * 2 * LAYERS, r.render()
    assert "aiter backend, which has no blockscale_mm_grouped kernel" in rejected[0].detail
