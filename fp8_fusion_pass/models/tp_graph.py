"""Graph audit for tensor-parallel compiles: the pass never fuses across, moves or removes a collective.

The bug class the seed PR's review found worst (``../shared/seeds/fused-norm-silu-quant-pr.txt``): a fusion at the
all-reduce boundary that reads the tensor before the sum, or that drops / reorders the collective. An audit
wraps the pass (or nothing, for a compile without it), snapshots the collective nodes of the post-grad graph
before and after, and checks:

1. the collective nodes (``_c10d_functional.*`` / ``c10d.*``) are the same nodes, targets, arguments and order
   (a tensor argument by its dtype and shape: ``inline_norm`` replaces a norm op that feeds a collective with
   its aten ops, a new producer node of the same values);
2. every ``wait_tensor`` that had users still has users (its summed output still feeds the model);
3. no fused op reads a collective's *input* (the per-rank partial sum): a fused op's inputs come after the wait;
4. every fused op sits after, in graph order, each ``wait_tensor`` it reads through views.

``uuid()`` is None, so Inductor's FX graph cache is bypassed and every compile runs the audit and the pass:
each rank's compile produces its own report even when another rank (same graph) already filled the cache.
"""

from __future__ import annotations

import dataclasses

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..kernels.ops import FUSED as FUSED_OPS  # every op the pass swaps in, GEMM-based ones included

# Ops that only reinterpret their first argument: reading through them still reads the same values.
_VIEWS = {"view", "reshape", "_unsafe_view", "alias", "squeeze", "unsqueeze", "expand", "contiguous", "clone"}


def is_collective(node: torch.fx.Node) -> bool:
    ns = getattr(getattr(node.target, "_schema", None), "name", "").split("::")[0]
    return node.op == "call_function" and ns in ("_c10d_functional", "c10d")


def _op_name(node: torch.fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else str(node.target)


def is_fused(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.name in {f"fp8_fusion::{o}" for o in FUSED_OPS}


def source(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose values ``node`` carries, looking through views and reshapes."""
    while node.op == "call_function" and _op_name(node) in _VIEWS and isinstance(next(iter(node.args), None),
                                                                                  torch.fx.Node):
        node = node.args[0]
    return node


def _arg(a) -> str:
    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    return f"tensor {val.dtype} {tuple(val.shape)}" if isinstance(val, torch.Tensor) else str(a)


def _snapshot(graph: torch.fx.Graph) -> list[tuple]:
    return [(n.name, _op_name(n), tuple(_arg(a) for a in n.args)) for n in graph.nodes if is_collective(n)]


@dataclasses.dataclass
class GraphAudit:
    """What one compiled graph looked like around its collectives, and every rule the pass broke."""

    all_reduces: int = 0
    waits: int = 0
    fused: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (fused op, op its x input comes from)
    violations: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def audit(graph: torch.fx.Graph, before: list[tuple], waits_used: set[str]) -> GraphAudit:
    """Check the rules above on ``graph`` after the pass, given the snapshot taken before it."""
    after = _snapshot(graph)
    result = GraphAudit(all_reduces=sum(op.startswith("all_reduce") for _, op, _ in after),
                        waits=sum(op == "wait_tensor" for _, op, _ in after))
    if after != before:
        result.violations.append(f"collectives changed: before {before}, after {after}")
    order = {n: i for i, n in enumerate(graph.nodes)}
    nodes = {n.name: n for n in graph.nodes}
    for name in sorted(waits_used):
        if name not in nodes or not nodes[name].users:
            result.violations.append(f"{name}: the summed output lost its users (fused across the collective?)")
    # The per-rank partial sums: what a collective reads (through views), never what a fused op may read.
    partials = {source(a) for n in graph.nodes if is_collective(n) and _op_name(n) != "wait_tensor"
                for a in n.args if isinstance(a, torch.fx.Node)}
    for n in graph.nodes:
        if not is_fused(n):
            continue
        inputs = [source(a) for a in n.args if isinstance(a, torch.fx.Node)]
        result.fused.append((_op_name(n), _op_name(inputs[0]) if inputs else ""))
        for a in inputs:
            if a in partials:
                result.violations.append(f"{n.name} ({_op_name(n)}) reads {a.name}, the input of a collective")
            if is_collective(a) and order[a] > order[n]:
                result.violations.append(f"{n.name} ({_op_name(n)}) runs before {a.name}, which it reads")
    return result


class CollectiveAudit(CustomGraphPass):
    """Run ``inner`` (a post-grad pass, or None) and audit the collectives around it; results in ``audits``."""

    def __init__(self, inner: CustomGraphPass | None = None) -> None:
        self.inner = inner
        self.audits: list[GraphAudit] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        before = _snapshot(graph)
        waits_used = {n.name for n in graph.nodes if is_collective(n) and _op_name(n) == "wait_tensor" and n.users}
        if self.inner is not None:
            self.inner(graph)
        self.audits.append(audit(graph, before, waits_used))

    def uuid(self) -> None:
        return None  # never served from the FX graph cache: every compile is audited (see the module docstring)
