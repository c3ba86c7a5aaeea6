"""The CUDA paths: ``diff`` (two full compiles, kernel launches per forward from torch.profiler) and ``verify``.

Run on the GPU machine: ``python -m pytest tests/cli/test_cli_gpu.py -m gpu -q -s`` (about 3 minutes before the
decode-step test, which is new on 2026-12-06 and has not run on a GPU yet).
"""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset, scheme", [("qwen3-tiny", "block"), ("llama-tiny", "per-tensor")])
def test_diff_on_cuda_counts_fewer_launches_with_the_pass(preset, scheme):
    res = run_cli("diff", preset, "--scheme", scheme, "--device", "cuda", "--format", "json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compile 1/2: without the pass" in res.stderr and "compile 2/2: with the pass" in res.stderr
    summary = json.loads(res.stdout)["summary"]
    launches = summary["launches_per_forward"]
    print(preset, scheme, "launches per forward:", launches, "kernel ops:", summary["kernel_ops"])
    assert launches["before"] > 0
    # Each fusion removes at least one launch (a norm or quant kernel; a memset per stripped fill).
    assert launches["after"] < launches["before"], launches


def test_verify_on_cuda_within_contract():
    # On the GPU the fused ops run the Triton kernels, the unfused ones Inductor's code: the real comparison.
    res = run_cli("verify", "qwen3-tiny", "--device", "cuda")
    print(res.stdout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ok: 9 checks within the contract" in res.stdout


def test_a_decode_step_on_cuda_fuses_its_attention_and_stays_within_contract():
    # --cache on the GPU: the Triton attention / RoPE-cache kernels against Inductor's, through the same cache
    res = run_cli("diff", "llama-tiny", "--form", "engine", "--cache", "64", "--seq", "1", "--batch", "3",
                  "--device", "cuda", "--format", "json")
    assert res.returncode == 0, res.stderr[-3000:]
    summary, counts = json.loads(res.stdout)["summary"], json.loads(res.stdout)["report"]["counts"]
    print("decode step launches per forward:", summary["launches_per_forward"], counts)
    assert counts.get("rope_attention") == 2 and summary["launches_per_forward"]["after"] < \
        summary["launches_per_forward"]["before"]
    res = run_cli("verify", "llama-tiny", "--form", "engine", "--cache", "64", "--seq", "1", "--batch", "3",
                  "--device", "cuda")
    print(res.stdout)
    assert res.returncode == 0 and "ok: 9 checks within the contract" in res.stdout, res.stdout[-3000:]
