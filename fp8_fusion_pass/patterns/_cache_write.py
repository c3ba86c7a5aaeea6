"""Static KV-cache writes in a post-grad graph: ``cache[b, h, positions] = x`` on a graph input, as functionalized.

    the engine (``k_cache.index_put_((rows, heads, at), k)``):
    w = index_put(cache, [iota(B)[B,1,1], iota(H)[1,H,1], pos[B,1,S]], x)
    transformers' StaticCache (``index_copy_``):
    w = index_put(cache, [None, None, pos[S]], x)   or   index_copy(cache, 2, pos[S], x)
    ... attention reads w ...
    copy_(cache, w)                  # the mutation of the graph input, written back at the end

``x [B, H, S, D]``, ``cache [B, H, T, D]``. ``norm_rope`` moves such a write into its kernel (``rms_norm_rope_cache``),
so only a write Inductor would have done in place is taken: the cache is a placeholder whose only users are the
write and its one ``copy_`` back, so nothing reads the old contents and Inductor's reinplacing can hand the op the
cache itself (a write it could not reinplace would cost a copy of the whole cache per step).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import _graph

aten = torch.ops.aten
_INT = (torch.int32, torch.int64)
_VIEWS = (*_graph.RESHAPES, aten.unsqueeze.default)


@dataclasses.dataclass(frozen=True)
class CacheWrite:
    write: Node  # the index_put / index_copy: the updated cache
    cache: Node  # the placeholder it updates
    copy: Node  # copy_(cache, write)
    positions: Node  # [B, S] (one position per batch row and token) or [S] (shared by every row)
    value: Node  # x [B, H, S, D]
    key: tuple  # (positions, per batch row?): writes with one key go to the same slots


def _iota_index(node, n, shape) -> bool:
    """``node`` is ``iota(n)`` (0, 1, ... n - 1) put into the given broadcast shape by reshapes / unsqueezes
    (``arange(b)[:, None, None]``, however it was spelled)."""
    v = _graph.val(node)
    if v is None or v.dim() != 3 or not all(statically_known_true(a == b) for a, b in zip(v.shape, shape)):
        return False
    while isinstance(node, Node) and node.target in _VIEWS:
        node = node.args[0]
    if not (isinstance(node, Node) and node.target is torch.ops.prims.iota.default):
        return False
    count = node.args[0]
    if isinstance(count, Node):  # a symbolic length is the graph's SymInt input: its value is the symbol
        count = _graph.val(count)
    return node.kwargs.get("start", 0) == 0 and node.kwargs.get("step", 1) == 1 and statically_known_true(count == n)


def _positions(write: Node, x) -> tuple[Node, tuple] | None:
    """The positions of a write of ``x [B, H, S, D]`` along dim 2 and its key (the positions node and whether they
    are per batch row); None for any other indexing."""
    b, h, _, _ = x.shape
    if write.target is aten.index_copy.default:
        _, dim, pos, _ = write.args
        return (pos, (pos, False)) if dim in (2, -2) else None
    if write.target is not aten.index_put.default or (len(write.args) > 3 and write.args[3]):
        return None  # accumulate=True adds into the cache
    idx = write.args[1]
    if len(idx) != 3:
        return None
    if idx[0] is None and idx[1] is None:
        return idx[2], (idx[2], False)
    rows, heads, at = idx
    if not (_iota_index(rows, b, (b, 1, 1)) and _iota_index(heads, h, (1, h, 1))):
        return None
    if not (isinstance(at, Node) and at.target is aten.unsqueeze.default and at.args[1] == 1):
        return None
    return at.args[0], (at.args[0], True)


def find(value: Node) -> CacheWrite | None:
    """The cache write whose only input value is ``value`` (its only user), or None (``why_not`` says why)."""
    return of_write(next(iter(value.users)), value) if len(value.users) == 1 else None


def why_not(value: Node) -> str:
    """Why ``value`` has no cache write ``find`` takes: the first condition that fails, for the report."""
    if len(value.users) != 1:
        return f"k feeds {len(value.users)} nodes, not only its cache write"
    return _why(next(iter(value.users)), value) or "no reason found"


def of_write(write: Node, value: Node | None = None) -> CacheWrite | None:
    return None if _why(write, value) else _match(write)


def _why(write: Node, value: Node | None) -> str:
    """Empty when ``write`` is an in-place static-cache write of ``value`` (of any value when None)."""
    if write.op != "call_function" or write.target not in (aten.index_put.default, aten.index_copy.default):
        return "k feeds no index_put / index_copy"
    cache = write.args[0]
    x = write.args[2] if write.target is aten.index_put.default else write.args[3]
    if value is not None and x is not value:
        return "k is the index of the write, not its value"
    xv, cv = _graph.val(x), _graph.val(cache)
    if not (isinstance(cache, Node) and cache.op == "placeholder"):
        return "the cache is computed in the graph, not a graph input"
    if not (isinstance(xv, torch.Tensor) and isinstance(cv, torch.Tensor) and xv.dim() == 4 and cv.dim() == 4):
        return "the write is not [B, H, S, D] into [B, H, T, D]"
    found = _positions(write, xv)
    if found is None:
        return "the write is indexed other than [rows, heads, positions] / [None, None, positions] along dim 2"
    pv, (b, _, s, _) = _graph.val(found[0]), xv.shape
    if not (isinstance(pv, torch.Tensor) and pv.dtype in _INT and _graph.shape_is(pv, (s,), (b, s), (1, s))):
        return "the positions are not int32 / int64 [S], [1, S] or [B, S]"
    copies = [u for u in write.users if u.target is aten.copy_.default and u.args == (cache, write)]
    if len(copies) != 1:
        return f"{len(copies)} copy_ of the new cache back into the input, not one"
    if set(cache.users) != {write, copies[0]}:
        return "the cache's old contents are read too (Inductor would copy the whole cache)"
    return ""


def _match(write: Node) -> CacheWrite:
    cache = write.args[0]
    x = write.args[2] if write.target is aten.index_put.default else write.args[3]
    pos, key = _positions(write, _graph.val(x))
    copy = next(u for u in write.users if u.target is aten.copy_.default and u.args == (cache, write))
    return CacheWrite(write, cache, copy, pos, x, key)


def partners(write: CacheWrite) -> list[CacheWrite]:
    """The other writes to the same slots (the same positions, indexed the same way): the v write of a k write."""
    graph = write.write.graph
    found = [of_write(n) for n in graph.nodes if n is not write.write and n.op == "call_function"]
    return [w for w in found if w is not None and w.key == write.key and w.cache is not write.cache]
