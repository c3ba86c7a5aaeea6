"""``benchmarks/decode.py``: ``--dry-run`` (CPU, tiny Qwen3, both forms) runs the harness end to end, so a broken
variant loop, table or accuracy check fails here and not in a GPU session; its times mean nothing.

The accuracy columns are checked as numbers: with the HF StaticCache's token count reset before the eager and
the compiled step, both start from one state, and a 2-layer model's logits agree within a few percent (before the
reset the HF eager column read 1.39 on the H200 for both compiles: two steps from different cache states)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def _dry_run(tmp_path_factory, *args: str) -> tuple[dict, str, str]:
    """``decode.py --dry-run`` on a 2-layer tiny Qwen3 at batch 1 and an 8-token prefill: (its JSON, stdout, stderr)."""
    out = str(tmp_path_factory.mktemp("json") / "d.json")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "decode.py"), "--dry-run", "--presets", "qwen3-tiny",
           "--batches", "1", "--context", "16", "--prefill", "8", "--steps", "1", "--layers", "2", "--no-bf16",
           "--json", out, *args]
    # A fresh Inductor cache: graphs served from an earlier run's cache skip the pass, and its counts with it.
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor"))}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out) as f:
        cells = json.load(f)
    assert cells["device"] == "CPU (dry run)" and "--dry-run" in cells["argv"]
    assert all(r["preset"] == "qwen3-tiny" for r in cells["rows"]), cells["rows"]
    return cells, res.stdout, res.stderr


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """Both forms, each timing path once: the engine form with ``--interleave 3`` and one more variant
    (``--also=-norm_rope``), the HF form one variant after the other (the timing path of ``issue7.sh 1``), with a
    threshold set (``--set``: gqa_attention's heads bound lowered, so batch 1's 8 copied heads take it). The stdout of
    both, then the engine run's stderr."""
    engine, engine_out, engine_err = _dry_run(tmp_path_factory, "--forms", "engine", "--interleave", "3",
                                              "--also=-norm_rope")
    hf, hf_out, _ = _dry_run(tmp_path_factory, "--forms", "hf", "--set", "guards.GQA_MIN_BATCH_HEADS=1")
    # every cell the tables show: engine (block, block+pass, block+pass-norm_rope), HF (block, block+pass), each at
    # batch 1 and the prefill
    assert len(engine["rows"]) == 6 and len(hf["rows"]) == 4, (engine["rows"], hf["rows"])
    return engine_out + hf_out, engine_err


def test_every_form_has_a_row_with_errors_against_eager(dry_run):
    dry_run, _ = dry_run
    rows = {m[0]: [float(x) for x in m[1:]] for m in re.findall(
        r"^qwen3-tiny\s+(engine|hf)\s+pass\s+1\s+\S+\s+\S+\s+\S+x\s+-\s+-\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)$",
        dry_run, re.M)}
    assert set(rows) == {"engine", "hf"}, dry_run
    for form, (pass_vs_plain, plain_vs_eager, pass_vs_eager) in rows.items():
        assert 0 <= pass_vs_plain < 0.1 and 0 <= plain_vs_eager < 0.1 and 0 <= pass_vs_eager < 0.1, (form, dry_run)


def test_the_default_pass_runs_its_whole_graph_rewrites(dry_run):
    dry_run, _ = dry_run
    fused = dict(re.findall(r"^fused \(qwen3-tiny (engine|hf)\): (\{.*\})$", dry_run, re.M))
    assert "'norm_rope': 2" in fused["engine"] and "'group_gemm'" not in fused["engine"], fused
    assert "'group_gemm': 4" in fused["hf"] and "'errors': 0" in fused["hf"], fused
    assert "'gqa_attention': 2" in fused["hf"], fused  # --set reached the pass (as committed: kv_copy_faster)
    # --also=-norm_rope: the same pass with that rewrite off, in its own rows; the q / k norms go to inline_norm
    also = dict(re.findall(r"^fused \(qwen3-tiny (engine|hf) block\+pass-norm_rope\): (\{.*\})$", dry_run, re.M))
    assert "'inline_norm': 4" in also["engine"] and "'norm_rope'" not in also["engine"], also
    assert re.search(r"^qwen3-tiny\s+engine\s+pass-norm_rope\s+1\s", dry_run, re.M), dry_run


def test_without_switches_rewrites_off():
    import decode

    config = decode.pass_config("inline_norm, group_gemm")
    assert not config.inline_norm and not config.group_gemm and config.norm_quant
    with pytest.raises(SystemExit, match="unknown fusion"):
        decode.pass_config("inline_norms")


def test_set_takes_a_number_of_the_pass_or_exits_with_the_reason(monkeypatch):
    import decode

    from fp8_fusion_pass import guards
    from fp8_fusion_pass.patterns import decode_attention

    monkeypatch.setattr(guards, "GQA_MIN_BATCH_HEADS", guards.GQA_MIN_BATCH_HEADS)  # restored after the test
    monkeypatch.setattr(decode_attention, "MAX_ROWS", decode_attention.MAX_ROWS)
    got = decode.set_thresholds(" guards.GQA_MIN_BATCH_HEADS=1, patterns.decode_attention.MAX_ROWS = 64")
    assert got == {"guards.GQA_MIN_BATCH_HEADS": 1, "patterns.decode_attention.MAX_ROWS": 64}
    assert guards.GQA_MIN_BATCH_HEADS == 1 and decode_attention.MAX_ROWS == 64 and decode.set_thresholds("") == {}
    for spec, match in [("guards.GQA_MIN_PAIR=1", "not MODULE.NAME=VALUE"),  # misspelt
                        ("guards.ENV_DISABLE=x", "not MODULE.NAME=VALUE"),  # a string, not a number
                        ("nosuch.MAX=1", "not MODULE.NAME=VALUE"), ("GQA_MIN_BATCH_HEADS=1", "not MODULE.NAME=VALUE"),
                        ("guards.GQA_MIN_BATCH_HEADS", "not MODULE.NAME=VALUE"),
                        ("guards.GQA_MIN_BATCH_HEADS=1.5", "is int")]:
        with pytest.raises(SystemExit, match=match):
            decode.set_thresholds(spec)


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_a_step_of_several_tokens_feeds_them_at_consecutive_positions(form, monkeypatch):
    # --tokens 3: a step verifying 2 draft tokens; every row's 3 tokens at --context, +1, +2 (the engine's per row)
    import decode

    from fp8_fusion_pass.models import build_model

    monkeypatch.setattr(decode, "DEVICE", "cpu")
    model = build_model("qwen3-tiny", form=form, layers=1)
    runner = (decode.EngineRunner if form == "engine" else decode.HFRunner)(model, 2, 24, 16, tokens=3)
    ids, pos = runner.args()
    assert ids.shape == (2, 3)
    want = [[16, 17, 18]] * 2 if form == "engine" else [16, 17, 18]
    assert pos.tolist() == want
    with decode.torch.no_grad():
        runner.reset()
        assert runner.step_fn()(*runner.args()).shape[:2] == (2, 3)
    with pytest.raises(SystemExit, match="--tokens takes 1-64"):
        decode.main(["--dry-run", "--tokens", "65"])


def test_variant_labels_name_their_config():
    import decode

    assert decode.variant_config("block") is None and decode.variant_config("bf16") is None
    assert decode.variant_config("block+pass") == decode.PASS_CONFIG
    config = decode.variant_config("block+pass-norm_rope+zero_fill-group_gemm")
    assert not config.norm_rope and not config.group_gemm and config.zero_fill and config.inline_norm
    assert decode.also_variant(" -norm_rope, quant_gemm") == ["block+pass-norm_rope+quant_gemm"]
    assert decode.also_variant("") == []
    for label, match in [("block+pass-norm_ropes", "unknown fusion"), ("block+pas", "expected block\\+pass"),
                         ("block+pass norm_rope", "expected block\\+pass")]:
        with pytest.raises(SystemExit, match=match):
            decode.variant_config(label)


def test_inductor_options_reach_both_compiles_or_exit_with_the_reason():
    import decode

    options = decode.inductor_options(" combo_kernels=True, triton.cudagraphs=False,coordinate_descent_tuning = 1")
    assert options == {"combo_kernels": True, "triton.cudagraphs": False, "coordinate_descent_tuning": 1}
    assert decode.inductor_options("") == {}
    for spec, match in [("combo_kernel=True", "no option 'combo_kernel'"), ("combo_kernels", "not NAME=VALUE"),
                        ("combo_kernels=yes", "not a Python literal")]:
        with pytest.raises(SystemExit, match=match):
            decode.inductor_options(spec)
    old = decode.INDUCTOR_OPTIONS
    try:
        decode.INDUCTOR_OPTIONS = {"combo_kernels": True}
        without, with_pass = decode.pass_options(None), decode.pass_options(decode.PASS_CONFIG)
    finally:
        decode.INDUCTOR_OPTIONS = old
    assert without == {"combo_kernels": True}
    assert with_pass["combo_kernels"] is True and "post_grad_custom_post_pass" in with_pass


def test_sigterm_prints_the_cells_that_finished(monkeypatch, capsys):
    # `timeout N python decode.py` ends a run that outlasts its device call: the finished cells still get their
    # table (on the H200 two HF runs lost theirs to a timeout before this)
    import os
    import signal

    import decode

    def one_cell_then_sigterm(preset, form, label, args, bw, rows, reference_logits, eager_logits, held):
        rows.append(dict(preset=preset, form=form, variant=label, batch=1, ms=2.0 if "pass" in label else 3.0,
                         roofline_ms=1.0, err="", err_eager=""))
        if "pass" in label:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(decode, "run_variant", one_cell_then_sigterm)
    monkeypatch.setattr(decode, "copy_bandwidth", lambda dry_run: 1e12)
    import torch

    with torch.enable_grad():  # main() turns grad off for the process: give later tests theirs back
        assert decode.main(["--dry-run", "--presets", "qwen3-tiny", "--forms", "hf", "--no-bf16", "--prefill",
                            "0"]) == 0  # fmt: skip
    assert torch.is_grad_enabled()
    out = capsys.readouterr()
    assert re.search(r"^qwen3-tiny\s+hf\s+pass\s+1\s+3\S*\s+2\S*\s+1\.500x", out.out, re.M), out.out
    assert "stopped (SIGTERM) after 2 cells" in out.err
    assert signal.getsignal(signal.SIGTERM) is not decode._stop  # the handler is put back


@pytest.mark.parametrize("wraps", [Exception, BaseException])
def test_sigterm_inside_a_compile_that_wraps_errors_still_prints_the_table(wraps, monkeypatch, capsys):
    # on the H200 a SIGTERM arrived while Inductor compiled, which wraps any Exception in its InductorError: the run
    # ended with a traceback and no table. Stopped is a BaseException now, and one wrapped anyway is recognised.
    import os
    import signal
    import time

    import decode
    import torch

    def sigterm_inside_a_compile(preset, form, label, args, bw, rows, reference_logits, eager_logits, held):
        rows.append(dict(preset=preset, form=form, variant=label, batch=1, ms=2.0 if "pass" in label else 3.0,
                         roofline_ms=1.0, err="", err_eager=""))
        if "pass" in label:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            except wraps as e:  # what a compile does with an error inside it
                raise RuntimeError("InductorError: wrapped") from e

    monkeypatch.setattr(decode, "run_variant", sigterm_inside_a_compile)
    monkeypatch.setattr(decode, "copy_bandwidth", lambda dry_run: 1e12)
    with torch.enable_grad():
        assert decode.main(["--dry-run", "--presets", "qwen3-tiny", "--forms", "engine", "--no-bf16", "--prefill",
                            "0"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert re.search(r"^qwen3-tiny\s+engine\s+pass\s+1\s+3\S*\s+2\S*\s+1\.500x", out.out, re.M), out.out
    assert "stopped (SIGTERM) after 2 cells" in out.err


def test_interleave_times_every_variant_in_each_round(dry_run):
    # --interleave 3 (the engine run of the fixture): every compile of a cell captured first (no dynamo reset between
    # them, so the first one's kernels stay loaded), then timed in three alternating rounds; the table has their
    # medians and a line gives the speed-up of each round. The pass's own rewrites still apply (its compile is its
    # own, not the first's).
    stdout, engine_err = dry_run
    for label in ("block+pass", "block+pass-norm_rope"):
        line = rf"^speed-up per round \(qwen3-tiny engine {re.escape(label)} batch 1\): (.*)$"
        rounds = re.search(line, stdout, re.M)
        assert rounds and len(rounds.group(1).split()) == 3, stdout
    assert re.search(r"^qwen3-tiny\s+engine\s+pass\s+1\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+x", stdout, re.M), stdout
    assert "'rope_attention': 2" in stdout and "interleaved, 3 rounds" in engine_err
    import decode

    with pytest.raises(SystemExit, match="regional compile only"):
        decode.main(["--compile", "full", "--interleave", "2"])
    with pytest.raises(SystemExit, match="rounds >= 1"):
        decode.main(["--dry-run", "--interleave", "-1"])


def test_sigterm_times_the_captured_cells_before_the_table(monkeypatch, capsys):
    # a run stopped after both compiles of a cell were captured for --interleave, before their rounds: the table
    # still has their times (one round each), not "-"
    import os
    import signal

    import decode
    import torch

    class Graph:  # what time_replays replays on the CPU (--dry-run)
        def replay(self):
            pass

    def capture_then_sigterm(preset, form, label, args, bw, rows, reference_logits, eager_logits, held):
        rows.append(dict(preset=preset, form=form, variant=label, batch=1, ms=None, roofline_ms=1.0, err="",
                         err_eager=""))
        held.append(((preset, form, 1), label, Graph(), None, None))
        if "pass" in label:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(decode, "run_variant", capture_then_sigterm)
    monkeypatch.setattr(decode, "copy_bandwidth", lambda dry_run: 1e12)
    with torch.enable_grad():
        assert decode.main(["--dry-run", "--presets", "qwen3-tiny", "--forms", "engine", "--no-bf16", "--prefill",
                            "0", "--interleave", "4"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert re.search(r"^qwen3-tiny\s+engine\s+pass\s+1\s+[\d.]+\s+[\d.]+\s+\d+\.\d+x", out.out, re.M), out.out
    assert re.search(r"^speed-up per round \(qwen3-tiny engine block\+pass batch 1\): \S+x$", out.out, re.M), out.out


def test_a_variant_without_reports_says_why():
    # A variant whose every graph came from a compile cache left no report: the summary says so, not zero counts.
    import decode

    from fp8_fusion_pass.report import FusionReport

    assert "no report" in decode.fusion_summary([])["note"]
    hit = FusionReport(graph=1, cache_hit=True)
    assert decode.fusion_summary([hit]) == {"graphs the pass ran on": 0, "served from the FX graph cache": 1}


def test_scheme_per_tensor_times_the_per_tensor_model(tmp_path_factory):
    # --scheme per-tensor: the fp8 variants ("block" labels) build per-tensor linears, and each row says so; a step
    # of 2 tokens, so the pass's plain token form takes the attention and rope_attention its RoPE (no group quant
    # to fold), and no group-quant rewrite applies
    cells, out, _ = _dry_run(tmp_path_factory, "--forms", "engine", "--layers", "1", "--tokens", "2", "--scheme",
                             "per-tensor")  # fmt: skip
    assert {r["scheme"] for r in cells["rows"]} == {"per-tensor"} and len(cells["rows"]) == 4, cells["rows"]
    fused = re.search(r"^fused \(qwen3-tiny engine\): (\{.*\})$", out, re.M).group(1)
    assert "'rope_attention': 1" in fused and "'decode_attention': 1" in fused, fused
    assert "norm_quant" not in fused and "silu_quant" not in fused and "'fills_stripped': 4" in fused, fused
