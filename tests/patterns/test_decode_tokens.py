"""decode_attention at several tokens per step (verifying draft tokens): ``decode_attention_tokens_quant``.

On the CPU (the op's reference runs there): whole engine steps of 4 tokens compiled with the token form and with
the masked form it replaces (``_decode_tokens.MAX_TOKENS = 1``), bit for bit; the graph without the q / output
copies, the mask and the o_proj's quant launch; and the hand-written steps that must keep the masked form.
"""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, capture, count, run_pass
from test_rope_cache import LAYERS, _compiled_step

from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.models import build_model
from fp8_fusion_pass.patterns import _decode_tokens

aten = torch.ops.aten
ops = torch.ops.fp8_fusion
TOKENS = ops.decode_attention_tokens_quant.default
PLAIN = ops.decode_attention_tokens.default
MASKED = ops.decode_attention.default
ALONE = dataclasses.replace(FUSIONS_ONLY, decode_attention=True)
NO_ROPE = FusionConfig(rope_attention=False)  # the token form as it is (rope_attention takes it into the RoPE's launch)


def _engine_tokens(preset, tokens=4, scheme="block"):
    """An engine step of ``tokens`` new tokens per row at positions 5.., 11.., 2.. of a 16-slot cache."""
    m = build_model(preset, form="engine", scheme=scheme, layers=LAYERS)
    ids = torch.randint(0, 100, (3, tokens), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[5], [11], [2]]) + torch.arange(tokens)

    def new_cache():
        cache = m.new_kv_cache(3, 16)
        for i, t in enumerate(cache.k + cache.v):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
        return cache, cache.k + cache.v

    return m, ids, positions, new_cache


@pytest.mark.parametrize("preset, scheme, op", [
    ("qwen3-tiny", "block", "decode_attention_tokens_quant"),
    ("llama-tiny", "block", "decode_attention_tokens.default"),  # heads of 64: the quant stays apart
    ("qwen3-tiny", "per-tensor", "decode_attention_tokens.default"),  # the o_proj's quant is per tensor
])  # fmt: skip
def test_a_step_of_several_tokens_is_the_masked_form_bit_for_bit(monkeypatch, preset, scheme, op):
    model, ids, positions, new_cache = _engine_tokens(preset, scheme=scheme)
    step = lambda f, cache: f(ids, positions, cache)  # noqa: E731
    with_it = _compiled_step(model, step, new_cache, NO_ROPE)
    monkeypatch.setattr(_decode_tokens, "MAX_TOKENS", 1)
    masked = _compiled_step(model, step, new_cache, NO_ROPE)
    assert with_it[2]["decode_attention"] == masked[2]["decode_attention"] == LAYERS, with_it[2]
    assert f"fp8_fusion.{op}" in with_it[3]
    assert "fp8_fusion.decode_attention_tokens" not in masked[3]
    assert "fp8_fusion.decode_attention.default(" in masked[3]
    assert torch.equal(with_it[0], masked[0])  # same attention, same quant, no copy in between
    assert all(torch.equal(a, b) for a, b in zip(with_it[1], masked[1]))


def test_the_copies_the_mask_and_the_quant_launch_go():
    model, ids, positions, new_cache = _engine_tokens("qwen3-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    r, out = run_pass(gm, NO_ROPE)
    fused = [n for n in out.graph.nodes if n.target is TOKENS]
    assert len(fused) == LAYERS and count(out, MASKED) == 0, r.render()
    assert "4 tokens per kv head" in next(d.detail for d in r.applied if d.pattern == "decode_attention")
    # every layer reads the positions as [B, S] and the RoPE op's q as it is: no mask kernel, no copy of q or o
    copies = [n for n in out.graph.nodes if n.target is aten.clone.default and n.meta["val"].dtype == torch.bfloat16]
    assert count(out, aten.le.Tensor) == 0 and not copies  # (the one clone left is the RoPE table's angles, fp32)
    assert all(list(n.args[3].meta["val"].shape) == [3, 4] for n in fused)
    assert all(n.args[0].target is operator.getitem for n in fused)
    # the o_proj's input quant is the op's: the only group quants left are none (the norms and SiLU fused theirs)
    assert count(out, ops.group_quant.default) == 0


def test_heads_narrower_than_a_quant_group_keep_the_quant_apart():
    # llama-tiny's heads are 64 wide: a 128-wide quant group spans two heads, which no attention row holds; the
    # token form without the quant still reads q and writes the output in their layouts, the quant its own launch
    model, ids, positions, new_cache = _engine_tokens("llama-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda i, p: model(i, p, cache), ids, positions)
    r, out = run_pass(gm, NO_ROPE)
    assert count(out, PLAIN) == LAYERS and count(out, TOKENS) == count(out, MASKED) == 0, r.render()
    assert count(out, aten.le.Tensor) == 0  # no mask
    details = [d.detail for d in r.applied if d.pattern == "decode_attention"]
    assert all(d.endswith("in q's dtype (its quant stays a launch: heads of 64 do not hold whole 128-wide quant "
                          "groups): one launch") for d in details), details  # fmt: skip


class _Step(torch.nn.Module):
    """The engine's attention of S tokens (q as the RoPE leaves it, a position per token), its output laid out for
    the o_proj and the o_proj's input quant; ``variant`` breaks one condition of the token form."""

    def __init__(self, variant=""):
        super().__init__()
        self.variant = variant

    def forward(self, q, k_cache, v_cache, positions):  # q [B, Hq, S, D], caches [B, Hkv, T, D], positions [B, S]
        b, hq, s, d = q.shape
        hkv, t = k_cache.shape[1], k_cache.shape[2]
        g = hq // hkv
        visible = torch.arange(t) <= positions.unsqueeze(-1)  # [B, S, T]
        if self.variant == "one_position":  # one position per row for every token: decode_attention_upto's mask
            visible = (torch.arange(t) <= positions[:, -1:, None]).expand(b, s, t)
        if self.variant == "window":
            visible = visible & (torch.arange(t) > positions.unsqueeze(-1) - 4)
        if self.variant == "token_major":  # rows (token, head), q and mask alike: a right model, not the op's order
            mask = visible.unsqueeze(2).expand(b, s, g, t).reshape(b, 1, s * g, t)
            qg = q.transpose(1, 2).reshape(b, s, hkv, g, d).transpose(1, 2).reshape(b, hkv, s * g, d)
        else:
            mask = visible.unsqueeze(1).expand(b, g, s, t).reshape(b, 1, g * s, t)
            qg = q.reshape(b, hkv, g * s, d)
        scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * 0.125
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
        o = torch.matmul(p, v_cache)
        if self.variant == "token_major":
            o = o.reshape(b, hkv, s, g, d).transpose(1, 2).reshape(b, s, hq * d)
        else:
            o = o.reshape(b, hq, s, d).transpose(1, 2).reshape(b, s, hq * d)
        if self.variant == "no_quant":  # a bf16 o_proj: nothing to quantize in the launch
            return o * 2
        if self.variant == "also_read":
            return ops.group_quant(o, 128), o.sum()
        return ops.group_quant(o, 128)


def _step_inputs(b=3, hkv=2, g=2, s=3, t=40, d=128):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, s, hkv * g, d, generator=gen).to(torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(b, hkv, t, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    return q, k, v, torch.tensor([[5], [30], [17]]) + torch.arange(s)


def test_a_hand_written_step_is_taken():
    (gm,) = capture(_Step(), *_step_inputs())
    r, out = run_pass(gm, ALONE)
    assert count(out, TOKENS) == 1 and count(out, ops.group_quant.default) == 0, r.render()
    assert count(out, aten.bmm.default) == 0 and count(out, aten.clone.default) == 0


@pytest.mark.parametrize("variant, why", [
    # not a position per token laid out (head, token): nothing to say of the token form
    ("window", None), ("one_position", None), ("token_major", None),
])  # fmt: skip
def test_the_masked_form_stays_where_the_step_is_not_the_token_form(variant, why):
    # token_major at G = S = 2: the shapes alone cannot tell (token, head) rows from (head, token) ones
    (gm,) = capture(_Step(variant), *_step_inputs(s=2 if variant == "token_major" else 3))
    r, out = run_pass(gm, ALONE)
    assert r.counts()["decode_attention"] == 1 and not r.errors, r.render()
    assert count(out, TOKENS) == 0 and count(out, aten.bmm.default) == 0, r.render()
    (detail,) = [d.detail for d in r.applied if d.pattern == "decode_attention"]
    if why is None:
        assert "a position per token" not in detail, detail
    else:
        assert f"(a position per token, but the masked form: {why}" in detail, detail


@pytest.mark.parametrize("variant", ["no_quant", "also_read"])
def test_without_a_quant_to_fold_the_output_is_written_in_the_o_projs_layout(variant):
    # a bf16 o_proj (no quant after the output), or the output read by more than its quant: decode_attention_tokens
    # in place of the copies and the mask, the output's readers reading it reshaped (values: the kernel test, and
    # llama-tiny's whole steps above, bit for bit the masked form)
    (gm,) = capture(_Step(variant), *_step_inputs())
    r, out = run_pass(gm, ALONE)
    assert count(out, PLAIN) == 1 and count(out, TOKENS) == count(out, MASKED) == 0, r.render()
    assert count(out, aten.bmm.default) == 0 and count(out, aten.clone.default) == 0, r.render()
    assert count(out, ops.group_quant.default) == (variant == "also_read")
    (detail,) = [d.detail for d in r.applied if d.pattern == "decode_attention"]
    assert "the output written in the o_proj's, in q's dtype: one launch" in detail, detail


@pytest.mark.parametrize("variant", ["", "no_quant", "window"])
def test_the_token_form_has_its_own_rows_bound(monkeypatch, variant):
    # above decode_attention.MAX_ROWS (scaled down here: 6 rows, 2 heads x 3 tokens, over a bound of 4) the token form
    # is taken up to _decode_tokens.MAX_ROWS; a step the token form declines, or past its bound, keeps the GEMMs
    from fp8_fusion_pass.patterns import decode_attention

    monkeypatch.setattr(decode_attention, "MAX_ROWS", 4)
    monkeypatch.setattr(_decode_tokens, "MAX_ROWS", 8)
    (gm,) = capture(_Step(variant), *_step_inputs())
    r, out = run_pass(gm, ALONE)
    if variant != "window":
        assert count(out, TOKENS) + count(out, PLAIN) == 1 and count(out, aten.bmm.default) == 0, r.render()
        monkeypatch.setattr(_decode_tokens, "MAX_ROWS", 4)
        (gm,) = capture(_Step(variant), *_step_inputs())
        r, out = run_pass(gm, ALONE)
    assert count(out, TOKENS) + count(out, PLAIN) == 0 and count(out, aten.bmm.default) == 2, r.render()
    assert r.rejection_reasons().get("attention_rows_above_decode") == 1, r.render()
    assert "6 query rows per kv head, above 4" in r.render()


@pytest.mark.parametrize("g, tokens, taken", [(4, 8, True), (8, 8, True), (8, 9, False)])
def test_the_committed_bounds_take_64_rows_per_kv_head(g, tokens, taken):
    # as committed: a step of 8 tokens at the 8B models' 4 query heads per kv head (32 rows, above the masked form's
    # 16) or at Qwen3-32B's 8 (64 rows, the kernel's most) is the token form's (timed faster than Inductor's
    # attention there, _decode_tokens.MAX_ROWS); 9 tokens at 8 heads (72 rows) keep the GEMMs
    (gm,) = capture(_Step(), *_step_inputs(g=g, s=tokens))
    r, out = run_pass(gm, ALONE)
    assert count(out, TOKENS) == int(taken) and count(out, aten.bmm.default) == 2 * (not taken), r.render()
    if not taken:
        assert f"{g * tokens} query rows per kv head" in r.render()
