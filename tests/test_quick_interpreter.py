"""``benchmarks/_quick_interpreter.py``: the cached builtin walk patches exactly what Triton's own walk patches,
on unpatched modules (in a fresh process) and inside a launch, and a kernel that calls ``@triton.jit`` helpers
computes the same under it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")

import _quick_interpreter  # noqa: E402  (after the importorskips: it needs triton)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")


def _quickened():
    if not _quick_interpreter.quicken():
        pytest.skip(f"Triton {triton.__version__}'s interpreter is not the one the quick walk was written for")
    return interpreter._patch_builtin


def _patched_names(walk, pkg) -> set[str]:
    """The attributes of ``pkg`` that ``walk`` replaces, put back as they were afterwards."""
    before = {name: getattr(pkg, name) for name in dir(pkg)}
    scope = interpreter._LangPatchScope() if hasattr(interpreter, "_LangPatchScope") else None
    walk(pkg, interpreter.interpreter_builder, *([scope] if scope is not None else []))
    changed = {name for name in dir(pkg) if getattr(pkg, name) is not before.get(name)}
    if scope is not None:
        scope.restore()
    else:
        for name in changed:
            setattr(pkg, name, before[name])
    return changed


def compare_walks() -> dict:
    """{module: (names the original walk patches, the quick walk's, the quick walk's again)} on unpatched modules.

    Run in a fresh process: in this one, earlier kernel tests leave ``triton.language.core`` patched for good (the
    interpreter's call of a helper patches the modules its file sees and never puts them back), and a walk over a
    patched module finds nothing, in either version."""
    quick = _quickened()
    out = {}
    for name, pkg in [("tl", tl), ("core", tl.core), ("math", tl.math), ("tensor", tl.tensor)]:
        want = _patched_names(quick.original, pkg)
        out[name] = [sorted(want), sorted(_patched_names(quick, pkg)), sorted(_patched_names(quick, pkg))]
    return out


def test_the_quick_walk_patches_what_the_original_patches():
    _quickened()  # another Triton: skipped here, not failed in the subprocess
    here = pathlib.Path(__file__).resolve().parent
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(here.parent), str(here), str(here.parent / "benchmarks")])}
    script = "import json, test_quick_interpreter as t; print(json.dumps(t.compare_walks()))"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    walks = json.loads(proc.stdout.splitlines()[-1])
    assert set(walks) == {"tl", "core", "math", "tensor"}
    for name, (want, quick, again) in walks.items():
        assert len(want) > 10, (name, want)  # the builtins: a walk that finds none would pass the comparison
        assert quick == want and again == want, (name, set(want) ^ set(quick), set(want) ^ set(again))


def test_inside_a_launch_neither_walk_patches_anything():
    quick = _quickened()
    scope = interpreter._LangPatchScope() if hasattr(interpreter, "_LangPatchScope") else None
    if scope is None:
        pytest.skip("this Triton's interpreter patches without a scope")
    quick.original(tl, interpreter.interpreter_builder, scope)  # as a launch leaves the language
    try:
        assert _patched_names(quick.original, tl) == set() and _patched_names(quick, tl) == set()
    finally:
        scope.restore()


def test_installing_twice_wraps_once():
    quick = _quickened()
    assert _quick_interpreter.quicken() and interpreter._patch_builtin is quick


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _square_plus(x, s):
    return _scaled(x, s) * x + tl.sqrt(tl.abs(x))


@triton.jit
def _helpers_kernel(src, dst, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n, other=float("-inf"))  # the padding never wins the max (0.0 did, when
    tl.store(dst + offs, _square_plus(x, s) + tl.max(x, 0), mask=offs < n)  # a short block was all negative: flaky)


def test_a_kernel_with_nested_helpers_computes_as_torch_does():
    _quickened()
    x = torch.randn(100)
    out = torch.empty_like(x)
    _helpers_kernel[(4,)](x, out, 3.0, 100, BLOCK=32)
    blocks = [x[i:i + 32] for i in range(0, 100, 32)]
    want = torch.cat([b * 3.0 * b + b.abs().sqrt() + b.max() for b in blocks])
    torch.testing.assert_close(out, want)
