"""Zero-fill stripping: a zeroed scale buffer that only an overwriting op consumes becomes ``empty``.

    before                                                  after
    s = full([1], 0, f32)          # torch.zeros(1)          s = empty.memory_format([1], f32)
    af = auto_functionalized_v2(fp8_fusion.dynamic_per_tensor_quant, x=x,
             _out_base_index=0, _scale_base_index=1, _all_bases=[out, s])      (unchanged)

Engine code (sglang ``scaled_fp8_quant``, the seed PR, ``quantize.PerTensorFP8Linear``) allocates
``torch.zeros(1)`` before a dynamic per-tensor quant op. Whether the zeros matter is a property of the op:
aiter's ``dynamic_per_tensor_quant`` and ours overwrite the scale (the fill is one dead FillFunctor launch per
quantized GEMM input), vLLM's ``dynamic_scaled_fp8_quant`` max-reduces into it (the fill is load-bearing).
``scale_semantics.py`` holds that knowledge; this rewrite only acts on ``overwrites`` entries.

A zero fill is any of ``full(size, 0)`` (what zeros / zeros_like / new_zeros / empty().zero_() / fill_(0)
become in the post-grad graph), ``zeros``, ``full_like(x, 0)`` / ``zeros_like``, or ``zero`` / ``fill(0)``
(functional or in-place) on a fresh ``empty`` nobody else uses. Its consumers are read in all three forms:
- v2 (default): ``auto_functionalized_v2(op, _<arg>_base_index=i, _all_bases=[...])``; base ``i`` maps back
  to the argument through ``_<arg>_base_index``, and ``_<arg>_size/_stride/_storage_offset``,
  ``_<arg>_slice_*`` or ``_<arg>_alias`` mean the op sees a view, not the whole buffer;
- v1 (``enable_auto_functionalized_v2=False``): ``auto_functionalized(op, <arg>=fill, ...)``;
- a direct call of the op (graphs built by hand, or ops whose schema hides the mutation).
Ops tagged ``torch.Tag.out`` (2.13+) never show the user's buffer (``_all_bases=[]``): nothing to strip.

Guards (a fill is stripped only if every one holds; otherwise it is kept with a reason code, FILL_REASONS):
- every consumer is a scale argument of an op registered ``overwrites`` whose schema declares it mutable;
- each consumer sees the whole buffer (no view, no second slot of the same op);
- nothing else reads it and it is not a graph output.
Fills that feed no mutable argument and no registered one (masks, accumulators) are not scale buffers: no
decision is recorded for them.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Graph, Node

from ..config import FusionConfig
from ..report import FusionReport
from ..scale_semantics import ACCUMULATES, OVERWRITES, lookup, op_key
from . import _graph

NAME = "zero_fill"
aten = torch.ops.aten

# Reason codes for kept fills, most important first (the report shows the first that applies).
FILL_REASONS = {
    "fill_graph_output": "the zeroed buffer is returned from the graph",
    "fill_other_reader": "something reads the zeros: a plain op, or a non-scale argument of the consumer",
    "fill_aliased": "a consumer sees a view or alias of the buffer, or gets it twice",
    "fill_registry_invalid": "the registry entry does not fit the op's schema (argument missing or not mutable)",
    "fill_accumulating_op": "the consumer is registered `accumulates`: it max-reduces into the zeros",
    "fill_unregistered_op": "the (op, argument) has no scale-semantics entry; probe it, then register_scale_writer",
}
_PRIORITY = {code: i for i, code in enumerate(FILL_REASONS)}

_FULL = (aten.full.default, aten.zeros.default)  # (size, [value]) -> new buffer
_LIKE = (aten.full_like.default, aten.zeros_like.default)  # (x, [value]) -> buffer shaped like x
_ZERO_EMPTY = (aten.zero.default, aten.zero_.default, aten.fill.Scalar, aten.fill_.Scalar)  # (empty, [value])
_EMPTY = (aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
          aten.new_empty.default, aten.new_empty_strided.default)
_VIEW_SUFFIXES = ("_size", "_stride", "_storage_offset", "_slice_dim", "_slice_start", "_slice_end", "_alias")


@dataclasses.dataclass(frozen=True)
class Use:
    """How one user of a fill uses it. ``reason`` empty = an overwriting scale slot; ``slot`` = it feeds a
    mutable (or registered) argument, which makes the fill a scale-buffer candidate worth a report line."""

    what: str  # "fp8_fusion::dynamic_per_tensor_quant(scale)" or the reader's target
    reason: str = ""
    slot: bool = False


def _is_zero(value) -> bool:
    return isinstance(value, (bool, int, float)) and value == 0  # 0, 0.0, -0.0, False


def _zero_fill(node: Node) -> str | None:
    """``"full"`` / ``"like"`` / ``"fresh_empty"`` if ``node`` makes a zero-filled buffer, else None."""
    if node.op != "call_function":
        return None
    value = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value", node.kwargs.get("value", 0))
    if node.target in _FULL or node.target in _LIKE:
        zeros = node.target in (aten.zeros.default, aten.zeros_like.default)
        return ("full" if node.target in _FULL else "like") if zeros or _is_zero(value) else None
    if node.target in _ZERO_EMPTY and (node.target in (aten.zero.default, aten.zero_.default) or _is_zero(value)):
        src = node.args[0]
        if isinstance(src, Node) and src.op == "call_function" and src.target in _EMPTY and len(src.users) == 1:
            return "fresh_empty"
    return None


def _mutable_args(op) -> set[str]:
    return {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def _slot_use(op, arg: str) -> Use:
    what = f"{op_key(op).removesuffix('.default')}({arg})"
    found = lookup(op, arg)
    if found.entry is None:
        return Use(what, "fill_unregistered_op", slot=True)
    if found.error:
        return Use(what, "fill_registry_invalid", slot=True)
    return Use(what, "" if found.entry.semantics == OVERWRITES else "fill_accumulating_op", slot=True)


def _contains(value, node: Node) -> bool:
    return value is node or (isinstance(value, (list, tuple)) and any(_contains(v, node) for v in value))


def _uses_v2(fill: Node, user: Node) -> list[Use]:
    op, kwargs = user.args[0], user.kwargs
    bases = list(kwargs.get("_all_bases", ()))
    uses = [Use(f"{op_key(op)} reads it as {k}", "fill_other_reader")
            for k, v in kwargs.items() if k != "_all_bases" and _contains(v, fill)]
    for index in (i for i, b in enumerate(bases) if b is fill):
        # "_<arg>_base_index" (or "_<arg>_<k>_base_index" for Tensor[] arguments) -> the argument(s) on base i
        prefixes = [k.removesuffix("_base_index") for k, v in kwargs.items()
                    if k.endswith("_base_index") and v == index]
        args = [p[1:] for p in prefixes]
        if len(args) != 1 or args[0] not in _mutable_args(op):
            uses.append(Use(f"{op_key(op)} gets it as {args or 'no argument'}", "fill_aliased", slot=True))
        elif any(prefixes[0] + s in kwargs for s in _VIEW_SUFFIXES):
            uses.append(Use(f"{op_key(op)}({args[0]}) sees a view of it", "fill_aliased", slot=True))
        else:
            uses.append(_slot_use(op, args[0]))
    if bases.count(fill) > 1:
        uses.append(Use(f"{op_key(op)} lists it twice in _all_bases", "fill_aliased", slot=True))
    return uses


def _uses_named(fill: Node, op, named: dict) -> list[Use]:
    # v1 auto_functionalized kwargs, or a direct call's arguments by schema name.
    mutable = _mutable_args(op)
    names = [k for k, v in named.items() if _contains(v, fill)]
    uses = []
    for name in names:
        if name in mutable or lookup(op, name).entry is not None:
            uses.append(_slot_use(op, name))
        else:
            uses.append(Use(f"{op_key(op)} reads it as {name}", "fill_other_reader"))
    if sum(u.slot for u in uses) > 1:
        uses.append(Use(f"{op_key(op)} gets it in {names}", "fill_aliased", slot=True))
    return uses


def _by_name(op, node: Node) -> dict:
    schema = op._schema.arguments
    named = {a.name: v for a, v in zip(schema, node.args)}
    named.update(node.kwargs)
    return named


def _uses(fill: Node, user: Node) -> list[Use]:
    if user.op == "output":
        return [Use("graph output", "fill_graph_output")]
    if user.op == "call_function" and user.target in _graph.AUTO_FUNCTIONALIZED:
        if not isinstance(user.args[0], torch._ops.OpOverload):  # v2 can also wrap a higher-order op
            return [Use(f"{_name(user.args[0])} (no schema)", "fill_unregistered_op", slot=True)]
        if "_all_bases" in user.kwargs:
            return _uses_v2(fill, user)
        return _uses_named(fill, user.args[0], user.kwargs)
    if user.op == "call_function" and isinstance(user.target, torch._ops.OpOverload):
        if user.target._schema.is_mutable or any(lookup(user.target, n).entry for n in _by_name(user.target, user)):
            return _uses_named(fill, user.target, _by_name(user.target, user))
        # A view of the fill, consumed as a scale: the op would write only part of it (or alias it).
        if user.target.is_view and any(u.slot for d in user.users for u in _uses(user, d)):
            return [Use(f"{_name(user.target)} views it", "fill_aliased", slot=True)]
    return [Use(f"{_name(user.target)} reads it", "fill_other_reader")]


def _name(target) -> str:
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def _shapes(node: Node) -> str:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ""
    return f"{str(val.dtype).removeprefix('torch.')}[{', '.join(map(str, val.shape))}]"


def _empty_like_fill(graph: Graph, fill: Node, kind: str) -> Node:
    """A new ``empty`` with the fill's size / dtype / device (the fill's meta copied), inserted before it."""
    val = fill.meta.get("val")
    kw = {k: fill.kwargs[k] for k in ("dtype", "layout", "device", "pin_memory") if k in fill.kwargs}
    if isinstance(val, torch.Tensor):
        kw.update(dtype=val.dtype, device=val.device)  # full(size, 0) with dtype=None is int64: trust the meta
    with graph.inserting_before(fill):
        if kind == "full":
            new = graph.call_function(aten.empty.memory_format, (fill.args[0],), kw)
        else:  # like: keep the strides of the source tensor
            new = graph.call_function(aten.empty_like.default, (fill.args[0],),
                                      {**kw, "memory_format": torch.preserve_format})
    new.meta.update(fill.meta)
    return new


def _strip(graph: Graph, fill: Node, kind: str) -> None:
    if kind == "fresh_empty":
        fill.replace_all_uses_with(fill.args[0])
    else:
        # One empty per consumer: a buffer shared by two mutating ops would make Inductor clone it for the first.
        for user in list(fill.users):
            user.replace_input_with(fill, _empty_like_fill(graph, fill, kind))
    graph.erase_node(fill)


def run(graph: Graph, report: FusionReport, config: FusionConfig) -> int:
    """Strip every zero fill whose only consumers overwrite it; record each stripped and each kept fill.
    Returns the number stripped."""
    if not config.enabled(NAME):
        return 0
    stripped = 0
    for fill in list(graph.nodes):
        kind = _zero_fill(fill)
        if kind is None:
            continue
        try:
            uses = [u for user in fill.users for u in _uses(fill, user)]
        except Exception as e:  # noqa: BLE001 - an unexpected graph form keeps its fill; the rest still run
            report.error(NAME, fill.name, f"deciding about this fill raised {type(e).__name__}: {e}")
            continue
        if not any(u.slot for u in uses):
            continue  # not a scale buffer (a mask, an accumulator): no decision to report
        kept = sorted((u for u in uses if u.reason), key=lambda u: _PRIORITY[u.reason])
        if kept:
            detail = "; ".join(f"{u.what}: {u.reason}" if u.reason else f"{u.what}: overwrites" for u in uses)
            report.keep_fill(fill.name, kept[0].reason, detail, _shapes(fill))
            continue
        shapes = _shapes(fill)
        _strip(graph, fill, kind)
        report.strip_fill(fill.name, ", ".join(u.what for u in uses), shapes)
        stripped += 1
    return stripped


__all__ = ["ACCUMULATES", "FILL_REASONS", "NAME", "OVERWRITES", "run"]
