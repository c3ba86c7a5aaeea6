"""FusionReport: counts, the one-line summary, JSON, merging."""

from __future__ import annotations

import json

from fp8_fusion_pass import report


def _sample() -> report.FusionReport:
    r = report.FusionReport(graph=7, config="cfg")
    r.apply("norm_quant", "mul_1", "x[16, 4096]", "bfloat16")
    r.apply("silu_quant", "mul_9")
    r.reject("norm_quant", "mul_30", "no_quant_consumer", "mul_30 feeds aten.mm")
    r.strip_fill("full_0", "fp8_fusion.dynamic_per_tensor_quant")
    r.keep_fill("full_1", "fill_other_reader", "aten.add reads it")
    return r


def test_counts_and_reasons():
    r = _sample()
    assert r.counts() == {"norm_quant": 1, "silu_quant": 1, "fills_stripped": 1, "fills_kept": 1, "rejected": 1,
                          "errors": 0}
    assert r.rejection_reasons() == {"no_quant_consumer": 1}


def test_summary_line():
    assert report.FusionReport(graph=1).summary_line() == (
        "fp8_fusion_pass graph 1: fused [none]; rejected 0; fills stripped 0, kept 0")
    line = _sample().summary_line()
    assert line.startswith("fp8_fusion_pass graph 7: fused [norm_quant=1, silu_quant=1]; rejected 1 ")
    assert "no_quant_consumer" in line and "fills stripped 1, kept 1" in line
    training = report.FusionReport(graph=2, inference=False)
    assert training.summary_line().endswith("not an inference graph: left alone")


def test_json_round_trip_keeps_every_decision():
    d = json.loads(_sample().to_json())
    assert d["schema_version"] == report.SCHEMA_VERSION and d["counts"]["norm_quant"] == 1
    assert [x["reason"] for x in d["rejected"]] == ["no_quant_consumer"]
    assert [x["reason"] for x in d["fills_kept"]] == ["fill_other_reader"]


def test_merged_sums_graphs():
    m = report.merged([_sample(), _sample()])
    assert m.counts()["norm_quant"] == 2 and m.counts()["rejected"] == 2


def test_render_lists_rejections_with_reasons():
    text = _sample().render()
    assert "no_quant_consumer" in text and "mul_30 feeds aten.mm" in text and "fill_other_reader" in text


def test_settle_rejects_rewrites_or_records_the_error():
    from fp8_fusion_pass import guards

    r = report.FusionReport(graph=1)
    r.settle("p", "a", "x[4]", "bfloat16", guards.reject("dtype_not_bf16", "fp32 input"), "left alone", str, "never")
    r.settle("p", "b", "x[4]", "bfloat16", guards.OK, "left alone", lambda d: f"fused {d}", "once")
    r.settle("p", "c", "x[4]", "bfloat16", guards.OK, "left alone", lambda: 1 / 0)
    assert [(d.node, d.reason, d.detail) for d in r.rejected] == [("a", "dtype_not_bf16", "fp32 input: left alone")]
    assert [(d.node, d.detail) for d in r.applied] == [("b", "fused once")]
    assert [d.node for d in r.errors] == ["c"] and "ZeroDivisionError" in r.errors[0].detail
