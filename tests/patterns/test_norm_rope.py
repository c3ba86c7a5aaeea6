"""norm_rope: Qwen3's q / k norm ops and the RoPE after each become one ``rms_norm_rope`` (on by default)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, capture, compile_model, count, logits, rel_l2, run_pass

from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.kernels import reference
from fp8_fusion_pass.models import build_model, example_inputs
from fp8_fusion_pass.models.engine import _rope

ops = torch.ops.fp8_fusion
LAYERS = 2
NORM_ROPE = dataclasses.replace(FUSIONS_ONLY, norm_rope=True)


@pytest.fixture(scope="module")
def engine():
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    inputs = example_inputs(m, 2, 5)
    (gm,) = capture(m, *inputs)
    return m, inputs, gm


def test_switched_off_the_norms_go_to_inline_norm(engine):
    _, _, gm = engine
    r, out = run_pass(gm, FusionConfig(norm_rope=False))
    assert "norm_rope" not in r.counts() and count(out, ops.rms_norm_rope.default) == 0
    assert r.counts()["inline_norm"] == 2 * LAYERS + 1  # the q / k norms go to Inductor, fused into its RoPE


def test_each_layers_q_and_k_share_one_launch(engine):
    _, _, gm = engine
    r, out = run_pass(gm, NORM_ROPE)
    assert r.counts()["norm_rope"] == LAYERS, r.render()
    assert count(out, ops.rms_norm_rope.default) == LAYERS and count(out, ops.rms_norm.default) == 0
    # nothing of the RoPE chains is left: no cat / neg of the rotate-half, no q / k norm
    assert count(out, torch.ops.aten.cat.default) == 0 and count(out, torch.ops.aten.neg.default) == 0
    assert not r.errors and "no_norm_rope_pair" not in r.rejection_reasons()
    # the defaults (inline_norm on too): only the final norm is left for it
    r, out = run_pass(gm, FusionConfig())
    assert r.counts()["norm_rope"] == LAYERS and r.counts()["inline_norm"] == 1


def test_symbolic_batch_and_length():
    # dynamic=True: B and S symbolic; the table checks are static facts about them, and the op's fake takes them
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5), dynamic=True)
    r, out = run_pass(gm, NORM_ROPE)
    assert r.counts()["norm_rope"] == LAYERS and not r.errors, r.render()
    assert count(out, ops.rms_norm_rope.default) == LAYERS


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_whole_model_within_the_pass_bound(engine, form):
    # compiled on the CPU: with the rewrite the q / k norms and RoPEs run as the op (its reference: eager's
    # roundings), without it as Inductor's C++ code of the same ops; both against the eager model
    import tolerances

    if form == "engine":
        m, inputs, _ = engine
    else:
        m = build_model("qwen3-tiny", form="hf", layers=LAYERS)
        inputs = example_inputs(m, 2, 5)
    plain, counts = compile_model(m, inputs, FUSIONS_ONLY)
    assert "norm_rope" not in counts
    fused, counts = compile_model(m, inputs, NORM_ROPE)
    assert counts["norm_rope"] == LAYERS
    with torch.no_grad():
        eager = logits(m(*inputs))
    plain_vs_eager, err = rel_l2(plain, eager), rel_l2(fused, eager)
    assert err <= tolerances.pass_vs_eager_bound(plain_vs_eager), (err, plain_vs_eager)


def test_a_lone_chain_is_reported_and_left_to_inline_norm():
    class OnlyQ(torch.nn.Module):  # a model that norms q but not k: nothing to pair with
        def forward(self, q, k, w, cos, sin):
            q = _rope(ops.rms_norm(q, w, 1e-6).transpose(1, 2), cos, sin)
            return q, _rope(k.transpose(1, 2), cos, sin)

    q, w, k, _, cos, sin = _tensors()
    (gm,) = capture(OnlyQ(), q, k, w, cos, sin)
    r, out = run_pass(gm, NORM_ROPE)
    assert "norm_rope" not in r.counts() and r.rejection_reasons()["no_norm_rope_pair"] == 1, r.render()
    assert count(out, ops.rms_norm.default) == 1


def test_a_chain_the_kernel_cannot_take_is_named():
    class Pair(torch.nn.Module):
        def forward(self, q, k, wq, wk, cos, sin):
            return (_rope(ops.rms_norm(q, wq, 1e-6).transpose(1, 2), cos, sin),
                    _rope(ops.rms_norm(k, wk, 1e-6).transpose(1, 2), cos, sin))  # fmt: skip

    q, wq, k, wk, cos, sin = _tensors(d=96)  # even, not a power of two
    (gm,) = capture(Pair(), q, k, wq, wk, cos, sin)
    r, _ = run_pass(gm, NORM_ROPE)
    assert "norm_rope" not in r.counts() and r.rejection_reasons()["no_fused_kernel"] == 2, r.render()
    _compiles_to_the_reference(Pair())


def _compiles_to_the_reference(pair: torch.nn.Module) -> None:
    """``pair`` (q / k norm + RoPE, either spelling) compiled with the rewrite is one op, bit for bit its CPU
    reference."""
    q, wq, k, wk, cos, sin = _tensors()
    got, counts = compile_model(pair, (q, k, wq, wk, cos, sin), NORM_ROPE)
    assert counts["norm_rope"] == 1, counts
    want = reference.rms_norm_rope(q, wq, k, wk, 1e-6, cos, sin)  # the op's CPU implementation: bit for bit
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_pair_whose_k_reads_its_q_stays_apart():
    class Tangled(torch.nn.Module):  # k's activation is computed from q's RoPE output: one op would be a cycle
        def forward(self, q, k, wq, wk, cos, sin):
            q_out = _rope(ops.rms_norm(q, wq, 1e-6).transpose(1, 2), cos, sin)
            k = k + q_out.transpose(1, 2)[:, :, : k.shape[2]]
            return q_out, _rope(ops.rms_norm(k, wk, 1e-6).transpose(1, 2), cos, sin)

    q, wq, k, wk, cos, sin = _tensors()
    (gm,) = capture(Tangled(), q, k, wq, wk, cos, sin)
    r, out = run_pass(gm, NORM_ROPE)  # run_pass lints the graph: still valid and ordered
    assert "norm_rope" not in r.counts() and r.rejection_reasons()["operand_defined_later"] == 1, r.render()
    assert count(out, ops.rms_norm.default) == 2 and not r.errors


def _tensors(b=2, s=3, hq=4, hk=2, d=64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, s, hq, d, generator=g).bfloat16()
    k = torch.randn(b, s, hk, d, generator=g).bfloat16()
    wq, wk = ((torch.rand(d, generator=g) + 0.5).bfloat16() for _ in range(2))
    emb = torch.randn(b, s, d, generator=g)
    return q, wq, k, wk, emb.cos().bfloat16(), emb.sin().bfloat16()


def test_hf_plain_torch_norms_pair_too():
    # transformers' Qwen3RMSNorm is plain torch (reference.rms_norm); after the q / k projections it feeds the same
    # transpose + rotate-half RoPE as the engine's op does
    m = build_model("qwen3-tiny", form="hf", layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, 2, 5))
    before = count(gm, torch.ops.aten.rsqrt.default)
    r, out = run_pass(gm, NORM_ROPE)
    assert r.counts()["norm_rope"] == LAYERS and not r.errors, r.render()
    assert count(out, ops.rms_norm_rope.default) == LAYERS
    assert count(out, torch.ops.aten.rsqrt.default) == before - 2 * LAYERS - 2 * LAYERS  # q / k norms, fused norms
    r, out = run_pass(gm, FUSIONS_ONLY)
    assert count(out, torch.ops.aten.rsqrt.default) == before - 2 * LAYERS  # only norm_quant's took theirs


def test_hf_spelled_pair_is_the_reference_bit_for_bit():
    class Pair(torch.nn.Module):  # HF's spelling: the norm in plain torch, then transpose and RoPE
        def forward(self, q, k, wq, wk, cos, sin):
            return (_rope(reference.rms_norm(q, wq, 1e-6).transpose(1, 2), cos, sin),
                    _rope(reference.rms_norm(k, wk, 1e-6).transpose(1, 2), cos, sin))  # fmt: skip

    _compiles_to_the_reference(Pair())


def test_inductor_combo_kernels_keep_inductors_own_kernels(engine):
    # measured on the H200: with combo_kernels Inductor's merged RoPE / KV-write launch beat rms_norm_rope beside
    # the writes (here: no cache at all; test_rope_cache.py has the decode step, where the writes join our launch)
    from torch._inductor import config as inductor_config

    _, _, gm = engine
    with inductor_config.patch(combo_kernels=True):
        r, out = run_pass(gm, NORM_ROPE)
    assert "norm_rope" not in r.counts() and count(out, ops.rms_norm_rope.default) == 0
    assert r.rejection_reasons()["unfused_pair_faster"] == LAYERS, r.render()  # one per q / k pair


def test_hf_norm_patterns_are_traced_once_and_shared_with_the_pass():
    from fp8_fusion_pass.patterns import norm_rope
    from fp8_fusion_pass.patterns.norm_quant import FORMS

    torch_form = next(f for f in FORMS["norm_quant"] if f.name == "torch")
    assert torch_form.patterns() is torch_form.patterns()  # tracing costs a fake trace per spelling: once a process
    assert all(a is b for a, b in zip(norm_rope._hf_patterns(), torch_form.patterns()))
