"""Every ``module.NAME`` that the tests and benchmarks read from a module of this package exists.

The GPU tests and the benchmarks run only on the device machine, a few times a session, so a name renamed in the
package (a guard's bound, a kernel's table) but left in one of them would fail there first, after the CPU suite
passed (``guards.GQA_MIN_PAIRS`` in a GPU test's body, 2026-12-06, caught by hand). This reads each file's imports
of ``fp8_fusion_pass`` modules and checks every attribute it loads from them on the CPU; and every call of a
function the file defines at module level (the GPU tests' helpers) against that function's parameters.
"""

from __future__ import annotations

import ast
import importlib
import inspect
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


def _signature(fn: ast.FunctionDef) -> inspect.Signature:
    """The parameters of a ``def`` as written (defaults stand in as None: only their presence matters here)."""
    a, kind = fn.args, inspect.Parameter
    params = [kind(x.arg, kind.POSITIONAL_ONLY) for x in a.posonlyargs]
    params += [kind(x.arg, kind.POSITIONAL_OR_KEYWORD) for x in a.args]
    params += [kind(a.vararg.arg, kind.VAR_POSITIONAL)] if a.vararg else []
    params += [kind(x.arg, kind.KEYWORD_ONLY) for x in a.kwonlyargs]
    params += [kind(a.kwarg.arg, kind.VAR_KEYWORD)] if a.kwarg else []
    positional = a.posonlyargs + a.args
    first_default = len(positional) - len(a.defaults)
    params = [p.replace(default=None) if (i >= first_default and i < len(positional))
              or (p.kind is kind.KEYWORD_ONLY and a.kw_defaults[i - len(positional) - bool(a.vararg)] is not None)
              else p for i, p in enumerate(params)]
    return inspect.Signature(params)


def bad_calls(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Calls whose arguments the callee does not take (a keyword renamed, a parameter added without a default): of a
    function the file defines once at module level, undecorated, by its bare name; of a plain function of a package
    module, imported by name or read from the module's alias. Calls that spread ``*args`` / ``**kwargs`` are not
    checked."""
    tree = ast.parse(path.read_text(), str(path))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    names = [d.name for d in defs]
    rebound = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
               for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    nested = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} - set(names)
    # a decorator may change what the name takes (hypothesis' composite drops ``draw``; a fixture is never called)
    known = {d.name: _signature(d) for d in defs
             if names.count(d.name) == 1 and d.name not in rebound | nested and not d.decorator_list}
    known.update((k, v) for k, v in package_functions(tree).items() if k not in rebound | nested | set(names))
    aliases = package_aliases(tree)
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in known:
            sig = known[name]
        elif isinstance(node.func, ast.Attribute) and _dotted(node.func.value) in aliases:
            sig = _package_signature(aliases[_dotted(node.func.value)], node.func.attr)
        else:
            continue
        spread = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        if sig is None or spread:
            continue
        try:
            sig.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            bad.append(f"{path.relative_to(root)}:{node.lineno}: {name}(): {e}")
    return bad


def _package_signature(module: str, attr: str) -> inspect.Signature | None:
    """A plain Python function's signature in a package module, else None (classes, torch ops, builtins)."""
    obj = getattr(importlib.import_module(module), attr, None)
    return inspect.signature(obj) if inspect.isfunction(obj) else None


def package_functions(tree: ast.Module) -> dict[str, inspect.Signature]:
    """Functions the file imports by name from a package module (``from fp8_fusion_pass.models import
    build_model``), by their local name."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fp8_fusion_pass"):
            for a in node.names:
                sig = _package_signature(node.module, a.name) if a.name != "*" else None
                if sig is not None:
                    out[a.asname or a.name] = sig
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_read_from_the_package_exists(path):
    assert not missing_names(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_call_of_a_module_function_fits_its_parameters(path):
    assert not bad_calls(path)


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


def test_a_call_with_a_renamed_keyword_is_found(tmp_path):
    # the check can fail: a GPU test calling its helper with a keyword the helper no longer takes
    stale = tmp_path / "stale.py"
    stale.write_text("def helper(model, step, batch, *, eager=None):\n    return model\n\n\n"
                     "def test_x():\n    helper(1, 2, 3, eager=4)\n    helper(1, 2, batch=3, reference=4)\n"
                     "    helper(1, 2)\n")
    got = bad_calls(stale, tmp_path)
    assert [g.split(":")[1] for g in got] == ["7", "8"], got
    # and a package function, imported by name or read from its module
    stale.write_text("from fp8_fusion_pass import guards\n"
                     "from fp8_fusion_pass.models import build_model\n\n\ndef test_x():\n"
                     "    build_model('qwen3-8b', n_layers=2)\n    guards.should_read_cache_grouped(1, 8)\n")
    got = bad_calls(stale, tmp_path)
    assert [g.split(": ")[1] for g in got] == ["build_model()", "guards.should_read_cache_grouped()"], got
