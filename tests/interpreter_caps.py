"""What the Triton interpreter of this environment can run: tests that simulate an AMD GPU on the CPU need it to
hold ``float8_e4m3fnuz`` values, which the interpreter of Triton 3.7.1 (torch 2.12.1's pin) cannot ("fail to convert
fp8e4b8 to ir type", 2026-12-03); those of Triton 3.8 (torch 2.14.1) and 3.9 can. Only those simulations
are skipped there: on a real gfx942 the kernels are compiled, not interpreted, and every other test runs."""

from __future__ import annotations

import functools
import os

import pytest
import torch


@functools.cache
def interpreter_holds_fnuz() -> bool:
    """True when the interpreter copies an e4m3fnuz tensor (False off the interpreter: the question is moot)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return True
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src, dst):
        tl.store(dst + tl.arange(0, 16), tl.load(src + tl.arange(0, 16)))

    x = torch.arange(16, dtype=torch.float32).to(torch.float8_e4m3fnuz)
    y = torch.zeros_like(x)
    try:
        _copy[(1,)](x, y)
    except Exception:  # noqa: BLE001 - the interpreter's own error types differ by version
        return False
    return torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def require_fnuz_interpreter() -> None:
    """Skip the calling test where the interpreter cannot hold e4m3fnuz (checked when the test runs, once)."""
    if not interpreter_holds_fnuz():
        pytest.skip("this Triton interpreter cannot hold float8_e4m3fnuz (seen with 3.7.1): no gfx942 simulation")
