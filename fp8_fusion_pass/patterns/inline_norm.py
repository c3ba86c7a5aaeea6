"""Leftover norms become plain ops that Inductor can fuse.

    before (engine-form Qwen3 attention: the per-head q/k norms have no quant consumer, so no fusion takes them)
    q = rms_norm(view(q, [B, S, H, D]), w_q, eps)  -> transpose -> RoPE (an Inductor kernel)
    h, residual = add_rms_norm(x, residual, w, eps)  (the final norm, feeding the bf16 lm_head)

    after
    xf = convert_element_type(x, f32); r = rsqrt(mean(xf * xf, -1) + eps)
    q = w_q * convert_element_type(xf * r, bf16)      -> Inductor fuses it into the RoPE kernel
    residual = residual + x, then the same ops on it

``fp8_fusion::rms_norm`` / ``add_rms_norm`` are opaque to Inductor: each is its own kernel launch. Engines (vLLM,
sglang) write every norm as such an op; where the norm feeds a quant the pass fuses the two, and this rewrite
handles the rest, the way vLLM under ``torch.compile`` runs its norms as native torch code. The ops inserted are
``reference.rms_norm``'s, in its order (fp32 normalise, round to the activation dtype, multiply by w), so the
eager semantics are the op's; Inductor's kernel may differ from the op's kernel in reduction order and rsqrt
rounding (not bit-exact: deterministic mode keeps it off).

Runs after the fusions and the "why not" scan, so every norm a fusion could take has been taken (or has its
reason recorded) before the rest are inlined. Rejected, with nothing changed: a norm whose eps is a graph input
(``eps_graph_input``: ``dynamic=True`` lifted it), one on an fp16 / fp32 activation (``dtype_not_bf16``: such
graphs are left alone, as by the fusions' dtype guard), and one whose inlined output would differ from the op's
in dtype or shape (``inline_changes_output``).

Measured on the H200 profile (benchmarks/profile_step.py, engine form, batch 1): the q / k norm ops are two
launches of ~2 us per layer; the HF form, whose norms are plain torch, runs its q / k norms fused into the RoPE
kernel. Inlining them (``benchmarks/decode.py``, all 36 layers of engine-form Qwen3-8B) took the pass's decode
speed-up from 1.044 / 1.043 / 1.030 / 1.031x to 1.083 / 1.115 / 1.102 / 1.078x at batch 1 / 8 / 32 / 64 and its
2048-token prefill gain from 1.030x to 1.050x. (On the CPU, Inductor's C++ backend generated more kernels with
it, 31 against 23 for the 2-layer tiny model: its fusion rules are not Triton's.) Llama has no per-head norms:
nothing to inline inside its layers.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .. import guards
from . import _graph

aten, prims = torch.ops.aten, torch.ops.prims
RMS_NORM = torch.ops.fp8_fusion.rms_norm.default
ADD_RMS_NORM = torch.ops.fp8_fusion.add_rms_norm.default
NAME = "inline_norm"


def leftover_norms(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in (RMS_NORM, ADD_RMS_NORM)]


def _norm(e: _graph.Edit, x: Node, w: Node, eps: float) -> Node:
    """``reference.rms_norm`` as aten / prims calls: w * (xf * rsqrt(mean(xf^2) + eps)).to(x.dtype)."""
    dtype = _graph.val(x).dtype
    xf = e.call(prims.convert_element_type.default, x, torch.float32)
    var = e.call(aten.mean.dim, e.call(aten.mul.Tensor, xf, xf), [-1], True)
    r = e.call(aten.rsqrt.default, e.call(aten.add.Tensor, var, eps))
    y = e.call(prims.convert_element_type.default, e.call(aten.mul.Tensor, xf, r), dtype)
    return e.call(aten.mul.Tensor, w, y)


def _same(new: Node, old) -> bool:
    v = _graph.val(new)
    return isinstance(v, torch.Tensor) and isinstance(old, torch.Tensor) and v.dtype == old.dtype \
        and v.dim() == old.dim()


def inline(graph: Graph, node: Node) -> tuple[str, str] | None:
    """Replace one norm op by its aten ops. Returns None when done, else (reason code, detail) for leaving it."""
    if node.target is RMS_NORM:
        x, w, eps = node.args[:3]
        residual = None
    else:
        x, residual, w, eps = node.args[:4]
    # The fusions' own guards: eps a compile-time float; bf16 only (fp16 / fp32 graphs are left alone)
    res_val = _graph.val(residual) if residual is not None else None
    for verdict in (guards.can_eps(eps), guards.can_dtype(_graph.val(x), residual=res_val)):
        if not verdict.ok:
            return verdict.reason, verdict.detail
    if residual is not None and any(u.target is not operator.getitem for u in node.users):
        # not seen: the op's outputs are unpacked
        return "inline_changes_output", "a user takes the whole (y, residual) tuple"
    old = node.meta.get("val")
    with _graph.Edit(graph, before=node) as e:
        if residual is None:
            outputs = [_norm(e, x, w, float(eps))]
            olds = [old]
        else:
            total = e.call(aten.add.Tensor, residual, x)  # reference.add_rms_norm: residual + x, rounded
            outputs = [_norm(e, total, w, float(eps)), total]
            olds = list(old) if isinstance(old, (tuple, list)) else [None, None]
        bad = [i for i, (new, o) in enumerate(zip(outputs, olds)) if not _same(new, o)]
        if bad:
            raise _Mismatch(f"output {bad[0]} would change dtype or rank")
    if residual is None:
        node.replace_all_uses_with(outputs[0])
    else:
        for user in list(node.users):
            user.replace_all_uses_with(outputs[user.args[1]])
    _graph.erase_dead(graph, [*node.users, node])
    return None


class _Mismatch(ValueError):
    pass


def run(graph: Graph, report) -> None:
    for node in leftover_norms(graph):
        shapes, dtype = _graph.shape_str(x=node.args[0]), _graph.dtype_str(node.args[0])
        try:
            why = inline(graph, node)
        except _Mismatch as e:
            why = "inline_changes_output", str(e)
        if why is None:
            report.apply(NAME, node.name, shapes, dtype, "inlined as aten ops for Inductor to fuse")
        else:
            report.reject(NAME, node.name, *why, shapes=shapes, dtype=dtype)
