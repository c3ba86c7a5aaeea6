"""``benchmarks/l2_prefetch.py`` on the CPU (Triton interpreter, where no hint is issued): the script runs end to
end, and its check rejects a hinting norm whose GEMM output differs."""

from __future__ import annotations

import os
import sys

import pytest
from benchmark_script import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import l2_prefetch  # noqa: E402


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "DEVICE", "cpu")


def test_the_dry_run_times_every_variant(on_cpu, capsys):
    assert l2_prefetch.main(["--dry-run"]) == 0
    variants = [" ".join(line.split()[5:-2]) for line in capsys.readouterr().out.splitlines() if "(tiny)" in line]
    assert variants == ["pair", "launch alone 0.1", "in-norm pf 0.1", "launch pf 0.1"]


def test_a_hint_that_changes_the_output_is_caught(on_cpu, monkeypatch):
    real = l2_prefetch.launch

    def wrong_with_hint(x, w, eps, res, g, prefetch=None, prefetch_nbytes=0):
        return real(x, w * 2 if prefetch is not None else w, eps, res, g)

    monkeypatch.setattr(l2_prefetch, "launch", wrong_with_hint)
    with pytest.raises(SystemExit, match="WRONG"):
        l2_prefetch.run_norm("tiny", 256, 384, (0.1,))
