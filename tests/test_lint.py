"""``ruff check`` with the project's rules (pyproject.toml: pyflakes' undefined names and unused imports, pycodestyle
at 120 columns, sorted imports) over the whole tree, and the line budget of its modules. ruff is pinned in the
``test`` extra: a newer release may stabilize rules in these families.

The GPU tests and the benchmarks run only on the device machine; a name they lack (a helper renamed, an import
dropped) would fail there first, after the CPU suite passed. ``test_references.py`` checks the names read from the
package's modules; this checks every other name.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TREE = ["fp8_fusion_pass", "tests", "benchmarks", "examples"]
# The house style: one concern per module, aim at 400 lines, past 600 split by concern (tinygrad enforces its budget in
# CI the same way). The largest today: kernels/triton/_small_m_kernels.py, 590.
MAX_LINES = 600


def ruff(*paths: str | pathlib.Path, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    """``ruff check`` with the configuration ``cwd`` has (the project's at the root)."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, paths)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_tree_has_no_ruff_finding():
    got = ruff(*TREE)
    assert got.returncode == 0, got.stdout + got.stderr


def test_an_undefined_name_in_gpu_only_code_is_found(tmp_path):
    # the check can fail: a GPU test's body reading a helper that no longer exists
    (tmp_path / "test_gpu_only.py").write_text("import torch\n\n\ndef test_x():\n    if torch.cuda.is_available():\n"
                                               "        assert _engine_step_8b() is not None\n")
    got = ruff("test_gpu_only.py", cwd=tmp_path)  # ruff's default rules include pyflakes'
    assert got.returncode == 1 and "F821" in got.stdout, got.stdout + got.stderr


def test_no_module_is_past_the_line_budget():
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for d in TREE for p in ROOT.joinpath(d).rglob("*.py")}
    assert len(sizes) > 100 and not {p: n for p, n in sizes.items() if n > MAX_LINES}
