"""inline_norm: rms_norm / add_rms_norm ops left after the fusions become aten ops (FusionConfig(inline_norm=True))."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, count, rel_l2, run_pass

from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.kernels import reference
from fp8_fusion_pass.models import build_model, example_inputs

ops = torch.ops.fp8_fusion
LAYERS = 2
INLINE = dataclasses.replace(FUSIONS_ONLY, inline_norm=True)  # this rewrite alone on top of the fusions


@pytest.fixture(scope="module")
def engine_graph():
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    return gm


def test_on_by_default_and_nothing_without_it(engine_graph):
    # norm_rope off: it would take the q / k norms first (test_norm_rope.py), leaving only the final norm here
    r, gm = run_pass(engine_graph, FusionConfig(norm_rope=False))
    assert r.counts()["inline_norm"] == 2 * LAYERS + 1, r.render()
    r, gm = run_pass(engine_graph, FUSIONS_ONLY)
    assert "inline_norm" not in r.counts()
    # the q / k norms of every layer and the final norm stay ops, each with its "why not"
    assert count(gm, ops.rms_norm.default) == 2 * LAYERS and count(gm, ops.add_rms_norm.default) == 1


def test_leftover_norms_become_aten_ops(engine_graph):
    r, gm = run_pass(engine_graph, INLINE)
    c = r.counts()
    assert c["inline_norm"] == 2 * LAYERS + 1, r.render()
    # the fusions are made first and are unchanged; only what they left is inlined
    assert (c["norm_quant"], c["add_norm_quant"], c["silu_quant"]) == (1, 2 * LAYERS - 1, LAYERS)
    assert count(gm, ops.rms_norm.default) == 0 and count(gm, ops.add_rms_norm.default) == 0
    assert count(gm, torch.ops.aten.rsqrt.default) == 2 * LAYERS + 1
    assert not r.errors and not r.notes


def test_inlined_ops_are_the_reference_formula_when_run_eagerly():
    # The aten ops inline_norm writes are reference.rms_norm's, in its order: run eagerly (no Inductor), the
    # rewritten graph is bit-identical to the op graph. (Compiled, Inductor may skip a rounding: next test.)
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(5, 3, 256, generator=g).bfloat16() for _ in range(2))
    w = (torch.rand(256, generator=g) + 0.5).bfloat16()
    gm = make_fx(_norms, tracing_mode="fake")(x, r, w)
    want = gm(x, r, w)
    rep, out = run_pass(gm, INLINE)
    assert rep.counts()["inline_norm"] == 2 and count(out, ops.rms_norm.default) == 0
    for got, exp in zip(out(x, r, w), want):
        assert torch.equal(got, exp)


def test_hf_form_has_no_norm_ops_to_inline():
    m = build_model("qwen3-tiny", form="hf", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    r, _ = run_pass(gm, INLINE)
    assert "inline_norm" not in r.counts()  # HF writes its norms in plain torch: Inductor fuses them already


def test_switches_and_deterministic_mode_keep_it_off(engine_graph, monkeypatch):
    monkeypatch.setenv("FP8_FUSION_DISABLE", "inline_norm")
    r, _ = run_pass(engine_graph, INLINE)
    assert "inline_norm" not in r.counts()
    monkeypatch.delenv("FP8_FUSION_DISABLE")
    torch.use_deterministic_algorithms(True)
    try:
        r, _ = run_pass(engine_graph, INLINE)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "inline_norm" not in r.counts()  # Inductor's kernel may round differently: not bit-exact


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_fp32_norms_stay_ops(dtype):
    # fp16 / fp32 graphs are left alone, as by the fusions' dtype guard; the report says why in a note
    x, r, w = torch.randn(3, 256, dtype=dtype), torch.randn(3, 256, dtype=dtype), torch.randn(256, dtype=dtype)
    (gm,) = capture(_Norms(), x, r, w)
    rep, out = run_pass(gm, INLINE)
    assert "inline_norm" not in rep.counts()
    assert count(out, ops.rms_norm.default) == 1 and count(out, ops.add_rms_norm.default) == 1
    rejected = [(d.pattern, d.reason) for d in rep.rejected if d.pattern == "inline_norm"]
    assert rejected == [("inline_norm", "dtype_not_bf16")] * 2, rep.render()


class _Norms(torch.nn.Module):
    def forward(self, x, r, w):
        return _norms(x, r, w)


def _norms(x, r, w):
    y1 = ops.rms_norm(x, w, 1e-6)
    y2, res = ops.add_rms_norm(x, r, w, 1e-5)
    return y1, y2, res


def test_compiled_numerics_stay_within_one_bf16_step():
    # Inlined, the norm is Inductor's kernel: the residual sum is exact, the normalised value may skip the op's
    # intermediate bf16 rounding (as Inductor's compile of HF's own norm code does), so values may move by one
    # bf16 step (measured on the CPU: 26-34% of them), never more.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 128, generator=g).bfloat16()
    r = torch.randn(64, 8, 128, generator=g).bfloat16()
    w = (torch.rand(128, generator=g) + 0.5).bfloat16()
    want_res = r + x
    want = (reference.rms_norm(x, w, 1e-6), reference.rms_norm(want_res, w, 1e-5))
    torch._dynamo.reset()
    report_mod.clear_reports()
    opts = {"post_grad_custom_post_pass": FP8FusionPass(INLINE), "fx_graph_cache": False}
    y1, y2, res = torch.compile(_norms, options=opts)(x, r, w)
    torch._dynamo.reset()
    assert report_mod.last_report().counts()["inline_norm"] == 2
    assert torch.equal(res, want_res)
    for got, exp in zip((y1, y2), want):
        step = torch.finfo(torch.bfloat16).eps * exp.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
        assert ((got.float() - exp.float()).abs() <= step * 1.0001).all()


def test_whole_model_within_the_pass_bound():
    import tolerances

    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    inputs = example_inputs(m, 2, 5)
    plain, _ = compile_model(m, inputs, FUSIONS_ONLY)
    fused, _ = compile_model(m, inputs, INLINE)
    with torch.no_grad():
        eager = m(*inputs)
    plain_vs_eager, err = rel_l2(plain, eager), rel_l2(fused, eager)
    assert err <= tolerances.pass_vs_eager_bound(plain_vs_eager), (err, plain_vs_eager)
