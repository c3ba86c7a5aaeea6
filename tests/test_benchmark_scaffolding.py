"""``benchmarks/_script.py``: the device choice, the first log line and the JSON every kernel benchmark shares."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _script


def test_dry_run_is_the_cpu_whatever_the_machine():
    assert _script.pick_device("benchmarks/gemm.py", True) == "cpu"
    assert _script.device_name("cpu") == "cpu (dry run)"


def test_no_gpu_names_the_script_and_the_way_out(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _script.pick_device("/any/where/benchmarks/grouped_gemm.py", False) is None
    assert capsys.readouterr().err.strip() == "benchmarks/grouped_gemm.py needs a CUDA GPU (or --dry-run)"


def test_a_gpu_is_taken_when_present(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _script.pick_device("gemm.py", False) == "cuda"
    assert capsys.readouterr().err == ""


def test_setup_line_carries_what_a_reader_needs_to_compare_runs():
    line = _script.setup_line("cpu", "sm90", 4.28e12)
    assert line == f"{_script.versions('cpu')}; sm90; copy bandwidth 4.28 TB/s"


@pytest.mark.parametrize("path", [None, ""])
def test_no_json_without_a_path(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _script.write_json(path, 1e12, "cpu", [{"M": 1}])
    assert os.listdir(tmp_path) == []


def test_json_holds_the_rows_with_their_bandwidth_and_device(tmp_path):
    out = tmp_path / "rows.json"
    _script.write_json(str(out), 4.2e12, "cpu", [{"M": 1, "config": object()}])  # str() of what json cannot hold
    got = json.loads(out.read_text())
    assert got["bandwidth"] == 4.2e12 and got["device"] == "cpu (dry run)" and got["rows"][0]["M"] == 1


def test_provenance_names_the_script_that_measured():
    got = _script.provenance("cpu", 4.28e12, "/x/benchmarks/quant_gemm.py")
    assert got == f"{_script.versions('cpu')}; copy bandwidth 4.28 TB/s; by `python benchmarks/quant_gemm.py`"


def test_versions_name_device_torch_and_triton():
    assert _script.versions("cpu") == f"cpu (dry run); torch {torch.__version__}; Triton {_script.triton.__version__}"


def test_rotating_copies_exceed_the_l2_rotation_within_their_bounds():
    from _timing import ROTATE_BYTES, rotating_copies

    assert rotating_copies(ROTATE_BYTES / 10) == 10 and rotating_copies(ROTATE_BYTES / 10 - 1) == 11
    assert rotating_copies(4 * ROTATE_BYTES) == 2 and rotating_copies(4 * ROTATE_BYTES, least=1) == 1
    assert rotating_copies(1000, most=64) == 64 and rotating_copies(0, least=1, most=64) == 64
    # a dry run times nothing: the fewest copies, however small the inputs
    assert rotating_copies(1000, dry_run=True) == 2 and rotating_copies(1000, dry_run=True, least=1) == 1


def test_checked_time_times_only_a_checked_repeatable_call():
    # gemm.py's and gemm_silu_quant.py's sweeps rank configs by this; a wrong, racy or failing config must lose
    # with its reason, never with a time.
    from _timing import checked_time

    logged = []
    good = torch.ones(4)

    def time_of(call, repeats=0, err=lambda out: (out - good).abs().max().item()):
        return checked_time("cfg", call, 2, err, 1e-3, repeats, log=logged.append, dry_run=True)

    assert isinstance(time_of(lambda i: good.clone()), float)
    assert time_of(lambda i: good + 1) == "WRONG" and "rel err 1" in logged[-1]
    calls = iter(range(10))
    assert time_of(lambda i: good + next(calls) * 1e-6, repeats=1) == "RACY"  # within tolerance, not bitwise the same
    assert isinstance(time_of(lambda i: good + next(calls) * 1e-6, repeats=0), float)  # no repeat asked for

    def refuses(i):
        raise ValueError("block_n 96 is not a power of two\nmore")

    assert time_of(refuses) == "n/a" and logged[-1] == "  cfg: n/a (block_n 96 is not a power of two)"
    assert time_of(lambda i: None) == "n/a"  # a launcher that declines the shape returns None
