"""Test-wide setup: the Triton CPU interpreter on machines without a GPU (quickened: benchmarks/_quick_interpreter.py)
and Inductor's CPU code without SIMD there, and the gpu / rocm markers.

TRITON_INTERPRET must be set before triton is first imported (``triton.jit`` reads it when a kernel is
defined), so it is set here, at collection time. On the CPU the automatic backend stays the reference;
kernel tests ask for Triton explicitly.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _quick_interpreter

if os.environ.get("TRITON_INTERPRET") == "1":
    _quick_interpreter.quicken()  # the kernel tests spend a third of their time in a walk it caches

if not torch.cuda.is_available():
    # Inductor's C++ code for the CPU without SIMD: the tests check the pass's graphs and our kernels, not Inductor's
    # vectorizer, and scalar code is quicker to generate and to build (compile-heavy test files, cold caches, side by
    # side on the 2-core box: 482 s against 536 s). simdlen 1 matches no vector ISA, so Inductor emits scalar loops.
    import torch._inductor.config

    torch._inductor.config.cpp.simdlen = 1
    # The same for the processes the tests start (examples, CLI, benchmarks' dry runs, cache workers): with ATen's
    # CPU capability "default", Inductor picks no vector ISA there either (test_examples and test_cli_compile side by
    # side, cold caches: 282 s against 308 s). Their eager ATen kernels run scalar too. This process's ATen reads
    # the variable lazily, so it reads it first (pytest-xdist's workers are such started processes, and inherit it).
    # A value set by the caller stays. Not on a CPU with AMX: there ATen's bf16 CPU flash attention packs its
    # operands for AMX whatever the capability, and below AVX512 it raises ("pack_vnni2 is only supported when
    # avx512 is supported", torch 2.11-2.13; seen 2026-12-06 on a Xeon with amx_bf16: every bf16 SDPA prefill).
    torch.backends.cpu.get_cpu_capability()
    if not torch.cpu._is_amx_tile_supported():
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")


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


def _fuzz_tallies(config) -> list[dict]:
    """The fuzz tests' tallies (tests/fuzz/conftest.py): this process's, or one per pytest-xdist worker."""
    return config.__dict__.setdefault("fp8_fuzz_tallies", [])


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a worker finished and sent what it tallied
def pytest_testnodedown(node, error):
    sent = getattr(node, "workeroutput", {}).get("fp8_fuzz")
    if sent:
        _fuzz_tallies(node.config).append(json.loads(sent))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tallies = _fuzz_tallies(config)
    if not tallies:
        return
    tally, reasons = collections.Counter(), collections.Counter()
    for counts in tallies:
        tally.update(counts["tally"])
        reasons.update(counts["reasons"])
    profile = tallies[0]["profile"]
    terminalreporter.section(f"fp8 fuzz tally (profile {profile})")
    for key, value in sorted(tally.items()):
        terminalreporter.write_line(f"{key}: {value}")
    terminalreporter.write_line(f"rejection reasons seen: {dict(sorted(reasons.items()))}")
    path = os.environ.get("FP8_FUZZ_STATS")
    if path:
        with open(path, "w") as f:
            json.dump({"profile": profile, "tally": dict(tally), "reasons": dict(reasons)}, f, indent=2)
