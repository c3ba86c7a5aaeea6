"""FP8FusionPass itself: uuid and the FX graph cache, failure isolation, training graphs, lazy thread-safe tracing,
the pre-2.13 convert folding, one log line per compile."""

from __future__ import annotations

import json
import logging
import threading
import warnings

import pytest
import tolerances
import torch
from pattern_helpers import FUSIONS_ONLY, NormLinear, capture, count, graph_text, run_pass

import fp8_fusion_pass
from fp8_fusion_pass import fusion_pass
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.patterns import _site, _trace

BF16 = torch.bfloat16


def x3(b=2, s=3):
    return torch.randn(b, s, 256, dtype=BF16, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def op_graph():
    return capture(NormLinear(form="op"), x3())[0]


# ---------------------------------------------------------------- uuid


def test_uuid_is_stable_and_follows_config_env_and_determinism(monkeypatch):
    monkeypatch.delenv("FP8_FUSION_DISABLE", raising=False)
    base = fusion_pass.FP8FusionPass().uuid()
    assert base == fusion_pass.FP8FusionPass(FusionConfig()).uuid()
    assert base != fusion_pass.FP8FusionPass(FusionConfig(norm_quant=False)).uuid()
    assert base != fusion_pass.FP8FusionPass(FusionConfig(group_sizes=(128,))).uuid()
    monkeypatch.setenv("FP8_FUSION_DISABLE", "silu_quant")
    assert base != fusion_pass.FP8FusionPass().uuid()
    monkeypatch.setenv("FP8_FUSION_DISABLE", "not_a_fusion")  # malformed: still a uuid, never an exception
    assert fusion_pass.FP8FusionPass().uuid() not in (base, None)
    monkeypatch.delenv("FP8_FUSION_DISABLE")
    torch.use_deterministic_algorithms(True)
    try:
        assert base != fusion_pass.FP8FusionPass().uuid()
    finally:
        torch.use_deterministic_algorithms(False)


def test_uuid_follows_the_pattern_sources(monkeypatch, tmp_path):
    names = {str(p.relative_to(fusion_pass.PACKAGE)) for p in fusion_pass.hashed_files()}
    assert {"fusion_pass.py", "guards.py", "patterns/norm_quant.py", "patterns/silu_quant.py",
            "patterns/dedup_quant.py", "patterns/__init__.py", "kernels/ops.py"} <= names
    src = tmp_path / "pattern.py"
    src.write_text("A = 1\n")
    files = fusion_pass.hashed_files() + [src]
    monkeypatch.setattr(fusion_pass, "hashed_files", lambda: files)
    before = fusion_pass.FP8FusionPass().uuid()
    src.write_text("A = 2\n")
    assert fusion_pass.FP8FusionPass().uuid() != before


def test_fx_graph_cache_hit_skips_the_pass_and_a_new_config_misses(monkeypatch, tmp_path):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    m, x = NormLinear(form="op"), x3()

    def compile_once(config):
        torch._dynamo.reset()
        counters.clear()
        report_mod.clear_reports()
        with torch.no_grad():
            torch.compile(m, backend=fp8_fusion_pass.backend(config))(x)
        return counters["inductor"]["fxgraph_cache_hit"], [r.cache_hit for r in report_mod.all_reports()]

    assert compile_once(FusionConfig()) == (0, [False])  # miss: the pass ran and reported
    # same uuid: served from the cache, the pass did not run; the backend's report says so (cache_hit)
    assert compile_once(FusionConfig()) == (1, [True])
    assert compile_once(FusionConfig(norm_quant=False)) == (0, [False])  # new uuid: compiled again
    torch._dynamo.reset()


# ---------------------------------------------------------------- failure isolation


@pytest.mark.parametrize("stage", ["guard", "replacement"])
def test_a_raising_stage_leaves_the_match_and_warns_once(op_graph, stage):
    fusion_pass._WARNED.clear()
    with fusion_pass.inject_failure(stage, "norm_quant"):
        with pytest.warns(UserWarning, match=f"norm_quant {stage} raised RuntimeError"):
            r, gm = run_pass(op_graph)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second failure of the same kind is only in the report
            r2, _ = run_pass(op_graph)
    assert graph_text(gm) == graph_text(op_graph)
    assert [(e.pattern, e.reason) for e in r.errors] == [("norm_quant", "replacement_failed")]
    assert f"{stage} raised RuntimeError: injected" in r.errors[0].detail
    assert not r.applied and len(r2.errors) == 1
    assert run_pass(op_graph)[0].counts()["norm_quant"] == 1  # hook gone: fuses again


def test_injected_failure_compiles_and_matches_the_unfused_model():
    m, x = NormLinear(form="op"), x3()
    fusion_pass._WARNED.clear()
    torch._dynamo.reset()
    with torch.no_grad(), fusion_pass.inject_failure("replacement", "norm_quant"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # FUSIONS_ONLY: inline_norm would hand the norm the failure left to Inductor, which rounds differently
        got = torch.compile(m, backend=fp8_fusion_pass.backend(FUSIONS_ONLY, fx_graph_cache=False))(x)
    torch._dynamo.reset()
    assert len(fp8_fusion_pass.last_report().errors) == 1
    assert torch.equal(got, m(x))


def test_a_stage_that_raises_is_isolated(op_graph, monkeypatch):
    # e.g. a pattern that no longer traces on some torch version: the other stages still run, the compile goes on
    def broken():
        raise RuntimeError("cannot trace")

    monkeypatch.setattr(fusion_pass, "_traced", broken)
    fusion_pass._WARNED.clear()
    with pytest.warns(UserWarning, match="fusions stage raised RuntimeError"):
        r, gm = run_pass(op_graph)
    assert [(e.pattern, e.node) for e in r.errors] == [("fusions", "(graph)")]
    assert graph_text(gm) == graph_text(op_graph)
    assert r.rejection_reasons() == {"unrecognized_spelling": 1}  # the why-not scan still explains the norm


def _stage_names(graph) -> list[str]:
    return [name for name, _ in fusion_pass._Run(graph, FusionConfig(), True).stages()]


def test_the_stages_run_in_the_order_of_the_fusions_table(op_graph, monkeypatch):
    from fp8_fusion_pass.patterns import FUSIONS

    graph_rows = [f.name for f in FUSIONS if f.stage == "graph"]
    assert _stage_names(op_graph.graph) == ["dedup_quant", "fusions", "why-not scan", *graph_rows, "zero_fill"]
    # the attention's launch takes the o_proj quant before quant_gemm may (patterns/__init__.py says why)
    assert graph_rows.index("rope_attention") < graph_rows.index("quant_gemm")
    # one table sets the order: moving a row moves its stage, nothing else to edit
    moved = tuple(f for f in FUSIONS if f.name != "quant_gemm")
    moved = moved[:3] + (next(f for f in FUSIONS if f.name == "quant_gemm"),) + moved[3:]
    monkeypatch.setattr(fusion_pass, "FUSIONS", moved)
    assert _stage_names(op_graph.graph)[:4] == ["dedup_quant", "fusions", "why-not scan", "quant_gemm"]


def test_a_fusion_row_with_an_unknown_stage_is_refused_where_it_is_written():
    from fp8_fusion_pass.patterns import Fusion

    with pytest.raises(ValueError, match="stage 'grpah'"):
        Fusion("x", "x", "x", None, False, "grpah")


def test_inject_failure_rejects_unknown_stages():
    with pytest.raises(ValueError):
        with fusion_pass.inject_failure("match", "norm_quant"):
            pass


# ---------------------------------------------------------------- training graphs


class _Trainable(NormLinear):
    """The quantized path needs no gradient; a trainable bf16 head after it does."""

    def __init__(self):
        super().__init__(form="op")
        self.head = torch.nn.Linear(256, 256, dtype=BF16)

    def forward(self, x):
        return self.head(super().forward(x))


def test_training_graphs_are_left_alone_and_still_compile():
    m = _Trainable().train()
    torch._dynamo.reset()
    report_mod.clear_reports()
    out = torch.compile(m, backend=fp8_fusion_pass.backend(fx_graph_cache=False))(x3())
    out.float().sum().backward()  # the compiled backward works
    torch._dynamo.reset()
    reports = report_mod.all_reports()
    assert reports and all(not r.inference and not r.applied for r in reports)
    assert all("not an inference graph" in r.notes[0] for r in reports)
    assert m.head.weight.grad is not None


def test_is_inference_fallback_for_torch_2_11(op_graph):
    def post_grad_passes(gm, is_inference):  # the name and argument of Inductor's caller, 2.1 - 2.15
        return fusion_pass._is_inference(gm.graph)

    assert post_grad_passes(op_graph, True) is True
    assert post_grad_passes(op_graph, False) is False
    g = torch.fx.Graph()
    g.placeholder("tangents_1")
    assert fusion_pass._is_inference(g) is False  # no caller frame: a graph with tangents is a backward graph


def test_not_inference_flag_leaves_the_graph(op_graph):
    r, gm = run_pass(op_graph, is_inference=False)
    assert graph_text(gm) == graph_text(op_graph) and not r.inference and not r.applied and not r.rejected


# ---------------------------------------------------------------- lazy, thread-safe tracing


def test_patterns_are_traced_once_across_threads(monkeypatch):
    calls = []
    original = _site.Form.patterns
    monkeypatch.setattr(_site.Form, "patterns", lambda self: calls.append(self.name) or original(self))
    monkeypatch.setattr(fusion_pass, "_TRACED", None)
    results = []
    threads = [threading.Thread(target=lambda: results.append(fusion_pass._traced())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert len(calls) == 6  # (add_norm, norm) x (op, torch) + silu x (op, torch): once each


def test_importing_traces_nothing():
    import subprocess
    import sys

    code = ("import torch, fp8_fusion_pass.backend, fp8_fusion_pass.fusion_pass as f; "
            "assert f._TRACED is None; assert torch._inductor.config.post_grad_custom_post_pass is None")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------- version spellings, logging, report


def test_fold_round_trips_gives_the_pre_2_13_spelling():
    def f(x):
        return (x.float().to(BF16).float() * 2).to(BF16)

    x = torch.randn(4, 8, dtype=BF16)
    kept = _trace.trace(f, [x])
    folded = _trace.trace(f, [x], fold=True)
    converts = torch.ops.prims.convert_element_type.default
    assert count(kept, converts) == 4 and count(folded, converts) == 2
    assert torch.equal(kept(x), f(x))
    assert folded(x).dtype == BF16


def test_one_info_line_per_compile_and_a_json_report(op_graph, caplog):
    with caplog.at_level(logging.INFO, logger="fp8_fusion_pass"):
        r, _ = run_pass(op_graph)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "fp8_fusion_pass"]
    assert lines == [r.summary_line()] and "norm_quant=1" in lines[0]
    d = json.loads(r.to_json())
    assert d["counts"]["norm_quant"] == 1 and d["applied"][0]["pattern"] == "norm_quant"
    assert d["applied"][0]["shapes"] == "x[2, 3, 256] q_in[6, 256]" and d["applied"][0]["dtype"] == "bfloat16"


def test_pass_object_in_options_works_directly():
    m, x = NormLinear(form="hf"), x3()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(m, options={"post_grad_custom_post_pass": fusion_pass.FP8FusionPass(),
                                        "fx_graph_cache": False})(x)
    torch._dynamo.reset()
    assert fp8_fusion_pass.last_report().counts()["norm_quant"] == 1
    want = m(x).float()
    assert ((got.float() - want).norm() / want.norm()) < tolerances.MODEL_PASS_VS_NO_PASS_REL_ERR
