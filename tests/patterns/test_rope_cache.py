"""rope_cache: the static KV-cache writes after ``rms_norm_rope`` move into its launch (``rms_norm_rope_cache``).

On the CPU: whole decode steps of the engine (``index_put_`` per batch row) and of transformers with a
``StaticCache`` (one position per token for every row), compiled with and without the rewrite: the logits and
every cache bit for bit, the op handed the cache inputs themselves (Inductor reinplaced it: no copy of a cache),
and each guard's rejection on a hand-written step.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, capture, count, logits, run_pass
from torch._inductor.utils import run_and_get_code

from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.models import build_model

ops = torch.ops.fp8_fusion
LAYERS = 2
BF16 = torch.bfloat16


def _engine_step(preset):
    m = build_model(preset, form="engine", layers=LAYERS)
    ids, positions = torch.randint(0, 100, (3, 1), generator=torch.Generator().manual_seed(0)), torch.tensor(
        [[5], [11], [2]])

    def new_cache():
        cache = m.new_kv_cache(3, 16)
        for i, t in enumerate(cache.k + cache.v):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
        return cache, cache.k + cache.v

    return m, lambda f, cache: f(ids, positions, cache), new_cache


def _hf_step(preset, batch=2, tokens=1):
    """An HF step of ``tokens`` new tokens per row (more than one: a step verifying draft tokens) at slot 6 of a
    16-slot ``StaticCache`` of random contents: (model, step(f, cache), new_cache())."""
    from transformers import StaticCache

    m = build_model(preset, form="hf", layers=LAYERS)
    ids = torch.randint(0, 100, (batch, tokens), generator=torch.Generator().manual_seed(0))
    position = torch.arange(6, 6 + tokens)

    def new_cache():
        cache = StaticCache(config=m.config, max_cache_len=16)
        with torch.no_grad():  # allocates the layers' buffers
            m(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True)
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        for i, t in enumerate(tensors):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length"):  # transformers 5.x counts the tokens written
                layer.cumulative_length.fill_(6)
        return cache, tensors

    return m, lambda f, cache: f(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True), (
        new_cache)


def _compiled_step(model, step, new_cache, config):
    """One decode step compiled with the pass under ``config``: (logits, the caches after it, counts, the code)."""
    torch._dynamo.reset()
    report_mod.clear_reports()
    cache, tensors = new_cache()
    opts = {"post_grad_custom_post_pass": FP8FusionPass(config), "fx_graph_cache": False}
    with torch.no_grad():
        out, code = run_and_get_code(step, torch.compile(model, options=opts), cache)
    counts = report_mod.last_report().counts()
    torch._dynamo.reset()
    return logits(out), tensors, counts, "\n".join(code)


@pytest.mark.parametrize("form, preset, rope", [
    ("engine", "qwen3-tiny", "norm_rope"), ("hf", "qwen3-tiny", "norm_rope"), ("engine", "llama-tiny", "qk_rope"),
])  # fmt: skip  (HF Llama's cache writes are HF Qwen3's; its qk_rope is test_qk_rope.py's)
def test_decode_step_bit_for_bit_and_the_caches_written_in_place(form, preset, rope):
    model, step, new_cache = (_engine_step if form == "engine" else _hf_step)(preset)
    # rope_attention off: the engine form's op would go on into the attention's launch (test_rope_attention.py)
    with_it = _compiled_step(model, step, new_cache, FusionConfig(rope_attention=False))
    without = _compiled_step(model, step, new_cache, FusionConfig(rope_cache=False))
    assert with_it[2]["rope_cache"] == LAYERS and with_it[2][rope] == LAYERS, with_it[2]
    assert "rope_cache" not in without[2] and without[2][rope] == LAYERS
    assert torch.equal(with_it[0], without[0])  # the rewrite is bit-exact: same k, v copied, same slots
    assert all(torch.equal(a, b) for a, b in zip(with_it[1], without[1]))
    _, eager_caches = new_cache()
    assert not all(torch.equal(a, b) for a, b in zip(with_it[1], eager_caches))  # the step did write
    # Inductor reinplaced the op: each call gets two of the graph's inputs (argN_1) as its caches, not a copy
    calls = re.findall(r"fp8_fusion\.(?:rms_norm|qk)_rope_cache\.default\((.*)\)", with_it[3])
    assert len(calls) == LAYERS
    for args in calls:
        assert all(re.fullmatch(r"arg\d+_1", a.strip()) for a in args.split(",")[-2:]), args


class _Step(torch.nn.Module):
    """A hand-written decode step: the op, then k and v into their caches by index (``variant`` breaks a guard)."""

    def __init__(self, variant=""):
        super().__init__()
        self.variant = variant

    def forward(self, q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache):
        q_out, k_out = ops.rms_norm_rope(q, wq, k, wk, 1e-6, cos, sin)
        b, h = k_out.shape[:2]
        rows, heads = torch.arange(b)[:, None, None], torch.arange(h)[None, :, None]
        old = k_cache.sum() if self.variant == "reads_old_cache" else 0  # before the write: the old contents
        k_cache.index_put_((rows, heads, positions[:, None, :]), k_out)
        if self.variant != "no_v_write":
            v_cache.index_put_((rows, heads, positions[:, None, :]), v)
        extra = k_out.sum() if self.variant == "k_read_too" else 0
        return q_out.sum() + k_cache.sum() + v_cache.sum() + old + extra


def _step_inputs(b=2, s=1, hq=4, hk=2, d=64, t=8):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, s, h, d, generator=g).to(BF16) for h in (hq, hk))
    v = torch.randn(b, hk, s, d, generator=g).to(BF16)
    wq, wk = ((torch.rand(d, generator=g) + 0.5).to(BF16) for _ in range(2))
    emb = torch.randn(1, s, d, generator=g)
    caches = [torch.zeros(b, hk, t, d, dtype=BF16) for _ in range(2)]
    return q, wq, k, wk, emb.cos().to(BF16), emb.sin().to(BF16), v, torch.tensor([[3], [5]]), *caches


def test_a_hand_written_step_is_taken():
    (gm,) = capture(_Step(), *_step_inputs())
    r, out = run_pass(gm, dataclasses.replace(FUSIONS_ONLY, rope_cache=True))
    assert r.counts()["rope_cache"] == 1 and not r.errors, r.render()
    assert count(out, ops.rms_norm_rope.default) == 0
    assert count(out, torch.ops.aten.index_put.default) == 0


@pytest.mark.parametrize("variant, reason, why", [
    ("k_read_too", "cache_write_not_in_place", "k feeds 2 nodes"),  # the op would have to return k as well
    ("reads_old_cache", "cache_write_not_in_place", "old contents are read"),  # Inductor would copy the cache
    ("no_v_write", "no_kv_write_pair", "0 other cache writes"),
])  # fmt: skip
def test_guards_leave_the_writes_to_inductor(variant, reason, why):
    (gm,) = capture(_Step(variant), *_step_inputs())
    r, out = run_pass(gm, dataclasses.replace(FUSIONS_ONLY, rope_cache=True))
    assert "rope_cache" not in r.counts() and r.rejection_reasons()[reason] == 1, r.render()
    assert why in next(d.detail for d in r.rejected if d.pattern == "rope_cache"), r.render()  # the report says why
    assert count(out, ops.rms_norm_rope.default) == 1 and not r.errors


class _TwoLayers(torch.nn.Module):
    """Two layers writing at the same positions, the first one's writes left to Inductor (its k is read too): the
    second layer's v write must still be found among both layers' writes."""

    def forward(self, q, wq, k, wk, cos, sin, v, positions, k0, v0, k1, v1):
        rows, heads = torch.arange(q.shape[0])[:, None, None], torch.arange(k.shape[2])[None, :, None]
        at = (rows, heads, positions[:, None, :])
        q_out, k_out = ops.rms_norm_rope(q, wq, k, wk, 1e-6, cos, sin)
        k0.index_put_(at, k_out)
        v0.index_put_(at, v)
        h = (q_out.sum() + k_out.sum() + k0.sum() + v0.sum()).to(q.dtype)  # layer 1's input reads layer 0's caches
        q_out, k_out = ops.rms_norm_rope(q + h, wq, k + h, wk, 1e-6, cos, sin)
        k1.index_put_(at, k_out)
        v1.index_put_(at, v * 2)
        return q_out.sum() + k1.sum() + v1.sum()


def test_the_v_write_is_the_one_no_cycle_excludes():
    *args, k0, v0 = _step_inputs()
    (gm,) = capture(_TwoLayers(), *args, k0, v0, k0.clone(), v0.clone())
    r, _ = run_pass(gm, dataclasses.replace(FUSIONS_ONLY, rope_cache=True))
    # layer 0's v write is read before layer 1's inputs exist, so one op cannot take it with layer 1's k
    assert r.counts()["rope_cache"] == 1 and r.rejection_reasons() == {"cache_write_not_in_place": 1}, r.render()


def test_prefill_without_a_cache_is_no_candidate():
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, torch.randint(0, 100, (2, 5)), torch.arange(5).expand(2, 5))
    r, _ = run_pass(gm, FusionConfig())
    assert r.counts()["norm_rope"] == LAYERS and "rope_cache" not in r.counts()
    assert not any(d.pattern == "rope_cache" for d in r.rejected), r.render()


@pytest.mark.parametrize("rope_cache", [True, False])
def test_under_combo_kernels_only_a_launch_the_writes_join(rope_cache):
    # H200: with Inductor's combo_kernels our RoPE launch lost beside the cache writes and won with them inside
    from torch._inductor import config as inductor_config

    model, _, new_cache = _engine_step("qwen3-tiny")
    cache, _ = new_cache()
    (gm,) = capture(lambda ids, pos: model(ids, pos, cache), torch.zeros(3, 1, dtype=torch.long),
                    torch.tensor([[5], [11], [2]]))  # fmt: skip
    with inductor_config.patch(combo_kernels=True):
        r, _ = run_pass(gm, FusionConfig(rope_cache=rope_cache))
    if rope_cache:
        assert r.counts()["norm_rope"] == LAYERS and r.counts()["rope_cache"] == LAYERS, r.render()
    else:
        assert "norm_rope" not in r.counts() and r.rejection_reasons()["unfused_pair_faster"] == LAYERS, r.render()
