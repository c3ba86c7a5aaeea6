"""qk_rope: Llama's q / k RoPE (no per-head norms) in one ``qk_rope`` op, on by default (``rope_cache`` then gives it
the KV-cache writes: ``test_rope_cache.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import tolerances
import torch
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, count, rel_l2, run_pass

from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.models import build_model, example_inputs

ops = torch.ops.fp8_fusion
LAYERS = 2
QK_ROPE = dataclasses.replace(FUSIONS_ONLY, qk_rope=True)


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_each_llama_layers_q_and_k_share_one_launch(form):
    m = build_model("llama-tiny", form=form, layers=LAYERS)
    inputs = example_inputs(m, 2, 5)
    (gm,) = capture(m, *inputs)
    r, out = run_pass(gm, QK_ROPE)
    assert r.counts()["qk_rope"] == LAYERS and not r.errors, r.render()
    assert count(out, ops.qk_rope.default) == LAYERS
    # each RoPE chain's rotate-half is gone (its neg and the cat of it)
    assert not any(n.target is torch.ops.aten.neg.default for c in out.graph.nodes if c.target is torch.ops.aten.cat
                   .default for n in c.args[0])  # fmt: skip
    assert "no_norm_rope_pair" not in r.rejection_reasons()  # v's view -> permute is no candidate
    if form == "hf":
        return  # the whole-model compile below is the engine's only (CI time)
    # the whole model compiled: within the pass bound against eager (the op rounds each step as eager does)
    with torch.no_grad():
        eager = m(*inputs)
    eager = eager.logits if hasattr(eager, "logits") else eager
    plain, _ = compile_model(m, inputs, FUSIONS_ONLY)
    fused, counts = compile_model(m, inputs, QK_ROPE)
    assert counts["qk_rope"] == LAYERS
    assert rel_l2(fused, eager) <= tolerances.pass_vs_eager_bound(rel_l2(plain, eager))


def test_qwen3s_normed_chains_are_norm_ropes_not_its():
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    r, _ = run_pass(gm, FusionConfig())  # the defaults: norm_rope takes them first
    assert r.counts()["norm_rope"] == LAYERS and "qk_rope" not in r.counts()
    r, out = run_pass(gm, FusionConfig(norm_rope=False))  # off: the norms and RoPEs stay Inductor's
    assert "qk_rope" not in r.counts() and count(out, ops.qk_rope.default) == 0, r.render()


def test_switched_off():
    m = build_model("llama-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    r, out = run_pass(gm, FusionConfig(qk_rope=False))
    assert "qk_rope" not in r.counts() and count(out, ops.qk_rope.default) == 0
