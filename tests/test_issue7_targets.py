"""``benchmarks/issue7_targets.py`` and ``benchmarks/issue7.sh targets``: the targets table from one run's raw
outputs, with docs/benchmarks.md's thresholds. The kernel rows are checked on the committed CSV of the H200 run
of 2026-12-05, whose figures the page quotes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import issue7_targets as it  # noqa: E402


def _decode_rows(preset, form, batch, no_pass, with_pass, bf16=None, per_round=None):
    rows = [{"preset": preset, "form": form, "variant": "block", "batch": batch, "ms": no_pass},
            {"preset": preset, "form": form, "variant": "block+pass", "batch": batch, "ms": with_pass}]
    if per_round:
        rows[1]["per_round"] = per_round
    if bf16:
        rows.append({"preset": preset, "form": form, "variant": "bf16", "batch": batch, "ms": bf16})
    return rows


def test_kernel_targets_on_the_committed_h200_csv():
    rows = it.load_kernels(str(ROOT / "docs" / "img" / "kernels_h200_98347f3.csv"))
    peer, roofline = it.kernel_targets(rows)
    assert peer.met and peer.measured.startswith("0 of 150 slower; worst fused / best peer 0.74x")
    assert not roofline.met and roofline.measured.startswith("35 of 50; worst 3.36x (silu_mul_group_quant K=384")
    assert "1.11x of the read floor" in roofline.measured


def test_one_decode_cell_under_the_line_fails_the_target_and_is_named():
    rows = (_decode_rows("qwen3-32b", "engine", 1, 10.281, 9.353, per_round=[1.0989, 1.0992])
            + _decode_rows("qwen3-32b", "engine", 8, 11.464, 10.263)
            + _decode_rows("qwen3-32b", "engine", "prefill 2048", 40.0, 39.0))
    decode, prefill = it.decode_targets(rows)
    assert not decode.met and decode.measured.endswith("below 1.10x: qwen3-32b b1 1.099x")
    assert "1.099x (b1; 2 rounds 1.099-1.099x)" in decode.measured and "1.117x (b8)" in decode.measured
    assert prefill.met and prefill.measured == "qwen3-32b 1.026x faster"
    assert it.decode_targets(_decode_rows("qwen3-8b", "hf", 1, 3.3, 2.9))[0].met


def test_bf16_target_needs_batch_1_at_1_5x_and_every_batch_faster():
    rows = _decode_rows("llama3.1-8b", "engine", 1, 3.0, 2.6, bf16=4.0) + _decode_rows(
        "llama3.1-8b", "engine", 64, 5.0, 4.3, bf16=4.2)  # bf16 faster at batch 64
    bf16 = it.decode_targets(rows)[-1]
    assert not bf16.met and "1.538x at batch 1" in bf16.measured
    assert it.decode_targets(rows[:3])[-1].met


def test_gemm_counts_the_run_best_and_the_committed_rows():
    rows = [
        {"shape": "a", "M": 1, "roofline_us": 10.0, "best_us": 14.0, "cublas_us": 20.0},
        {"shape": "b", "M": 16, "roofline_us": 10.0, "best_us": 14.9, "table_us": 15.2, "cublas_us": 20.0},
        {"shape": "k|v", "M": 64, "roofline_us": 1.0, "best_us": 6.2, "cublas_us": 15.0},
        {"shape": "big", "M": 2048, "roofline_us": 10.0, "best_us": 30.0, "cublas_us": 12.0},  # not a small-M point
    ]
    within, cublas = it.gemm_targets(rows)
    assert not within.met
    assert within.measured == ("2 of 3 with the run's best config (1 / 1 / 0 at M = 1 / 16 / 64), 1 with the "
                               "committed TABLE rows; worst 6.20x (k|v M=64)")
    assert cublas.met and cublas.measured == "0 of 3 slower; cuBLAS at least 1.32x our time"


def test_script_prints_one_table_and_needs_an_input(tmp_path, capsys):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"rows": _decode_rows("llama3.1-8b", "engine", 1, 3.0, 2.7)}))
    assert it.main(["--decode", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| decode >= 1.10x with the pass (engine form) | llama3.1-8b: 1.111x (b1)" in out and "| yes" in out
    with pytest.raises(SystemExit):
        it.main([])


@pytest.mark.skipif(sys.platform == "win32", reason="bash")
def test_issue7_sh_targets_reads_every_output_in_the_folder(tmp_path):
    (tmp_path / "decode_engine_8b.json").write_text(json.dumps(
        {"rows": _decode_rows("qwen3-8b", "engine", 64, 5.87, 4.668)}))
    (tmp_path / "gemm.json").write_text(json.dumps({"rows": [
        {"shape": "k|v", "M": 64, "roofline_us": 1.0, "best_us": 6.2, "cublas_us": 15.0}]}))
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "issue7.sh"), "targets"], capture_output=True,
                         text=True, env={**os.environ, "OUT": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert "1.257x (b64)" in run.stdout and "(k\\|v M=64)" in run.stdout  # a | in a cell is escaped
    empty = subprocess.run(["bash", str(ROOT / "benchmarks" / "issue7.sh"), "targets"], capture_output=True,
                           text=True, env={**os.environ, "OUT": str(tmp_path / "none")})
    assert empty.returncode == 1 and "no decode_*.json" in empty.stderr


def test_steps_of_several_tokens_count_for_no_target():
    # decode.py --tokens 4 rows (a step verifying draft tokens) in a decode JSON must not stand in for decode cells
    rows = _decode_rows("qwen3-8b", "engine", 8, 4.0, 3.0)
    verify = [{**r, "tokens": 4, "ms": r["ms"] * 10} for r in _decode_rows("qwen3-8b", "engine", 8, 4.0, 3.0)]
    assert it.decode_cells(rows + verify) == it.decode_cells(rows)
    assert it.decode_cells(verify) == {}


def test_per_tensor_models_count_for_no_target():
    # decode.py --scheme per-tensor rows (its fp8 variants keep the "block" labels) must not stand in for block-FP8's
    rows = _decode_rows("qwen3-8b", "engine", 8, 4.0, 3.0)
    per_tensor = [{**r, "scheme": "per-tensor", "ms": r["ms"] * 10} for r in rows]
    assert it.decode_cells(rows + per_tensor) == it.decode_cells(rows) != {}
    assert it.decode_cells(per_tensor) == {}
