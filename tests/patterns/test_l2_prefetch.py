"""l2_prefetch: at batch 1 a fused norm's launch gets the next GEMM's weight to hint into L2
(FusionConfig(l2_prefetch=True), the default; NVIDIA sm_90+ only, so the CPU tests stand the hardware check in)."""

from __future__ import annotations

import pytest
import torch
from pattern_helpers import BlockLinear, capture, run_pass
from torch import nn

import fp8_fusion_pass
from fp8_fusion_pass import guards
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.models import build_model, example_inputs
from fp8_fusion_pass.patterns import l2_prefetch

ops = torch.ops.fp8_fusion
NORMS = (ops.rms_norm_group_quant.default, ops.add_rms_norm_group_quant.default)
LAYERS = 2


def _graph(form, batch=1, seq=1):
    m = build_model("qwen3-tiny", form=form, layers=LAYERS)
    (gm,) = capture(m, *example_inputs(m, batch, seq))
    return gm


@pytest.fixture(scope="module")
def engine_graph():
    return _graph("engine")


@pytest.fixture
def sm90(monkeypatch):
    """The CPU graph as if on an sm_90 GPU with the Triton norm, and qwen3-tiny's small weights as if measured."""
    monkeypatch.setattr(l2_prefetch, "_hardware", lambda device, op: guards.OK)
    monkeypatch.setattr(l2_prefetch, "MIN_WEIGHT_BYTES", 0)


def _hints(gm) -> list[tuple[str, str]]:
    """(norm op, the GEMM op whose weight it hints) per hinting norm, in graph order."""
    out = []
    for norm in [n for n in gm.graph.nodes if n.target in NORMS and n.kwargs.get("prefetch") is not None]:
        w = norm.kwargs["prefetch"]
        (gemm,) = {u for u in w.users if u is not norm and u.target in l2_prefetch.GEMMS}
        assert gemm.args[2] is w or gemm.args[2][0] is w  # the GEMM's (first) weight
        out.append((norm.target._schema.name, gemm.target._schema.name))
    return out


def _mine(r):
    return [d.reason for d in r.rejected if d.pattern == "l2_prefetch"]


def test_on_the_cpu_no_norm_is_hinted_and_the_report_says_why(engine_graph):
    r, out = run_pass(engine_graph, FusionConfig())
    assert _hints(out) == [] and r.counts().get("l2_prefetch", 0) == 0
    # every fused norm feeding a GEMM: the two per layer (the final norm feeds the bf16 lm_head: no candidate)
    assert _mine(r) == ["no_fused_kernel"] * (2 * LAYERS), r.render()
    assert "sm_90" in next(d.detail for d in r.rejected if d.pattern == "l2_prefetch")


def test_each_norm_hints_the_weight_of_the_gemm_after_it(engine_graph, sm90):
    r, out = run_pass(engine_graph, FusionConfig())
    assert r.counts()["l2_prefetch"] == 2 * LAYERS and not r.errors and _mine(r) == [], r.render()
    # input norm -> the qkv GEMM; post-attention norm -> gate_up with the silu-quant in its epilogue (batch 1); the
    # first layer's input norm has no residual to add
    qkv, gate_up = "fp8_fusion::blockscale_mm", "fp8_fusion::blockscale_mm_silu_mul_group_quant"
    norm, add_norm = "fp8_fusion::rms_norm_group_quant", "fp8_fusion::add_rms_norm_group_quant"
    assert _hints(out) == [(norm, qkv), (add_norm, gate_up), (add_norm, qkv), (add_norm, gate_up)]
    assert any("MB) hinted into L2" in d.detail for d in r.applied if d.pattern == "l2_prefetch")


def test_the_hf_form_hints_the_first_weight_of_a_grouped_gemm(sm90):
    r, out = run_pass(_graph("hf"), FusionConfig())
    assert r.counts()["l2_prefetch"] == 2 * LAYERS and not r.errors, r.render()
    assert {gemm for _, gemm in _hints(out)} <= {"fp8_fusion::blockscale_mm_grouped",
                                                 "fp8_fusion::blockscale_mm_silu_mul_group_quant"}


def test_more_than_one_row_and_small_weights_are_not_hinted(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "_hardware", lambda device, op: guards.OK)
    r, out = run_pass(_graph("engine", batch=2), FusionConfig())
    assert _hints(out) == [] and _mine(r) == ["prefetch_not_measured"] * (2 * LAYERS), r.render()
    assert "M=2" in next(d.detail for d in r.rejected if d.pattern == "l2_prefetch")
    r, out = run_pass(_graph("engine"), FusionConfig())  # qwen3-tiny's weights: well under 16 MB
    assert _hints(out) == [] and _mine(r) == ["prefetch_not_measured"] * (2 * LAYERS), r.render()
    assert "MB, under the 16 MB" in next(d.detail for d in r.rejected if d.pattern == "l2_prefetch")


class _FusedNormGemm(nn.Module):
    """A fused norm (the op itself) -> GEMM; ``computed``: the GEMM's weight is a copy made in the graph, after
    the norm."""

    def __init__(self, computed=False, k=256, n=256):
        super().__init__()
        self.lin = BlockLinear(k, n)
        self.w = nn.Parameter(torch.ones(k, dtype=torch.bfloat16), requires_grad=False)
        self.computed = computed

    def forward(self, x):
        q, s = ops.rms_norm_group_quant(x, self.w, 1e-6, 128)
        wq = self.lin.weight
        if self.computed:
            wq = wq.view(torch.uint8).add(0).view(torch.float8_e4m3fn)
        return ops.blockscale_mm(q, s, wq, self.lin.weight_scale_inv, torch.bfloat16)


def _fused_graph(computed=False):
    (gm,) = capture(_FusedNormGemm(computed), torch.randn(1, 256, dtype=torch.bfloat16))
    return gm


def test_switches_keep_it_off_but_deterministic_mode_does_not(sm90, monkeypatch):
    gm = _fused_graph()
    assert _hints(run_pass(gm, FusionConfig())[1]) == [("fp8_fusion::rms_norm_group_quant", "fp8_fusion::blockscale_mm")]
    assert _hints(run_pass(gm, FusionConfig.without("l2_prefetch"))[1]) == []
    monkeypatch.setenv("FP8_FUSION_DISABLE", "l2_prefetch")
    assert _hints(run_pass(gm, FusionConfig())[1]) == []
    monkeypatch.delenv("FP8_FUSION_DISABLE")
    torch.use_deterministic_algorithms(True)
    try:  # a hint changes no value: bit-exact, so it stays on
        r, out = run_pass(gm, FusionConfig())
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(_hints(out)) == 1, r.render()


def test_a_second_run_leaves_a_hinting_norm_alone(engine_graph, sm90):
    _, once = run_pass(engine_graph, FusionConfig())
    r, twice = run_pass(once, FusionConfig())
    assert _hints(twice) == _hints(once) and r.counts().get("l2_prefetch", 0) == 0 and _mine(r) == []


def test_a_weight_computed_after_the_norm_is_not_hinted(sm90):
    r, out = run_pass(_fused_graph(computed=True), FusionConfig())
    assert _hints(out) == [] and _mine(r) == ["operand_defined_later"], r.render()


def test_a_compiled_step_with_the_hint_matches_the_step_without(sm90):
    # the CPU backends take the hint and ignore it: the same values, the op's schema accepting the weight
    m = build_model("qwen3-tiny", form="engine", layers=LAYERS)
    inputs = example_inputs(m, 1, 1)
    want = torch.compile(m, backend=fp8_fusion_pass.backend(FusionConfig.without("l2_prefetch"),
                                                            fx_graph_cache=False))(*inputs)  # fmt: skip
    torch._dynamo.reset()
    got = torch.compile(m, backend=fp8_fusion_pass.backend(FusionConfig(), fx_graph_cache=False))(*inputs)
    assert fp8_fusion_pass.last_report().counts()["l2_prefetch"] == 2 * LAYERS
    assert torch.equal(got[0] if isinstance(got, tuple) else got, want[0] if isinstance(want, tuple) else want)


def test_the_pass_constant_is_the_kernel_fact():
    from fp8_fusion_pass.kernels.triton import rms_norm

    assert l2_prefetch.PREFETCH_MB * 1_000_000 == rms_norm.L2_PREFETCH_BYTES
