"""What a decode step's attention mask is, read from the post-grad graph (``decode_attention``'s helpers).

The engine form builds ``keep = arange(T) <= positions`` per batch row and token, then lays it out for the G query
heads of a kv head (an expand and a reshape). ``one_row`` undoes that layout at one token, where every row is the
same, so the op reads [B, 1, 1, T] and Inductor writes no G-row copy. ``upto`` recognises the comparison itself, so
the op can take the positions instead of a mask (no mask kernel, no cache slot after the position read).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from . import _graph

aten = torch.ops.aten
prims = torch.ops.prims


def one_row(keep: Node) -> Node:
    """``x`` when ``keep`` is ``reshape(expand(x [B|1, 1, 1, T], [.., G, 1, T]), [.., 1, G, T])``: every row the same
    (the engine's mask at one query token, laid out for the G query heads of a kv head). The op reads x's one row
    for all rows, and Inductor need not write the [.., G, T] copy, a launch per layer."""
    if _graph.is_call(keep, aten.expand.default) and _graph.same_shape(keep.args[0], keep):
        return keep.args[0]  # one query head per kv head: the layout is an expand to the same shape, no reshape
    expand = keep.args[0] if _graph.is_call(keep, *_graph.RESHAPES) else None
    if not _graph.is_call(expand, aten.expand.default):
        return keep
    x, wide, out = _graph.val(expand.args[0]), _graph.val(expand), _graph.val(keep)
    if x is None or x.dim() != 4 or wide.dim() != 4 or out.dim() != 4:
        return keep
    b, _, _, t = x.shape
    if _graph.shape_is(x, (b, 1, 1, t)) and _graph.shape_is(wide, (b, wide.shape[1], 1, t)) and _graph.shape_is(
            out, (b, 1, wide.shape[1], t)):  # fmt: skip
        return expand.args[0]
    return keep


# slot <op> position, as (which argument is the slot index, what to add to the position for the last slot seen)
COMPARES = {aten.le.Tensor: (0, 0), aten.lt.Tensor: (0, -1), aten.ge.Tensor: (1, 0), aten.gt.Tensor: (1, -1)}


def slot_compare(node: Node) -> tuple[Node, int] | None:
    """(P, offset) when ``node`` is ``iota(T) <= P`` (``<``: offset -1; the slots on either side) with P an integer
    tensor: slot t is seen while ``t <= P + offset``. None for anything else."""
    if not (_graph.is_call(node, *COMPARES) and len(node.args) == 2):
        return None
    slot_at, offset = COMPARES[node.target]
    iota, pos = node.args[slot_at], node.args[1 - slot_at]
    p = _graph.val(pos)
    if not _graph.is_call(iota, prims.iota.default):
        return None
    if not (iota.kwargs.get("start") == 0 and iota.kwargs.get("step") == 1):  # slot t is t
        return None
    if not (isinstance(p, torch.Tensor) and not p.is_floating_point() and p.dtype != torch.bool):
        return None
    return pos, offset


def upto(keep: Node) -> tuple[Node, int] | None:
    """(P, offset) when ``keep [B, 1, 1, T]`` is ``iota(T) <= P`` (``<``: offset -1) with P an integer
    ``[B, 1, ..]`` (one position per batch row), read through unsqueezes: batch row b sees the slots
    ``0..P[b] + offset``. The engine form's decode mask; the op then needs neither the mask nor the slots after it."""
    node = keep
    while _graph.is_call(node, aten.unsqueeze.default, *_graph.RESHAPES):
        node = node.args[0]
    found = slot_compare(node)
    if found is None:
        return None
    pos, offset = found
    kept, out, p = _graph.val(keep), _graph.val(node), _graph.val(pos)
    b, t = kept.shape[0], kept.shape[-1]
    ones = (1,) * (out.dim() - 2)
    if not (_graph.shape_is(kept, (b, 1, 1, t)) and _graph.shape_is(out, (b, *ones, t))
            and _graph.shape_is(p, (b, *ones, 1))):  # fmt: skip
        return None
    return pos, offset
