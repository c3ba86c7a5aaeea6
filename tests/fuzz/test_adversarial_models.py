"""Adversarial numerics through whole fused models: pathological embedding rows, fused vs unfused graph.

Qwen3-tiny (2 layers, block-FP8) in HF and engine form is compiled once with the pass (every site fused: issue 4's
counts), through ``fuzz_harness.Recorder``: each call runs the post-grad graph before and after the pass on the same
runtime arguments. Embedding rows are edited in place (a parameter: no recompile) and restored, and the perturbed
tokens placed in the input ids. Named cases are ``verify.CASES`` (random, zero rows, 1e-30, 1e4, 1e20, one outlier,
NaN, +inf) plus one row per pathology of ``adversarial_data.KINDS`` (-inf, fp8 max, bf16 max, denormals, one
outlier per group, ...); hypothesis then places 1-3 random pathologies at random positions.

Checked per output: NaN / +inf / -inf on the same positions with and without the pass, relative L2 over positions
finite in both <= MODEL_PASS_VS_NO_PASS_REL_ERR. The GPU variant (``-m gpu``) runs the same on CUDA, where the fused
ops are the Triton kernels and the unfused graph Inductor's decomposed norm: there the bound is what is tested.
"""

from __future__ import annotations

import pytest
import tolerances
import torch
from adversarial_data import KINDS, embedding_rows
from fuzz_harness import Recorder, applied_counts, float_outputs
from fuzz_stats import ADVERSARIAL_EXAMPLES, TALLY, profile
from hypothesis import given, note
from hypothesis import strategies as st

from fp8_fusion_pass import verify
from fp8_fusion_pass.models import build_model, example_inputs

REL_L2 = tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR
FUSED = {"hf": {"norm_quant": 1, "add_norm_quant": 3, "silu_quant": 2, "dedup_quant": 6},
         "engine": {"norm_quant": 1, "add_norm_quant": 3, "silu_quant": 2}}
BATCH, SEQ = 2, 5

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MODELS = [pytest.param(("hf", "cpu"), id="hf-cpu"), pytest.param(("engine", "cpu"), id="engine-cpu")] + [
    pytest.param((form, "cuda"), id=f"{form}-cuda", marks=pytest.mark.gpu) for form in ("hf", "engine")]


class Compiled:
    def __init__(self, form: str, device: str):
        self.model = build_model("qwen3-tiny", form=form, scheme="block", layers=2, device=device)
        self.inputs = example_inputs(self.model, batch=BATCH, seq=SEQ)
        self.rec = Recorder()
        torch._dynamo.reset()
        self.fn = torch.compile(self.model, backend=self.rec)
        self.call(self.inputs)
        (capture,) = self.rec.captures
        assert applied_counts(capture.report) == FUSED[form], capture.report.render()

    def call(self, inputs):
        with torch.no_grad():
            self.fn(*inputs)
        assert len(self.rec.captures) == 1, "an input edit recompiled the model"
        return self.rec.calls[-1]


@pytest.fixture(scope="module", params=MODELS)
def compiled(request):
    c = Compiled(*request.param)
    yield c
    torch._dynamo.reset()


def _check(call, case: str) -> None:
    for i, (a, b) in enumerate(zip(float_outputs(call.before), float_outputs(call.after))):
        c = verify.compare(case, str(i), a, b, REL_L2)
        what = f"{case}: rel L2 {c.rel_l2:.3g}, non-finite {c.nonfinite_without} / {c.nonfinite_with} of {c.total}"
        assert c.positions_agree, f"NaN / inf positions differ: {what}"
        assert c.ok, f"rel L2 above {REL_L2}: {what}"
        TALLY["model outputs with non-finite values" if c.nonfinite_without else "model outputs all finite"] += 1
    TALLY["model inputs (adversarial)"] += 1


@pytest.mark.parametrize("case", [c.name for c in verify.CASES])
def test_verify_cases(compiled, case):
    with next(c for c in verify.CASES if c.name == case).apply(compiled.model, compiled.inputs) as args:
        _check(compiled.call(args), case)


@pytest.mark.parametrize("kind", KINDS)
def test_each_pathology_in_one_token(compiled, kind):
    ids = compiled.inputs[0].clone()
    with embedding_rows(compiled.model, [(kind, 5)]) as (token,):
        ids[0, 2] = token  # mid-sequence in batch row 0: later positions attend to it, batch row 1 must not
        _check(compiled.call((ids, *compiled.inputs[1:])), kind)


@profile(max_examples=ADVERSARIAL_EXAMPLES)
@given(data=st.data())
def test_random_pathologies(compiled, data):
    edits = data.draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 255)), min_size=1, max_size=3))
    ids = compiled.inputs[0].clone()
    with embedding_rows(compiled.model, edits) as tokens:
        for token in tokens:
            ids[data.draw(st.integers(0, BATCH - 1)), data.draw(st.integers(0, SEQ - 1))] = token
        note(f"edits {edits} at ids {ids.tolist()}")
        _check(compiled.call((ids, *compiled.inputs[1:])), "random")
