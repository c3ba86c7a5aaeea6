"""Which implementation runs each op on each device.

Backends, each a module exposing ``kernels() -> dict[op_name, callable]`` (loaded lazily, on first use):
- ``reference``: pure torch (``reference.py`` bound to the device's fp8 facts); every op, any device.
- ``triton``: ``kernels/triton/`` (CUDA sm89+, ROCm Triton, or the CPU under ``TRITON_INTERPRET=1``).
- ``aiter``: ``kernels/aiter.py`` (ROCm with aiter installed).

Selection: an explicit choice (``set_backend("triton")``, ``use_backend(...)`` or env ``FP8_FUSION_BACKEND``)
raises ``BackendUnavailable`` when that backend cannot run on the device; the automatic choice walks the
device's preference list and logs at INFO once when it falls back. An op a backend does not implement
falls through to the next backend in the list (the reference implements everything).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import threading
import warnings
from typing import Callable, Iterator

import torch

from .. import arch as _arch

log = logging.getLogger("fp8_fusion_pass")

BACKENDS = ("reference", "triton", "aiter")
ENV_BACKEND = "FP8_FUSION_BACKEND"

_MODULES = {
    "reference": "fp8_fusion_pass.kernels.reference_backend",
    "triton": "fp8_fusion_pass.kernels.triton",
    "aiter": "fp8_fusion_pass.kernels.aiter",
}

_local = threading.local()
_global_choice: str | None = None
_warned: set = set()


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot run here."""


def set_backend(name: str | None) -> None:
    """Force a backend process-wide (``None`` restores the automatic choice)."""
    global _global_choice
    _check_name(name)
    _global_choice = name


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Force a backend in this thread for the duration of the block."""
    _check_name(name)
    previous = getattr(_local, "choice", None)
    _local.choice = name
    try:
        yield
    finally:
        _local.choice = previous


def explicit_choice() -> str | None:
    return getattr(_local, "choice", None) or _global_choice or (os.environ.get(ENV_BACKEND) or None)


def _check_name(name: str | None) -> None:
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why ``name`` cannot run on ``device``, or None when it can."""
    arch = _arch.arch_of(device)
    if name == "reference":
        return None
    if name == "triton":
        if not _importable("triton"):
            return "the triton package is not installed (pip install triton)"
        if device.type == "cpu":
            return None if _arch.triton_interpreting() else "Triton runs on the CPU only under TRITON_INTERPRET=1"
        if not arch.triton_fp8:
            return f"Triton has no fp8 on {arch.name} (needs sm89+, gfx942 or gfx950)"
        return None
    if name == "aiter":
        if not arch.is_rocm:
            return f"aiter runs on ROCm only (this device is {arch.name})"
        from . import aiter as aiter_adapters  # lazy: importing aiter runs rocminfo

        return aiter_adapters.unavailable_reason()
    return f"unknown backend {name!r}"


def preference(device: torch.device) -> tuple[str, ...]:
    """Automatic order for a device: fastest first, the reference last."""
    arch = _arch.arch_of(device)
    if arch.is_rocm:
        return ("aiter", "triton", "reference")
    if device.type == "cuda":
        return ("triton", "reference")
    # On the CPU the reference is the automatic choice even under TRITON_INTERPRET=1 (the interpreter is for
    # checking kernel numerics, ~100x slower than torch): ask for Triton explicitly with use_backend("triton").
    return ("reference",)


def chosen_backends(device: torch.device) -> tuple[str, ...]:
    """The backends to try for ``device``, in order; raises if an explicit one is unavailable."""
    explicit = explicit_choice()
    if explicit is not None:
        reason = unavailable_reason(explicit, device)
        if reason is not None:
            raise BackendUnavailable(f"backend {explicit!r} was requested but is unavailable on {device}: {reason}")
        return (explicit, "reference") if explicit != "reference" else ("reference",)
    usable, skipped = [], []
    for name in preference(device):
        reason = unavailable_reason(name, device)
        if reason is None:
            usable.append(name)
            continue
        skipped.append(f"{name}: {reason}")
        if (name, device.type) not in _warned:
            _warned.add((name, device.type))
            log.info("fp8_fusion_pass: backend %s skipped on %s: %s", name, device.type, reason)
    if device.type != "cpu" and usable == ["reference"] and ("reference only", device.type) not in _warned:
        # Every op then runs pure torch on the GPU (a GEMM dequantizes its weight per call): say so louder than INFO.
        _warned.add(("reference only", device.type))
        warnings.warn(f"fp8_fusion_pass: no kernel backend runs on this {device.type} device "
                      f"({'; '.join(skipped)}), so every fp8_fusion op runs its pure-torch reference, many times "
                      "slower; the pass's fusions are off there (reason no_fused_kernel)", stacklevel=3)
    return tuple(usable)


def get_kernel(op: str, device: torch.device) -> Callable:
    """The implementation of ``op`` for ``device`` under the current backend choice."""
    for name in chosen_backends(device):
        table = _kernels(name)
        if op in table:
            return table[op]
    raise KeyError(f"no backend implements {op!r}")  # unreachable: the reference implements every op


def backend_for(op: str, device: torch.device) -> str:
    """Name of the backend that ``get_kernel`` would use (for reports and tests)."""
    for name in chosen_backends(device):
        if op in _kernels(name):
            return name
    raise KeyError(op)


@functools.lru_cache(maxsize=None)
def _kernels(name: str) -> dict:
    return importlib.import_module(_MODULES[name]).kernels()


@functools.lru_cache(maxsize=None)
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True
