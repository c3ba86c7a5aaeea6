""""Why didn't it fuse?" for everything the patterns did not decide: after matching, every norm, silu and
group_quant still in the graph gets a rejection with a reason, unless a guard already gave one.

Candidates are found loosely, by their signature op, so spellings the patterns do not know are reported too:
- norms: ``fp8_fusion.rms_norm`` / ``add_rms_norm`` nodes and every ``aten.rsqrt`` (the HF RMSNorm's core);
- silu: ``fp8_fusion.silu_and_mul`` nodes, ``exp(neg(.))`` (decomposed ``F.silu``), ``aten.sigmoid``, ``aten.silu``;
- quants: every ``fp8_fusion.group_quant`` left.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch.fx import Graph, Node

from . import _graph
from ._graph import GROUP_QUANT

aten = torch.ops.aten
ops = torch.ops.fp8_fusion
PER_TENSOR_QUANT = ops.dynamic_per_tensor_quant.default

# (reason, detail) -> recorded by the caller as report.reject(pattern, node, reason, detail, shapes, dtype)
Record = Callable[[str, Node, str, str, Node], None]


def _norm(node: Node) -> tuple[str, Node, Node, object] | None:
    """(pattern, activation input, output, eps) of a norm candidate, or None."""
    if node.target is ops.rms_norm.default:
        return "norm_quant", node.args[0], node, node.args[2]
    if node.target is ops.add_rms_norm.default:
        out = next((u for u in node.users if u.target is operator.getitem and u.args[1] == 0), node)
        return "add_norm_quant", node.args[0], out, node.args[3]
    if node.target is not aten.rsqrt.default:
        return None
    add = node.args[0]
    eps = add.args[1] if getattr(add, "target", None) in (aten.add.Tensor, aten.add.Scalar) else None
    mean = add.args[0] if eps is not None else None
    x = _walk_back(mean, (aten.mean.dim, aten.pow.Tensor_Scalar, torch.ops.prims.convert_element_type.default))
    out = _walk_forward(node, (aten.mul.Tensor, torch.ops.prims.convert_element_type.default), 3)
    is_add = getattr(x, "target", None) is aten.add.Tensor
    return ("add_norm_quant" if is_add else "norm_quant"), x, out, eps


def _silu(node: Node) -> tuple[Node, Node] | None:
    """(activation input, output) of a silu candidate, or None."""
    if node.target is ops.silu_and_mul.default:
        return node.args[0], node
    if node.target is aten.exp.default and getattr(node.args[0], "target", None) is aten.neg.default:
        x = _walk_back(node.args[0], (aten.neg.default, torch.ops.prims.convert_element_type.default))
        steps = (aten.add.Tensor, aten.div.Tensor, torch.ops.prims.convert_element_type.default, aten.mul.Tensor)
        return x, _walk_forward(node, steps, 4)
    if node.target in (aten.sigmoid.default, aten.silu.default):
        return node.args[0], _walk_forward(node, (aten.mul.Tensor,), 2)
    return None


def _walk_back(node, targets) -> Node | None:
    while isinstance(node, Node) and node.target in targets:
        node = node.args[0]
    return node if isinstance(node, Node) else None


def _walk_forward(node: Node, targets, steps: int) -> Node:
    for _ in range(steps):
        users = [u for u in node.users if u.target in targets]
        if len(users) != 1:
            break
        node = users[0]
    return node


def _quants_of(out: Node) -> list[Node]:
    return [u for u, _ in _graph.final_users(out) if u.target is GROUP_QUANT]


def explain(graph: Graph, explained: set, record: Record) -> None:
    """Record a reason for each undecided candidate; ``explained`` holds the nodes already accounted for."""
    for node in list(graph.nodes):
        if node in explained or node.op != "call_function":
            continue
        norm = _norm(node)
        if norm is not None:
            pattern, x, out, eps = norm
            _diagnose(pattern, node, x, out, eps, explained, record)
            continue
        silu = _silu(node)
        if silu is not None:
            _diagnose("silu_quant", node, silu[0], silu[1], None, explained, record)
    for node in list(graph.nodes):
        if node.target is GROUP_QUANT and node not in explained:
            src, _ = _graph.strip_reshapes(node.args[0])
            record("producer_not_fusable", node, "group_quant", f"input comes from {_graph.describe(src)}", src)


def _diagnose(pattern: str, node: Node, x, out: Node, eps, explained: set, record: Record) -> None:
    quants = _quants_of(out)
    explained.update(quants)
    explained.add(node)
    if x is None or _graph.val(x) is None:
        reason, detail = "unrecognized_spelling", f"could not find the input of {node.name}"
    elif _graph.dtype_str(x) != "bfloat16":
        reason, detail = "dtype_not_bf16", f"activation {x.name} is {_graph.dtype_str(x)}"
    elif not quants:
        final = [u for u, _ in _graph.final_users(out)]
        users = sorted({_graph.describe(u) for u in final})
        reason, detail = "no_quant_consumer", f"{out.name} feeds {', '.join(users) or 'nothing'}"
        if any(_graph.op_of(u) is PER_TENSOR_QUANT for u in final):
            detail += (" (a per-tensor quant: the fused kernels take 1 x 128 group quants, whose scales need no "
                       "reduction over the whole tensor)")
    elif isinstance(eps, Node):  # (a matched norm reports this through guards.can_eps)
        reason, detail = "eps_graph_input", (f"eps is graph input {eps.name} (dynamic=True lifted the float); use "
                                             "fp8_fusion_pass.fuse(..., dynamic=True) or "
                                             "torch._dynamo.config.specialize_float=True")
    else:
        reason, detail = "unrecognized_spelling", (f"{out.name} feeds {len(quants)} group_quant(s) but matched no "
                                                   "registered spelling (TORCHINDUCTOR_PATTERN_MATCH_DEBUG="
                                                   f"{','.join(q.name for q in quants)} shows why)")
    record(reason, out, pattern, detail, x if isinstance(x, Node) else out)
