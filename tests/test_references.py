"""Every name the tests and benchmarks read from this project's modules exists, and every call of this project's
functions fits the callee's parameters, checked on the CPU.

The GPU tests and the benchmarks run only on the device machine, a few times a session, so a name renamed in the
package (a guard's bound, a kernel's table) or in a test helper, but left in one of them, would fail there first,
after the CPU suite passed (``guards.GQA_MIN_PAIRS`` in a GPU test's body, 2026-12-06, caught by hand). Two kinds of
module are "ours": the package's (``fp8_fusion_pass.*``: imported, attributes and signatures read from the objects)
and the tests' and benchmarks' helper modules (``tolerances``, ``pattern_helpers``, ``_timing``, ...: read from
their source, never imported). Plain functions only: a class, a decorated function or a torch op is not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.joinpath("tests").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py")])


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


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """Names a module binds at its top level (inside top-level ``if`` / ``try`` too, never inside a def)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            names |= {t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        elif isinstance(node, (ast.If, ast.Try)):
            inner = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            inner += [s for h in getattr(node, "handlers", []) for s in h.body]
            names |= _bound_names(inner)
    return names


class Module:
    """One of our modules, as the check sees it: ``has(name)`` (None: unknown, e.g. a star import) and
    ``signature(name)`` (None: not a plain function)."""

    def __init__(self, name: str, path: pathlib.Path | None):
        self.name, self.path = name, path
        if path is None:  # the package's: the module object itself
            self.obj = importlib.import_module(name)
            return
        tree = ast.parse(path.read_text(), str(path))
        star = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in tree.body)
        self.names = None if star else _bound_names(tree.body)
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        once = [d for d in defs if [e.name for e in defs].count(d.name) == 1 and not d.decorator_list]
        self.functions = {d.name: _signature(d) for d in once}

    def has(self, attr: str) -> bool | None:
        if self.path is None:
            return hasattr(self.obj, attr) or _module(f"{self.name}.{attr}") is not None
        return None if self.names is None else attr in self.names

    def signature(self, attr: str) -> inspect.Signature | None:
        if self.path is None:
            obj = getattr(self.obj, attr, None)
            return inspect.signature(obj) if inspect.isfunction(obj) else None
        return self.functions.get(attr)


@functools.cache
def _helpers() -> dict[str, pathlib.Path]:
    """The tests' and benchmarks' helper modules by the name they are imported as: files of a directory that is no
    package (pytest and the benchmarks put those on ``sys.path``), not test files, not named as a standard module
    (the aiter stand-in's ``aiter/ops/enum.py`` is ``aiter.ops.enum``); a name two files share is left out: which
    one an import gets depends on ``sys.path``."""
    paths = [p for p in FILES if not p.name.startswith("test_") and p.name != "conftest.py"
             and not (p.parent / "__init__.py").exists() and p.stem not in sys.stdlib_module_names]
    stems = [p.stem for p in paths]
    return {p.stem: p for p in paths if stems.count(p.stem) == 1}


@functools.cache
def _module(name: str) -> Module | None:
    """Our module of that dotted name, else None (torch, the standard library, ...)."""
    if name.split(".")[0] == "fp8_fusion_pass":
        try:
            return Module(name, None)
        except ImportError:
            return None
    return Module(name, _helpers()[name]) if name in _helpers() else None


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a chain of attribute loads on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def _imports(tree: ast.Module):
    """``(node, module name, imported name or None, local name)`` for every absolute import of one of our modules
    (``import m`` / ``import m as x``: imported name None), top level or inside a function."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # ``import a.b`` binds ``a``; ``import a.b as x`` binds ``x`` to ``a.b``
                mod = a.name if a.asname else a.name.split(".")[0]
                if _module(a.name) and _module(mod):
                    yield node, mod, None, a.asname or mod
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _module(node.module):
            for a in node.names:
                yield node, node.module, a.name, a.asname or a.name


def _scope(tree: ast.Module) -> tuple[dict[str, Module], dict[str, tuple[Module, str]]]:
    """Local names bound to our modules, and to names imported from them (``from m import f``: (m, "f"))."""
    modules, names = {}, {}
    for _, mod, name, local in _imports(tree):
        if name is None:
            modules[local] = _module(mod)
        elif _module(f"{mod}.{name}"):
            modules[local] = _module(f"{mod}.{name}")
        else:
            names[local] = (_module(mod), name)
    return modules, names


def _target(node: ast.AST, modules: dict[str, Module]) -> tuple[Module, str] | None:
    """(module, attribute) when ``node`` reads an attribute of one of our modules (``alias.x`` or a dotted
    ``fp8_fusion_pass.a.x``)."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
        return None
    head = _dotted(node.value)
    module = modules.get(head) if head in modules else (_module(head) if head and "." in head else None)
    return (module, node.attr) if module else None


def missing_names(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Names the file reads from our modules that they lack: ``from m import x`` (in a function too, where an import
    runs only when the test does), ``alias.x`` and ``fp8_fusion_pass.m.x`` spelt out."""
    tree = ast.parse(path.read_text(), str(path))
    modules, _ = _scope(tree)
    missing = []
    for node, mod, name, _ in _imports(tree):
        if name not in (None, "*") and _module(mod).has(name) is False:
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {mod}.{name}")
    for node in ast.walk(tree):
        target = _target(node, modules)
        if target and target[0].has(target[1]) is False:
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {_dotted(node.value)}.{node.attr}")
    return missing


def bad_calls(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Calls whose arguments the callee does not take (a keyword renamed, a parameter added without a default): of a
    function the file defines once at module level, undecorated, by its bare name; of a plain function of our
    modules, imported by name or read from the module's alias. Calls that spread ``*args`` / ``**kwargs`` are not
    checked, nor names the file rebinds."""
    tree = ast.parse(path.read_text(), str(path))
    modules, imported = _scope(tree)
    own = Module(path.stem, path).functions
    rebound = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
               for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    nested = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} - set(own)
    calls = {local: m.signature(name) for local, (m, name) in imported.items()} | own
    calls = {k: v for k, v in calls.items() if v is not None and k not in rebound | nested}
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name):
            sig = calls.get(node.func.id)
        else:
            target = _target(node.func, modules)
            sig = target and target[0].signature(target[1])
        spread = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        if sig is None or spread:
            continue
        try:
            sig.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            bad.append(f"{path.relative_to(root)}:{node.lineno}: {_dotted(node.func)}(): {e}")
    return bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_read_from_our_modules_exists(path):
    assert not missing_names(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_call_of_our_functions_fits_their_parameters(path):
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
    # a test helper module, read from its source
    stale.write_text("import tolerances\nfrom pattern_helpers import exact_attention\n\n\n"
                     "def f(noise):\n    return tolerances.pass_vs_eager(noise)\n")
    assert missing_names(stale, tmp_path) == ["stale.py:2: pattern_helpers.exact_attention",
                                              "stale.py:6: tolerances.pass_vs_eager"]


def test_a_call_with_a_renamed_keyword_is_found(tmp_path):
    # the check can fail: a GPU test calling its helper with a keyword the helper no longer takes
    stale = tmp_path / "stale.py"
    stale.write_text("def helper(model, step, batch, *, eager=None):\n    return model\n\n\n"
                     "def test_x():\n    helper(1, 2, 3, eager=4)\n    helper(1, 2, batch=3, reference=4)\n"
                     "    helper(1, 2)\n")
    got = bad_calls(stale, tmp_path)
    assert [g.split(":")[1] for g in got] == ["7", "8"], got
    # a package function, imported by name or read from its module; a test helper's
    stale.write_text("import tolerances\nfrom fp8_fusion_pass import guards\n"
                     "from fp8_fusion_pass.models import build_model\n\n\ndef test_x():\n"
                     "    build_model('qwen3-8b', n_layers=2)\n    guards.should_read_cache_grouped(1, 8)\n"
                     "    tolerances.pass_vs_eager_bound(0.1, 0.2, 0.3)\n")
    got = bad_calls(stale, tmp_path)
    assert [g.split(": ")[1] for g in got] == [
        "build_model()", "guards.should_read_cache_grouped()", "tolerances.pass_vs_eager_bound()"], got
