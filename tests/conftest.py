"""Test-wide setup: the Triton CPU interpreter on machines without a GPU, and the gpu / rocm markers.

TRITON_INTERPRET must be set before triton is first imported (``triton.jit`` reads it when a kernel is
defined), so it is set here, at collection time. On the CPU the automatic backend stays the reference;
kernel tests ask for Triton explicitly.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_sessionstart(session):
    from interpreter_caps import interpreter_error

    reason = interpreter_error()
    if reason is not None:  # every Triton kernel test would fail on it, with a message that does not say why
        pytest.exit(reason, returncode=2)


def _is_rocm() -> bool:
    return torch.cuda.is_available() and torch.version.hip is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_rocm = pytest.mark.skip(reason="needs an AMD GPU with aiter")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "rocm" in item.keywords and not _is_rocm():
            item.add_marker(skip_rocm)
