"""``benchmarks/rope_kernels.py``: the ``--dry-run`` (CPU, Triton interpreter, tiny shapes) runs end to end, table
and ``--sweep``, and its numerics check refuses a launch that is off the reference."""

from __future__ import annotations

import csv
import os
import sys

import pytest
import torch
from benchmark_script import ROOT, run_dry

OPS = ("rms_norm_rope", "rms_norm_rope_cache", "qk_rope", "qk_rope_cache")


def _run(tmp_path, *args: str) -> str:
    return run_dry("rope_kernels.py", tmp_path, *args)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """One dry run of the table (~30 s in the interpreter), read by the tests below: (stdout, its --out dir)."""
    out_dir = tmp_path_factory.mktemp("rope_table")
    return _run(out_dir, "--no-inductor"), out_dir


def test_dry_run_table(table):
    out, tmp_path = table
    assert "all M: fused / best peer" in out
    rows = list(csv.DictReader((tmp_path / "rope_kernels.csv").read_text().splitlines()))
    assert sorted({r["op"] for r in rows}) == sorted(OPS) and {r["M"] for r in rows} == {"3", "1"}
    assert all(float(r["read_floor_us"]) > 0 and float(r["roofline_us"]) > 0 for r in rows)


def test_dry_run_sweep_writes_every_candidate(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import rope_kernels

    out = _run(tmp_path, "--sweep", "--ops", "qk_rope_cache")
    rows = list(csv.DictReader((tmp_path / "rope_sweep.csv").read_text().splitlines()))
    assert len(rows) == 2 * len(rope_kernels.CANDIDATES)  # M = 3 and 1, every candidate
    assert sum(r["is_default"] == "True" for r in rows) == 2 and "n_rows in [0, 512)" in out


def test_replot_reads_back_what_report_wrote(table, tmp_path):
    # docs/img/rope_kernels_h200.png is drawn from the measured CSV with --replot: the rows it reads must be the
    # numbers report() wrote, heads and M as ints
    table_dir = table[1]
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import rope_kernels

    rows = rope_kernels.read_csv(str(table_dir / "rope_kernels.csv"))
    assert {type(r[k]) for r in rows for k in ("Hq", "Hk", "M")} == {int}
    assert all(r["fused_over_read_floor"] == r["fused_us"] / r["read_floor_us"] for r in rows)
    out = tmp_path / "replot"
    assert rope_kernels.main(["--replot", str(table_dir / "rope_kernels.csv"), "--out", str(out)]) == 0


def test_check_refuses_a_wrong_launch(monkeypatch):
    # the numerics check is what keeps a wrong kernel out of the table: a launch whose k is off by a bf16 step of
    # its largest values must stop the run
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import rope_kernels

    monkeypatch.setattr(rope_kernels, "DEVICE", "cpu")
    weights = rope_kernels._weights()
    case = rope_kernels.Case("rms_norm_rope", 4, 2, 3, weights)
    eager = rope_kernels.reference_fn("rms_norm_rope", 4, 2, *weights)
    rope_kernels._check(case, eager)  # the real launch passes
    fused = case.fused
    monkeypatch.setattr(case, "fused", lambda i, tile=None: (fused(i)[0], fused(i)[1] * (1 + 2.0**-6)))
    with pytest.raises(AssertionError, match="beyond the RoPE contract"):
        rope_kernels._check(case, eager)
    assert torch.is_tensor(fused(0)[0])
