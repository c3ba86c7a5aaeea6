"""Run ``python -m fp8_fusion_pass.cli`` as a subprocess, the way a user's shell does (stdout piped: no colour)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), full_env.get("PYTHONPATH", "")])
    full_env.pop("NO_COLOR", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "fp8_fusion_pass.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT,
    )
