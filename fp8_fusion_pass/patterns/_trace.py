"""Turning search functions into patterns that match Inductor's post-grad graph.

A search function (written from ``kernels/reference.py``) is traced once per process with tiny fake inputs,
normalised the way ``compile_fx`` normalises the real graph, and converted into a ``PatternExpr``:

- ``fwd_only`` gives ``aten.view``; the post-grad graph has ``aten.reshape`` (``compile_fx`` runs
  ``view_to_reshape`` first), so the trace runs it too (``inductor_api.md`` §0.3: 0 matches without it);
- torch 2.11 / 2.12 fold ``fp32 -> bf16 -> fp32`` convert chains before the post-grad passes and 2.13+ keep
  them (§0.4), so ``fold_round_trips=True`` gives the pre-2.13 spelling; forms register both when they differ;
- literals are kept exact (``ignore_types=()``: ``pow(x, 2)`` never matches ``pow(x, 3)``), except the ones
  named in ``scalar_workaround`` (eps), which become ``KeywordArg``s so any eps matches and reaches the rewrite.

Tracing runs under a private ``FakeTensorMode`` (no kernel runs, no device touched; the same trick as vLLM's
``enable_fake_mode``) and outside any compile's fake mode.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch
from torch._inductor.pattern_matcher import (
    MULTIPLE,
    CallFunction,
    KeywordArg,
    PatternExpr,
    fwd_only,
    fx_to_pattern,
)

aten = torch.ops.aten
prims = torch.ops.prims

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fold_round_trips(gm: torch.fx.GraphModule) -> int:
    """Fold ``convert(convert(x, narrow), wide)`` into ``convert(x, wide)`` as torch < 2.13's joint-graph
    ``pointless_convert`` does (then drop converts to the dtype x already has). Returns the number folded."""
    folded = 0
    convert = prims.convert_element_type.default
    for node in list(gm.graph.nodes):
        if node.target is not convert or not isinstance(node.args[0], torch.fx.Node):
            continue
        inner = node.args[0]
        if inner.target is not convert or node.args[1] not in _FLOATS or inner.args[1] not in _FLOATS:
            continue
        src = inner.args[0]
        src_dtype = src.meta["val"].dtype if isinstance(src, torch.fx.Node) and "val" in src.meta else None
        with gm.graph.inserting_before(node):
            repl = src if src_dtype == node.args[1] else gm.graph.call_function(convert, (src, node.args[1]))
        if repl is not src:
            repl.meta.update(node.meta)
        node.replace_all_uses_with(repl)
        gm.graph.erase_node(node)
        if not inner.users:
            gm.graph.erase_node(inner)
        folded += 1
    gm.graph.lint()
    gm.recompile()
    return folded


def trace(fn: Callable, args: Sequence, fold: bool = False) -> torch.fx.GraphModule:
    """``fwd_only`` + ``view_to_reshape`` (+ the pre-2.13 convert folding when ``fold``)."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = fwd_only(fn, list(args))  # no get_decomp_fn keyword: 2.11 lacks it
    view_to_reshape(gm)
    if fold:
        fold_round_trips(gm)
    return gm


def pattern_of(
    search_fn: Callable,
    example_inputs: Callable[[], Sequence],
    scalar_workaround: dict[str, float] | None = None,
    fold: bool = False,
) -> tuple[PatternExpr, str]:
    """The pattern of ``search_fn`` and a printable key (for de-duplicating equal variants).

    ``example_inputs`` is called inside the fake mode; scalars named in ``scalar_workaround`` are passed with
    their example value (pick one that occurs nowhere else in the trace).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    names = list(inspect.signature(search_fn).parameters)
    scalar_workaround = dict(scalar_workaround or {})
    with torch._guards.tracing(None), unset_fake_temporarily(), FakeTensorMode():
        tensors = list(example_inputs())
        args = [scalar_workaround[n] if n in scalar_workaround else tensors.pop(0) for n in names]
        gm = trace(search_fn, args, fold=fold)
    pattern = fx_to_pattern(gm, ignore_types=(), argnames=names, scalar_workaround=scalar_workaround)
    return pattern, gm.code


def walk(pattern) -> list:
    """Every ``PatternExpr`` node reachable from ``pattern`` (args and kwargs, lists included)."""
    out, stack, seen = [], [pattern], set()
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        if isinstance(p, (list, tuple)):
            stack.extend(p)
            continue
        if not isinstance(p, PatternExpr):
            continue
        out.append(p)
        stack.extend(getattr(p, "args", ()))
        stack.extend(getattr(p, "kwargs", {}).values())
    return out


def allow_extra_users(pattern: PatternExpr, fn) -> PatternExpr:
    """Let every call of ``fn`` inside ``pattern`` have users outside it (the residual add's sum is also the
    next residual; a norm output may be inspected by the rewrite for other consumers)."""
    for p in walk(pattern):
        if isinstance(p, CallFunction) and fn in p.fns:
            p.users = MULTIPLE
    return pattern


def cut(pattern: PatternExpr, fn, names: Sequence[str]) -> PatternExpr:
    """``pattern`` with the calls of ``fn`` replaced, in order of first appearance (arguments depth-first), by
    ``KeywordArg(names[i])``: the split gate/up SiLU form is the merged form with its two slices cut off.

    Builds new ``CallFunction``s (they cache their flattened arguments, so editing ``args`` in place would not
    change what they match), keeping shared sub-patterns shared."""
    found: list = []
    memo: dict = {}

    def visit(p):
        if isinstance(p, (list, tuple)):
            return type(p)(visit(a) for a in p)
        if not isinstance(p, CallFunction):
            return p
        if id(p) in memo:
            return memo[id(p)]
        if fn in p.fns:
            if p not in found:
                found.append(p)
            out = KeywordArg(names[found.index(p)])
        else:
            args = [visit(a) for a in p.args]
            kwargs = {k: visit(v) for k, v in p.kwargs.items()}
            out = CallFunction(p.fns, *args, _users=p.users, **kwargs)
        memo[id(p)] = out
        return out

    out = visit(pattern)
    if len(found) != len(names):
        raise ValueError(f"cut: expected {len(names)} calls of {fn}, found {len(found)}")
    return out
