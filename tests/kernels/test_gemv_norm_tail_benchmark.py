"""``benchmarks/gemv_norm_tail.py`` on the CPU: the probe's kernel (the GEMV, then the row's add + RMSNorm + quant in
its last program) runs in the Triton interpreter against the GEMV and ``add_rms_norm_group_quant``, and its check
rejects a tail that is wrong."""

from __future__ import annotations

import os
import sys

import pytest
from benchmark_script import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gemv_norm_tail  # noqa: E402


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(gemv_norm_tail, "DEVICE", "cpu")


def test_the_tail_matches_the_pair(on_cpu, capsys):
    assert gemv_norm_tail.main(["--dry-run"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("tiny")]
    assert row[-1] == "0" and row[-4] == "4"  # q bit for bit the pair's at this shape; the GEMV config's warps


def test_a_wrong_tail_is_caught(on_cpu, monkeypatch):
    real = gemv_norm_tail.gemv_norm_tail

    def off_by_eps(q, x_scale, w_q, w_scale, residual, norm_w, eps, config, counter):
        return real(q, x_scale, w_q, w_scale, residual, norm_w, 0.5, config, counter)  # another eps: other scales

    monkeypatch.setattr(gemv_norm_tail, "gemv_norm_tail", off_by_eps)
    with pytest.raises(SystemExit, match="WRONG"):
        gemv_norm_tail.run_point("tiny", 384, 512, gemv_norm_tail.GemvConfig(4, 256, 4, 1))


def test_a_counter_left_set_is_caught(on_cpu, monkeypatch):
    real = gemv_norm_tail.gemv_norm_tail

    def leaves_ticket(*args):
        out = real(*args)
        args[-1].add_(1)  # the next launch would never see its last program
        return out

    monkeypatch.setattr(gemv_norm_tail, "gemv_norm_tail", leaves_ticket)
    with pytest.raises(SystemExit, match="WRONG"):
        gemv_norm_tail.run_point("tiny", 384, 512, gemv_norm_tail.GemvConfig(4, 256, 4, 1))
