"""gemm_silu_quant: a gate/up GEMM and the silu-quant after it become one blockscale_mm_silu_mul_group_quant
(FusionConfig(gemm_silu_quant=True), the default)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pattern_helpers import FUSIONS_ONLY, BlockLinear, capture, compile_model, count, run_pass
from torch import nn

from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.models import build_model, example_inputs

ops = torch.ops.fp8_fusion
FUSED = ops.blockscale_mm_silu_mul_group_quant.default
LAYERS = 2
EPILOGUE = dataclasses.replace(FUSIONS_ONLY, gemm_silu_quant=True)  # this rewrite alone on top of the fusions


def _graph(form, batch=2, seq=5, layers=LAYERS):
    m = build_model("qwen3-tiny", form=form, layers=layers)
    (gm,) = capture(m, *example_inputs(m, batch, seq))
    return gm


@pytest.fixture(scope="module")
def engine_graph():
    return _graph("engine")


@pytest.fixture(scope="module")
def hf_graph():
    return _graph("hf")


def _weights_of(gm):
    return [len(n.args[2]) for n in gm.graph.nodes if n.target is FUSED]


def test_engine_gate_up_takes_the_silu_quant(engine_graph):
    r, gm = run_pass(engine_graph, EPILOGUE)
    assert r.counts()["gemm_silu_quant"] == LAYERS, r.render()
    assert count(gm, ops.silu_mul_group_quant.default) == 0
    assert _weights_of(gm) == [1] * LAYERS  # the merged gate_up_proj weight
    # per layer: qkv, o, down stay block-scale GEMMs; gate_up is inside the fused op
    assert count(gm, ops.blockscale_mm.default) == 3 * LAYERS
    assert not r.errors and not r.notes
    _, plain = run_pass(engine_graph, FusionConfig())
    assert count(plain, FUSED) == LAYERS  # on by default


def test_hf_grouped_gate_up_takes_it_too(hf_graph):
    r, gm = run_pass(hf_graph, FusionConfig())
    assert r.counts()["gemm_silu_quant"] == LAYERS and r.counts()["group_gemm"] == 2 * LAYERS, r.render()
    assert _weights_of(gm) == [2] * LAYERS  # gate_proj and up_proj, read in place
    assert count(gm, ops.silu_mul_group_quant.default) == 0
    assert count(gm, ops.blockscale_mm_grouped.default) == LAYERS  # q / k / v only
    # without group_gemm the HF silu-quant reads cat([gate, up]): not a GEMM output, nothing to take
    r, gm = run_pass(hf_graph, EPILOGUE)
    assert "gemm_silu_quant" not in r.counts() and count(gm, FUSED) == 0


def test_deterministic_mode_and_the_switches_keep_it_off(engine_graph, monkeypatch):
    torch.use_deterministic_algorithms(True)
    try:
        r, _ = run_pass(engine_graph, EPILOGUE)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "gemm_silu_quant" not in r.counts()
    r, gm = run_pass(engine_graph, FusionConfig.without("gemm_silu_quant"))
    assert count(gm, FUSED) == 0 and count(gm, ops.silu_mul_group_quant.default) == LAYERS
    monkeypatch.setenv("FP8_FUSION_DISABLE", "gemm_silu_quant")
    r, gm = run_pass(engine_graph, FusionConfig())
    assert count(gm, FUSED) == 0


def test_static_prefill_graphs_keep_two_launches():
    r, gm = run_pass(_graph("engine", batch=1, seq=65, layers=1), EPILOGUE)
    assert count(gm, FUSED) == 0
    assert [(d.pattern, d.reason) for d in r.rejected if d.pattern == "gemm_silu_quant"] == [
        ("gemm_silu_quant", "m_above_small_m")], r.render()


def test_dynamic_batch_is_fused():
    m = build_model("qwen3-tiny", form="engine", layers=1)
    (gm,) = capture(m, *example_inputs(m, 2, 5), dynamic=True)
    r, out = run_pass(gm, EPILOGUE)
    assert count(out, FUSED) == 1, r.render()
    (node,) = [n for n in out.graph.nodes if n.target is FUSED]
    assert not isinstance(node.args[0].meta["val"].shape[0], int)  # the op decides per call


class _GateUpDown(nn.Module):
    """gate_up (block-FP8) -> silu_and_mul -> down (block-FP8); ``tap`` also returns the gate_up output."""

    def __init__(self, tap=False):
        super().__init__()
        self.gate_up, self.down, self.tap = BlockLinear(256, 512, seed=1), BlockLinear(256, 256, seed=2), tap

    def forward(self, x):
        y = self.gate_up(x)
        out = self.down(ops.silu_and_mul(y))
        return (out, y) if self.tap else out


def test_a_gemm_output_with_another_consumer_is_left_alone():
    (gm,) = capture(_GateUpDown(tap=True), torch.randn(3, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, EPILOGUE)
    assert count(out, FUSED) == 0 and r.counts()["silu_quant"] == 1
    assert [d.reason for d in r.rejected if d.pattern == "gemm_silu_quant"] == ["extra_consumer"], r.render()


def test_on_a_backend_without_the_fused_kernel_it_is_rejected(monkeypatch):
    (gm,) = capture(_GateUpDown(), torch.randn(3, 256, dtype=torch.bfloat16))
    real = backends.backend_for
    monkeypatch.setattr(backends, "backend_for",
                        lambda op, device: "aiter" if op == "blockscale_mm" else real(op, device))  # fmt: skip
    r, out = run_pass(gm, EPILOGUE)
    assert count(out, FUSED) == 0
    (d,) = [d for d in r.rejected if d.pattern == "gemm_silu_quant"]
    assert d.reason == "no_fused_kernel" and "aiter" in d.detail, r.render()


def test_on_triton_only_a_measured_win_is_fused(monkeypatch):
    from fp8_fusion_pass import arch
    from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
    from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig

    (gm,) = capture(_GateUpDown(), torch.randn(3, 256, dtype=torch.bfloat16))
    key = (arch.arch_of("cpu").name, 4, 256, 256)

    def rejection():
        with backends.use_backend("triton"):
            r, out = run_pass(gm, EPILOGUE)
        found = [d for d in r.rejected if d.pattern == "gemm_silu_quant"]
        return count(out, FUSED), found[0] if found else None, r

    n, d, r = rejection()  # no row for this GEMM: never measured, not assumed faster
    assert n == 0 and d.reason == "unfused_pair_faster" and "never measured" in d.detail, r.render()
    monkeypatch.setitem(bsq.TABLE, key, None)  # measured: the two launches won
    n, d, r = rejection()
    assert n == 0 and "M=3, I=256, K=256" in d.detail and "no faster" in d.detail, r.render()
    monkeypatch.setitem(bsq.TABLE, key, SmallMConfig(128, 1, 4, 2, "last"))  # measured: the fused launch won
    n, d, r = rejection()
    assert n == 1 and d is None, r.render()


class _SplitGateUp(nn.Module):
    """Two gate / up block-FP8 GEMMs of one activation (grouped by group_gemm) -> silu(gate) * up -> down."""

    def __init__(self, gate_n=256, up_n=256):
        super().__init__()
        self.gate, self.up = BlockLinear(256, gate_n, seed=1), BlockLinear(256, up_n, seed=2)
        self.down = BlockLinear(256, 256, seed=3)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def test_hf_split_form_is_taken_with_both_weights():
    (gm,) = capture(_SplitGateUp(), torch.randn(3, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, FusionConfig())
    assert r.counts().get("gemm_silu_quant") == 1 and _weights_of(out) == [2], r.render()


def test_grouped_gemms_that_are_not_the_silus_halves_are_left_alone():
    class Uneven(nn.Module):  # silu_and_mul of [a (384) | b (128)]: its halves are 256 + 256, not a and b
        def __init__(self):
            super().__init__()
            self.a, self.b = BlockLinear(256, 384, seed=1), BlockLinear(256, 128, seed=2)
            self.down = BlockLinear(256, 256, seed=3)

        def forward(self, x):
            return self.down(ops.silu_and_mul(torch.cat([self.a(x), self.b(x)], -1)))

    (gm,) = capture(Uneven(), torch.randn(3, 256, dtype=torch.bfloat16))
    r, out = run_pass(gm, FusionConfig())
    assert r.counts().get("group_gemm") == 1 and count(out, FUSED) == 0, r.render()
    (d,) = [d for d in r.rejected if d.pattern == "gemm_silu_quant"]
    assert d.reason == "unrecognized_spelling" and "(384, 256), (128, 256)" in d.detail, r.render()


def test_a_merged_weight_whose_halves_share_a_scale_block_stays_two_launches_on_triton(monkeypatch):
    from fp8_fusion_pass import arch
    from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
    from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig

    class Merged192(nn.Module):  # gate_up [384, 256]: I = 192, its 128-row scale block 1 spans gate and up
        def __init__(self):
            super().__init__()
            self.gate_up, self.down = BlockLinear(256, 384, seed=1), BlockLinear(192, 256, 64, seed=2)

        def forward(self, x):
            return self.down(ops.silu_and_mul(self.gate_up(x)))

    (gm,) = capture(Merged192(), torch.randn(3, 256, dtype=torch.bfloat16))
    monkeypatch.setitem(bsq.TABLE, (arch.arch_of("cpu").name, 4, 192, 256), SmallMConfig(64, 1, 4, 2, "last"))
    with backends.use_backend("triton"):
        r, out = run_pass(gm, EPILOGUE)
    (d,) = [d for d in r.rejected if d.pattern == "gemm_silu_quant"]
    assert count(out, FUSED) == 0 and d.reason == "no_fused_kernel" and "multiple of 128" in d.detail, r.render()
    r, out = run_pass(gm, EPILOGUE)  # the reference backend composes the unfused ops: any layout
    assert count(out, FUSED) == 1, r.render()


def test_one_site_that_fails_to_rewrite_leaves_the_others(monkeypatch, engine_graph):
    from fp8_fusion_pass.patterns import gemm_silu_quant

    real, calls = gemm_silu_quant.rewrite, []

    def first_fails(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(*args)

    monkeypatch.setattr(gemm_silu_quant, "rewrite", first_fails)
    r, gm = run_pass(engine_graph, EPILOGUE)
    assert count(gm, FUSED) == LAYERS - 1 and count(gm, ops.silu_mul_group_quant.default) == 1
    assert [e.detail for e in r.errors] == ["replacement raised RuntimeError: injected"], r.render()


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_whole_model_outputs_are_unchanged_on_the_reference_backend(form):
    # On the CPU the fused op is the reference GEMM then the reference silu-quant: the logits are bit-identical.
    m = build_model("qwen3-tiny", form=form, layers=LAYERS)
    inputs = example_inputs(m, 2, 5)
    plain, counts = compile_model(m, inputs, FusionConfig.without("gemm_silu_quant"))
    assert "gemm_silu_quant" not in counts
    fused, counts = compile_model(m, inputs, FusionConfig())
    assert counts["gemm_silu_quant"] == LAYERS
    assert torch.equal(fused, plain)

