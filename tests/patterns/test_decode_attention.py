"""decode_attention: attention spelled as plain torch at decode (score bmm, masked fp32 softmax, value bmm) becomes
one ``fp8_fusion.decode_attention`` launch, or ``decode_attention_upto`` where the mask is ``slot <= position``.

On the CPU (the op's reference runs there): whole engine decode steps compiled with and without the rewrite, the
online-softmax spelling Inductor makes on CUDA, and a hand-written attention (``_Attention``) whose variants each
break one guard, checked against eager.
"""

from __future__ import annotations

import dataclasses

import pytest
import tolerances
import torch
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, logits, rel_l2, run_pass
from test_rope_cache import LAYERS, _compiled_step, _engine_step

from fp8_fusion_pass import guards
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.models import build_model
from fp8_fusion_pass.patterns import decode_attention

aten = torch.ops.aten
ALONE = dataclasses.replace(FUSIONS_ONLY, decode_attention=True)
BF16 = torch.bfloat16
FUSED = torch.ops.fp8_fusion.decode_attention.default
UPTO = torch.ops.fp8_fusion.decode_attention_upto.default


def _count(gm, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target)


@pytest.mark.parametrize("preset", ["qwen3-tiny", "llama-tiny"])
def test_engine_decode_step_attends_in_one_op(preset):
    model, step, new_cache = _engine_step(preset)
    # rope_attention off: it would take the op on into its own launch (tests/patterns/test_rope_attention.py)
    with_it = _compiled_step(model, step, new_cache, FusionConfig(rope_attention=False))
    without = _compiled_step(model, step, new_cache, FusionConfig(decode_attention=False))
    assert with_it[2]["decode_attention"] == LAYERS and "decode_attention" not in without[2], with_it[2]
    assert "fp8_fusion.decode_attention_upto" in with_it[3] and "fp8_fusion.decode_attention" not in without[3]
    # fp32 scores and probabilities where the graph rounded both to bf16: not equal, and the fp8 quants after the
    # attention turn ulps into fp8 steps; so each compile against eager, as the model tests compare (tolerances.py)
    cache, _ = new_cache()
    with torch.no_grad():
        eager = logits(step(model, cache))
    assert rel_l2(with_it[0], eager) <= tolerances.pass_vs_eager_bound(rel_l2(without[0], eager))
    # the first layer's cache writes come before any attention: untouched (later layers' k / v follow the outputs)
    assert torch.equal(with_it[1][0], without[1][0]) and torch.equal(with_it[1][LAYERS], without[1][LAYERS])


def test_every_layer_reads_the_positions_and_no_mask():
    """The engine's mask is ``slot <= position`` at one query token: every layer's op reads one [B] view of the
    positions (no mask computed at all, a launch per layer before), and the G-row copy of the mask is gone."""
    model, _, new_cache = _engine_step("llama-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda ids, pos: model(ids, pos, cache), torch.zeros(3, 1, dtype=torch.long),
                    torch.tensor([[5], [11], [2]]))  # fmt: skip
    r, out = run_pass(gm, ALONE)
    fused = [n for n in out.graph.nodes if n.target is UPTO]
    assert len(fused) == LAYERS and r.counts()["decode_attention"] == LAYERS, r.render()
    lasts = {n.args[3] for n in fused}
    assert len(lasts) == 1 and list(next(iter(lasts)).meta["val"].shape) == [3]
    assert _count(out, aten.le.Tensor) == 0 and _count(out, FUSED) == 0


def test_one_query_head_per_kv_head_reads_the_positions_too(monkeypatch):
    """Multi-head attention (as many kv heads as query heads): the mask's layout for the query heads is an expand
    to the same shape and no reshape; it is still ``slot <= position`` (found by the decode fuzz: it went to the
    op as a mask, which rope_attention cannot take)."""
    from fp8_fusion_pass.models import presets

    tiny = presets.PRESETS["llama-tiny"]
    monkeypatch.setitem(presets.PRESETS, "llama-tiny", dataclasses.replace(
        tiny, config={**tiny.config, "num_key_value_heads": tiny.config["num_attention_heads"]}))
    model, _, new_cache = _engine_step("llama-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda ids, pos: model(ids, pos, cache), torch.zeros(3, 1, dtype=torch.long),
                    torch.tensor([[5], [11], [2]]))  # fmt: skip
    r, out = run_pass(gm, ALONE)
    assert _count(out, UPTO) == LAYERS and _count(out, FUSED) == 0 and _count(out, aten.le.Tensor) == 0, r.render()


def test_every_layer_reads_one_mask_of_one_row():
    """A mask that is not ``slot <= position`` (a sliding window) goes to the op as a mask: one node for all layers
    (one Inductor kernel per step), and at one query token the op reads [B, 1, 1, T], not the G-row copy."""
    args = _inputs()
    (gm,) = capture(_Layers("window"), *args)
    r, out = run_pass(gm, ALONE)
    fused = [n for n in out.graph.nodes if n.target is FUSED]
    assert len(fused) == 2 and r.counts()["decode_attention"] == 2, r.render()
    masks = {n.args[3] for n in fused}
    assert len(masks) == 1 and list(next(iter(masks)).meta["val"].shape) == [3, 1, 1, 40]
    assert _count(out, aten.le.Tensor) == 1


class _Attention(torch.nn.Module):
    """The engine's ``math`` decode attention on grouped rows; ``variant`` breaks one guard."""

    def __init__(self, variant=""):
        super().__init__()
        self.variant = variant

    def forward(self, q, k_cache, v_cache, positions):  # q [B, Hkv, R, D], caches [B, Hkv, T, D]
        t = k_cache.shape[2]
        slot = torch.arange(t)
        visible = (slot <= positions.view(-1, 1, 1, 1))  # [B, 1, 1, T]
        if self.variant == "window":  # a sliding window: not slot <= position, so a mask
            visible = visible & (slot > positions.view(-1, 1, 1, 1) - 8)
        elif self.variant == "lt":  # slot < position + 1
            visible = slot < positions.view(-1, 1, 1, 1) + 1
        s = self._bmm(q, k_cache.transpose(-1, -2))
        if self.variant != "bf16_softmax":
            s = s.float()
        s = s * 0.125
        if self.variant == "additive_mask":  # HF eager attention adds a float mask
            s = s + torch.where(visible, 0.0, -1e9)
        elif self.variant == "keep_first":  # where(mask, s, -inf): the mask says what is kept
            s = torch.where(visible, s, float("-inf"))
        else:
            s = s.masked_fill(~visible, float("-inf"))
        p = s.softmax(-1).to(q.dtype)
        o = self._bmm(p, v_cache)
        return (o, s) if self.variant == "scores_read" else o

    def _bmm(self, a, b):
        if self.variant != "padded":
            return torch.matmul(a, b)
        # as Inductor's pad_mm writes a bmm on CUDA where padding the rows to 8 benchmarked faster
        a3, b3 = a.reshape(-1, *a.shape[2:]), b.reshape(-1, *b.shape[2:])
        pad = a3.new_zeros(a3.shape[0], 8 - a3.shape[1] % 8, a3.shape[2])
        out = torch.bmm(torch.cat([a3, pad], 1), b3)[:, : a3.shape[1]]
        return out.reshape(*a.shape[:3], b.shape[-1])


class _Layers(torch.nn.Module):
    """Two attentions on the same positions, as two layers of a model attend."""

    def __init__(self, variant=""):
        super().__init__()
        self.one, self.two = _Attention(variant), _Attention(variant)

    def forward(self, q, k_cache, v_cache, positions):
        o = self.one(q, k_cache, v_cache, positions)
        return self.two(o, k_cache, v_cache, positions)


def _inputs(b=3, hkv=2, r=4, t=40, d=32, dtype=BF16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hkv, r, d, generator=g).to(dtype)
    kc = torch.randn(b, hkv, t, d, generator=g).to(dtype)
    return q, kc, torch.randn(b, hkv, t, d, generator=g).to(dtype), torch.tensor([5, 39, 17][:b])


@pytest.mark.parametrize("variant, dtype, op", [
    ("", BF16, UPTO), ("keep_first", BF16, UPTO), ("", torch.float16, UPTO), ("lt", BF16, UPTO),
    ("window", BF16, FUSED), ("padded", BF16, UPTO),
])  # fmt: skip
def test_a_hand_written_decode_attention_is_taken(variant, dtype, op):
    m, args = _Attention(variant), _inputs(dtype=dtype)
    (gm,) = capture(m, *args)
    r, out = run_pass(gm, ALONE)
    assert r.counts()["decode_attention"] == 1 and not r.errors, r.render()
    assert _count(out, op) == 1 and _count(out, aten.bmm.default) == 0
    got, counts = compile_model(m, args, FusionConfig())
    assert counts["decode_attention"] == 1
    with torch.no_grad():
        assert rel_l2(got, m(*args)) < 1e-2


def _online_softmax(gm) -> torch.fx.GraphModule:
    """Inductor's post-grad ``prepare_softmax`` replacement, as it runs on CUDA (config.online_softmax): the max
    and the sum from one ``prepare_softmax_online``."""
    g = gm.graph
    for amax in [n for n in g.nodes if n.target is aten.amax.default]:
        x = amax.args[0]
        sub = next(u for u in amax.users if u.target is aten.sub.Tensor)
        exp = next(iter(sub.users))
        total = next(u for u in exp.users if u.target is aten.sum.dim_IntList)
        with g.inserting_before(amax):
            prep = g.call_function(decode_attention.ONLINE_SOFTMAX, (x, -1))
            prep.meta["val"] = decode_attention.ONLINE_SOFTMAX(x.meta["val"], -1)
            top, s = (g.call_function(__import__("operator").getitem, (prep, i)) for i in (0, 1))
            top.meta["val"], s.meta["val"] = prep.meta["val"]
        amax.replace_all_uses_with(top)
        total.replace_all_uses_with(s)
        g.erase_node(total)
        g.erase_node(amax)
    gm.recompile()
    return gm


def _pads_as(gm, spelling: str) -> torch.fx.GraphModule:
    """The captured ``cat([a, zeros], 1)`` row padding of the "padded" variant respelt as torch 2.11-2.13's
    ``pad_mm`` writes it on CUDA (seen in the H200's post-grad graphs): ``constant_pad_nd(a, [0, 0, 0, p, 0, 0])``
    ("nd"), or a padding the rewrite does not read: the K dim padded too ("k")."""
    g = gm.graph
    for cat in [n for n in g.nodes if n.target is aten.cat.default]:
        a, zeros = cat.args[0]
        p = zeros.meta["val"].shape[1]
        pad = [0, 0, 0, p, 0, 0] if spelling == "nd" else [0, 8, 0, p, 0, 0]
        with g.inserting_before(cat):
            nd = g.call_function(aten.constant_pad_nd.default, (a, pad))
            nd.meta["val"] = aten.constant_pad_nd.default(a.meta["val"], pad)
        cat.replace_all_uses_with(nd)
        g.erase_node(cat)
    if spelling == "k":  # the other operand padded along K as well, so the GEMM still multiplies
        for bmm in [n for n in g.nodes if n.target is aten.bmm.default]:
            b = bmm.args[1]
            with g.inserting_before(bmm):
                nd = g.call_function(aten.constant_pad_nd.default, (b, [0, 0, 0, 8, 0, 0]))
                nd.meta["val"] = aten.constant_pad_nd.default(b.meta["val"], [0, 0, 0, 8, 0, 0])
            bmm.replace_input_with(b, nd)
    g.eliminate_dead_code()
    gm.recompile()
    return gm


def test_the_constant_pad_spelling_of_padded_rows_is_taken():
    # pad_mm pads the 4 rows per kv head with constant_pad_nd where its compile-time benchmark says so: on the H200
    # the rewrite then fell out of a Llama-3.1-8B batch-64 step (1.028x against 1.177x), silently; the
    # force_shape_pad=True compile showed the form.
    m, args = _Attention("padded"), _inputs()
    (gm,) = capture(m, *args)
    gm = _pads_as(gm, "nd")
    assert _count(gm, aten.constant_pad_nd.default) == 2 and _count(gm, aten.cat.default) == 0
    r, out = run_pass(gm, ALONE)
    assert r.counts()["decode_attention"] == 1 and not r.errors, r.render()
    assert _count(out, UPTO) == 1 and _count(out, aten.bmm.default) == 0
    assert _count(out, aten.constant_pad_nd.default) == 0


def test_a_padding_it_does_not_read_is_reported():
    # K padded as well: not the rows-only padding the op's inputs can be read through. The GEMMs stay, and the
    # report says why (it was a silent skip for any unknown padding of the value GEMM).
    (gm,) = capture(_Attention("padded"), *_inputs())
    r, out = run_pass(_pads_as(gm, "k"), ALONE)
    assert "decode_attention" not in r.counts() and r.rejection_reasons() == {"attention_not_plain": 1}, r.render()
    assert _count(out, aten.bmm.default) == 2
    assert "form the rewrite does not read" in r.render()


def test_the_online_softmax_spelling_is_taken():
    m, args = _Attention(), _inputs()
    (gm,) = capture(m, *args)
    gm = _online_softmax(gm)
    assert _count(gm, decode_attention.ONLINE_SOFTMAX) == 1 and _count(gm, aten.amax.default) == 0
    r, out = run_pass(gm, ALONE)
    assert r.counts()["decode_attention"] == 1 and not r.errors, r.render()
    assert _count(out, UPTO) == 1 and _count(out, decode_attention.ONLINE_SOFTMAX) == 0


@pytest.mark.parametrize("variant, reason", [
    ("additive_mask", "attention_not_plain"),  # HF eager attention: an additive mask, not -inf by a bool mask
    ("bf16_softmax", "attention_not_plain"),  # the softmax in bf16: the op's numerics are fp32's
    ("scores_read", "attention_not_plain"),  # the scores are also an output
])  # fmt: skip
def test_guards_keep_the_gemms(variant, reason):
    (gm,) = capture(_Attention(variant), *_inputs())
    r, out = run_pass(gm, ALONE)
    assert "decode_attention" not in r.counts() and r.rejection_reasons() == {reason: 1}, r.render()
    assert _count(out, aten.bmm.default) == 2 and _count(out, FUSED) + _count(out, UPTO) == 0
    assert guards.REASONS[reason]


def test_many_rows_a_prefill_keeps_the_gemms():
    args = _inputs(r=decode_attention.MAX_ROWS + 1)
    (gm,) = capture(_Attention(), *args)
    r, _ = run_pass(gm, ALONE)
    assert r.rejection_reasons() == {"attention_rows_above_decode": 1}, r.render()


def test_deterministic_mode_keeps_it_off():
    (gm,) = capture(_Attention(), *_inputs())
    torch.use_deterministic_algorithms(True)
    try:
        r, _ = run_pass(gm, ALONE)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "decode_attention" not in r.counts()


def test_a_symbolic_batch_is_taken():
    args = _inputs(b=3)
    for t in args:
        torch._dynamo.mark_dynamic(t, 0)
    (gm,) = capture(_Attention(), *args)
    r, _ = run_pass(gm, ALONE)
    assert r.counts().get("decode_attention") == 1, r.render()


def test_symbolic_heads_keep_the_gemms():
    """``dynamic=True`` makes every size symbolic; the op's row and column tiles need the heads and head dim."""
    graphs = capture(_Attention(), *_inputs(b=3), dynamic=True, calls=[_inputs(b=2)])
    r, _ = run_pass(graphs[-1], ALONE)
    assert r.rejection_reasons() == {"kv_heads_dynamic": 1}, r.render()


@pytest.mark.parametrize("bound", [{"min": 2, "max": 4}, {}], ids=["max4", "unbounded"])
def test_a_token_count_marked_dynamic_is_taken_where_bounded(bound):
    """An engine verifying 2-4 draft tokens a step marks the token dim dynamic: G x s query rows per kv head. With
    ``max=`` they stay within the kernel's tile, and one compile takes 2 and then 3 tokens, each against eager with
    the caches written alike; without a bound the report says why (``attention_rows_dynamic``)."""
    model = build_model("llama-tiny", form="engine", layers=LAYERS)  # G = 2: at most 8 rows with max=4
    torch._dynamo.reset()
    report_mod.clear_reports()
    opts = {"post_grad_custom_post_pass": FP8FusionPass(FusionConfig()), "fx_graph_cache": False}
    compiled = torch.compile(model, options=opts)
    for n in (2, 3):
        ids = torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(n))
        positions = torch.tensor([[4], [9]]) + torch.arange(n)
        for t in (ids, positions):
            torch._dynamo.mark_dynamic(t, 1, **bound)
        caches = [model.new_kv_cache(2, 16) for _ in range(2)]
        for cache in caches:
            for i, t in enumerate(cache.k + cache.v):
                t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
        with torch.no_grad():
            got, want = logits(compiled(ids, positions, caches[0])), logits(model(ids, positions, caches[1]))
        assert rel_l2(got, want) <= tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR, n
        for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
            assert rel_l2(a, b) <= tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR, n
    reports = report_mod.all_reports()
    assert len(reports) == 1, [r.render() for r in reports]  # one compile for both token counts
    if bound:
        assert reports[0].counts().get("decode_attention") == LAYERS, reports[0].render()
    else:
        assert "decode_attention" not in reports[0].counts()
        assert reports[0].rejection_reasons()["attention_rows_dynamic"] == LAYERS, reports[0].render()
    torch._dynamo.reset()


def test_not_a_softmax_is_no_candidate():
    class TwoGemms(torch.nn.Module):
        def forward(self, a, b, c):
            return torch.matmul(torch.matmul(a, b).relu(), c)

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 4, 8, generator=g).to(BF16), torch.randn(2, 8, 8, generator=g).to(BF16),
            torch.randn(2, 8, 8, generator=g).to(BF16)]  # fmt: skip
    (gm,) = capture(TwoGemms(), *args)
    r, _ = run_pass(gm, ALONE)
    assert "decode_attention" not in r.counts() and not r.rejection_reasons(), r.render()



def test_a_candidate_that_cannot_be_read_is_reported(monkeypatch):
    # past the softmax a site is a candidate: whatever stops the match is a rejection with its reason, not silence
    def unreadable(*_):
        raise AttributeError("'NoneType' object has no attribute 'dim'")

    monkeypatch.setattr(decode_attention, "_scaled", unreadable)
    (gm,) = capture(_Attention(), *_inputs())
    r, out = run_pass(gm, ALONE)
    assert r.rejection_reasons() == {"attention_not_plain": 1}, r.render()
    assert "could not be read (AttributeError" in r.render() and _count(out, aten.bmm.default) == 2


class _AttentionThenQuant(torch.nn.Module):
    """The engine's decode attention, its output laid out as the o_proj reads it, and the o_proj's input quant."""

    def __init__(self, tokens=1):
        super().__init__()
        self.tokens = tokens

    def forward(self, q, k_cache, v_cache, positions):
        o = _Attention()(q, k_cache, v_cache, positions)  # [B, Hkv, G x S, D]
        b, hkv, rows, d = o.shape
        s = self.tokens
        x = o.reshape(b, hkv * rows // s, s, d).transpose(1, 2)  # [B, S, H, D], as the engine's o_proj input
        return torch.ops.fp8_fusion.group_quant(x, 128)


def _compiled(module, args):
    torch._dynamo.reset()
    opts = {"post_grad_custom_post_pass": FP8FusionPass(ALONE), "fx_graph_cache": False}
    with torch.no_grad():
        out = torch.compile(module, options=opts)(*args)
    torch._dynamo.reset()
    return out


def test_the_o_proj_quant_joins_the_launch_bit_for_bit(monkeypatch):
    args = _inputs(d=128)
    (gm,) = capture(_AttentionThenQuant(), *args)
    r, out = run_pass(gm, ALONE)
    assert _count(out, decode_attention.FUSED_UPTO_QUANT) == 1 and _count(out, UPTO) == 0, r.render()
    assert _count(out, torch.ops.fp8_fusion.group_quant.default) == 0
    assert "quant of its output" in next(d.detail for d in r.applied if d.pattern == "decode_attention")
    got_q, got_s = _compiled(_AttentionThenQuant(), args)
    monkeypatch.setattr(decode_attention, "_fold_quant", lambda *_: False)
    want_q, want_s = _compiled(_AttentionThenQuant(), args)  # the op, then group_quant
    assert got_q.shape == want_q.shape == (3, 1, 8, 128) and got_s.shape == want_s.shape == (3, 1, 8, 1)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got_s, want_s)


def test_the_quant_stays_when_the_layout_reorders_the_rows():
    # two tokens: o_proj reads (token, head) order, the op writes (head, token): the quant cannot be the op's
    (gm,) = capture(_AttentionThenQuant(tokens=2), *_inputs(r=8, d=128))
    r, out = run_pass(gm, ALONE)
    assert _count(out, UPTO) == 1 and _count(out, decode_attention.FUSED_UPTO_QUANT) == 0, r.render()


def test_the_quant_stays_when_the_output_is_read_elsewhere():
    class AlsoRead(_AttentionThenQuant):
        def forward(self, q, k_cache, v_cache, positions):
            o = _Attention()(q, k_cache, v_cache, positions)
            x = o.reshape(o.shape[0], 1, -1)
            return torch.ops.fp8_fusion.group_quant(x, 128), o.sum()

    (gm,) = capture(AlsoRead(), *_inputs(d=128))
    r, out = run_pass(gm, ALONE)
    assert _count(out, UPTO) == 1 and _count(out, decode_attention.FUSED_UPTO_QUANT) == 0, r.render()


def test_a_quant_fold_that_raises_keeps_the_attention_rewrite(monkeypatch):
    def broken(*_):
        raise RuntimeError("no")

    monkeypatch.setattr(decode_attention, "_in_order", broken)
    (gm,) = capture(_AttentionThenQuant(), *_inputs(d=128))
    r, out = run_pass(gm, ALONE)
    assert r.counts()["decode_attention"] == 1 and not r.errors, r.render()
    assert "folding it raised RuntimeError" in next(d.detail for d in r.applied if d.pattern == "decode_attention")
    assert _count(out, UPTO) == 1 and _count(out, torch.ops.fp8_fusion.group_quant.default) == 1
