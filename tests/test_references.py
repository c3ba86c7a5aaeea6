"""Every ``module.NAME`` that the tests and benchmarks read from a module of this package exists.

The GPU tests and the benchmarks run only on the device machine, a few times a session, so a name renamed in the
package (a guard's bound, a kernel's table) but left in one of them would fail there first, after the CPU suite
passed (``guards.GQA_MIN_PAIRS`` in a GPU test's parametrization body, 2026-12-06, caught by hand). This reads each
file's imports of ``fp8_fusion_pass`` modules and checks every attribute it loads from them on the CPU.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.joinpath("tests").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py")])


def package_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the ``fp8_fusion_pass`` module it is bound to, from the file's imports (top level or not)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fp8_fusion_pass") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fp8_fusion_pass"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _is_module(full):  # not a function or class imported from a module
                    aliases[a.asname or a.name] = full
    return aliases


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a chain of attribute loads on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def _has(module_name: str, attr: str) -> bool:
    return hasattr(importlib.import_module(module_name), attr) or _is_module(f"{module_name}.{attr}")


def missing_names(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Names the file reads from the package that it lacks: ``alias.attr`` (alias bound to a package module),
    ``fp8_fusion_pass.mod.attr`` spelt out, and ``from fp8_fusion_pass.mod import attr`` (in a function too, where
    an import runs only when the test does)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = package_aliases(tree)
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fp8_fusion_pass"):
            absent = [a.name for a in node.names if a.name != "*" and not _has(node.module, a.name)]
            missing += [f"{path.relative_to(root)}:{node.lineno}: {node.module}.{name}" for name in absent]
            continue
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        head = _dotted(node.value)
        module = aliases.get(head) or (head if head and head.startswith("fp8_fusion_pass") else None)
        if module and _is_module(module) and not _has(module, node.attr):
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {head}.{node.attr}")
    return missing


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_read_from_the_package_exists(path):
    assert not missing_names(path)


def test_a_stale_name_is_found(tmp_path):
    # the check can fail: a renamed guard bound, read as the GPU test read it
    stale = tmp_path / "stale.py"
    stale.write_text("from fp8_fusion_pass import guards\n\n\ndef f(batch):\n"
                     "    return batch * 8 < guards.GQA_MIN_PAIRS\n")
    assert missing_names(stale, tmp_path) == ["stale.py:5: guards.GQA_MIN_PAIRS"]
    stale.write_text("import fp8_fusion_pass\n\n\ndef f():\n    from fp8_fusion_pass.guards import GQA_GROUPS_ALWAYS\n"
                     "    return fp8_fusion_pass.guards.GQA_MIN_PAIRS, fp8_fusion_pass.guards.GQA_MIN_BATCH_HEADS\n")
    assert missing_names(stale, tmp_path) == ["stale.py:5: fp8_fusion_pass.guards.GQA_GROUPS_ALWAYS",
                                              "stale.py:6: fp8_fusion_pass.guards.GQA_MIN_PAIRS"]
