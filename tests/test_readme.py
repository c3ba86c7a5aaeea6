"""The README's two set-up commands are the contract with new users; CI must run exactly the test command."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    test_commands = [b for b in blocks if "pytest" in b]
    assert len(test_commands) == 1, f"README must have exactly one test command block, found {test_commands}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_commands[0] in ci.splitlines(), ".ci/run must run the README's test command verbatim"


def test_readme_commands_pin_the_cpu_torch_wheel():
    for block in _bash_blocks((ROOT / "README.md").read_text())[:2]:
        assert "torch==2.13.0" in block, f"an unpinned torch pulls a multi-GB CUDA build: {block}"


def test_test_module_basenames_are_unique():
    # pytest's default import mode puts each test dir on sys.path: two test files with one basename collide.
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
