"""Compile a model through Dynamo + AOTAutograd + Inductor's post-grad passes, with FP8FusionPass at its real place
(``post_grad_custom_post_pass``), and run the post-grad graph before and after the pass on every call.

Why not two full Inductor compiles per fuzz example: on this CPU box a tiny HF model costs 15-35 s per compile, most
of it C++ codegen, so a CI budget of 3 minutes would fuzz ~4 graphs. ``Recorder`` instead hands Inductor an
``inner_compile`` that runs the real ``compile_fx_inner`` up to the custom post pass, copies the graph there, runs
the pass, copies the result and stops before lowering; the runtime then executes both copies as FX graphs on the
real runtime arguments (AOTAutograd's own calling convention, SymInts included, so dynamic shapes and recompiles
work unchanged). The graph before the pass, executed eagerly, is the "without the pass" reference: it is also free
of Inductor's own codegen noise (fp32 intermediates flip fp8 values: ``verify.py`` NOISE_FACTOR), so the comparison
isolates what the pass changed. A few examples per run also go through two real Inductor compiles
(``test_fuzz_graphs.py``), which covers lowering of the rewritten graph.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.output_code import OutputCode
from torch.fx import GraphModule, Node

import fp8_fusion_pass.kernels.ops  # noqa: F401  (registers torch.ops.fp8_fusion.*)
from fp8_fusion_pass import graph_diff
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass

aten = torch.ops.aten
ops = torch.ops.fp8_fusion
_Base = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", custom_graph_pass.CustomGraphPass)


class _Stop(graph_diff._StopAfterCapture):
    """Raised by the capture after the pass ran: the compile stops before lowering (``graph_diff._is_stop``
    finds it however Inductor wraps it)."""


def copy_gm(gm: GraphModule) -> GraphModule:
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    return GraphModule(gm, g)


@dataclasses.dataclass
class Capture:
    """One compiled graph: the post-grad graph before and after the pass, and the pass's report."""

    before: GraphModule
    after: GraphModule
    report: report_mod.FusionReport


class _CapturePass(_Base):
    def __init__(self, config: FusionConfig | None) -> None:
        self.fusion_pass = FP8FusionPass(config)
        self.result: Capture | None = None

    def __call__(self, graph, is_inference: bool | None = None) -> None:
        gm = graph.owning_module
        before = copy_gm(gm)
        self.fusion_pass(graph, is_inference)
        report = report_mod.last_report()
        self.result = Capture(before, copy_gm(gm), report)
        raise _Stop()

    def uuid(self):
        return None  # bypass the FX graph cache: the capture must run


@dataclasses.dataclass
class _GraphPair(OutputCode):
    """What AOTAutograd calls at run time (boxed: one list of flat arguments): both graphs, logged."""

    capture: Any = None
    log: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self._boxed_call = True

    def __call__(self, inputs: Sequence[Any]) -> Any:
        """Both graphs from the same state: an input the graph before the pass wrote (a KV cache) is put back as it
        was before the graph after the pass runs, so a write to a wrong slot shows as a difference in ``mutations``,
        and the run goes on with the state the rewritten graph left."""
        args = list(inputs)
        snap = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
        with torch.no_grad():
            before = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in self.capture.before(*args))
            written = {i: a.clone() for i, (a, s) in enumerate(zip(args, snap)) if s is not None and not same(a, s)}
            for i in written:
                args[i].copy_(snap[i])
            after = self.capture.after(*args)
        mutations = {i: Mutation(s, written.get(i, s), a.clone())
                     for i, (a, s) in enumerate(zip(args, snap)) if s is not None and (i in written or not same(a, s))}
        self.log.append(Call(self.capture, before, tuple(after), tuple(args), mutations))
        return after

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass

    def prepare_for_serialization(self) -> None:
        pass

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


@dataclasses.dataclass
class Mutation:
    """A graph input a call wrote in place: as it was, as the graph without the pass left it, as the graph with it
    left it (both run from ``old``)."""

    old: torch.Tensor
    without: torch.Tensor
    with_pass: torch.Tensor


@dataclasses.dataclass
class Call:
    capture: Capture
    before: tuple  # outputs of the graph without the pass
    after: tuple  # outputs with the pass
    args: tuple = ()  # the flat runtime arguments (parameters included): both graphs can be re-run on them
    mutations: dict = dataclasses.field(default_factory=dict)  # input index -> Mutation, for inputs either wrote


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, a NaN equal to a NaN (a cache may hold NaN from a poisoned input)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


class Recorder:
    """A ``torch.compile`` backend that records every compiled graph (``captures``) and every call (``calls``).

    Unlike ``graph_diff.capture_backend`` (the CLI's, which runs the Dynamo graph eagerly after the capture), the
    runtime here executes the post-grad graphs themselves, before and after the pass, on AOTAutograd's arguments.
    """

    def __init__(self, config: FusionConfig | None = None) -> None:
        self.config = config
        self.captures: list[Capture] = []
        self.calls: list[Call] = []

    def __call__(self, gm: GraphModule, example_inputs):
        # Caches off: AOTAutograd's cache would otherwise hand back a plain Inductor compile of the same graph
        # (its key does not see ``inner_compile``), and the capture would never run.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=self._inner, config_patches={"fx_graph_cache": False})

    def _inner(self, gm: GraphModule, example_inputs, **kwargs) -> OutputCode:
        cap = _CapturePass(self.config)
        try:
            with inductor_config.patch(post_grad_custom_post_pass=cap):
                compile_fx_inner(gm, example_inputs, **kwargs)
        except Exception as e:
            if not graph_diff._is_stop(e):
                raise
        if cap.result is None:
            raise AssertionError("the post-grad custom pass never ran (Inductor's post-grad passes disabled?)")
        self.captures.append(cap.result)
        return _GraphPair(capture=cap.result, log=self.calls)


# ---------------------------------------------------------------- graph properties

NORMS = (ops.rms_norm.default, ops.add_rms_norm.default, aten.rsqrt.default)
SILUS = (ops.silu_and_mul.default, aten.sigmoid.default, aten.silu.default)
GROUP_QUANT = ops.group_quant.default
FUSED = {
    "norm_quant": ops.rms_norm_group_quant.default,
    "add_norm_quant": ops.add_rms_norm_group_quant.default,
    "silu_quant": ops.silu_mul_group_quant.default,
    "gemm_silu_quant": ops.blockscale_mm_silu_mul_group_quant.default,
}
# A fused op that a later rewrite takes into its own: each gemm_silu_quant replaces one silu_quant's op.
ABSORBED_BY = {"silu_quant": "gemm_silu_quant"}


def fused_op_count(report: report_mod.FusionReport, name: str) -> int:
    """How many of ``name``'s fused ops the graph holds after the pass, by the report."""
    counts = report.counts()
    return counts.get(name, 0) - counts.get(ABSORBED_BY.get(name, ""), 0)


def _is_silu(node: Node) -> bool:
    if node.target in SILUS:
        return True
    return node.target is aten.exp.default and getattr(node.args[0], "target", None) is aten.neg.default


def candidates(gm: GraphModule) -> list[Node]:
    """Every norm, silu and group_quant node left in a graph (the pass must say why each one stayed)."""
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and (n.target in NORMS or n.target is GROUP_QUANT or _is_silu(n))]


def _forward(node: Node, hops: int) -> set[str]:
    """Names of ``node`` and every node reachable from it within ``hops`` user edges."""
    seen, frontier = {node.name}, [node]
    for _ in range(hops):
        frontier = [u for n in frontier for u in n.users]
        seen.update(u.name for u in frontier)
    return seen


def _source(node: Node) -> Node:
    while isinstance(node.args[0], Node) and node.args[0].target in (aten.reshape.default, aten.view.default):
        node = node.args[0]
    return node.args[0]


def unexplained(capture: Capture) -> list[str]:
    """Candidates left in the rewritten graph that no report entry (rejection or error) names.

    A norm or silu is explained by an entry naming it or a node at most 6 user edges downstream (the report
    names the norm's / silu's output: HF's rsqrt -> mul -> convert -> mul is 3 edges, the decomposed silu's
    exp -> add -> div -> convert -> mul 4, with slack for bias adds and converts). A group_quant is explained by an
    entry naming it or the tensor it quantizes (through reshapes), or by being inside an explained producer's reach.
    A norm that ``inline_norm`` wrote as aten ops is a new node under a new name (the op it replaced is gone, and
    with it the name the report gives); each applied ``inline_norm`` entry explains one such rsqrt.
    """
    named = {d.node for d in capture.report.rejected} | {d.node for d in capture.report.errors}
    before = {n.name for n in capture.before.graph.nodes}
    inlined = capture.report.counts().get("inline_norm", 0)
    missing = []
    for node in candidates(capture.after):
        if node.target is aten.rsqrt.default and node.name not in before and inlined > 0:
            inlined -= 1
            continue
        if node.target is GROUP_QUANT:
            src = _source(node)
            if node.name in named or (isinstance(src, Node) and src.name in named):
                continue
        elif named & _forward(node, 6):
            continue
        missing.append(node.format_node())
    return missing


def raw_symbols(gm: GraphModule) -> list[str]:
    """Nodes holding a SymInt / SymFloat object in their arguments: Inductor reads a symbolic size only as a graph
    value (a node), so a rewrite must pass ints, -1 or the graph's own size nodes."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return [n.format_node() for n in gm.graph.nodes
            if any(isinstance(a, sym) for a in torch.utils._pytree.tree_leaves((n.args, n.kwargs)))]


def count_ops(gm: GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target)


def value_changing_rewrites(report: report_mod.FusionReport) -> set[str]:
    """The rewrites applied to a graph that may move its outputs off bit-exactness: all but dedup_quant (the
    fusions, and the whole-graph inline_norm / group_gemm that expected_counts does not model)."""
    return {d.pattern for d in report.applied} - {"dedup_quant"}


def applied_counts(report: report_mod.FusionReport) -> dict[str, int]:
    counts = report.counts()
    return {k: v for k, v in counts.items() if k in ("norm_quant", "add_norm_quant", "silu_quant", "dedup_quant") and v}


# ---------------------------------------------------------------- numerics


@dataclasses.dataclass
class Diff:
    rel_l2: float  # over positions finite in both
    positions_agree: bool  # NaN / +inf / -inf on the same positions
    bit_exact: bool

    def __str__(self) -> str:
        return f"rel_l2={self.rel_l2:.4g} nonfinite_positions_agree={self.positions_agree} bit_exact={self.bit_exact}"


def diff(without: torch.Tensor, with_pass: torch.Tensor) -> Diff:
    a, b = without.detach().float(), with_pass.detach().float()
    if a.shape != b.shape:
        return Diff(float("inf"), False, False)
    agree = all(torch.equal(f(a), f(b)) for f in (torch.isnan, torch.isposinf, torch.isneginf))
    finite = torch.isfinite(a) & torch.isfinite(b)
    da, db = a[finite], b[finite]
    ref = da.norm().item()
    err = (db - da).norm().item()
    rel = err / ref if ref > 0 else err
    return Diff(rel, agree, agree and torch.equal(da, db))


def float_outputs(outs: tuple) -> list[torch.Tensor]:
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


def logits(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def getitem_users(node: Node, index: int) -> list[Node]:
    return [u for u in node.users if u.target is operator.getitem and u.args[1] == index]
