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


def test_supersede_moves_the_rejections_of_a_node_a_later_rewrite_took():
    r = _sample()
    r.reject("group_quant", "group_quant_1", "producer_not_fusable", "input comes from aten.permute")
    r.reject("quant_gemm", "group_quant_1", "m_above_gemv", "M=16 is above the quantizing GEMV's 4 rows")
    r.supersede({"group_quant_1", "not_rejected_anywhere"}, by="rope_attention")
    assert [d.node for d in r.rejected] == ["mul_30"] and r.counts()["rejected"] == 1
    assert [(s.rejection.pattern, s.rejection.reason, s.taken_by) for s in r.superseded] == [
        ("group_quant", "producer_not_fusable", "rope_attention"), ("quant_gemm", "m_above_gemv", "rope_attention")]
    d = json.loads(r.to_json())
    assert [(x["node"], x["reason"], x["taken_by"]) for x in d["superseded"]] == [
        ("group_quant_1", "producer_not_fusable", "rope_attention"),
        ("group_quant_1", "m_above_gemv", "rope_attention")]
    line = "declined, then taken by a later rewrite: 1 group_quant -> rope_attention, 1 quant_gemm -> rope_attention"
    assert r.superseded_line() == line and line in r.render()
    assert len(report.merged([r, r]).superseded) == 4
    r.supersede(set(), by="norm_rope")  # nothing taken: nothing moves
    assert len(r.superseded) == 2 and "superseded" not in _sample().render()
