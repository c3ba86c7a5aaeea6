"""What every kernel benchmark script does around its measurements: pick the device (the GPU, or the CPU under
``--dry-run``, where the Triton interpreter runs the kernels and the numbers mean nothing), say what it runs on,
and write its rows as JSON beside the bandwidth and device they were measured with.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton


def pick_device(script: str, dry_run: bool) -> str | None:
    """"cpu" under --dry-run, "cuda" where a GPU is present; None where not, having said so on stderr (the script
    then exits 2)."""
    if dry_run:
        import _quick_interpreter

        _quick_interpreter.quicken()  # the interpreter runs every kernel of a dry run: ~30% of its time saved
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    print(f"benchmarks/{os.path.basename(script)} needs a CUDA GPU (or --dry-run)", file=sys.stderr)
    return None


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"


def versions(device: str) -> str:
    """"<device>; torch <version>; Triton <version>": what a printed table was measured on."""
    return f"{device_name(device)}; torch {torch.__version__}; Triton {triton.__version__}"


def setup_line(device: str, arch_name: str, bandwidth: float) -> str:
    """The run's first log line: device, arch, versions and the copy bandwidth every roofline divides by."""
    return f"{versions(device)}; {arch_name}; copy bandwidth {bandwidth / 1e12:.2f} TB/s"


def provenance(device: str, bandwidth: float, script: str) -> str:
    """What a pasted table row was measured on and by: device, versions, copy bandwidth, the script."""
    return (f"{versions(device)}; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
            f"by `python benchmarks/{os.path.basename(script)}`")  # fmt: skip


def write_json(path: str | None, bandwidth: float, device: str, rows: list[dict]) -> None:
    """The rows as measured (``--json``); nothing without a path."""
    if path:
        with open(path, "w") as f:
            json.dump({"bandwidth": bandwidth, "device": device_name(device), "rows": rows}, f, indent=1, default=str)
