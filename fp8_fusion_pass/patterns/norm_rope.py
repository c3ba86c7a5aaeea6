"""Qwen3's per-head q / k norms and the RoPE after each: both tensors in one op.

    before (Qwen3 attention; the norms have no quant consumer; rms_norm is the op or HF's plain torch)
    q = rms_norm(view(q, [B, S, Hq, D]), w_q, eps) -> permute(0, 2, 1, 3) -> q * cos + rotate_half(q) * sin
    k = rms_norm(view(k, [B, S, Hk, D]), w_k, eps) -> permute(0, 2, 1, 3) -> k * cos + rotate_half(k) * sin

    after
    q, k = rms_norm_rope(view(q), w_q, view(k), w_k, eps, cos, sin)

With ``inline_norm`` alone Inductor fuses each norm into its RoPE kernel: two launches per layer, the k one with
the k-cache write (``kernels/triton/rms_norm_rope.py`` has the H200 figures). Here one launch does both norms
and both RoPEs; the two cache writes after it go into the same launch too, by ``rope_cache`` (which runs next).
With the writes still Inductor's (two launches: they did not merge), on the H200 (``docs/benchmarks.md``, "The q
/ k norms and RoPE in one launch") it took 0.8-2.4% off a Qwen3-8B decode step and brought its logits closer to
eager's; with Inductor's ``combo_kernels=True`` it lost 1.5%, so under that option it stands aside unless the
writes join the launch (guard below). On by default. Not bit-exact against Inductor's fusion (which keeps the RoPE in
fp32; this op rounds each step as eager does), so deterministic mode keeps it off.

The norm is the ``fp8_fusion.rms_norm`` op (engine-style code) or transformers' ``Qwen3RMSNorm`` in plain torch,
found with ``norm_quant``'s traced ``torch`` form (every torch version's spelling). The HF form's first GPU run
failed: Inductor handed the op HF's D-strided cos, which its fake refused. The kernel now reads any strides of
every input, and both forms pass ``tests/patterns/test_pass_gpu.py`` on the H200.

The RoPE is matched as ``reference.rope`` (HF ``apply_rotary_pos_emb``) reads after decomposition: the norm's
only user is ``permute(0, 2, 1, 3)``; its users are ``mul(p, unsqueeze(cos, 1))`` and the two halves
``slice(p, 3, D/2, end)`` -> ``neg`` and ``slice(p, 3, 0, D/2)``, joined by ``cat(-1)``, times ``unsqueeze(sin,
1)``, and the ``add`` of the two products (either operand order). Chains sharing one cos, sin and eps pair up
in graph order, q / k as they come; a chain left without a partner is reported (``no_norm_rope_pair``) and left
as it is (``inline_norm`` takes an op). Guards: the switch and deterministic mode; under Inductor's
``combo_kernels``, only a pair whose k goes into a cache write ``rope_cache`` will take (otherwise Inductor's merged
kernels measured faster: ``unfused_pair_faster``); bf16; x ``[B, S, H, D]`` with D
a power of two (``no_fused_kernel`` otherwise: the kernel's one tile per row); cos / sin ``[B or 1, S, D]``.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .. import guards
from . import _cache_write, _graph
from .norm_quant import FORMS

aten = torch.ops.aten
RMS_NORM = torch.ops.fp8_fusion.rms_norm.default
FUSED = torch.ops.fp8_fusion.rms_norm_rope.default
QK_ROPE = torch.ops.fp8_fusion.qk_rope.default
NAME = "norm_rope"
_END = 2**63 - 1  # slice(x, dim, start) with no end, as traced


def _only_user(node: Node) -> Node | None:
    users = _graph.data_users(node)
    return users[0] if len(users) == 1 else None


def _is(node, target) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target is target


def _table(node) -> Node | None:
    """``unsqueeze(t, 1)``'s t (cos or sin [B, S, D]), else None."""
    if _is(node, aten.unsqueeze.default) and node.args[1] == 1 and isinstance(node.args[0], Node):
        return node.args[0]
    return None


def _other(pair, node):
    a, b = pair
    return b if a is node else a if b is node else None


@dataclasses.dataclass(frozen=True)
class Norm:
    """One RMSNorm in the graph: its output node and its (x, w, eps), whichever way it is spelled."""

    out: Node  # the fp8_fusion.rms_norm node, or the last mul of HF's plain-torch norm (qk_rope: the view itself)
    x: Node
    w: Node | None  # None: no norm (qk_rope)
    eps: object


def _hf_patterns() -> list:
    """HF's ``Qwen3RMSNorm`` as the post-grad graph spells it (every torch version's spelling): norm_quant's
    ``torch`` form, traced from ``reference.rms_norm`` (once per process, shared with the pass's matcher)."""
    return [p for form in FORMS["norm_quant"] if form.name == "torch" for p in form.patterns()]


def norms(graph: Graph) -> list[Norm]:
    """Every ``fp8_fusion.rms_norm`` op and every HF plain-torch RMSNorm in ``graph``, in graph order."""
    out = []
    for n in graph.nodes:
        if _is(n, RMS_NORM):
            out.append(Norm(n, n.args[0], n.args[1], n.args[2]))
        elif _is(n, aten.mul.Tensor):
            for pattern in _hf_patterns():
                m = pattern.match(n)
                if m:  # a FailedMatch is falsy
                    out.append(Norm(n, m.kwargs["x"], m.kwargs["w"], m.kwargs["eps"]))
                    break
    return out


def rope_chain(norm: Norm) -> dict | None:
    """The RoPE after ``norm`` as ``reference.rope`` traces (module docstring), or None: ``{"out": the add,
    "cos", "sin": the tables, "nodes": every node of the chain}``."""
    x = _graph.val(norm.x)
    d = _graph.static_int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() == 4 else None
    if d is None:
        return None
    half = d // 2
    p = _only_user(norm.out)
    if not _is(p, aten.permute.default) or list(p.args[1]) != [0, 2, 1, 3] or len(p.users) != 3:
        return None
    mul_cos = hi = lo = None
    for u in p.users:
        if _is(u, aten.mul.Tensor):
            mul_cos = u
        elif _is(u, aten.slice.Tensor) and u.args[1] in (3, -1) and u.args[0] is p and (list(u.args[4:]) or [1]) == [1]:
            start, end = (_graph.static_int(_graph.val(a)) if isinstance(a, Node) else a
                          for a in (list(u.args[2:4]) + [None, None])[:2])  # a bound may be a size's node
            if start == half and end in (None, _END, 2 * half):
                hi = u
            elif start in (0, None) and end == half:
                lo = u
    if mul_cos is None or hi is None or lo is None:
        return None
    cos = _table(_other(mul_cos.args, p))
    neg = _only_user(hi)
    cat = _only_user(lo)
    if cos is None or not _is(neg, aten.neg.default) or not _is(cat, aten.cat.default) or _only_user(neg) is not cat:
        return None
    if list(cat.args[0]) != [neg, lo] or (cat.args[1] if len(cat.args) > 1 else 0) not in (-1, 3):
        return None
    mul_sin = _only_user(cat)
    if not _is(mul_sin, aten.mul.Tensor):
        return None
    sin = _table(_other(mul_sin.args, cat))
    add = _only_user(mul_cos)
    if sin is None or not _is(add, aten.add.Tensor) or _only_user(mul_sin) is not add or len(add.args) != 2:
        return None
    if {add.args[0], add.args[1]} != {mul_cos, mul_sin} or add.kwargs.get("alpha", 1) != 1:
        return None
    nodes = [norm.out, p, mul_cos, hi, lo, neg, cat, mul_sin, add]
    return {"out": add, "cos": cos, "sin": sin, "nodes": nodes}


def _check(norm: Norm, chain: dict) -> guards.Verdict:
    x, cos, sin = (_graph.val(n) for n in (norm.x, chain["cos"], chain["sin"]))
    d = x.shape[-1]
    verdict = guards.first_failure(lambda: guards.OK if norm.w is None else guards.can_eps(norm.eps),  # qk_rope
                                   lambda: guards.can_dtype(x))
    if not verdict.ok:
        return verdict
    # kernels/triton/rms_norm_rope.unsupported's rule, restated: the pass must not import Triton
    if d & (d - 1) or d > 1024:
        return guards.reject("no_fused_kernel", f"head dim {d}: the kernel takes a power of two up to 1024")
    for t in (cos, sin):  # statically_known_true: B and S may be symbolic (dynamic=True)
        table_ok = t.dim() == 3 and t.dtype == x.dtype and t.shape[-1] == d
        table_ok = table_ok and statically_known_true(t.shape[1] == x.shape[1])
        batch_ok = statically_known_true(t.shape[0] == 1) or statically_known_true(t.shape[0] == x.shape[0])
        if not (table_ok and batch_ok):
            return guards.reject("no_fused_kernel", f"RoPE table {tuple(t.shape)} {t.dtype} is not [B or 1, S, D] "
                                 "of the activation dtype")  # fmt: skip
    return guards.OK


def _inputs_precede(q: tuple[Norm, dict], k: tuple[Norm, dict]) -> bool:
    """None of the fused op's inputs is computed from either RoPE's output: one op for both cannot then close a
    cycle (a model whose k depends on its q's attention, say), whatever the graph order."""
    inputs = {q[0].x, q[0].w, k[0].x, k[0].w, q[1]["cos"], q[1]["sin"]}
    seen, todo = set(), [q[1]["out"], k[1]["out"]]
    while todo:
        n = todo.pop()
        if n in inputs:
            return False
        if n not in seen:
            seen.add(n)
            todo.extend(n.users)
    return True


def rewrite(graph: Graph, q: tuple[Norm, dict], k: tuple[Norm, dict]) -> str:
    """One ``rms_norm_rope`` for the pair (``qk_rope`` for a pair without norms), its outputs where the two RoPE
    adds were; then a stable topological sort (k's input may be defined after q's RoPE users)."""
    (qn, qc), (kn, kc) = q, k
    detail = f"q {list(_graph.val(qn.x).shape)} and k {list(_graph.val(kn.x).shape)} in one launch"
    first_use = min((u for c in (qc, kc) for u in c["out"].users), key=_position(graph), default=None)
    with _graph.Edit(graph, before=first_use if first_use is not None else graph.output_node()) as e:
        if qn.w is None:
            fused = e.call(QK_ROPE, qn.x, kn.x, qc["cos"], qc["sin"])
        else:
            fused = e.call(FUSED, qn.x, qn.w, kn.x, kn.w, float(qn.eps), qc["cos"], qc["sin"])
        outs = [e.call(operator.getitem, fused, i) for i in (0, 1)]
    for chain, out in zip((qc, kc), outs):
        chain["out"].replace_all_uses_with(out)
    _graph.erase_dead(graph, [qc["out"], kc["out"]])
    stable_topological_sort(graph)
    return detail


def _position(graph: Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: order[n]


def run(graph: Graph, report, rope_cache: bool = True) -> None:
    """``rope_cache``: will the rope_cache rewrite run after this one (the switch, as the pass decided)."""
    pair_and_rewrite(graph, report, NAME, norms(graph), rope_cache)


def pair_and_rewrite(graph: Graph, report, name: str, heads: list[Norm], rope_cache: bool) -> None:
    """Pair the RoPE chains after ``heads`` (norms, or for ``qk_rope`` the q / k views themselves) that share a
    cos, sin and eps, q / k in graph order, and rewrite each pair into one op; report every outcome as ``name``.
    ``rope_cache``: whether that rewrite runs next (the combo-kernels guard asks whether the cache writes join)."""
    groups: dict[tuple, list[tuple[Norm, dict]]] = {}
    for norm in heads:
        chain = rope_chain(norm)
        if chain is None:
            continue  # not a norm before RoPE: inline_norm's (an op) or Inductor's (HF's plain torch)
        shapes, dtype = _graph.shape_str(x=norm.x), _graph.dtype_str(norm.x)
        verdict = _check(norm, chain)
        if not verdict.ok:
            report.reject(name, norm.out.name, verdict.reason, verdict.detail, shapes, dtype)
            continue
        key = (chain["cos"], chain["sin"], norm.eps)  # one table pair: one B and S (checked against x above)
        groups.setdefault(key, []).append((norm, chain))
    for sites in groups.values():
        for i in range(0, len(sites) - 1, 2):
            q, k = sites[i], sites[i + 1]
            shapes, dtype = _graph.shape_str(q=q[0].x, k=k[0].x), _graph.dtype_str(q[0].x)
            joins = rope_cache and _cache_write.find(k[1]["out"]) is not None  # rope_cache takes it (or says why)
            verdict = guards.should_fuse_norm_rope(joins)
            if verdict.ok and not _inputs_precede(q, k):
                verdict = guards.reject("operand_defined_later", "an input of the pair is computed from one of their "
                                        "RoPE outputs: the two stay apart")  # fmt: skip
            report.settle(name, q[0].out.name, shapes, dtype, verdict, "", rewrite, graph, q, k)
        if len(sites) % 2:
            norm = sites[-1][0]
            report.reject(name, norm.out.name, "no_norm_rope_pair", "no second RoPE chain on the same cos / sin: "
                          "left as it is", _graph.shape_str(x=norm.x), _graph.dtype_str(norm.x))
