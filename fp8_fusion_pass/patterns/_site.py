"""What the norm and silu fusions share: a ``Form`` (one graph spelling of a producer), the anchor patterns built
from it, a matched ``Site``, its guards, and the rewrite that swaps in the fused op.

Every fusion is anchored at the ``group_quant`` node::

    producer(...) -> [reshape -> [reshape]] -> group_quant(., [group_size]) -> (q, scale) -> blockscale_mm

so the quant's input may be the producer's output seen through up to two reshapes (HF hidden states are
``[B, S, H]`` and the quantized linear flattens them to ``[B*S, H]``; a per-row group quant commutes with any
reshape that keeps the last dim). The fused op runs on the producer's own inputs (3-D stays 3-D) and its
``(q, scale)`` are reshaped like the quant's input was.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Callable, Sequence

import torch
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, Ignored, KeywordArg, PatternExpr
from torch.fx import Node

from .. import arch, guards
from . import Fusion, _graph, _trace
from ._graph import GROUP_QUANT, RESHAPES

aten = torch.ops.aten
MAX_RESHAPES = 2  # [B, S, H] -> [B*S, H] is one; a second covers views engines add (e.g. [T, H] -> [T, 1, H])
# id(form) -> (form, its traced patterns): each Form is traced once per process, whoever asks first (the pass's
# matcher, norm_rope's HF norms). Holding the form keeps its id from being reused.
_PATTERNS: dict[int, tuple] = {}
_PATTERNS_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Form:
    """One spelling of a producer in the post-grad graph, as a search function and how to trace it."""

    name: str  # "op" (our unfused op) or "torch" (plain torch, as HF code decomposes)
    search: Callable  # written from kernels/reference.py (or the unfused op); returns the quantized tensor
    example_inputs: Callable[[], Sequence[torch.Tensor]]  # tiny bf16 tensors, called under a fake mode
    scalars: dict = dataclasses.field(default_factory=dict)  # scalar_workaround: eps -> an unlikely example
    shared: tuple = ()  # ops inside the pattern whose output may also be used outside it (the residual add)
    post: Callable[[PatternExpr], PatternExpr] | None = None  # edit after tracing (cut the silu slices)

    def patterns(self) -> list[PatternExpr]:
        """The producer pattern per torch-version spelling (as traced; with pre-2.13 round trips folded), equal
        spellings once; traced on the first call in the process, the same objects after."""
        with _PATTERNS_LOCK:
            if id(self) not in _PATTERNS:
                _PATTERNS[id(self)] = (self, self._trace())
            return _PATTERNS[id(self)][1]

    def _trace(self) -> list[PatternExpr]:
        out, keys = [], set()
        for fold in (False, True):
            pattern, key = _trace.pattern_of(self.search, self.example_inputs, self.scalars, fold=fold)
            if key in keys:
                continue
            keys.add(key)
            for fn in self.shared:
                _trace.allow_extra_users(pattern, fn)
            if self.post is not None:
                pattern = self.post(pattern)
            pattern.users = MULTIPLE  # other consumers are the rewrite's to judge (and report)
            out.append(pattern)
        return out


def anchors(producer: PatternExpr) -> list[PatternExpr]:
    """group_quant patterns over ``producer``: 0..MAX_RESHAPES reshapes in between, group size spelled or left
    to its default (the graph drops a default-valued argument: ``group_quant(x)`` is group 128)."""
    out = []
    inner = producer
    for _ in range(MAX_RESHAPES + 1):
        out.append(CallFunction(GROUP_QUANT, inner))
        out.append(CallFunction(GROUP_QUANT, inner, KeywordArg("group_size")))
        inner = CallFunction(list(RESHAPES), inner, Ignored(), _users=MULTIPLE)  # others: the guards' call
    return out


@dataclasses.dataclass
class Site:
    """A matched producer -> quant, with everything the guards and the rewrite need."""

    fusion: Fusion
    form: str
    quant: Node  # the group_quant (anchor)
    producer: Node  # the node whose output the quant reads (through ``chain``)
    chain: list[Node]  # reshapes from the quant back to the producer
    group_size: int
    x: Node | None  # the fused op's activation input (None: concatenate ``pieces``)
    args: tuple  # the fused op's other arguments before group_size (w, eps / residual, w, eps)
    matched: set  # nodes of the match (for telling internal from external users)
    residual_in: Node | None = None  # the residual operand of the add (add_norm_quant)
    residual: Node | None = None  # node whose users take the fused op's residual_out (None: no users)
    pieces: tuple | None = None  # (gate, up) of a plain-torch silu; concatenated when ``x`` is None
    weight: Node | None = None  # norm weight (dtype guard)
    eps: object = None  # norm eps: a float, or a graph node under dynamic=True (rejected)

    @property
    def quant_input(self) -> Node:
        return self.quant.args[0]

    def activation(self) -> Node:
        return self.x if self.x is not None else self.pieces[0]

    def shapes(self) -> str:
        return _graph.shape_str(x=self.activation(), q_in=self.quant_input)


def group_size_of(quant: Node) -> int:
    if len(quant.args) > 1:
        return quant.args[1]
    return quant.kwargs.get("group_size", 128)  # the op's default (kernels/ops.py DEFAULT_GROUP_SIZE)


def check(site: Site, config, env_disabled, deterministic) -> guards.Verdict:
    """The guards every fusion shares, in the order that gives the most useful reason first."""
    f = site.fusion
    x = _graph.val(site.activation())
    q_in = _graph.val(site.quant_input)
    residual = _graph.val(site.residual_in) if site.residual_in is not None else None
    return guards.first_failure(
        lambda: guards.can_run_fusion(f.switch, guards.is_bit_exact(f.bit_exact, f.fused_op, x.device), config,
                                      env_disabled, deterministic),
        lambda: guards.can_dtype(x, _graph.val(site.weight) if site.weight is not None else None, residual),
        lambda: guards.can_dtype(q_in),
        lambda: guards.can_eps(site.eps) if site.weight is not None else guards.OK,
        lambda: guards.can_run_kernel(f.fused_op, x.device),
        lambda: guards.can_group(q_in.shape[-1], site.group_size, config.group_sizes),
        lambda: _reshapes_ok(site),
        lambda: guards.can_layout(x=x, residual=residual, **_pieces(site)),
        lambda: guards.can_own_output(*_other_consumers(site)),
        lambda: guards.can_feed_gemms(_graph.quant_consumers(site.quant)),
        lambda: guards.should_fuse_small_m(arch.arch_of(x.device).name, guards.static_rows(q_in),
                                           _graph.gemm_shapes(site.quant)),
    )


def _pieces(site: Site) -> dict:
    if site.pieces is None:
        return {}
    return {"gate": _graph.val(site.pieces[0]), "up": _graph.val(site.pieces[1])}


def _reshapes_ok(site: Site) -> guards.Verdict:
    if _graph.keeps_last_dim(site.chain):
        return guards.OK
    return guards.reject("reshape_changes_last_dim", " -> ".join(_graph.shape_str(r=r) for r in site.chain))


def _other_consumers(site: Site) -> tuple[list[str], int]:
    """(non-quant consumers of the producer's output, number of group_quants reading it through reshapes)."""
    others, quants = [], 0
    for user, _ in _graph.final_users(site.producer):
        if user.target is GROUP_QUANT:
            quants += 1
        else:
            others.append(_graph.describe(user))
    return others, quants


def rewrite(graph, site: Site) -> Node:
    """Swap in the fused op; returns it. Raises before touching existing nodes if anything goes wrong (the nodes
    it inserted are erased again), so a failed rewrite leaves the graph as it was."""
    shape = list(site.chain[0].args[1]) if site.chain else []
    # every node the new ones read, symbolic sizes of the reshape included, must come before them
    inputs = [n for n in (site.x, *site.args, *(site.pieces or ()), *shape) if isinstance(n, Node)]
    fused_op = getattr(torch.ops.fp8_fusion, site.fusion.fused_op).default
    q_gets, s_gets = _graph.quant_outputs(site.quant)
    last = max(inputs)
    early = [u for u in (site.residual.users if site.residual is not None else ()) if u not in site.matched
             and u < last]
    if early:  # the new residual would be defined after a reader of the old one (never seen in real graphs)
        raise RuntimeError(f"residual {site.residual.name} is read by {early[0].name} before {last.name}, which the "
                           "fused op needs; left unfused")
    with _graph.Edit(graph, **_insertion_point(graph, inputs)) as e:
        x = site.x if site.x is not None else e.call(aten.cat.default, list(site.pieces), -1)
        fused = e.call(fused_op, x, *site.args, site.group_size)
        q, s = e.call(operator.getitem, fused, 0), e.call(operator.getitem, fused, 1)
        if site.chain:
            k = _graph.val(site.quant_input).shape[-1]
            q = e.call(aten.reshape.default, q, shape)
            s = e.call(aten.reshape.default, s, shape[:-1] + [k // site.group_size])
        residual_out = e.call(operator.getitem, fused, 2) if site.residual is not None else None
    # rewire: nothing below allocates or traces, so it does not fail half-way
    for g in q_gets:
        g.replace_all_uses_with(q)
    for g in s_gets:
        g.replace_all_uses_with(s)
    if residual_out is not None:
        _graph.replace_uses(site.residual, residual_out, keep=site.matched)
    _graph.erase_dead(graph, [*q_gets, *s_gets, site.quant])
    extra = [n for n in (site.residual, *(site.pieces or ())) if n is not None]
    _graph.erase_dead(graph, [*site.matched, *extra])
    return fused


def _insertion_point(graph, inputs: list[Node]) -> dict:
    """Right after the last input (so every consumer of the outputs, the residual's included, comes later);
    after the placeholders when all inputs are placeholders."""
    last = max(inputs)
    if last.op != "placeholder":
        return {"after": last}
    return {"before": next(n for n in graph.nodes if n.op != "placeholder")}
