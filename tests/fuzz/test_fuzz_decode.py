"""Decode-step fuzzing: random models with a static KV cache (``fuzz_decode``), one token per row at random
positions, through the pass; the attention rewrites (``decode_attention``, the RoPE ops, ``rope_cache``,
``rope_attention``, ``gqa_attention``) are the pass's largest graph surgery and in-place writes, so:

1. the pass records no error, and the rewritten graph is one Inductor can lower (every node has a fake value, no
   SymInt object in any node's arguments);
2. it fuses or says why: the attention rewrites' counts equal ``expected_attention_counts``, the
   norm / silu counts equal ``fuzz_models.expected_counts``, the zero fills stripped ``expected_fills`` (per-tensor
   models: one per linear), every rewrite the oracle does not expect has a rejection per layer, and every
   norm / silu / quant left is named by one (``fuzz_harness.unexplained``);
3. the logits with and without the pass agree within the numerics contract, and the caches too: the step's slots
   within the same bound, every other slot exactly as it was (with and without the pass, each run from the same
   cache: ``fuzz_harness`` puts back what the graph without the pass wrote).
"""

from __future__ import annotations

import contextlib

import tolerances
import torch
from fuzz_decode import (
    ATTENTION_REWRITES,
    DecodeRun,
    DecodeSpec,
    decode_specs,
    expected_attention_counts,
    heads_fold_the_quant,
    token_form,
)
from fuzz_harness import Recorder, applied_counts, raw_symbols, same, unexplained
from fuzz_models import DecoderSpec, expected_counts, expected_fills
from fuzz_stats import REASONS, TALLY, profile
from hypothesis import example, given, note

from fp8_fusion_pass import verify
from fp8_fusion_pass.models.engine import KVCache

REL_L2 = tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR


def _compile(run: DecodeRun, rec: Recorder):
    torch._dynamo.reset()
    if run.spec.dynamic == "all":
        return torch.compile(run.model, backend=rec, dynamic=True), torch._dynamo.config.patch(specialize_float=True)
    run.mark_cache_dynamic()
    return torch.compile(run.model, backend=rec), contextlib.nullcontext()


def check_report(spec: DecodeSpec, capture) -> None:
    report = capture.report
    note(report.render())
    assert report.inference and not report.errors, report.render()
    missing_meta = [n.name for n in capture.after.graph.nodes if n.op == "call_function" and "val" not in n.meta]
    assert not missing_meta, missing_meta
    assert not raw_symbols(capture.after), raw_symbols(capture.after)
    counts = report.counts()
    expected = expected_attention_counts(spec)
    got = {k: counts[k] for k in ATTENTION_REWRITES if counts.get(k) and k not in expected.either}
    want = {k: n for k, n in expected.counts.items() if k not in expected.either}
    assert got == want, (got, want, report.render())
    rejected = [d.pattern for d in report.rejected]
    for name in expected.candidates - want.keys() - expected.either:  # not taken: named in every layer's report
        assert rejected.count(name) >= spec.model.layers, (name, report.render())
    for name in expected.either:  # applied in every layer, or rejected in every layer where it had a candidate
        assert counts.get(name, 0) in (0, spec.model.layers), (name, report.render())
        has_candidate = name in expected.candidates and (name != "rope_attention" or counts.get("decode_attention"))
        if has_candidate and not counts.get(name):
            assert rejected.count(name) >= spec.model.layers, (name, report.render())
    assert applied_counts(report) == expected_counts(spec.model), report.render()
    fills = (counts["fills_stripped"], counts["fills_kept"])
    assert fills == (expected_fills(spec.model), 0), (fills, report.render())
    assert unexplained(capture) == [], report.render()
    details = [d.detail for d in report.applied if d.pattern == "decode_attention"]
    tokens_form = sum("tokens per kv head" in d for d in details)
    quantized = sum("tokens per kv head" in d and "output quantized in the o_proj's" in d for d in details)
    # several static tokens in the engine's layouts take it; none else, but where the token count may be tied to a
    # static size (expected.either); where heads fold the quant it is always the quantized op
    if _takes_the_token_form(spec, counts) or "decode_attention" not in expected.either:
        assert tokens_form == (spec.model.layers if _takes_the_token_form(spec, counts) else 0), report.render()
    assert quantized == (tokens_form if heads_fold_the_quant(spec) else 0), report.render()
    TALLY["decode attention in the token form"] += tokens_form
    TALLY["decode attention in the token form, quantized"] += quantized
    TALLY[f"decode attention in the token form ({spec.model.scheme})"] += tokens_form
    TALLY[f"decode zero fills stripped ({spec.model.scheme})"] += counts["fills_stripped"]
    TALLY["decode graphs"] += 1
    for name, n in counts.items():
        if name in ATTENTION_REWRITES and n:
            TALLY[f"decode applied {name}"] += n
    REASONS.update(d.reason for d in report.rejected)


def _takes_the_token_form(spec: DecodeSpec, counts: dict) -> bool:
    """``decode_attention`` took the step and it is the token form (``fuzz_decode.token_form``)."""
    return bool(counts.get("decode_attention")) and token_form(spec)


def close(name: str, without: torch.Tensor, with_pass: torch.Tensor, exact: torch.Tensor | None) -> None:
    """NaN / inf on the same positions, and within the contract's bound of each other; or, where the pass changed
    the attention's numerics (``decode_attention`` does not round scores and probabilities to bf16 as the plain
    graph does, and fp8 quantization downstream turns those ulps into whole fp8 steps), no farther from the exact
    attention than the plain graph is, by ``tolerances.pass_vs_eager_bound``. Per-tensor models share these bounds:
    the pass leaves their quant as it is (zero-fill stripping is bit-exact, docs/numerics.md) and the rewrites before
    it are the block models'; their NaN / inf cases poison every row through the one scale, with and without the
    pass alike, so there only the non-finite positions are compared."""
    c = verify.compare("decode", name, without, with_pass, REL_L2)
    assert c.positions_agree, c
    if c.ok:
        return
    assert exact is not None, c
    err = verify.compare("decode", name, exact, with_pass, REL_L2).rel_l2
    noise = verify.compare("decode", name, exact, without, REL_L2).rel_l2
    note(f"{name}: with vs without {c.rel_l2:.4f}; vs exact attention: with {err:.4f}, without {noise:.4f}")
    assert err <= tolerances.pass_vs_eager_bound(noise), (c, err, noise)
    TALLY["decode outputs held to exact attention"] += 1


def check_call(run: DecodeRun, call, slots, exact) -> None:
    for i, (a, b) in enumerate(zip(call.before, call.after)):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            logits = exact is not None and a.shape == exact.logits.shape
            close(f"output {i}", a, b, exact.logits if logits else None)
    caches = {c.data_ptr(): k for k, c in enumerate(run.tensors)}
    written = set()
    for i, m in call.mutations.items():
        k = caches.get(call.args[i].data_ptr())
        if k is None:  # another buffer the step writes (transformers' token counters): the same bits
            assert same(m.without, m.with_pass), f"input {i} written differently with the pass"
            continue
        written.add(k)
        keep = ~slots[k]
        for name, t in (("without", m.without), ("with", m.with_pass)):
            assert same(t[keep], m.old[keep]), f"cache {k}: the step {name} the pass wrote outside its slots"
        close(f"cache {k}", m.without[slots[k]], m.with_pass[slots[k]],
              None if exact is None else exact.caches[k][slots[k]])
    assert written == set(range(len(run.tensors))), f"caches written: {sorted(written)}"


@profile()
@given(spec=decode_specs())
@example(  # Qwen3 engine, batch marked dynamic (an engine serving any batch; rope_cache refused its write), NaN row 0
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 256, 256, 4, 2, 128, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=6, cache_len=12, steps=2, dynamic="batch", case="nan"))
@example(  # Llama engine as fuse(model, dynamic=True) compiles it: the cache's kv heads fixed by a guard
    spec=DecodeSpec(DecoderSpec("llama", "engine", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=5, cache_len=8, steps=1, dynamic="all"))
@example(  # found by this fuzz: Qwen3 engine, one query head per kv head: its mask went to the op as a mask, which
    # rope_attention could not take, and the report said nothing
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 128, 128, 1, 1, 16, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=1, cache_len=4, steps=1, dynamic="static"))
@example(  # HF Llama, StaticCache, 8 rows x 2 kv heads: gqa_attention's smallest batch; last slot; inf in the last row
    spec=DecodeSpec(DecoderSpec("llama", "hf", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=8, cache_len=9, steps=1, dynamic="static", seed=3, case="inf"))
@example(  # HF Qwen3 as fuse(model, dynamic=True) compiles it: the StaticCache's length is symbolic too; the grouped
    # SDPA used to refuse it (kv_heads_dynamic), losing gqa_attention
    spec=DecodeSpec(DecoderSpec("qwen3", "hf", 256, 256, 8, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=3, cache_len=12, steps=2, dynamic="all"))
@example(  # HF Qwen3, 8 query heads per kv head at batch 1, one token: 16 copied heads, under GQA_MIN_BATCH_HEADS:
    # the copy stays though G = 8 (taken while a G = 8 rule stood; 2 pairs at G = 8 measured 0.79x, H100)
    spec=DecodeSpec(DecoderSpec("qwen3", "hf", 256, 256, 16, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=1, cache_len=10, steps=2, dynamic="static"))
@example(  # HF Qwen3, 3 tokens per step (verifying 2 draft tokens), 2 rows x 2 kv heads: gqa_attention takes the
    # 2 x 3 rows per kv head, each with its own token's mask row (at one token these 4 pairs keep the copy)
    spec=DecodeSpec(DecoderSpec("qwen3", "hf", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=10, steps=2, dynamic="static", tokens=3))
@example(  # HF Qwen3, 3 tokens per step, the token dim marked with max=8 (ids and cache_position): gqa_attention at a
    # symbolic S, one compile for both steps
    spec=DecodeSpec(DecoderSpec("qwen3", "hf", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=10, steps=2, dynamic="tokens", tokens=3, token_max=8))
@example(  # HF Llama, batch and tokens marked, the tokens without a bound: gqa_attention keeps the copy
    spec=DecodeSpec(DecoderSpec("llama", "hf", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=3, cache_len=10, steps=2, dynamic="both", tokens=2))
@example(  # HF Llama, 3 tokens per step under dynamic=True: the token count symbolic, so query_too_long (a count
    # that duck sizing ties to a static size, 2 = the kv heads, would be taken)
    spec=DecodeSpec(DecoderSpec("llama", "hf", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=8, cache_len=9, steps=2, dynamic="all", tokens=3))
@example(  # Qwen3 engine, 3 tokens per step, heads of 128: decode_attention_tokens_quant (q read as the RoPE op
    # leaves it, a position per token, the o_proj's quant in its launch), then the RoPE in that launch too
    # (rope_decode_attention_tokens_quant, the q / k norms' prologue), a NaN in one token's row
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 256, 256, 4, 2, 128, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=3, cache_len=10, steps=2, dynamic="static", case="nan", tokens=3))
@example(  # Llama engine, fp16, the batch marked dynamic, 8 query heads per kv head x 2 tokens (16 rows): the token
    # form at a symbolic batch (its reshapes by -1; fp16, so the RoPE stays unfused and rope_attention has no candidate)
    spec=DecodeSpec(DecoderSpec("llama", "engine", 256, 256, 8, 1, 128, 1, 1e-6, False, False, "fp16", False, False,
                                ((1, 1),)), batch=5, cache_len=9, steps=2, dynamic="batch", case="outlier", tokens=2))
@example(  # Llama engine, bf16, the batch marked dynamic, 2 tokens per step, heads of 128: the RoPE in the token
    # form's launch (rope_decode_attention_tokens_quant) at a symbolic batch, both layers
    spec=DecodeSpec(DecoderSpec("llama", "engine", 256, 256, 4, 2, 128, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=4, cache_len=12, steps=2, dynamic="batch", case="random-2", tokens=2))
@example(  # per-tensor Qwen3 engine, 3 tokens per step, heads of 128: the token form without the quant
    # (decode_attention_tokens, then rope_decode_attention_tokens), as the o_proj's one scale over the whole tensor
    # is no group quant a launch per head could take; every scale buffer's zero fill stripped
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 256, 256, 4, 2, 128, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),), scheme="per-tensor"), batch=3, cache_len=10, steps=2, dynamic="static",
                    tokens=3))
@example(  # Llama engine, 3 tokens per step (a speculative-decoding check): the attention with a causal mask per
    # token (rows 2 x 3; heads of 64, so the token form without the quant, which stays its own launch),
    # rope_attention takes the RoPE into that launch (rope_decode_attention_tokens), the three slots per row written
    spec=DecodeSpec(DecoderSpec("llama", "engine", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=3, cache_len=10, steps=2, dynamic="static", tokens=3))
@example(  # as the long profile found: Qwen2 engine, 2 layers, layer 1's v slot 0.057 rel L2 from the plain graph's
    # (its bf16 scores / probabilities through fp8 quants); with the pass it equals exact attention's bit for bit
    spec=DecodeSpec(DecoderSpec("qwen2", "engine", 384, 128, 4, 2, 96, 2, 1e-6, True, False, "bf16", False, False,
                                ((1, 1),), seed=583), batch=1, cache_len=4, steps=2, dynamic="static", seed=1))
@example(  # switches off, as FP8_FUSION_DISABLE=rope_cache,inline_norm: the attention still fused, rope_attention
    # without its RoPE-cache op has no candidate, the q / k norms stay aten ops
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=6, steps=1, dynamic="static",
                    disabled=("inline_norm", "rope_cache")))
@example(  # found by the long profile: dynamic=True with 3 tokens, which duck sizing tied to the 3 heads: a static
    # token count after all, so the attention was taken (either outcome is right; the oracle had said rejected)
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 129, 128, 3, 3, 16, 1, 1e-6, True, False, "bf16", False, False,
                                ((1, 1),), seed=3633), batch=1, cache_len=36, steps=2, dynamic="all", seed=261,
                    tokens=3))
@example(  # found by the fourth long soak: dynamic=True, batch 2 = 2 tokens, one symbol (duck sizing): the views' -1
    # left the head dim as 128 // ((2*s*((s**2)//s)) // s**2), and the RoPE matchers found no candidate, silently
    spec=DecodeSpec(DecoderSpec("qwen2", "hf", 128, 384, 2, 2, 64, 1, 1e-5, True, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=6, steps=1, dynamic="all", tokens=2))
@example(  # found by the fifth long soak: dynamic=True, batch 2 = 2 kv heads (duck sizing, then fixed by a guard): the
    # scores' view had a sym_size read of its kv heads (for the mask's expand), and decode_attention refused it
    spec=DecodeSpec(DecoderSpec("qwen2", "engine", 64, 128, 4, 2, 16, 1, 1e-6, True, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=4, steps=1, dynamic="all", case="random-1"))
@example(  # found by the sixth long soak: dynamic=True at batch 1 in fp16 (no RoPE-cache rewrite to fix them): the kv
    # heads stayed symbolic (rows 4 // s), and decode_attention refused them (kv_heads_dynamic); now pinned by a guard
    spec=DecodeSpec(DecoderSpec("qwen2", "engine", 64, 128, 4, 2, 16, 1, 1e-6, True, False, "fp16", False, False,
                                ((1, 1),)), batch=1, cache_len=4, steps=1, dynamic="all", case="random-1"))
@example(  # found by the seventh long soak: as above, bf16, and the 4 kv heads share a symbol with the 4 cache slots
    # (duck sizing); the pin had left a shared symbol alone
    spec=DecodeSpec(DecoderSpec("qwen2", "engine", 384, 128, 8, 4, 48, 1, 1e-6, True, False, "bf16", False, False,
                                ((1, 1),)), batch=1, cache_len=4, steps=1, dynamic="all", case="random-1"))
@example(  # found by the ninth long soak: HF, dynamic=True, batch 3 = 3 kv heads: the batch is static after all (duck
    # sizing, then the config's views), so gqa_attention's measured rule (kv_copy_faster at 18 copied heads) applies;
    # the oracle had taken the batch as symbolic
    spec=DecodeSpec(DecoderSpec("qwen3", "hf", 132, 128, 6, 3, 16, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=3, cache_len=4, steps=1, dynamic="all", case="random-1"))
@example(  # found by the tenth long soak: fp16, dynamic=True, batch 2 = 2 kv heads, nothing fixing them: the kv heads
    # were ((s**2)//s) (a view's unsimplified -1), not a plain symbol, and the pin left them
    spec=DecodeSpec(DecoderSpec("llama", "engine", 128, 128, 4, 2, 16, 1, 1e-6, False, False, "fp16", False, False,
                                ((1, 1),)), batch=2, cache_len=4, steps=1, dynamic="all", case="random-1"))
@example(  # found by the twelfth long soak: the batch marked dynamic, batch 2 = 2 tokens: the RoPE-cache op's check
    # of its [S] positions against the tokens compared the symbolic batch with 2, and Dynamo specialized the batch
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 128, 256, 1, 1, 16, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=4, steps=1, dynamic="batch", case="random-1", tokens=2))
@example(  # Llama engine, 2 layers, the token dim marked dynamic (2-3 draft tokens per step): the RoPE ops and their
    # cache writes taken at a symbolic token count, the attention refused with its reason (rows 2*s: kv_heads_dynamic)
    spec=DecodeSpec(DecoderSpec("llama", "engine", 256, 256, 4, 2, 64, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=12, steps=2, dynamic="tokens", tokens=3))
@example(  # HF Llama, 2 layers, the batch of the ids and the StaticCache's tensors marked dynamic: gqa_attention at a
    # symbolic batch; NaN in row 0
    spec=DecodeSpec(DecoderSpec("llama", "hf", 256, 256, 8, 2, 64, 2, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=8, cache_len=12, steps=2, dynamic="batch", case="nan"))
@example(  # Qwen3 engine, the batch and the token dim both marked (max=3), batch 2 = 2 tokens: the attention taken at
    # symbolic rows 2*s over a symbolic batch, the RoPE op's checks adding no guard that would specialize either
    spec=DecodeSpec(DecoderSpec("qwen3", "engine", 256, 256, 4, 2, 64, 1, 1e-6, False, False, "bf16", False, False,
                                ((1, 1),)), batch=2, cache_len=12, steps=2, dynamic="both", tokens=2, token_max=3))
def test_random_decode_steps(spec: DecodeSpec):
    note(spec.short())
    run = DecodeRun(spec)
    rec = Recorder(spec.config)
    compiled, floats = _compile(run, rec)
    with torch.no_grad(), floats:
        steps = [run.run_step(compiled, i) for i in range(spec.steps)]
    assert rec.captures and len(rec.calls) == spec.steps
    for capture in rec.captures:
        check_report(spec, capture)
    for call, (written, exact) in zip(rec.calls, steps):
        check_call(run, call, written, exact)
        TALLY["decode steps"] += 1
    TALLY[f"decode models {spec.model.form} {spec.dynamic}"] += 1
    TALLY[f"decode models {spec.model.scheme} {spec.model.form}"] += 1
    TALLY[f"decode inputs {spec.case}"] += spec.steps
    for name in spec.disabled:
        TALLY[f"decode models with {name} off"] += 1


def test_a_kv_head_count_the_pass_pins_is_guarded():
    """Under ``dynamic=True`` at batch 1 in fp16 (no RoPE-cache rewrite, whose op would fix them) an engine step's
    kv heads stay symbolic; ``decode_attention`` fixes them by a guard (``_pin_kv_heads``) and takes the attention.
    The guard must reach Dynamo's: a cache with another count (4: two query heads each, which the plain graph runs,
    and nothing else in it guards against) gets a compile of its own, never the graph fused for 2."""
    spec = DecodeSpec(DecoderSpec("qwen2", "engine", 64, 128, 8, 2, 16, 1, 1e-6, True, False, "fp16", False, False,
                                  ((1, 1),)), batch=1, cache_len=4, steps=1, dynamic="all")  # fmt: skip
    run = DecodeRun(spec)
    rec = Recorder(spec.config)
    compiled, floats = _compile(run, rec)
    wide = KVCache(1, 1, 4, 4, 16, torch.float16)
    for c in wide.k + wide.v:
        c.normal_()
    with torch.no_grad(), floats:
        run.run_step(compiled, 0)
        compiled(run.ids[0], torch.tensor([[2]]), wide)
    assert len(rec.captures) == 2, [c.report.render() for c in rec.captures]
    for capture in rec.captures:
        assert capture.report.counts().get("decode_attention") == 1, capture.report.render()
    for call in rec.calls:  # each graph, with and without the pass, on its own cache
        for a, b in zip(call.before, call.after):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                assert verify.compare("decode", "out", a, b, REL_L2).ok
