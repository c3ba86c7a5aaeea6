"""No script in ``benchmarks/`` may share its name with an importable module: running a script puts ``benchmarks/``
first on ``sys.path`` (and the benchmark tests insert it there), so a script named like a package is what every
``import`` of that package gets. ``benchmarks/kernels.py`` did that to Hugging Face's ``kernels`` package, which
transformers 5.25 imports at model load: 198 tests failed in CI with "cannot import name 'CUDAProperties' from
'kernels' (.../benchmarks/kernels.py)" (2026-12-03), and ``decode.py`` failed the same way. It is now
``fused_kernels.py``."""

from __future__ import annotations

import importlib.machinery
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def _elsewhere(name: str) -> str | None:
    """Where ``import name`` would find a module outside ``benchmarks/`` (None: nowhere)."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return "the standard library"
    paths = [p for p in sys.path if p and os.path.abspath(p) != BENCHMARKS]
    spec = importlib.machinery.PathFinder.find_spec(name, paths)
    return None if spec is None else (spec.origin or str(spec.submodule_search_locations))


def test_no_benchmark_script_shadows_a_module():
    names = sorted(f[:-3] for f in os.listdir(BENCHMARKS) if f.endswith(".py"))
    assert "fused_kernels" in names  # the listing is the real one
    clashes = {n: where for n in names if (where := _elsewhere(n)) is not None}
    assert not clashes, f"benchmarks/ scripts named like importable modules (rename them): {clashes}"


def test_the_check_sees_an_installed_package():
    # The check must be able to fail: torch is installed, so a script named torch.py would be caught.
    assert _elsewhere("torch") is not None and _elsewhere("json") == "the standard library"
    assert _elsewhere("fp8_fusion_no_such_module") is None
