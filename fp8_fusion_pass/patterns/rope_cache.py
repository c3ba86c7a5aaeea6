"""The static KV-cache writes after ``rms_norm_rope`` (or ``qk_rope``, Llama's): into the same launch.

    before (a decode step with a static cache; the writes as functionalized, ``_cache_write``)
    q, k = rms_norm_rope(q, w_q, k, w_k, eps, cos, sin)
    k_new = index_put(k_cache, [rows, heads, pos], k)       v_new = index_put(v_cache, [rows, heads, pos], v)
    ... attention reads k_new, v_new ...                   copy_(k_cache, k_new); copy_(v_cache, v_new)

    after
    af = auto_functionalized_v2(rms_norm_rope_cache, q=.., v=v, positions=pos, _all_bases=[k_cache, v_cache])
                                                            (qk_rope -> qk_rope_cache, the same way)
    q = af[0]; k_new = af[1]; v_new = af[2]                (copy_ back unchanged: Inductor makes it a no-op)

Why: with ``norm_rope`` the k- and v-cache writes stayed two Inductor launches of their own (1.1 us each at
batch 1 on the H200, ``docs/benchmarks.md``, "The q / k norms and RoPE in one launch"); the kernel that computes k
can store it straight into its cache slot and copy v beside it. The inserted node is the form functionalization
gives a mutating custom op, so Inductor's own reinplacing hands the kernel the cache tensors (no copy of a cache:
``_cache_write`` takes only writes nothing else reads the old cache through). Bit-exact: k's bits are the op's,
v is copied, and the slots are the index's.

Guards: the switch (runs after ``norm_rope`` and ``qk_rope``; their ops written by hand count too); k's only user
is one in-place write of a graph-input cache (``cache_write_not_in_place`` when it goes into an indexed write that
is not); exactly one other write to the same slots that one op can take with k's without a cycle, the v write
(``no_kv_write_pair``: another layer's v is computed after this op or read before its inputs exist); k, v and both
caches of one shape / dtype (``kv_cache_mismatch``); positions not computed from the op's outputs
(``operand_defined_later``). A k with no cache write (prefill without a cache) is no candidate: nothing reported.
Positions outside ``[-T, T)`` write nothing on the Triton backend, where eager indexing raises.
"""

from __future__ import annotations

import operator

import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx import Graph, Node

from .. import guards
from . import _cache_write, _graph

_ops = torch.ops.fp8_fusion
# the op that computes k -> (its *_cache twin, the names of its arguments, which the twin takes by the same names)
CACHED = {
    _ops.rms_norm_rope.default: (_ops.rms_norm_rope_cache.default, ("q", "wq", "k", "wk", "eps", "cos", "sin")),
    _ops.qk_rope.default: (_ops.qk_rope_cache.default, ("q", "k", "cos", "sin")),
}
NAME = "rope_cache"
_WRITES = (torch.ops.aten.index_put.default, torch.ops.aten.index_copy.default)


def _outputs(rope: Node) -> tuple[Node | None, Node | None]:
    """(q, k): the op's getitem nodes (None where absent), or (None, None) if the tuple is used whole."""
    got = {u.args[1]: u for u in rope.users if u.target is operator.getitem}
    if len(got) != len(rope.users):
        return None, None
    return got.get(0), got.get(1)


def _check(rope: Node, k: Node) -> tuple[guards.Verdict, tuple]:
    kw = _cache_write.find(k)
    if kw is None:
        return guards.reject("cache_write_not_in_place", f"{_cache_write.why_not(k)}: the writes stay Inductor's"), ()
    # The v write: the one write to the same slots that one op can take with k's without a cycle. Every layer's
    # writes share the step's positions; another layer's v is computed from this op's outputs (a later layer) or
    # is read before this op's inputs exist (an earlier one), so at most one is left.
    down = _reachable([*rope.users, kw.write], lambda n: n.users)
    up = _reachable([a for a in rope.args if isinstance(a, Node)], lambda n: n.all_input_nodes)
    vws = [w for w in _cache_write.partners(kw) if w.value not in down and w.write not in up]
    if len(vws) != 1:
        return guards.reject("no_kv_write_pair", f"{len(vws)} other cache writes at k's slots that one op can take "
                             "with it, not one (the v write)"), ()  # fmt: skip
    vw = vws[0]
    if kw.positions in down:
        return guards.reject("operand_defined_later", "the positions are computed from the op's outputs"), ()
    vals = [_graph.val(n) for n in (kw.value, vw.value, kw.cache, vw.cache)]
    if not (_graph.same_shape(kw.value, vw.value) and _graph.same_shape(kw.cache, vw.cache)
            and len({t.dtype for t in vals}) == 1):  # fmt: skip
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}".replace("torch.", "") for t in vals)
        return guards.reject("kv_cache_mismatch", f"k, v, k_cache, v_cache: {shapes}"), ()
    return guards.OK, (kw, vw)


def _reachable(start: list, step) -> set:
    seen, todo = set(), list(start)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(step(n))
    return seen


def rewrite(graph: Graph, rope: Node, q: Node | None, kw, vw) -> str:
    """``auto_functionalized_v2(rms_norm_rope_cache, ...)`` where the first reader of q or of a new cache was; the
    writes' users (their ``copy_`` back included) read its outputs; then a stable topological sort (v may be
    defined after that reader)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    readers = [u for n in (q, kw.write, vw.write) if n is not None for u in n.users if u not in (kw.copy, vw.copy)]
    first = min(readers, key=order.__getitem__, default=kw.copy)
    cached, names = CACHED[rope.target]
    with _graph.Edit(graph, before=first) as e:
        af = e.call(auto_functionalized_v2, cached, **dict(zip(names, rope.args)), v=vw.value, positions=kw.positions,
                    _k_cache_base_index=0, _v_cache_base_index=1, _all_bases=[kw.cache, vw.cache])  # fmt: skip
        q_out, k_cache, v_cache = (e.call(operator.getitem, af, i) for i in range(3))
    if q is not None:
        q.replace_all_uses_with(q_out)
    kw.write.replace_all_uses_with(k_cache)  # the copy_ back included: copy_(cache, new cache)
    vw.write.replace_all_uses_with(v_cache)
    index_nodes = [n for w in (kw, vw) for n in w.write.all_input_nodes if n not in (w.cache, w.value, w.positions)]
    for w in (kw, vw):
        graph.erase_node(w.write)
    _graph.erase_dead(graph, [n for n in (q, kw.value) if n is not None] + index_nodes)  # the old op with them
    stable_topological_sort(graph)
    return f"k and v into their caches {list(_graph.val(kw.cache).shape)} in the same launch"


def run(graph: Graph, report) -> None:
    for rope in [n for n in graph.nodes if n.op == "call_function" and n.target in CACHED]:
        q, k = _outputs(rope)
        if k is None or not any(u.target in _WRITES for u in k.users):
            continue  # k goes into no indexed write (no cache: prefill): nothing to take
        shapes = _graph.shape_str(q=rope.args[0], k=rope.args[CACHED[rope.target][1].index("k")])
        dtype = _graph.dtype_str(rope.args[0])
        verdict, writes = _check(rope, k)
        report.settle(NAME, rope.name, shapes, dtype, verdict, "", rewrite, graph, rope, q, *writes)
