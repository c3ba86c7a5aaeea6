"""Graph fuzzing: random decoders (fuzz_models.decoder_specs) through the pass, checked against three properties.

1. Compilation never fails because of the pass, and the pass records no error.
2. Every graph either fuses or says why: the applied counts equal the oracle's (``expected_counts``, written from
   the guards' rules), the fused ops in the rewritten graph equal the report's counts, and every norm / silu /
   group_quant left in the graph is named by a rejection (``fuzz_harness.unexplained``).
3. Outputs with the pass equal outputs without it within the numerics contract: relative L2 of every floating
   output <= MODEL_PASS_VS_NO_PASS_REL_ERR over positions finite in both, NaN / +inf / -inf on the same
   positions; a graph the pass only de-duplicated (or left alone) gives bit-identical outputs.

``test_random_decoders`` runs many examples cheaply (post-grad graphs before / after the pass, executed as FX
graphs: ``fuzz_harness``); ``test_random_decoders_full_compile`` runs a few through two real Inductor compiles
(with / without the pass), which adds Inductor's lowering of the rewritten graph. Both compile with
``emulate_precision_casts`` where Inductor generates code, so its own fp32-intermediate noise (~0.05 rel L2 on
2-layer HF models, ``verify.py``) does not hide or fake a difference made by the pass.
"""

from __future__ import annotations

import contextlib

import pytest
import tolerances
import torch
from fuzz_harness import (
    FUSED,
    Recorder,
    applied_counts,
    count_ops,
    float_outputs,
    fused_op_count,
    logits,
    raw_symbols,
    unexplained,
    value_changing_rewrites,
)
from fuzz_models import DecoderSpec, build, decoder_specs, expected_counts, inputs
from fuzz_stats import REASONS, TALLY, full_compile_profile, profile
from hypothesis import example, given, note
from hypothesis import strategies as st

import fp8_fusion_pass
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass import verify

REL_L2 = tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR  # 0.05
NORM_FUSIONS = ("norm_quant", "add_norm_quant")
INPUT_CASES = ("random-1", "random-2") + tuple(c.name for c in verify.CASES if not c.name.startswith("random"))
CASES = {c.name: c for c in verify.CASES}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # transformers / Dynamo chatter on tiny configs


def _floats(spec: DecoderSpec):
    """Dynamo's float handling for the spec: ``fuse(..., dynamic=True)`` keeps eps a constant."""
    if spec.dynamic and spec.specialize_float:
        return torch._dynamo.config.patch(specialize_float=True)
    return contextlib.nullcontext()


def _calls(spec: DecoderSpec, cases: tuple[str, ...]):
    """(inputs, case name) per call: every shape with the first case, then the other cases on the last shape."""
    out = [(inputs(spec, b, s, seed=i), cases[0]) for i, (b, s) in enumerate(spec.shapes)]
    b, s = spec.shapes[-1]
    out += [(inputs(spec, b, s, seed=7), c) for c in cases[1:]]
    return out


def check_graph(spec: DecoderSpec, capture) -> None:
    report = capture.report
    note(report.render())
    assert report.inference and not report.errors, report.render()
    assert applied_counts(report) == expected_counts(spec), report.render()
    for name, op in FUSED.items():  # the report tells the truth about the graph
        assert count_ops(capture.after, op) == fused_op_count(report, name), name
    assert unexplained(capture) == [], report.render()
    left = {n.name for n in capture.after.graph.nodes}  # a superseded rejection's node was taken: gone
    assert not left & {s.rejection.node for s in report.superseded}, report.render()
    missing_meta = [n.name for n in capture.after.graph.nodes if n.op == "call_function" and "val" not in n.meta]
    assert not missing_meta, f"nodes without meta['val'] (Inductor's lowering needs it): {missing_meta}"
    assert not raw_symbols(capture.after), raw_symbols(capture.after)
    TALLY["graphs"] += 1
    for name, n in applied_counts(report).items():
        TALLY[f"applied {name}"] += n
    REASONS.update(d.reason for d in report.rejected)


def check_outputs(case: str, without: tuple, with_pass: tuple, bit_exact: bool) -> None:
    pairs = list(zip(float_outputs(without), float_outputs(with_pass)))
    assert pairs and len(float_outputs(without)) == len(float_outputs(with_pass))
    for i, (a, b) in enumerate(pairs):
        c = verify.compare(case, str(i), a, b, REL_L2)
        note(f"{case} output {i}: rel L2 {c.rel_l2:.3g}, non-finite {c.nonfinite_without} / {c.nonfinite_with}")
        assert c.positions_agree, f"{case}: NaN / inf positions differ ({c.nonfinite_without} vs {c.nonfinite_with})"
        assert c.ok, f"{case}: rel L2 {c.rel_l2:.4g} > {REL_L2}"
        if bit_exact:
            assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), f"{case}: not bit-exact, nothing was fused"
        TALLY["bit-exact outputs" if torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) else "outputs within bound"] += 1


@profile()
@given(spec=decoder_specs(), cases=st.lists(st.sampled_from(INPUT_CASES), min_size=1, max_size=3, unique=True))
@example(  # issue 4's shape of model: every site fuses; a NaN and an all-zero-rows input on top
    spec=DecoderSpec("qwen3", "hf", 256, 512, 4, 2, 64, 2, 1e-6, False, False, "bf16", False, False, ((2, 5),)),
    cases=("random-1", "nan", "zero-rows"),
)
@example(  # biases everywhere, 3 layers, dynamic shapes with eps kept constant (fuse(..., dynamic=True)), odd M
    spec=DecoderSpec("llama", "hf", 256, 256, 2, 1, 128, 3, 1e-5, True, True, "bf16", True, True, ((3, 5), (2, 7))),
    cases=("random-1", "inf"),
)
@example(  # Qwen2 (q/k/v bias), dynamic=True without specialized floats: eps is a graph input, norms stay
    spec=DecoderSpec("qwen2", "hf", 256, 384, 2, 1, 128, 2, 1e-6, True, False, "bf16", True, False, ((2, 3),)),
    cases=("random-1",),
)
@example(  # found by the long profile: engine form, hidden 96 (no quant anywhere), so inline_norm takes every norm
    spec=DecoderSpec("llama", "engine", 96, 128, 1, 1, 32, 1, 1e-6, False, False, "bf16", False, False, ((1, 1),)),
    cases=("random-1",),
)
def test_random_decoders(spec: DecoderSpec, cases: list[str]):
    note(spec.short())
    model = build(spec)
    rec = Recorder()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=rec, dynamic=spec.dynamic)
    with torch.no_grad(), _floats(spec):
        for args, case in _calls(spec, tuple(cases)):
            with CASES[case].apply(model, args) as case_args:
                compiled(*case_args)
    assert rec.captures and rec.calls
    for capture in rec.captures:
        check_graph(spec, capture)
    for i, (call, (_, case)) in enumerate(zip(rec.calls, _calls(spec, tuple(cases)))):
        check_outputs(case, call.before, call.after, bit_exact=not value_changing_rewrites(call.capture.report))
        TALLY["inputs"] += 1
        TALLY[f"inputs {case}"] += 1
    TALLY["models"] += 1
    for key in (spec.family, spec.form, spec.dtype, "dynamic" if spec.dynamic else "static", f"{spec.layers} layer(s)",
                "hidden % 128 != 0" if spec.hidden % 128 else "hidden % 128 == 0"):
        TALLY[f"models {key}"] += 1
    TALLY["models " + ("fusing" if any(applied_counts(c.report).keys() - {"dedup_quant"}
                                       for c in rec.captures) else "not fusing")] += 1


# ---------------------------------------------------------------- two real Inductor compiles


def _compiled_logits(model, spec: DecoderSpec, backend, calls) -> list[torch.Tensor]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=spec.dynamic)
    with torch.no_grad(), _floats(spec):
        return [logits(compiled(*args)).float() for args in calls]


@full_compile_profile()
@given(spec=decoder_specs(max_layers=2))
@example(spec=DecoderSpec("llama", "engine", 256, 256, 2, 1, 128, 2, 1e-5, True, False, "bf16", True, False,
                          ((3, 5), (1, 7))))
def test_random_decoders_full_compile(spec: DecoderSpec):
    """With / without the pass through Inductor's codegen: compiles, fuses as the oracle says, same numerics."""
    note(spec.short())
    model = build(spec)
    calls = [inputs(spec, b, s, seed=i) for i, (b, s) in enumerate(spec.shapes)]
    # fx_graph_cache off: a cache hit skips the pass (no report to check); the kernel code cache stays on.
    options = {"emulate_precision_casts": True, "fx_graph_cache": False}
    without = _compiled_logits(model, spec, lambda gm, ex: _inductor(gm, ex, options), calls)
    report_mod.clear_reports()
    with_pass = _compiled_logits(model, spec, fp8_fusion_pass.backend(**options), calls)
    reports = report_mod.all_reports()
    assert reports, "the pass never ran"
    for report in reports:
        note(report.render())
        assert not report.errors and applied_counts(report) == expected_counts(spec), report.render()
    for a, b in zip(without, with_pass):
        c = verify.compare("full-compile", "logits", a, b, REL_L2)
        assert c.positions_agree and c.ok, c
    TALLY["full compiles (with + without)"] += 1


def _inductor(gm, example_inputs, options):
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=options)
