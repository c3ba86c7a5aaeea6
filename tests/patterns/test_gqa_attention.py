"""gqa_attention: transformers' ``repeat_kv`` copies of the KV cache before SDPA go; at one query token per head,
SDPA reads the cache itself with a kv head's query heads as its query rows.

On the CPU: whole HF decode steps with a ``StaticCache`` (Qwen3, Llama) compiled with and without the rewrite, and a
hand-written attention (``_Attention``) whose variants each break one guard, checked against eager.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, exact_sdpa, rel_l2, run_pass
from test_rope_cache import LAYERS, _compiled_step, _hf_step

import fp8_fusion_pass
from fp8_fusion_pass import guards
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.patterns import gqa_attention

aten = torch.ops.aten
ALONE = dataclasses.replace(FUSIONS_ONLY, gqa_attention=True)
BF16 = torch.bfloat16
BATCH = 8  # 8 rows x the tiny presets' 4 query heads = guards.GQA_MIN_BATCH_HEADS: the smallest batch taken


def _kv_copies(gm) -> int:
    """repeat_kv's expands of a cache to [B, Hkv, G, L, D] left in the graph."""
    return sum(1 for n in gm.graph.nodes if n.target is aten.expand.default and n.meta["val"].dim() == 5)


@pytest.mark.parametrize("preset, tokens", [("qwen3-tiny", 1), ("llama-tiny", 1), ("qwen3-tiny", 4)])
def test_hf_decode_step_reads_the_cache_without_a_copy(preset, tokens):
    # tokens 4: a step verifying 3 draft tokens, each query row with its own mask row
    model, step, new_cache = _hf_step(preset, BATCH, tokens)
    with_it = _compiled_step(model, step, new_cache, FusionConfig())
    without = _compiled_step(model, step, new_cache, FusionConfig(gqa_attention=False))
    assert with_it[2]["gqa_attention"] == LAYERS and "gqa_attention" not in without[2], with_it[2]
    # the same math per query row; the kernel may block the rows differently, so close, not promised equal
    assert rel_l2(with_it[0], without[0]) < 1e-3
    assert all(torch.equal(a, b) for a, b in zip(with_it[1], without[1]))  # the cache writes are untouched
    # and the graph lost both copies per layer (captured before the pass, then rewritten)
    cache, _ = new_cache()
    (gm,) = capture(lambda ids, pos: model(input_ids=ids, past_key_values=cache, cache_position=pos,
                                           use_cache=True).logits,
                    torch.zeros(BATCH, tokens, dtype=torch.long), torch.arange(6, 6 + tokens))  # fmt: skip
    assert _kv_copies(gm) == 2 * LAYERS
    r, out = run_pass(gm, ALONE)
    assert r.counts()["gqa_attention"] == LAYERS and _kv_copies(out) == 0 and not r.errors, r.render()


class _Attention(torch.nn.Module):
    """transformers' sdpa_attention_forward with repeat_kv; ``variant`` breaks one guard (or changes the mask)."""

    def __init__(self, variant="", groups=2):
        super().__init__()
        self.variant, self.groups = variant, groups

    @staticmethod
    def repeat_kv(x, g):  # transformers.models.llama.modeling_llama.repeat_kv
        b, h, length, d = x.shape
        return x[:, :, None, :, :].expand(b, h, g, length, d).reshape(b, h * g, length, d)

    def forward(self, q, k_cache, v_cache, mask):
        k = self.repeat_kv(k_cache, self.groups)
        v = v_cache if self.variant == "v_not_copied" else self.repeat_kv(v_cache, self.groups)
        kwargs = {"attn_mask": None if self.variant in ("causal", "no_mask") else mask,
                  "is_causal": self.variant == "causal"}
        out = F.scaled_dot_product_attention(q, k, v, scale=0.125, **kwargs)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) + (k.sum() if self.variant == "k_read_too"
                                                                           else 0)  # fmt: skip


def _inputs(variant="", b=BATCH, s=1, hkv=2, g=2, length=16, d=64, mask_rows=None):
    """q, k / v caches and an additive mask [B, 1 | Hq, S (or mask_rows), L] of random holes."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, hkv * g, s, d, generator=gen).to(BF16)
    k, v = (torch.randn(b, hkv, length, d, generator=gen).to(BF16) for _ in range(2))
    if variant == "v_not_copied":
        v = torch.randn(b, hkv * g, length, d, generator=gen).to(BF16)
    heads = hkv * g if variant == "per_head_mask" else 1
    visible = torch.rand(b, heads, s if mask_rows is None else mask_rows, length, generator=gen) < 0.7
    visible[..., 0] = True  # every row sees a key
    mask = torch.zeros(visible.shape, dtype=BF16).masked_fill(~visible, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("variant, sizes", [
    ("", {}), ("per_head_mask", {}), ("no_mask", {}),
    ("", {"s": 4}), ("per_head_mask", {"s": 3}),  # a step verifying draft tokens: a mask row per token
    ("", {"s": 4, "mask_rows": 1}),  # one mask row for every token (broadcast)
    ("", {"b": 2, "s": 2}),  # 2 x 4 heads, too few at one token (kv_copy_faster): with more, measured faster
    ("", {"b": 2, "g": 8}),  # 2 rows x 16 query heads = 32 copied heads (GQA_MIN_BATCH_HEADS)
    ("", {"s": guards.GQA_MAX_QUERY_TOKENS, "length": 32}),  # the most tokens taken
])  # fmt: skip
def test_a_hand_written_decode_attention_is_taken_and_matches_eager(variant, sizes):
    inputs, g = _inputs(variant, **sizes), sizes.get("g", 2)
    (gm,) = capture(_Attention(variant, g), *inputs)
    r, out = run_pass(gm, ALONE)
    assert r.counts()["gqa_attention"] == 1 and _kv_copies(out) == 0 and not r.errors, r.render()
    with torch.no_grad():
        want = _Attention(variant, g)(*inputs)
    got, counts = compile_model(_Attention(variant, g), inputs, ALONE)
    kept, counts_off = compile_model(_Attention(variant, g), inputs, FUSIONS_ONLY)
    assert counts["gqa_attention"] == 1 and "gqa_attention" not in counts_off
    # the same math per query row: as close to eager as the compile that keeps the copy (a head given another
    # head's mask or keys is ~0.4 off)
    assert rel_l2(got, want) <= rel_l2(kept, want) + 2e-3, (rel_l2(got, want), rel_l2(kept, want))


@pytest.mark.parametrize("variant, inputs, reason, why", [
    # prefill: the mask copy per group would outgrow the KV copy; the attention is compute-bound
    ("", {"s": guards.GQA_MAX_QUERY_TOKENS + 1, "length": 32}, "query_too_long", "at most"),
    ("causal", {}, "attention_not_plain", "is_causal=True"),  # a causal query 0 sees key 0 only; row g would see g
    ("k_read_too", {}, "kv_copy_shared", "also feeds"),  # the copy stays for its other reader: nothing saved
    ("v_not_copied", {}, "kv_copy_shared", "not both"),
    ("", {"b": 2}, "kv_copy_faster", "= 8 copied heads"),  # 2 x 2 pairs: too few programs for the grouped SDPA
    ("", {"b": 2, "g": 4}, "kv_copy_faster", "= 16 copied heads"),  # a larger copy, still under 32
    ("", {"b": 1, "g": 8}, "kv_copy_faster", "2 programs"),  # G = 8 at 2 pairs: 0.79x measured (H100)
    ("", {"length": 1}, "single_key", "one key per head"),  # a first token without a cache (failed on the H200)
])  # fmt: skip
def test_guards_keep_the_copy(variant, inputs, reason, why):
    (gm,) = capture(_Attention(variant, inputs.get("g", 2)), *_inputs(variant, **inputs))
    r, out = run_pass(gm, ALONE)
    assert "gqa_attention" not in r.counts() and r.rejection_reasons() == {reason: 1}, r.render()
    assert why in next(d.detail for d in r.rejected if d.pattern == "gqa_attention"), r.render()
    assert _kv_copies(out) == _kv_copies(gm) and not r.errors


def _no_symint_arguments(gm) -> bool:
    """No SymInt object in any node's arguments: Inductor lowers sizes from nodes (``sym_size``) or ints."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return not [n for n in gm.graph.nodes if any(isinstance(a, sym) for a in (*n.args, *n.kwargs.values()))]


def _one_compile_matches_eager(module, calls) -> None:
    """``module`` compiled with the rewrite alone, called on each input tuple of ``calls``: every output as eager's,
    and one graph (one report, the rewrite applied) for them all."""
    torch._dynamo.reset()
    report_mod.clear_reports()
    compiled = torch.compile(module, options={"post_grad_custom_post_pass": FP8FusionPass(ALONE),
                                              "fx_graph_cache": False})  # fmt: skip
    with torch.no_grad():
        for i, args in enumerate(calls):
            got, want = compiled(*args), module(*args)
            assert rel_l2(got, want) < 1e-2, (i, rel_l2(got, want))
    reports = report_mod.all_reports()
    assert len(reports) == 1 and reports[0].counts()["gqa_attention"] == 1, [x.render() for x in reports]
    torch._dynamo.reset()


def _marked_tokens(s, most=None, b=BATCH):
    """Inputs of ``s`` query tokens with the token dim of q and the mask marked dynamic (``max=most``)."""
    q, k, v, mask = _inputs(b=b, s=s)
    bound = {} if most is None else {"min": 2, "max": most}
    for t in (q, mask):
        torch._dynamo.mark_dynamic(t, 2, **bound)
    return q, k, v, mask


def test_an_unbounded_symbolic_token_count_keeps_the_copy():
    # nothing bounds the rows (a prefill of any length would take the grouped path): the copy stays, and the
    # report says how to bound them
    (gm,) = capture(_Attention(), *_marked_tokens(4))
    r, out = run_pass(gm, ALONE)
    assert r.rejection_reasons() == {"query_too_long": 1}, r.render()
    assert f"max={guards.GQA_MAX_QUERY_TOKENS}" in r.rejected[0].detail, r.render()
    assert _kv_copies(out) == 2


def test_a_token_count_marked_within_the_bound_is_taken():
    # a step verifying 1-7 draft tokens, the token dim marked with max=8: the rows G x S read by a node, one
    # compile for every count, at a batch whose pairs would be too few at one token (2 x 2)
    module = _Attention()
    (gm,) = capture(module, *_marked_tokens(4, 8, b=2))
    r, out = run_pass(gm, ALONE)
    assert r.counts()["gqa_attention"] == 1 and _kv_copies(out) == 0 and not r.errors, r.render()
    assert _no_symint_arguments(out)
    _one_compile_matches_eager(module, [_marked_tokens(s, 8, b=2) for s in (4, 2, 7)])


def test_dropout_keeps_the_copy():
    # SDPA with dropout decomposes to math ops on the CPU: set it on the captured kernel op instead
    (gm,) = capture(_Attention(), *_inputs())
    (sdpa,) = [n for n in gm.graph.nodes if n.target in gqa_attention.SDPA_OPS]
    sdpa.update_kwarg("dropout_p", 0.5)
    r, _ = run_pass(gm, ALONE)
    assert r.rejection_reasons() == {"attention_not_plain": 1} and "dropout_p=0.5" in r.rejected[0].detail, r.render()


def test_a_symbolic_batch_is_taken():
    # a second batch size recompiles with B alone symbolic (automatic dynamic): the reshapes leave B to -1, and the
    # min-pairs guard cannot apply
    module = _Attention()
    gm = capture(module, *_inputs(b=8), dynamic=None, calls=[_inputs(b=5)])[-1]
    sizes = [n.meta["val"].shape for n in gm.graph.nodes if n.op == "placeholder" and isinstance(
        n.meta["val"], torch.Tensor)]  # fmt: skip
    assert all(isinstance(sh[0], torch.SymInt) and all(isinstance(x, int) for x in sh[1:]) for sh in sizes), sizes
    r, _ = run_pass(gm, ALONE)
    assert r.counts()["gqa_attention"] == 1 and not r.errors, r.render()
    # and the dynamic-batch graph computes the attention at batch sizes it was not traced at
    torch._dynamo.reset()
    compiled = torch.compile(module, options={"post_grad_custom_post_pass": FP8FusionPass(ALONE),
                                              "fx_graph_cache": False})  # fmt: skip
    with torch.no_grad():
        for b in (8, 5, 3):
            got, want = compiled(*_inputs(b=b)), module(*_inputs(b=b))
            assert rel_l2(got, want) < 1e-2, (b, rel_l2(got, want))
    assert report_mod.last_report().counts()["gqa_attention"] == 1
    torch._dynamo.reset()


def test_a_symbolic_cache_length_is_taken():
    # what fuse(model, dynamic=True) gives an HF StaticCache: batch and cache length symbolic, heads fixed; the
    # grouped mask's reshape reads the length from the mask by a node (a SymInt object cannot be a node argument)
    module = _Attention()

    def marked(b, length):
        q, k, v, mask = _inputs(b=b, length=length)
        for t, dims in ((q, (0,)), (k, (0, 2)), (v, (0, 2)), (mask, (0, 3))):
            for dim in dims:
                torch._dynamo.mark_dynamic(t, dim)
        return q, k, v, mask

    (gm,) = capture(module, *marked(8, 16))
    r, out = run_pass(gm, ALONE)
    assert r.counts()["gqa_attention"] == 1 and _kv_copies(out) == 0 and not r.errors, r.render()
    assert any(n.target is torch.ops.aten.sym_size.int for n in out.graph.nodes)
    assert _no_symint_arguments(out)
    # compiled (Inductor lowers the rewritten graph), one graph for other batches and cache lengths
    _one_compile_matches_eager(module, [marked(8, 16), marked(5, 11)])


def test_symbolic_heads_are_reported():
    (gm,) = capture(_Attention(), *_inputs(), dynamic=True)  # every size symbolic
    r, out = run_pass(gm, ALONE)
    assert r.rejection_reasons() == {"kv_heads_dynamic": 1} and _kv_copies(out) == 2, r.render()


def test_exact_sdpa_is_fp32_attention_and_reaches_an_hf_model():
    # the reference the GPU test at 8 query heads per kv head holds both compiles to: SDPA in fp32 (torch's own on
    # fp32 inputs, additive or boolean mask, grouped or not), and transformers' attention calls it
    q, k, v, mask = (t.float() for t in _inputs(g=4))
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask,
                                          scale=0.125)  # fmt: skip
    with exact_sdpa():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
        got_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=mask == 0, scale=0.125, enable_gqa=True)
        got_min = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.clamp(min=torch.finfo(mask.dtype).min),
                                                 scale=0.125, enable_gqa=True)  # fmt: skip
        with pytest.raises(NotImplementedError):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        with pytest.raises(NotImplementedError, match="not a bias"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask + 0.5, enable_gqa=True)
    assert all(torch.allclose(x, want, atol=1e-5) for x in (got, got_bool, got_min))
    model, step, new_cache = _hf_step("qwen3-tiny", 2)
    with torch.no_grad():
        plain = step(model, new_cache()[0]).logits
        with exact_sdpa():
            exact = step(model, new_cache()[0]).logits
    assert not torch.equal(exact, plain) and rel_l2(exact, plain) < 0.05  # reached, and the same attention


def test_the_heads_guard_reads_batch_times_query_heads():
    # batch, kv heads, G: 32 copied heads and up are taken, at any split between them (H100, gqa_tokens.py)
    assert guards.should_read_cache_grouped(1, 8, 4).ok and guards.should_read_cache_grouped(1, 4, 8).ok
    assert guards.should_read_cache_grouped(4, 2, 4).ok and guards.should_read_cache_grouped(2, 8, 4).ok
    assert not guards.should_read_cache_grouped(1, 4, 4).ok and not guards.should_read_cache_grouped(1, 2, 8).ok
    assert not guards.should_read_cache_grouped(1, 1, 8).ok and not guards.should_read_cache_grouped(1, 7, 4).ok
    assert guards.should_read_cache_grouped(torch.SymInt, 1, 4).ok  # not an int: symbolic, taken
    assert guards.should_read_cache_grouped(1, 1, 4, tokens=2).ok  # several tokens: measured faster at any batch
    assert guards.should_read_cache_grouped(1, 1, 4, tokens=None).ok  # a marked count: 2 or more


class _NoCopy(torch.nn.Module):
    def forward(self, q, k, v, mask):  # MHA, or a caller that passed enable_gqa: SDPA on the cache already
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_an_attention_without_a_copy_is_no_candidate():
    (gm,) = capture(_NoCopy(), *_inputs(g=1))
    r, _ = run_pass(gm, ALONE)
    assert r.render().count("gqa_attention") == 0 and not r.errors, r.render()


def test_every_sdpa_kernel_op_is_read_by_its_own_argument_names():
    # a renamed argument in a future torch would make the rewrite drop the mask: fail here instead
    for op, mask in gqa_attention.SDPA_OPS.items():
        names = [a.name for a in op._schema.arguments]
        assert names[:3] == ["query", "key", "value"] and "is_causal" in names and "dropout_p" in names, op
        assert mask is None or mask in names, op


def test_the_token_bound_benchmark_checks_both_forms_agree(capsys):
    # benchmarks/gqa_tokens.py times the KV copy against the grouped SDPA by tokens (GQA_MAX_QUERY_TOKENS's
    # measurement); its --dry-run (CPU) runs both forms and exits 1 if their outputs differ
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import gqa_tokens

    argv = ["--dry-run", "--batches", "1,2", "--tokens", "1,3", "--groups", "4", "--kv-heads", "1,2"]
    assert gqa_tokens.main(argv) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 1 | 4 |", "| 2 | 4 |"))]
    assert len(table) == 8, table  # (kv heads, G, batch, tokens) = (1 | 2, 4, 1 | 2, 1 | 3)
    q, k, v, mask = gqa_tokens.inputs(2, 2, 4, 3, 8, 16, "cpu", 0)
    assert rel_l2(gqa_tokens.grouped_form(q, k, v, mask), gqa_tokens.copy_form(q, k, v, mask)) < 1e-2
    assert rel_l2(gqa_tokens.copy_form(q, k, v, mask), gqa_tokens.exact(q, k, v, mask)) < 1e-2  # bf16 vs fp32
    # a grouped form that gave every token the first token's mask row would differ: the check can fail
    wrong = gqa_tokens.grouped_form(q, k, v, mask[:, :, :1].expand_as(mask))
    assert rel_l2(wrong, gqa_tokens.copy_form(q, k, v, mask)) > 0.05


def test_an_hf_step_with_its_token_count_marked_is_one_graph_for_every_count():
    # an HF loop verifying 2-7 draft tokens with the ids' token dim and cache_position marked (max=8): each layer's
    # attention grouped at a symbolic S, one compile for 4, 3 and 6 tokens, the logits as eager's
    from fp8_fusion_pass.models import build_model
    from fp8_fusion_pass.models.decode_inputs import static_cache

    model = build_model("qwen3-tiny", form="hf", layers=LAYERS)
    cache, tensors = static_cache(model, 2, 24)
    saved = [t.normal_().clone() for t in tensors]

    def step(fn, s, mark):
        for t, x in zip(tensors, saved):
            t.copy_(x)
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length"):  # transformers 5.x counts the tokens written
                layer.cumulative_length.fill_(10)
        ids = torch.randint(0, 100, (2, s), generator=torch.Generator().manual_seed(s))
        position = torch.arange(10, 10 + s)
        if mark:
            torch._dynamo.mark_dynamic(ids, 1, min=2, max=8)
            torch._dynamo.mark_dynamic(position, 0, min=2, max=8)
        with torch.no_grad():
            return fn(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits.float()

    torch._dynamo.reset()
    report_mod.clear_reports()
    compiled = torch.compile(model, backend=fp8_fusion_pass.backend(fx_graph_cache=False))
    for s in (4, 3, 6):
        assert rel_l2(step(compiled, s, True), step(model, s, False)) < 0.02, s  # measured 0.0038-0.0039
    reports = report_mod.all_reports()
    assert len(reports) == 1 and reports[0].counts()["gqa_attention"] == LAYERS, [r.render() for r in reports]
    torch._dynamo.reset()
