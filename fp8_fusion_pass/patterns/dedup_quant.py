"""Duplicate quants: identical group_quants of one tensor collapse into one, before any fusion.

    before (HF attention input: q_proj, k_proj, v_proj each quantize the normed tensor)
    y = rms_norm(x)
    qa, sa = group_quant(reshape(y, [-1, H]))  -> blockscale_mm(qa, sa, W_q)
    qb, sb = group_quant(reshape(y, [-1, H]))  -> blockscale_mm(qb, sb, W_k)
    qc, sc = group_quant(reshape(y, [-1, H]))  -> blockscale_mm(qc, sc, W_v)

    after
    qa, sa = group_quant(reshape(y, [-1, H]))  -> blockscale_mm(qa, sa, W_q), (qa, sa, W_k), (qa, sa, W_v)

The same happens for gate_proj / up_proj in the MLP. Each linear of transformers' ``Qwen3Attention`` /
``LlamaAttention`` (``q_proj(hidden_states)``, ``k_proj(...)``, ``v_proj(...)``) and ``Qwen3MLP`` /
``LlamaMLP`` (``gate_proj(x)``, ``up_proj(x)``) quantizes its input itself; after this rewrite the norm before
them has one quant to fuse with, and the report shows the quants that were shared.

Two quants are identical when they read the same tensor (through reshapes to the same shape) with the same group
size: the op is a pure function of those, so sharing its outputs is bit-exact. The earliest one in graph order
is kept (its outputs are defined before every user of the later ones).

Guards: the ``dedup_quant`` switch and ``FP8_FUSION_DISABLE`` (bit-exact: deterministic mode keeps it on); bf16
input (like every fusion: fp16 / fp32 graphs are left unchanged). When it is off, a norm with three quants is
reported as ``multiple_quants`` instead of fused.
"""

from __future__ import annotations

import operator

from torch._inductor.pattern_matcher import CallFunctionVarArgs, Match, PatternExpr
from torch.fx import Node

from .. import guards
from . import _graph
from ._graph import GROUP_QUANT
from ._site import group_size_of


def anchors() -> list[PatternExpr]:
    """Every group_quant node, whatever its arguments."""
    return [CallFunctionVarArgs(GROUP_QUANT)]


def twin(quant: Node) -> Node | None:
    """The earliest group_quant identical to ``quant`` (None when ``quant`` is the earliest or unique, or when it
    does not quantize bf16: fp16 / fp32 graphs are left exactly as they are)."""
    if not guards.can_dtype(_graph.val(quant.args[0])).ok:
        return None
    src, _ = _graph.strip_reshapes(quant.args[0])
    same = [
        user for user, _ in _graph.final_users(src)
        if user.target is GROUP_QUANT and group_size_of(user) == group_size_of(quant)
        and _graph.same_shape(user.args[0], quant.args[0])
    ]
    first = min(same) if same else None
    return first if first is not None and first is not quant else None


def rewrite(graph, quant: Node, keep: Node) -> None:
    """Point ``quant``'s q / scale users at ``keep``'s, then erase ``quant`` and its reshapes."""
    getitems = {i: next((u for u in keep.users if u.target is operator.getitem and u.args[1] == i), None)
                for i in (0, 1)}
    with _graph.Edit(graph, after=keep) as e:
        for i in (0, 1):
            if getitems[i] is None:
                getitems[i] = e.call(operator.getitem, keep, i)
    qs, ss = _graph.quant_outputs(quant)
    for i, olds in ((0, qs), (1, ss)):
        for old in olds:
            old.replace_all_uses_with(getitems[i])
    _graph.erase_dead(graph, [*qs, *ss, quant])


def describe(match: Match, keep: Node) -> str:
    src, _ = _graph.strip_reshapes(match.output_node().args[0])
    return f"shares {keep.name} (same group-{group_size_of(keep)} quant of {src.name})"
