"""``benchmarks/_quick_interpreter.py``: the cached builtin walk patches exactly what Triton's own walk patches,
unpatched and inside a launch, and a kernel that calls ``@triton.jit`` helpers computes the same under it."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")

import _quick_interpreter

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


@pytest.mark.parametrize("pkg", [tl, tl.core, tl.math, tl.tensor], ids=["tl", "core", "math", "tensor"])
def test_the_quick_walk_patches_what_the_original_patches(pkg):
    quick = _quickened()
    original = quick.original
    want = _patched_names(original, pkg)
    assert len(want) > 10, want  # the language's builtins: a walk that finds none would pass the comparison
    assert _patched_names(quick, pkg) == want
    assert _patched_names(quick, pkg) == want  # from the cache, the second time


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
    x = tl.load(src + offs, mask=offs < n, other=0.0)
    tl.store(dst + offs, _square_plus(x, s) + tl.max(x, 0), mask=offs < n)


def test_a_kernel_with_nested_helpers_computes_as_torch_does():
    _quickened()
    x = torch.randn(100)
    out = torch.empty_like(x)
    _helpers_kernel[(4,)](x, out, 3.0, 100, BLOCK=32)
    blocks = [x[i:i + 32] for i in range(0, 100, 32)]
    want = torch.cat([b * 3.0 * b + b.abs().sqrt() + b.max() for b in blocks])
    torch.testing.assert_close(out, want)
