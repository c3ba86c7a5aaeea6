"""SiLU-and-mul -> 1 x group quant -> block-scale GEMM (the MLP's down_proj input).

    before (merged gate_up [M, 2I])                   after
    h = silu_and_mul(gate_up)      [B, S, I] bf16     q, s = silu_mul_group_quant(gate_up, g)
    h2 = reshape(h, [-1, I])                           q2 = reshape(q, [-1, I]); s2 = reshape(s, [-1, I/g])
    q2, s2 = group_quant(h2, g) -> blockscale_mm       blockscale_mm(q2, s2, ...)

    before (split: HF gate_proj / up_proj)            after
    h = silu(gate) * up                                q, s = silu_mul_group_quant(cat([gate, up], -1), g)

Matched spellings:
- ``op``: ``fp8_fusion.silu_and_mul(gate_up)`` (engine-style model code, merged gate_up_proj);
- ``torch``: ``reference.silu_and_mul`` with its two slices cut off, i.e. transformers' ``Qwen3MLP`` /
  ``LlamaMLP.forward`` ``act_fn(gate_proj(x)) * up_proj(x)`` with ``F.silu`` decomposed
  (``convert -> neg -> exp -> add 1 -> div -> convert``, then ``mul``). When gate and up are the two halves of
  one tensor (``gate_up[..., :d]`` / ``gate_up[..., d:]`` slices, or ``gate_up.chunk(2, -1)``), the fused op
  reads that tensor; otherwise it reads ``cat([gate, up], -1)`` - one extra copy of 2I values per token (at
  decode size a few microseconds, and the same number of launches as Inductor's own silu*up kernel plus the
  quant; at prefill sizes it moves 13I instead of 9I bytes per token: merge gate/up for the best result).

Guards: the ``silu_quant`` switch and ``FP8_FUSION_DISABLE`` (bit-exact, so deterministic mode keeps it on);
bf16 gate/up; a fused kernel for the device; static I, configured group size, I % g == 0; reshapes keep the
last dim; contiguous last dims; the silu output feeds this one quant only; the quant's outputs feed only
``blockscale_mm``; the small-M table. Split form: gate and up of one shape and dtype.
"""

from __future__ import annotations

import operator

import torch
from torch._inductor.pattern_matcher import Match

from ..kernels import reference
from . import BY_NAME, _graph, _trace
from ._site import Form, Site, group_size_of

aten = torch.ops.aten
ops = torch.ops.fp8_fusion
INT64_MAX = 2**63 - 1  # what ``x[..., d:]`` puts as the slice end


def _gate_up():
    return (torch.empty(4, 512, dtype=torch.bfloat16),)


def _silu_and_mul_op(x):
    return ops.silu_and_mul(x)


def _silu_and_mul_torch(x):
    return reference.silu_and_mul(x)


def _cut_slices(pattern):
    return _trace.cut(pattern, aten.slice.Tensor, ("gate", "up"))


FORMS = {
    "silu_quant": (
        Form("op", _silu_and_mul_op, _gate_up),
        Form("torch", _silu_and_mul_torch, _gate_up, post=_cut_slices),
    ),
}


def _slice_args(node) -> tuple:
    """(dim, start, end, step) of an ``aten.slice.Tensor`` node, defaults filled in (None start = 0, None end = max)."""
    names = ("dim", "start", "end", "step")
    defaults = {"dim": 0, "start": 0, "end": INT64_MAX, "step": 1}
    given = dict(zip(names, node.args[1:]), **node.kwargs)
    return tuple(defaults[n] if given.get(n) is None else given[n] for n in names)


def _halves(gate, up):
    """The tensor whose first and second halves (last dim) are gate and up, or None."""
    if not all(isinstance(n, torch.fx.Node) and n.op == "call_function" and n.args for n in (gate, up)):
        return None
    if gate.args[0] is not up.args[0]:
        return None
    if gate.target is aten.slice.Tensor and up.target is aten.slice.Tensor:
        whole = gate.args[0]
        k, last = _last_dim(whole)
        g_dim, g_start, g_end, g_step = _slice_args(gate)
        u_dim, u_start, u_end, u_step = _slice_args(up)
        ok = (k is not None and g_dim in last and u_dim in last and g_step == u_step == 1 and g_start == 0
              and g_end == u_start == k // 2 and u_end >= k)
        return whole if ok else None
    split = gate.args[0]
    if (gate.target is operator.getitem and up.target is operator.getitem and (gate.args[1], up.args[1]) == (0, 1)
            and split.target in (aten.split.Tensor, aten.split_with_sizes.default)):
        whole, sizes = split.args[0], split.args[1]
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        k, last = _last_dim(whole)
        if k is None or dim not in last:
            return None
        halves = list(sizes) == [k // 2, k // 2] if isinstance(sizes, (list, tuple)) else 2 * sizes == k
        return whole if halves else None
    return None


def _last_dim(node) -> tuple:
    """(K, the two spellings of the last dim) of a tensor node; K is None unless static and even."""
    v = _graph.val(node)
    if not isinstance(v, torch.Tensor) or v.dim() == 0 or not isinstance(v.shape[-1], int) or v.shape[-1] % 2:
        return None, ()
    return v.shape[-1], (-1, v.dim() - 1)


def accepts(match: Match, fusion_name: str, form: str) -> bool:
    if form == "op":
        return True
    gate, up = match.kwargs["gate"], match.kwargs["up"]
    return _graph.same_shape(gate, up) and _graph.dtype_str(gate) == _graph.dtype_str(up)


def site(match: Match, fusion_name: str, form: str) -> Site:
    quant = match.output_node()
    producer, chain = _graph.strip_reshapes(quant.args[0])
    common = dict(fusion=BY_NAME[fusion_name], form=form, quant=quant, producer=producer, chain=chain,
                  group_size=group_size_of(quant), args=(), matched=set(match.nodes))
    if form == "op":
        return Site(x=match.kwargs["x"], **common)
    gate, up = match.kwargs["gate"], match.kwargs["up"]
    merged = _halves(gate, up)
    common["form"] = "torch-merged" if merged is not None else "torch-split"  # split: gate/up concatenated
    return Site(x=merged, pieces=(gate, up), **common)
