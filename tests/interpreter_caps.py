"""What the Triton interpreter of this environment can run: tests that simulate an AMD GPU on the CPU need it to
hold ``float8_e4m3fnuz`` values, which the interpreter of Triton 3.7.1 (torch 2.12.1's pin) cannot ("fail to convert
fp8e4b8 to ir type", 2026-12-03); those of Triton 3.8 (torch 2.14.1) and 3.9 can. Only those simulations
are skipped there: on a real gfx942 the kernels are compiled, not interpreted, and every other test runs.

And whether it runs our kernels at all: Triton 3.6's interpreter (torch 2.11's pin) turns a program id into a
Python int with ``int()`` of a one-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"; 275 kernel tests failed that way on 2026-12-04). ``tests/conftest.py`` stops the
session with the fix rather than let every kernel test fail on it."""

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


def interpreter_error() -> str | None:
    """Why the Triton interpreter cannot run a kernel that loops from its program id here (None when it can, or
    when the interpreter is off or Triton is not installed: the kernel tests then say so themselves)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _strided(dst, n):
        for i in range(tl.program_id(0), n, tl.num_programs(0)):  # int(program id), as our persistent kernels do
            tl.store(dst + i, i)

    out = torch.zeros(4, dtype=torch.int32)
    try:
        _strided[(2,)](out, 4)
    except Exception as e:  # noqa: BLE001 - the interpreter wraps the cause in its own error types
        import numpy

        return (f"the Triton {triton.__version__} interpreter cannot run the kernel tests with numpy "
                f"{numpy.__version__} ({type(e).__name__}: {e}); Triton 3.6 (torch 2.11) needs numpy < 2.4: "
                "pip install 'numpy<2.4', or use torch 2.12+ (Triton 3.7+)")
    if out.tolist() != [0, 1, 2, 3]:
        return f"the Triton {triton.__version__} interpreter ran a strided loop wrong: {out.tolist()}"
    return None
