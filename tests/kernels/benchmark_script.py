"""Run a ``benchmarks/`` script's ``--dry-run`` (CPU, Triton interpreter, tiny shapes) in a subprocess: shared by
the benchmark tests, which check that each script runs end to end and writes what its docs say."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_dry(script: str, tmp_path, *args: str) -> str:
    """stdout of ``benchmarks/<script> --dry-run --out tmp_path *args``; fails the test on a non-zero exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    path = os.path.join(ROOT, "benchmarks", script)
    proc = subprocess.run([sys.executable, path, "--dry-run", "--out", str(tmp_path), *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
