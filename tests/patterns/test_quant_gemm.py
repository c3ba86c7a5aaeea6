"""quant_gemm: a group quant no producer took in (o_proj after attention), feeding only block-scale GEMMs, becomes
``group_quant_blockscale_mm`` at M <= 4 (FusionConfig(quant_gemm=True), the default)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, BlockLinear, capture, count, run_pass
from torch import nn

from fp8_fusion_pass import arch
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.models import build_model, example_inputs

ops = torch.ops.fp8_fusion
FUSED = ops.group_quant_blockscale_mm.default
LAYERS = 2
ALONE = dataclasses.replace(FUSIONS_ONLY, quant_gemm=True)  # this rewrite on top of the fusions


def _graph(form, batch=1, seq=1, layers=LAYERS, dynamic=False):
    m = build_model("qwen3-tiny", form=form, layers=layers)
    (gm,) = capture(m, *example_inputs(m, batch, seq), dynamic=dynamic)
    return gm


@pytest.fixture(scope="module")
def engine_graph():
    return _graph("engine")


def _mine(r):
    return [(d.reason, d.detail) for d in r.rejected if d.pattern == "quant_gemm"]


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_the_o_proj_quant_moves_into_its_gemm(form, engine_graph):
    gm = engine_graph if form == "engine" else _graph("hf")
    r, out = run_pass(gm, FusionConfig())  # on by default, after every other rewrite
    assert r.counts()["quant_gemm"] == LAYERS and not r.errors, r.render()
    assert count(out, FUSED) == LAYERS and count(out, ops.group_quant.default) == 0
    (node, *_) = [n for n in out.graph.nodes if n.target is FUSED]
    assert node.args[0].meta["val"].dtype == torch.bfloat16 and node.args[-1] == 128  # the attention output, bf16
    assert _mine(r) == []


def test_switches_and_deterministic_mode_keep_it_off(engine_graph, monkeypatch):
    r, out = run_pass(engine_graph, FusionConfig.without("quant_gemm"))
    assert count(out, FUSED) == 0 and count(out, ops.group_quant.default) == LAYERS
    monkeypatch.setenv("FP8_FUSION_DISABLE", "quant_gemm")
    assert count(run_pass(engine_graph, FusionConfig())[1], FUSED) == 0
    monkeypatch.delenv("FP8_FUSION_DISABLE")
    torch.use_deterministic_algorithms(True)
    try:  # not bit-exact: the fused GEMV's config may differ from the GEMM's
        r, out = run_pass(engine_graph, ALONE)
    finally:
        torch.use_deterministic_algorithms(False)
    assert count(out, FUSED) == 0 and count(out, ops.silu_mul_group_quant.default) == LAYERS, r.render()


def test_the_pass_constants_are_the_kernel_facts():
    from fp8_fusion_pass.kernels.triton import _gemv_kernels
    from fp8_fusion_pass.patterns import quant_gemm

    assert quant_gemm.GEMV_MAX_M == _gemv_kernels.GEMV_MAX_M and quant_gemm.GROUP == _gemv_kernels.SCALE_BLOCK


def test_more_than_four_rows_keep_the_quant():
    r, out = run_pass(_graph("engine", batch=2, seq=5), ALONE)
    assert count(out, FUSED) == 0 and count(out, ops.group_quant.default) == LAYERS
    assert [reason for reason, _ in _mine(r)] == ["m_above_gemv"] * LAYERS, r.render()


def test_dynamic_batch_is_fused():
    gm = _graph("engine", batch=2, seq=1, layers=1, dynamic=True)
    r, out = run_pass(gm, ALONE)
    (node,) = [n for n in out.graph.nodes if n.target is FUSED]
    assert not isinstance(node.args[0].meta["val"].shape[0], int), r.render()  # the op decides per call


class _Proj(nn.Module):
    """x -> o_proj-like block-FP8 GEMM; ``mode`` adds a second GEMM of the quant, or a non-GEMM use of it."""

    def __init__(self, mode=""):
        super().__init__()
        self.a, self.b, self.mode = BlockLinear(256, 256, seed=1), BlockLinear(256, 128, seed=2), mode

    def forward(self, x):
        if self.mode == "two":  # one quant, two GEMMs (k and v of a model without group_gemm)
            q, s = ops.group_quant(x, 128)
            return (ops.blockscale_mm(q, s, self.a.weight, self.a.weight_scale_inv, x.dtype),
                    ops.blockscale_mm(q, s, self.b.weight, self.b.weight_scale_inv, x.dtype))  # fmt: skip
        if self.mode == "scale_out":  # the scale is also a graph output: the quant must stay
            q, s = ops.group_quant(x, 128)
            return ops.blockscale_mm(q, s, self.a.weight, self.a.weight_scale_inv, x.dtype), s
        if self.mode == "group64":
            q, s = ops.group_quant(x, 64)
            return ops.blockscale_mm(q, s, self.a.weight, self.a.weight_scale_inv, x.dtype)
        return self.a(x)


def test_a_quant_feeding_two_gemms_gives_each_its_own():
    (gm,) = capture(_Proj("two"), torch.randn(1, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, ALONE)
    assert count(out, FUSED) == 2 and count(out, ops.group_quant.default) == 0, r.render()
    assert "2 GEMM(s)" in r.applied[0].detail


def test_a_quant_with_another_consumer_is_not_a_candidate():
    (gm,) = capture(_Proj("scale_out"), torch.randn(1, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, ALONE)
    assert count(out, FUSED) == 0 and count(out, ops.group_quant.default) == 1
    assert _mine(r) == [], r.render()  # not this rewrite's graph: nothing to explain


def test_groups_of_64_are_rejected():
    (gm,) = capture(_Proj("group64"), torch.randn(1, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, ALONE)
    assert count(out, FUSED) == 0
    assert [reason for reason, _ in _mine(r)] == ["no_fused_kernel"], r.render()


def test_on_a_backend_without_the_fused_op_it_is_rejected(monkeypatch):
    (gm,) = capture(_Proj(), torch.randn(1, 256, dtype=torch.bfloat16))
    real = backends.backend_for
    monkeypatch.setattr(backends, "backend_for",
                        lambda op, device: "aiter" if op == "blockscale_mm" else real(op, device))  # fmt: skip
    r, out = run_pass(gm, ALONE)
    assert count(out, FUSED) == 0
    ((reason, detail),) = _mine(r)
    assert reason == "no_fused_kernel" and "aiter" in detail, r.render()


def test_on_triton_only_a_measured_win_is_fused(monkeypatch):
    from fp8_fusion_pass.kernels.triton import group_quant_blockscale_mm as gqm
    from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig

    (gm,) = capture(_Proj(), torch.randn(1, 256, dtype=torch.bfloat16))
    key = (arch.arch_of("cpu").name, 1, 256, 256)

    def run():
        with backends.use_backend("triton"):
            r, out = run_pass(gm, ALONE)
        return count(out, FUSED), _mine(r), r

    n, found, r = run()  # no row: never measured, not assumed faster
    assert n == 0 and found[0][0] == "unfused_pair_faster" and "never measured" in found[0][1], r.render()
    monkeypatch.setitem(gqm.TABLE, key, None)  # measured: the pair won
    n, found, r = run()
    assert n == 0 and "M=1, N=256, K=256" in found[0][1] and "no faster" in found[0][1], r.render()
    monkeypatch.setitem(gqm.TABLE, key, GemvConfig(8, 256, 4, 1))
    n, found, r = run()
    assert n == 1 and found == [], r.render()



def _decode_step_graph(preset):
    from test_rope_cache import _engine_step

    model, _, new_cache = _engine_step(preset)  # batch 3: rows the quantizing GEMV would take
    cache, _ = new_cache()
    (gm,) = capture(lambda ids, pos: model(ids, pos, cache), torch.zeros(3, 1, dtype=torch.long),
                    torch.tensor([[5], [11], [2]]))  # fmt: skip
    return gm


def test_the_attention_launch_takes_the_o_proj_quant_first():
    """At decode the attention rewrites run first and fold the o_proj's input quant into their launch: on the H200
    that costs the attention ~0.5 us where the quantizing GEMV costs ~0.9 us (the order's reason,
    patterns/__init__.py). With the attention rewrites off, this rewrite still takes the quant."""
    gm = _decode_step_graph("qwen3-tiny")  # head dim 128: one quant group per head, the fold can run
    r, out = run_pass(gm, FusionConfig())
    rope_ops = [n for n in out.graph.nodes if n.args and n.args[0] is ops.rope_decode_attention.default]
    assert r.counts()["rope_attention"] == LAYERS and "quant_gemm" not in r.counts(), r.render()
    assert count(out, FUSED) == 0 and count(out, ops.group_quant.default) == 0
    assert len(rope_ops) == LAYERS and all(n.kwargs["group_size"] == 128 for n in rope_ops)  # the quant in it
    r, out = run_pass(gm, FusionConfig(decode_attention=False))
    assert r.counts()["quant_gemm"] == LAYERS and count(out, FUSED) == LAYERS, r.render()


def test_a_quant_the_attention_cannot_fold_still_goes_into_the_gemv():
    # Llama-tiny's heads are 64 wide, half a quant group: the attention's launch cannot quantize its output
    r, out = run_pass(_decode_step_graph("llama-tiny"), FusionConfig())
    assert r.counts()["rope_attention"] == LAYERS and r.counts()["quant_gemm"] == LAYERS, r.render()
    assert count(out, FUSED) == LAYERS and count(out, ops.group_quant.default) == 0
