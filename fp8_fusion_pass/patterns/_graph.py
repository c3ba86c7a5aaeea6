"""Small graph-editing helpers the rewrites share: new nodes with fake ``meta["val"]``, reshape chains,
consumers of a quant, shape strings for the report, and an all-or-nothing edit (``Edit``).
"""

from __future__ import annotations

import contextlib
import functools
import operator

import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.node import map_arg

from ..kernels import ops as _ops  # noqa: F401  (registers torch.ops.fp8_fusion.*)

aten = torch.ops.aten
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
GROUP_QUANT = torch.ops.fp8_fusion.group_quant.default
BLOCKSCALE_MM = torch.ops.fp8_fusion.blockscale_mm.default


def is_call(node, *targets) -> bool:
    """``node`` is a graph node calling one of ``targets``."""
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def val(node):
    """The FakeTensor (or SymInt, or tuple) a node computes; None when unknown."""
    return node.meta.get("val") if isinstance(node, Node) else node


def static_int(n) -> int | None:
    """``n`` as an int when it is one in this graph: an int, a SymInt whose expression is a number (a size that
    Dynamo marked dynamic and then specialized by a guard, as ``dynamic=True`` does to a cache's kv heads that must
    equal the model's), or one the shape env proves equal to its hint; None for a size that can vary."""
    if isinstance(n, int):
        return n
    if isinstance(n, torch.SymInt) and n.node.expr.is_number:
        return int(n.node.expr)
    hint = n.node.hint if isinstance(n, torch.SymInt) else None
    if isinstance(hint, int) and statically_known_true(n == hint):  # a number written as an expression the shape
        return hint  # env proves equal to it (duck-sized symbols leave ((s**2)//s)-style floor divisions in views)
    return None


def data_users(node: Node) -> list[Node]:
    """``node``'s users that read its values, not only its shape (a dynamic graph's ``sym_size`` reads). For a node
    a rewrite keeps; one it erases keeps only the reads ``fold_static_size_reads`` cannot fold."""
    return [u for u in node.users if not is_call(u, aten.sym_size.int)]


def static_size_read(node) -> int | None:
    """The number a ``sym_size`` read gives when this graph fixes it (``static_int``), else None: such a read is no
    reason to keep what it reads, since the number can stand in for it (``fold_static_size_reads``)."""
    if not is_call(node, aten.sym_size.int):
        return None
    return static_int(val(node))


def fold_static_size_reads(nodes) -> None:
    """Every ``sym_size`` read of ``nodes`` that ``static_size_read`` fixes becomes its number in its readers'
    arguments, and goes. A rewrite calls this before it erases ``nodes``: a size read left on one (a dynamic graph's,
    e.g. the kv heads of the scores' view, read for the mask's expand) would keep it, and what it reads, alive."""
    for node in nodes:
        for read in [u for u in node.users if static_size_read(u) is not None]:
            number = static_size_read(read)
            for reader in list(read.users):  # not replace_input_with: its replace hooks take a node's name
                reader.args = map_arg(reader.args, functools.partial(_swap, read, number))
                reader.kwargs = map_arg(reader.kwargs, functools.partial(_swap, read, number))
            node.graph.erase_node(read)


def _swap(old: Node, new, arg):
    return new if arg is old else arg


def reshape_sizes(shape) -> list[int] | None:
    """``shape`` as a reshape's sizes: its static sizes as ints, one symbolic size as -1 (a SymInt object in a node's
    arguments would not be a graph value Inductor can read); None when more than one size is symbolic."""
    sizes = [static_int(s) for s in shape]
    unknown = [i for i, s in enumerate(sizes) if s is None]
    if len(unknown) > 1:
        return None
    if unknown:
        sizes[unknown[0]] = -1
    return sizes


def call(graph: Graph, target, args: tuple, kwargs: dict | None = None) -> Node:
    """Insert ``target(*args)`` at the graph's current insertion point, with ``meta["val"]`` computed on the fake
    values of its inputs (Inductor's later passes and our guards read it). Nothing is left behind if it raises."""
    kwargs = kwargs or {}
    node = graph.call_function(target, args, kwargs)
    try:
        if target is operator.getitem:
            node.meta["val"] = val(args[0])[args[1]]
            return node
        fake_args, fake_kwargs = torch.fx.map_arg((args, kwargs), lambda n: n.meta["val"])
        fake_mode = torch._guards.detect_fake_mode(pytree.tree_leaves((fake_args, fake_kwargs)))
        with fake_mode or contextlib.nullcontext():
            node.meta["val"] = target(*fake_args, **fake_kwargs)
    except BaseException:
        graph.erase_node(node)
        raise
    return node


def strip_reshapes(node: Node) -> tuple[Node, list[Node]]:
    """Walk back from ``node`` through reshapes / views; returns (source, chain from node back to source)."""
    chain = []
    while isinstance(node, Node) and node.target in RESHAPES:
        chain.append(node)
        node = node.args[0]
    return node, chain


def through_views(node: Node, chain: list[Node]) -> Node:
    """Walk back from ``node`` through reshapes and expands that keep the shape (what ``matmul`` adds around a
    bmm), appending each to ``chain``; returns the first node that is neither."""
    while is_call(node, *RESHAPES) or (is_call(node, aten.expand.default) and same_shape(node, node.args[0])):
        chain.append(node)
        node = node.args[0]
    return node


def keeps_last_dim(chain: list[Node]) -> bool:
    """Every reshape in ``chain`` keeps the last dim, so a per-row group quant commutes with it."""
    for r in chain:
        a, b = val(r.args[0]), val(r)
        if a is None or b is None or a.dim() == 0 or b.dim() == 0:
            return False
        if not statically_known_true(a.shape[-1] == b.shape[-1]):
            return False
    return True


def quant_outputs(quant: Node) -> tuple[list[Node], list[Node]]:
    """The getitem nodes of a group_quant: (those taking q, those taking scale)."""
    qs, ss = [], []
    for u in quant.users:
        if u.target is operator.getitem and u.args[1] == 0:
            qs.append(u)
        elif u.target is operator.getitem and u.args[1] == 1:
            ss.append(u)
    return qs, ss


def final_users(node: Node) -> list[tuple[Node, Node]]:
    """(user, the node it reads) for the users of ``node``, looking through reshapes / views."""
    out = []
    for u in node.users:
        if u.target in RESHAPES and u.args[0] is node:
            out.extend(final_users(u))
        else:
            out.append((u, node))
    return out


def quant_consumers(quant: Node) -> list[str]:
    """Describe every consumer of a quant's outputs that is not a block-scale GEMM reading them as (q, x_scale).

    Empty list: the quant feeds only ``blockscale_mm`` (through reshapes at most)."""
    bad = []
    qs, ss = quant_outputs(quant)
    for slot, getitems in ((0, qs), (1, ss)):
        for g in getitems:
            for user, read in final_users(g):
                if user.target is BLOCKSCALE_MM and len(user.args) > slot and user.args[slot] is read:
                    continue
                bad.append(f"{'q' if slot == 0 else 'scale'} -> {describe(user)}")
    if len(quant.users) != len(qs) + len(ss):
        bad.append("the quant's tuple is used whole")
    return bad


def gemm_shapes(quant: Node) -> list[tuple[int, int]]:
    """(N, K) of every block-scale GEMM consuming the quant's q (from its weight's shape)."""
    out = []
    for g in quant_outputs(quant)[0]:
        for user, _ in final_users(g):
            if user.target is BLOCKSCALE_MM and val(user.args[2]) is not None:
                n, k = val(user.args[2]).shape
                out.append((n, k))
    return out


def describe(node: Node) -> str:
    if node.op == "output":
        return "graph output"
    if node.op == "call_function":
        return f"{_target_name(op_of(node))} ({node.name})"
    return f"{node.op} {node.name}"


# Inductor's post-grad wrappers of an op that mutates its inputs: v1 and v2 (both exist in torch 2.11 - 2.15)
AUTO_FUNCTIONALIZED = (auto_functionalized, auto_functionalized_v2)


def op_of(node: Node):
    """The op a call runs: for an ``auto_functionalized(_v2)`` node (Inductor's post-grad form of an op that mutates
    its inputs, such as the per-tensor quant) the op it wraps, else its target."""
    if node.target in AUTO_FUNCTIONALIZED and node.args:
        return node.args[0]
    return node.target


def _target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return getattr(target, "__name__", str(target))


def shape_str(**tensors) -> str:
    """``x[2, 5, 256] w[256]`` for the report (symbolic sizes print as their expressions)."""
    parts = []
    for name, node in tensors.items():
        v = val(node)
        if isinstance(v, torch.Tensor):
            parts.append(f"{name}[{', '.join(str(s) for s in v.shape)}]")
    return " ".join(parts)


def dtype_str(node) -> str:
    v = val(node)
    return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else ""


def shape_is(t: torch.Tensor, *shapes) -> bool:
    """``t``'s shape is provably one of ``shapes`` (sizes or SymInts: a symbolic size matches itself, never a
    guess)."""
    return any(t.dim() == len(sh) and all(statically_known_true(a == b) for a, b in zip(t.shape, sh))
               for sh in shapes)  # fmt: skip


def same_shape(a, b) -> bool:
    a, b = val(a), val(b)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != b.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape))


class Edit:
    """Record the nodes a rewrite inserts; if the rewrite raises before rewiring, erase them again, so a failed
    rewrite leaves the graph as it was (``with Edit(graph, before=node) as e: e.call(...)``)."""

    def __init__(self, graph: Graph, before: Node | None = None, after: Node | None = None):
        self.graph, self.new = graph, []
        # inserting_after(n) would put each new node right after n, i.e. in reverse order: insert before n.next
        self._ctx = graph.inserting_before(after.next if after is not None else before)

    def call(self, target, *args, **kwargs) -> Node:
        node = call(self.graph, target, args, kwargs)
        self.new.append(node)
        return node

    def __enter__(self) -> Edit:
        self._ctx.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._ctx.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            for node in reversed(self.new):
                if not node.users:
                    self.graph.erase_node(node)
        return False


def replace_uses(old: Node, new: Node, keep: set | None = None) -> None:
    """Point every user of ``old`` (except those in ``keep``) at ``new``."""
    keep = keep or set()
    old.replace_all_uses_with(new, delete_user_cb=lambda u: u not in keep)


def erase_dead(graph: Graph, nodes) -> None:
    """Erase the given nodes (and what only they used) once nothing uses them; pure nodes only."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node._erased or node.users or node.op != "call_function" or _impure(node):
            continue
        inputs = [a for a in node.all_input_nodes]
        graph.erase_node(node)
        pending.extend(inputs)


def _impure(node: Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable


def structural_key(node, depth: int = 8):
    """A hashable key equal for two nodes that compute the same value by the same pure ops from the same inputs
    (graph inputs and impure nodes stand for themselves; ``depth`` bounds the walk): a small CSE for a rewrite
    that would otherwise make Inductor compute one value once per site."""
    if isinstance(node, (list, tuple)):
        return tuple(structural_key(a, depth) for a in node)
    if not isinstance(node, Node):
        return node
    if depth == 0 or node.op != "call_function" or _impure(node):
        return node
    args = structural_key(node.args, depth - 1)
    kwargs = tuple(sorted((k, structural_key(v, depth - 1)) for k, v in node.kwargs.items()))
    return node.target, args, kwargs
