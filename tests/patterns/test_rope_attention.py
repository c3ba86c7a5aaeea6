"""rope_attention: the decode step's RoPE op (which writes k / v into the static caches) and the decode attention
that reads them become one ``fp8_fusion.rope_decode_attention`` launch.

On the CPU (the op's reference runs there): whole engine decode steps compiled with and without the rewrite (the
reference composes the same two ops, so bit for bit), the o_proj's quant folded in at batch > 4, and each guard.
"""

from __future__ import annotations

import dataclasses
import operator
import re

import pytest
import torch
import torch.utils._pytree as pytree
from pattern_helpers import capture, run_pass
from test_rope_cache import LAYERS, _compiled_step, _engine_step

from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.models import presets
from fp8_fusion_pass.patterns import rope_attention

FUSED = torch.ops.fp8_fusion.rope_decode_attention.default
WITHOUT = FusionConfig(rope_attention=False)


def _count(gm, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target or (n.args and n.args[0] is target))


def _graph(preset: str, batch: int, config: FusionConfig | None = None):
    model, _, _ = _engine_step(preset)
    cache = model.new_kv_cache(batch, 16)
    ids, pos = torch.zeros(batch, 1, dtype=torch.long), torch.tensor([[(3 + 5 * i) % 16] for i in range(batch)])
    (gm,) = capture(lambda ids, pos: model(ids, pos, cache), ids, pos)
    return run_pass(gm, config or FusionConfig())


def test_engine_decode_steps_rope_and_attend_in_one_launch():
    for preset, rope in (("llama-tiny", "qk_rope"), ("qwen3-tiny", "norm_rope")):
        model, step, new_cache = _engine_step(preset)
        with_it = _compiled_step(model, step, new_cache, FusionConfig())
        without = _compiled_step(model, step, new_cache, WITHOUT)
        assert with_it[2]["rope_attention"] == LAYERS and "rope_attention" not in without[2], with_it[2]
        assert with_it[2][rope] == with_it[2]["rope_cache"] == with_it[2]["decode_attention"] == LAYERS
        assert "fp8_fusion.rope_decode_attention" in with_it[3] and "rope_cache.default" not in with_it[3]
        # Inductor reinplaced the op: each call gets two of the graph's inputs (argN_1) as its caches, not a copy
        calls = [ln for ln in with_it[3].splitlines() if "= torch.ops.fp8_fusion.rope_decode_attention.default(" in ln]
        assert len(calls) == LAYERS and all(re.search(r", arg\d+_1, arg\d+_1, ", ln) for ln in calls), calls
        # the reference is the two ops composed: the same logits and the same caches, written in place
        assert torch.equal(with_it[0], without[0]) and all(torch.equal(a, b) for a, b in zip(with_it[1], without[1]))
        _, untouched = new_cache()
        assert not all(torch.equal(a, b) for a, b in zip(with_it[1], untouched))


def test_the_o_proj_quant_folded_in_goes_along():
    # batch 6: the attention's output quant is the attention op's (decode_attention's fold: head dim 128, so
    # qwen3-tiny); the fused op takes it
    r, out = _graph("qwen3-tiny", 6)
    fused = [n for n in out.graph.nodes if n.args and n.args[0] is FUSED]
    assert len(fused) == LAYERS and r.counts()["rope_attention"] == LAYERS, r.render()
    assert {n.kwargs["group_size"] for n in fused} == {128}
    assert _count(out, torch.ops.fp8_fusion.decode_attention_upto_quant.default) == 0
    assert "(and its quant)" in next(d.detail for d in r.applied if d.pattern == "rope_attention")


def test_norms_over_many_pairs_stay_two_launches(monkeypatch):
    monkeypatch.setattr(rope_attention, "MAX_NORM_PAIRS", 4)  # qwen3-tiny: 3 batch rows x 2 kv heads = 6 pairs
    r, out = _graph("qwen3-tiny", 3)
    assert r.rejection_reasons().get("unfused_pair_faster") == LAYERS and "rope_attention" not in r.counts()
    assert _count(out, FUSED) == 0
    r, _ = _graph("llama-tiny", 3)  # no norms: taken at any size
    assert r.counts()["rope_attention"] == LAYERS


def test_a_q_read_elsewhere_keeps_two_launches():
    _, out = _graph("llama-tiny", 3, WITHOUT)
    graph = out.graph
    q_outs = [n for n in graph.nodes if n.target is operator.getitem and n.args[1] == 0
              and getattr(n.args[0], "args", None) and n.args[0].args[0] is torch.ops.fp8_fusion.qk_rope_cache.default]
    assert len(q_outs) == LAYERS
    with graph.inserting_after(q_outs[0]):
        graph.call_function(torch.ops.aten.neg.default, (q_outs[0],))
    report = report_mod.new_report()
    rope_attention.run(graph, report)
    assert report.rejection_reasons() == {"rope_attention_not_single": 1} and report.counts()["rope_attention"] == 1
    assert "also read by neg" in report.render()


def test_a_view_of_a_cache_base_keeps_two_launches():
    # the fused op writes the caches whole: a RoPE op that writes a view of its base (functionalization's
    # _k_cache_size / _stride / _storage_offset kwargs) is rejected with its reason, not rewritten wrongly
    _, out = _graph("llama-tiny", 3, WITHOUT)
    graph = out.graph
    afs = [n for n in graph.nodes if n.args and n.args[0] is torch.ops.fp8_fusion.qk_rope_cache.default]
    afs[0].update_kwarg("_k_cache_storage_offset", 0)
    report = report_mod.new_report()
    rope_attention.run(graph, report)
    assert report.rejection_reasons() == {"rope_attention_not_single": 1} and report.counts()["rope_attention"] == 1
    assert "views of its cache bases" in report.render()


def test_a_head_dim_below_the_kernels_tile_keeps_two_launches(monkeypatch):
    # head dim 8: the RoPE kernel and the decode attention take it, the fused kernel (one 16+ tile per head) does
    # not: a reported rejection, not an error in the op's checks after the rewrite
    tiny = presets.PRESETS["llama-tiny"]
    config = {**tiny.config, "head_dim": 8, "num_attention_heads": 32, "num_key_value_heads": 16}
    monkeypatch.setitem(presets.PRESETS, "llama-tiny", dataclasses.replace(tiny, config=config))
    r, out = _graph("llama-tiny", 3)
    assert r.counts()["decode_attention"] == r.counts()["rope_cache"] == LAYERS, r.render()
    assert r.rejection_reasons().get("rope_attention_not_single") == LAYERS and _count(out, FUSED) == 0
    assert "head dim 8 is not a power of two of at least 16" in r.render()


@pytest.mark.parametrize("reader", ["rope", "attention"])
def test_outputs_read_as_a_tuple_keep_two_launches(reader):
    # the rewrite moves each getitem reader to the fused op's outputs; a reader of the whole tuple has no place
    # there, so the candidate is rejected with its reason (batch 6: the attention is the quant form, two outputs)
    _, out = _graph("qwen3-tiny", 6, WITHOUT)
    graph = out.graph
    ops = {"rope": torch.ops.fp8_fusion.rms_norm_rope_cache.default,
           "attention": torch.ops.fp8_fusion.decode_attention_upto_quant.default}  # fmt: skip
    node = next(n for n in graph.nodes if n.target is ops[reader] or (n.args and n.args[0] is ops[reader]))
    with graph.inserting_after(node):
        graph.call_function(list, (node,))
    report = report_mod.new_report()
    rope_attention.run(graph, report)
    assert report.rejection_reasons() == {"rope_attention_not_single": 1} and report.counts()["rope_attention"] == 1
    what = "the RoPE op's" if reader == "rope" else "the attention's"
    assert f"{what} outputs are read as a tuple" in report.render()


def test_deterministic_mode_keeps_it_off():
    torch.use_deterministic_algorithms(True)
    try:
        r, out = _graph("llama-tiny", 3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "rope_attention" not in r.counts() and _count(out, FUSED) == 0


def _dynamic_graph(preset: str, batch: int, how: str):
    """The decode step's graph as an engine serving any batch compiles it: ``how`` "batch" marks the batch dim of
    every input dynamic; "all" is ``fuse(model, dynamic=True)`` (every size symbolic, floats kept constant)."""
    model, _, _ = _engine_step(preset)
    cache = model.new_kv_cache(batch, 16)
    ids, pos = torch.zeros(batch, 1, dtype=torch.long), torch.tensor([[(3 + 5 * i) % 16] for i in range(batch)])
    if how == "batch":
        for t in (ids, pos, *cache.k, *cache.v):
            torch._dynamo.mark_dynamic(t, 0)
    with torch._dynamo.config.patch(specialize_float=True):
        (gm,) = capture(lambda ids, pos: model(ids, pos, cache), ids, pos, dynamic=how == "all" or None)
    return run_pass(gm, FusionConfig())


def _symbols_in_args(gm) -> list[str]:
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return [n.name for n in gm.graph.nodes if any(isinstance(a, sym) for a in pytree.tree_leaves((n.args, n.kwargs)))]


@pytest.mark.parametrize("how", ["batch", "all"])
def test_a_symbolic_batch_is_taken(how):
    # Before: the engine's write rows iota(B) had the graph's SymInt node as its length, never "known equal" to B
    # (rope_cache, so rope_attention, refused every symbolic batch), and under dynamic=True the caches' kv heads were
    # a SymInt fixed to a number by a guard, which decode_attention took for a symbolic head count.
    r, out = _dynamic_graph("llama-tiny", 3, how)
    counts = r.counts()
    assert counts["rope_cache"] == counts["decode_attention"] == counts["rope_attention"] == LAYERS, r.render()
    assert _count(out, FUSED) == LAYERS and not r.errors
    assert not _symbols_in_args(out)  # Inductor lowers sizes from nodes or ints, never a SymInt object
    # Qwen3 at batch 6 (head dim 128): the o_proj quant folds into the attention, reshaped over a symbolic batch;
    # with q / k norms a symbolic batch is not known to be within MAX_NORM_PAIRS, so the RoPE launch stays its own
    r, out = _dynamic_graph("qwen3-tiny", 6, how)
    assert r.counts()["rope_cache"] == r.counts()["decode_attention"] == LAYERS, r.render()
    assert r.rejection_reasons().get("unfused_pair_faster") == LAYERS and not _symbols_in_args(out)
    assert _count(out, torch.ops.fp8_fusion.decode_attention_upto_quant.default) == LAYERS


def test_an_attention_that_reads_a_mask_is_reported(monkeypatch):
    # the fused kernel attends over every slot up to each row's position; one whose mask is not that comparison
    # keeps two launches, and the report says so (before: no candidate, no word in the report)
    from fp8_fusion_pass.patterns import _decode_mask

    monkeypatch.setattr(_decode_mask, "upto", lambda keep: None)
    r, out = _graph("llama-tiny", 3)
    assert r.counts()["decode_attention"] == r.counts()["rope_cache"] == LAYERS, r.render()
    assert r.rejection_reasons().get("rope_attention_not_single") == LAYERS and _count(out, FUSED) == 0
    assert "the attention reads a mask" in r.render()


FUSED_TOKENS = torch.ops.fp8_fusion.rope_decode_attention_tokens_quant.default


def test_steps_of_several_tokens_rope_and_attend_in_one_launch():
    # qwen3-tiny (heads of 128, so the token form): 4 tokens per step; the reference composes the same two ops, so
    # bit for bit the pass without the rewrite, logits and caches
    from test_decode_tokens import _engine_tokens

    model, ids, positions, new_cache = _engine_tokens("qwen3-tiny")
    step = lambda f, cache: f(ids, positions, cache)  # noqa: E731
    with_it = _compiled_step(model, step, new_cache, FusionConfig())
    without = _compiled_step(model, step, new_cache, WITHOUT)
    assert with_it[2]["rope_attention"] == with_it[2]["decode_attention"] == LAYERS, with_it[2]
    assert "fp8_fusion.rope_decode_attention_tokens_quant" in with_it[3] and "rope_cache.default" not in with_it[3]
    assert "fp8_fusion.decode_attention_tokens_quant" not in with_it[3]
    assert "fp8_fusion.decode_attention_tokens_quant" in without[3]
    assert torch.equal(with_it[0], without[0]) and all(torch.equal(a, b) for a, b in zip(with_it[1], without[1]))
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    r, out = run_pass(gm, FusionConfig())
    fused = [n for n in out.graph.nodes if n.args and n.args[0] is FUSED_TOKENS]
    assert len(fused) == LAYERS and {n.kwargs["group_size"] for n in fused} == {128}
    assert list(fused[0].kwargs["last"].meta["val"].shape) == [3, 4]
    detail = next(d.detail for d in r.applied if d.pattern == "rope_attention")
    assert detail.endswith("(and its quant) (4 tokens per step)"), detail


FUSED_TOKENS_PLAIN = torch.ops.fp8_fusion.rope_decode_attention_tokens.default


@pytest.mark.parametrize("preset, scheme", [("llama-tiny", "block"), ("qwen3-tiny", "per-tensor")])
def test_steps_of_several_tokens_without_a_foldable_quant_rope_and_attend_in_one_launch(preset, scheme):
    # the plain token form (heads of 64: no whole quant group per head; a per-tensor o_proj quantizes on its own):
    # the RoPE (Qwen3: with its norms) and the cache writes go into its launch all the same, bit for bit the pass
    # without the rewrite on the CPU, logits and caches
    from test_decode_tokens import _engine_tokens

    model, ids, positions, new_cache = _engine_tokens(preset, scheme=scheme)
    step = lambda f, cache: f(ids, positions, cache)  # noqa: E731
    with_it = _compiled_step(model, step, new_cache, FusionConfig())
    without = _compiled_step(model, step, new_cache, WITHOUT)
    assert with_it[2]["rope_attention"] == with_it[2]["decode_attention"] == LAYERS, with_it[2]
    assert "fp8_fusion.rope_decode_attention_tokens.default" in with_it[3] and "rope_cache.default" not in with_it[3]
    assert "fp8_fusion.decode_attention_tokens.default" in without[3]
    assert "fp8_fusion.decode_attention_tokens.default" not in with_it[3]
    assert torch.equal(with_it[0], without[0]) and all(torch.equal(a, b) for a, b in zip(with_it[1], without[1]))
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    r, out = run_pass(gm, FusionConfig())
    fused = [n for n in out.graph.nodes if n.args and n.args[0] is FUSED_TOKENS_PLAIN]
    assert len(fused) == LAYERS and all("group_size" not in n.kwargs for n in fused)
    assert all((n.kwargs["wq"] is None) == (preset == "llama-tiny") for n in fused)  # Qwen3's norms in the prologue
    assert list(fused[0].meta["val"][0].shape) == [3, 4, *list(fused[0].kwargs["q"].meta["val"].shape[2:])]
    detail = next(d.detail for d in r.applied if d.pattern == "rope_attention")
    assert detail.endswith("k / v cache writes in the attention's launch (4 tokens per step)"), detail


def test_steps_of_several_tokens_keep_the_norm_bound(monkeypatch):
    # the bound on (batch row, kv head) pairs with q / k norms holds at several tokens too (measured at one)
    from test_decode_tokens import _engine_tokens

    monkeypatch.setattr(rope_attention, "MAX_NORM_PAIRS", 4)  # 3 batch rows x 2 kv heads
    model, ids, positions, new_cache = _engine_tokens("qwen3-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    r, out = run_pass(gm, FusionConfig())
    assert r.rejection_reasons().get("unfused_pair_faster") == LAYERS and _count(out, FUSED_TOKENS) == 0
    assert _count(out, torch.ops.fp8_fusion.decode_attention_tokens_quant.default) == LAYERS


@pytest.mark.parametrize("preset, bound_name, other", [
    ("qwen3-tiny", "MAX_NORM_TOKEN_ROWS", "MAX_TOKEN_ROWS"),
    ("llama-tiny", "MAX_TOKEN_ROWS", "MAX_NORM_TOKEN_ROWS"),
])
def test_steps_of_more_rows_than_the_token_bound_keep_two_launches(monkeypatch, preset, bound_name, other):
    # the token form above its bound of query rows per kv head (with q / k norms the lower one) keeps the RoPE launch
    # (its RoPE in the attention's prologue measured slower above); at the bound the rewrite takes it, and the other
    # model's bound does not count
    from test_decode_tokens import _engine_tokens

    model, ids, positions, new_cache = _engine_tokens(preset)
    cache, _ = new_cache()
    rows = model.config.num_attention_heads // model.config.num_key_value_heads * 4
    monkeypatch.setattr(rope_attention, other, 0)
    for bound, taken in ((rows - 1, 0), (rows, LAYERS)):
        monkeypatch.setattr(rope_attention, bound_name, bound)
        (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
        r, out = run_pass(gm, FusionConfig())
        assert r.counts().get("rope_attention", 0) == taken, r.render()
        assert r.rejection_reasons().get("unfused_pair_faster", 0) == LAYERS - taken, r.render()
        if not taken:
            assert f"{rows} rows per kv head, above {bound}" in r.render()


def test_a_step_of_several_tokens_whose_q_is_read_elsewhere_keeps_two_launches():
    # the fused op never writes the RoPE'd q out: another reader of it keeps the RoPE op, with its reason
    from test_decode_tokens import _engine_tokens

    model, ids, positions, new_cache = _engine_tokens("qwen3-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    _, out = run_pass(gm, WITHOUT)
    graph = out.graph
    tokens = [n for n in graph.nodes if n.target is torch.ops.fp8_fusion.decode_attention_tokens_quant.default]
    assert len(tokens) == LAYERS
    with graph.inserting_after(tokens[0].args[0]):
        graph.call_function(torch.ops.aten.neg.default, (tokens[0].args[0],))
    report = report_mod.new_report()
    rope_attention.run(graph, report)
    assert report.rejection_reasons() == {"rope_attention_not_single": 1} and report.counts()["rope_attention"] == 1
    assert "also read by neg" in report.render()
    assert sum(1 for n in graph.nodes if n.args and n.args[0] is FUSED_TOKENS) == LAYERS - 1


@pytest.mark.parametrize("tokens", [1, 4])
def test_the_fused_op_sees_the_slots_the_attention_saw(tokens):
    # the fused op's `last` is the attention's (the last slot each row / token sees), not the RoPE op's positions
    # (where it writes): the models make them equal, so here each attention sees one slot more, and the fused op
    # must read that node
    from test_decode_tokens import _engine_tokens

    model, ids, positions, new_cache = _engine_tokens("llama-tiny", tokens)
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    _, out = run_pass(gm, WITHOUT)
    graph = out.graph
    attention = (torch.ops.fp8_fusion.decode_attention_upto.default, rope_attention.TOKENS_PLAIN)
    atts = [n for n in graph.nodes if n.target in attention]
    assert len(atts) == LAYERS
    seen = []
    for att in atts:
        with graph.inserting_before(att):
            later = graph.call_function(torch.ops.aten.add.Tensor, (att.args[3], 1))
        later.meta["val"] = att.args[3].meta["val"]
        att.update_arg(3, later)
        seen.append(later)
    report = report_mod.new_report()
    rope_attention.run(graph, report)
    fused = [n for n in graph.nodes if n.args and n.args[0] in (FUSED, FUSED_TOKENS_PLAIN)]
    assert report.counts()["rope_attention"] == len(fused) == LAYERS, report.render()
    assert [n.kwargs["last"] for n in fused] == seen
