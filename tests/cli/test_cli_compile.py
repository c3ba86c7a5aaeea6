"""The verbs on real compiles of the tiny presets, each run once as a subprocess (as a user's shell runs it).

Six compiling subprocesses in all (about 2.5 minutes on 2 CPU cores); each asserts several things:
- ``diff qwen3-tiny --dump-dir`` (the README's main-job command): the diff removes the unfused ops and adds the
  fused ones, the printed table matches report.json, the fused-op count in after.txt matches the report, the
  dump files reproduce the printed diff, progress goes to stderr and no colour reaches a pipe;
- ``diff llama-tiny --form engine --scheme per-tensor --only zero_fill --dynamic --format json``: one object
  whose report and summary agree (every scale fill of the 8 per-tensor linears stripped, nothing fused),
  ``--only`` honoured, symbolic shapes in the graphs;
- ``verify qwen3-tiny``: every case within the contract, exit 0; the HF form is the one where Inductor's own
  compile moves the logits (the noise the bound widens to), so the figures there are not all zero;
- ``diff ... --cache 32 --seq 1`` in both forms and ``verify llama-tiny --form engine --cache 16``: a decode step
  over a static KV cache, where the decode-time rewrites (attention, RoPE with its cache writes) show.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter

import pytest
from cli_run import run_cli

from fp8_fusion_pass.patterns import FUSIONS

PER_TENSOR_LINEARS = 2 * 4  # llama-tiny engine form: 2 layers x (qkv, o, gate_up, down); lm_head stays bf16


def _diff_lines(stdout: str) -> tuple[list[str], list[str]]:
    body = stdout.split("\n== fusion report ==")[0].splitlines()
    removed = [line[1:] for line in body if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in body if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _count_calls(lines, op: str) -> int:
    return sum(1 for line in lines if f" = fp8_fusion.{op}(" in line)


@pytest.fixture(scope="module")
def qwen_diff(tmp_path_factory):
    dump = tmp_path_factory.mktemp("qwen3-tiny-dump")
    res = run_cli("diff", "qwen3-tiny", "--dump-dir", str(dump))
    assert res.returncode == 0, res.stderr[-3000:]
    return res, dump


def test_diff_removes_unfused_ops_and_adds_fused_ones(qwen_diff):
    res, dump = qwen_diff
    out = res.stdout
    assert out.startswith("# fp8-fusion diff: qwen3-tiny (hf form, block scheme, 2 layers, bf16, cpu)")
    assert "\033[" not in out, "colour codes in piped output"
    assert "compile 1/1: with the pass" in res.stderr and "graph(s) captured" in res.stderr
    removed, added = _diff_lines(out)
    report = json.loads((dump / "report.json").read_text())
    applied = Counter(d["pattern"] for d in report["applied"])
    # Every fusion the report applied shows up as its fused op on a + line, and never on a - line.
    fused_ops = {f.name: f.fused_op for f in FUSIONS if f.fused_op}
    # (gqa_attention: the preset's 8-token prefill has transformers' KV copy and a mask, within its token bound)
    assert set(applied) == {"dedup_quant", "norm_quant", "add_norm_quant", "silu_quant", "group_gemm",
                            "gemm_silu_quant", "norm_rope", "gqa_attention"}, report["counts"]
    # gemm_silu_quant takes each silu-quant op, and its gate/up GEMM (grouped, in the HF form), into one op
    absorbed = {"silu_quant": applied["gemm_silu_quant"], "group_gemm": applied["gemm_silu_quant"]}
    for pattern, n in applied.items():
        op = fused_ops.get(pattern)
        if op:
            assert _count_calls(added, op) == n - absorbed.get(pattern, 0), (pattern, op, n)
            assert _count_calls(removed, op) == 0
    # ... and each fusion and each dedup removed exactly one group quant (the o_proj quants stay: no norm or
    # silu before them), so the - lines hold exactly that many group_quant calls and the + lines none.
    # (group_gemm groups GEMMs, gemm_silu_quant takes a silu-quant into one, norm_rope takes the q / k norms and
    # their RoPE, gqa_attention drops the KV copies: none of them removes a group quant)
    keep_quants = ("group_gemm", "gemm_silu_quant", "norm_rope", "gqa_attention")
    assert _count_calls(removed, "group_quant") == sum(n for p, n in applied.items() if p not in keep_quants)
    assert _count_calls(added, "group_quant") == 0


def test_table_and_summary_match_the_report(qwen_diff):
    res, dump = qwen_diff
    report = json.loads((dump / "report.json").read_text())
    table = res.stdout.split("== fusion report ==")[1].split("== summary ==")[0]
    rows = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^(\w+)\s+(\d+)\s+(\d+)", table, re.M)}
    applied = Counter(d["pattern"] for d in report["applied"])
    rejected = Counter(d["pattern"] for d in report["rejected"])
    assert rows == {p: (applied[p], rejected[p]) for p in set(applied) | set(rejected)}
    fills = re.search(r"zero fills stripped: (\d+)\s+kept: (\d+)\s+replacement errors: (\d+)", table)
    assert fills and tuple(map(int, fills.groups())) == (
        len(report["fills_stripped"]), len(report["fills_kept"]), len(report["errors"]))
    assert report["errors"] == []
    # The summary's kernel-op counts are those of the dumped graphs.
    before = (dump / "before.txt").read_text().splitlines()
    after = (dump / "after.txt").read_text().splitlines()
    m = re.search(r"kernel ops in the graph:\s+(\d+) -> (\d+) \((-\d+)\)", res.stdout)
    assert m, res.stdout[-2000:]
    assert int(m[2]) < int(m[1])
    fused_calls = sum(_count_calls(after, f.fused_op) for f in FUSIONS if f.fused_op)
    # each gemm_silu_quant takes one silu_quant's op and one group_gemm's grouped gate/up GEMM into its own
    assert fused_calls == sum(applied[f.name] for f in FUSIONS if f.fused_op) - 2 * applied["gemm_silu_quant"]
    # The dumped normalised graphs reproduce the printed diff exactly.
    printed = res.stdout.split("\n== fusion report ==")[0].splitlines()[3:]  # after the 3 header lines
    redone = list(difflib.unified_diff(before[1:], after[1:], "before", "after", n=3, lineterm=""))
    assert printed == redone
    assert "class " in (dump / "after_raw.txt").read_text() and "# File:" not in (dump / "after_raw.txt").read_text()


def test_diff_json_zero_fill_only():
    res = run_cli("diff", "llama-tiny", "--form", "engine", "--scheme", "per-tensor", "--only", "zero_fill",
                  "--dynamic", "--format", "json", "-q")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.strip() == "" or "[fp8-fusion" not in res.stderr, "--quiet still printed progress"
    doc = json.loads(res.stdout)  # one object, nothing else on stdout
    assert set(doc) == {"model", "diff", "report", "summary"}
    report, summary = doc["report"], doc["summary"]
    assert doc["model"].endswith(", dynamic shapes") and re.search(r"\[s\d+", doc["diff"]), "not a dynamic graph"
    assert report["applied"] == [], "--only zero_fill must not fuse anything"
    assert report["counts"]["fills_stripped"] == len(report["fills_stripped"]) == PER_TENSOR_LINEARS
    assert report["counts"]["fills_kept"] == 0
    # Each stripped fill is one zero-fill kernel less and one allocation more; nothing else changes.
    assert summary["kernel_ops"]["before"] - summary["kernel_ops"]["after"] == PER_TENSOR_LINEARS
    assert sum(summary["ops_removed"].values()) == sum(summary["ops_added"].values()) == PER_TENSOR_LINEARS
    assert all(op.startswith("aten.empty") for op in summary["ops_added"]), summary["ops_added"]
    removed, added = _diff_lines(doc["diff"] + "\n== fusion report ==")
    assert sum(" = aten.full([1], 0," in line for line in removed) == PER_TENSOR_LINEARS, doc["diff"][:3000]
    assert sum(" = aten.empty.memory_format([1]," in line for line in added) == PER_TENSOR_LINEARS
    # The rest of the changed lines are the quant ops now reading the empty buffers, and nothing else.
    assert all("aten.full" in line or "dynamic_per_tensor_quant" in line for line in removed)


def test_verify_hf_form_within_contract():
    res = run_cli("verify", "qwen3-tiny")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    for case in ("random-1", "random-2", "zero-rows", "tiny", "large", "overflow", "outlier", "nan", "inf"):
        assert re.search(rf"^{case}\s+logits\s.*\syes\s+ok$", out, re.M), f"{case} missing or broken:\n{out}"
    assert re.search(r"report: add_norm_quant=3, dedup_quant=6, gemm_silu_quant=2, gqa_attention=2, group_gemm=4, "
                     r"norm_quant=1, norm_rope=2, silu_quant=2", out), out
    assert "ok: 9 checks within the contract" in out
    rows = {m[0]: m[1:] for m in re.findall(
        r"^([\w-]+)\s+logits\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+\s+(\d+)/\d+\s+(\d+) / (\d+)", out, re.M)}
    rel, noise, bound = (float(x) for x in rows["random-1"][:3])
    assert 0 < rel <= bound and bound == pytest.approx(max(0.05, 2 * noise), rel=0.01)  # the pass changed values
    # The nan case really put NaNs through both compiles (else it would test nothing), on the same positions.
    assert int(rows["nan"][4]) == int(rows["nan"][5]) > 0


@pytest.mark.parametrize("form, preset, batch, taken", [
    ("engine", "llama-tiny", 3, {"decode_attention": 2, "rope_cache": 2, "rope_attention": 2, "qk_rope": 2}),
    ("hf", "qwen3-tiny", 8, {"gqa_attention": 2, "rope_cache": 2, "norm_rope": 2}),  # 8 x 4 heads: 32
])  # fmt: skip
def test_diff_of_a_decode_step_shows_the_decode_rewrites(form, preset, batch, taken):
    # Without --cache a forward is a prefill (SDPA): the decode-time rewrites had no candidate to show
    res = run_cli("diff", preset, "--form", form, "--cache", "32", "--seq", "1", "--batch", str(batch),
                  "--format", "json", "-q")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert f"a decode step of batch {batch} x 1 new tokens over a 32-slot KV cache" in doc["model"], doc["model"]
    counts = doc["report"]["counts"]
    assert {k: counts.get(k) for k in taken} == taken, counts
    removed, _ = _diff_lines(doc["diff"] + "\n== fusion report ==")
    # the cache writes (HF's index_copy_ too is an index_put after the decompositions) went into the RoPE op
    assert sum(" = aten.index_put(" in line for line in removed) == 4, doc["diff"][:3000]


def test_verify_of_a_decode_step_over_the_cache():
    # Every case through the same cache: each call rewrites the step's slots before reading them, so calls repeat
    res = run_cli("verify", "llama-tiny", "--form", "engine", "--cache", "16", "--seq", "1", "--batch", "3",
                  "--cases", "random-1,nan,large")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"report: .*decode_attention=2, .*rope_attention=2", res.stdout), res.stdout
    for case in ("random-1", "nan", "large"):
        assert re.search(rf"^{case}\s+output\s.*\syes\s+ok$", res.stdout, re.MULTILINE), res.stdout


def test_verify_holds_the_decode_attention_to_exact_attention():
    # qwen3-tiny engine at one token, the "tiny" case: with vs without the pass 0.051 on torch 2.13 (the plain graph
    # rounds the scores and probabilities to bf16, fp8 quants downstream), over the 0.05 bound, the pass's output
    # 0.004 from the model with fp32 attention, the plain compile's 0.051 (CPU, 2026-12-06); 0.034 on torch 2.11,
    # within it; 0.050 on 2.12. Either way ok: within the bound, or held to the exact-attention run made for an engine
    # decode step (the rule and its text: test_cli_fast.py's test_an_output_over_its_bound_is_held_to_exact_attention)
    res = run_cli("verify", "qwen3-tiny", "--form", "engine", "--layers", "2", "--cache", "64", "--seq", "1",
                  "--cases", "random-1,tiny", "--format", "json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "eagerly with exact (fp32) attention" in res.stderr, res.stderr[-3000:]
    (tiny,) = [c for c in json.loads(res.stdout)["checks"] if c["case"] == "tiny"]
    assert tiny["ok"], tiny
    if tiny["rel_l2"] > tiny["bound"]:
        err, plain = tiny["exact"]
        assert err <= max(0.05, 1.5 * plain), tiny
    else:
        assert tiny["exact"] is None, tiny
