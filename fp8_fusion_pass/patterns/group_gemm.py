"""GEMMs of one quantized activation become one grouped GEMM.

    before (HF attention: q_proj, k_proj, v_proj read the same quant after dedup_quant and the norm fusion)
    q, s = rms_norm_group_quant(x, w, eps, 128)
    yq = blockscale_mm(q, s, W_q, S_q)   yk = blockscale_mm(q, s, W_k, S_k)   yv = blockscale_mm(q, s, W_v, S_v)

    after
    y = blockscale_mm_grouped(q, s, [W_q, W_k, W_v], [S_q, S_k, S_v])     # [M, Nq + Nk + Nv]
    yq, yk, yv = slices of y along N

Engine model code merges these projections when it loads the weights (``qkv_proj``, ``gate_up_proj``); Hugging
Face models keep them separate, so at decode each is its own launch of a few microseconds (Qwen3-8B at M = 1 on
the H200: q 8.3 us, k 5.5, v 5.5, against 10.5 for the merged 6144 x 4096 shape; gate 16.4 + up 16.4 against
28.1; benchmarks/gemm.py). The grouped op reads every weight in place (no copy) and, on the Triton backend, runs
them in one launch with the measured config of the merged shape. Estimated from those GEMM times, ~13 us less
per Qwen3-8B layer at batch 1. Measured end to end (H200, all 36 layers of HF Qwen3-8B, batch 1, three runs of
``benchmarks/decode.py --forms hf``): the pass's decode speed-up went from 1.041x without this rewrite to
1.16-1.22x with it, ~17 us per layer.

HF's silu-mul fusion concatenates the separate gate and up outputs (``cat`` -> ``silu_mul_group_quant``); once
they are slices of one grouped output, in order, that concat is the grouped output itself and is folded away
(``fold_concats``), which saves a copy kernel per layer.

Runs after the fusions and the "why not" scan (which read each quant's GEMM consumers). Groups hold 2 or 3
GEMMs (more are split into groups of 3) with the same out dtype and static N; a graph whose M is static and above
the small-M range keeps its GEMMs separate (rejected: ``m_above_small_m``). Not bit-exact: the grouped launch
may split K differently from the separate ones (deterministic mode keeps it off).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.fx import Graph, Node

from .. import guards
from . import _graph
from ._graph import BLOCKSCALE_MM

GROUPED = torch.ops.fp8_fusion.blockscale_mm_grouped.default
NAME = "group_gemm"
MAX_GROUP = 3  # the Triton kernel's group count


def groups(graph: Graph) -> list[list[Node]]:
    """blockscale_mm nodes that share (q, x_scale, out_dtype), in graph order, in groups of 2..MAX_GROUP."""
    by_input: dict = defaultdict(list)
    for node in graph.nodes:
        if node.op == "call_function" and node.target is BLOCKSCALE_MM and _static_n(node) is not None:
            q, x_scale, _, _, out_dtype = node.args[:5]
            by_input[(q, x_scale, out_dtype)].append(node)
    out = []
    for nodes in by_input.values():
        for i in range(0, len(nodes), MAX_GROUP):
            chunk = nodes[i:i + MAX_GROUP]
            if len(chunk) >= 2:
                out.append(chunk)
    return out


def _static_n(gemm: Node) -> int | None:
    v = _graph.val(gemm)
    if not isinstance(v, torch.Tensor) or not isinstance(v.shape[-1], int):
        return None
    return v.shape[-1]


def rewrite(graph: Graph, gemms: list[Node]) -> str:
    """One grouped op before the first GEMM, a slice per GEMM for its users. Returns the report's detail."""
    first = gemms[0]
    q, x_scale, _, _, out_dtype = first.args[:5]
    weights, scales = [g.args[2] for g in gemms], [g.args[3] for g in gemms]
    for arg in weights + scales:
        if isinstance(arg, Node) and not arg < first:  # a weight computed after the first GEMM: keep the order
            raise _NotBefore(f"{arg.name} is defined after {first.name}")
    sizes = [_static_n(g) for g in gemms]
    with _graph.Edit(graph, before=first) as e:
        y = e.call(GROUPED, q, x_scale, weights, scales, out_dtype)
        start, parts = 0, []
        for n in sizes:
            parts.append(e.call(torch.ops.aten.slice.Tensor, y, 1, start, start + n))
            start += n
    for gemm, part in zip(gemms, parts):
        gemm.replace_all_uses_with(part)
    _graph.erase_dead(graph, gemms)
    detail = f"{len(gemms)} GEMMs of {q.name}: N = {' + '.join(map(str, sizes))}"
    folded = fold_concats(graph, y, sum(sizes))
    return detail + (f"; {folded} concat(s) of its slices folded" if folded else "")


def _piece(node: Node, y: Node):
    """(start, end, leading shape) of ``node`` = [reshape of] ``slice(y, 1, start, end)``; None otherwise."""
    shape = None
    if node.op == "call_function" and node.target in _graph.RESHAPES:
        shape, node = list(node.args[1]), node.args[0]
    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor or node.args[0] is not y:
        return None
    if node.args[1] != 1 or len(node.args) < 4 or not all(isinstance(a, int) for a in node.args[2:4]):
        return None
    start, end = node.args[2], node.args[3]
    if shape is not None and shape[-1] != end - start:
        return None  # the reshape changes the last dim
    return start, end, None if shape is None else tuple(shape[:-1])


def fold_concats(graph: Graph, y: Node, n_total: int) -> int:
    """``cat([slice(y, a, b) ...], -1)`` that puts the slices back in order over all of y's N is y itself (or a
    reshape of it): the HF silu-mul fusion concatenates gate and up, which the grouped GEMM just produced side by
    side. Replacing the cat saves its copy kernel; the value is bit-identical. Returns the number folded."""
    users = {u for part in y.users for u in part.users} | set(y.users)
    cats = {c for u in users for c in [u, *u.users]
            if c.op == "call_function" and c.target is torch.ops.aten.cat.default}
    folded = 0
    for cat in sorted(cats):
        inputs, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
        out = _graph.val(cat)
        if not isinstance(out, torch.Tensor) or dim not in (-1, out.dim() - 1):
            continue
        pieces = [_piece(a, y) for a in inputs]
        if any(p is None for p in pieces) or len({p[2] for p in pieces}) != 1:
            continue
        bounds = [(p[0], p[1]) for p in pieces]
        if bounds[0][0] != 0 or bounds[-1][1] != n_total or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
            continue
        lead = pieces[0][2]
        with _graph.Edit(graph, before=cat) as e:
            whole = y if lead is None else e.call(torch.ops.aten.reshape.default, y, [*lead, n_total])
        cat.replace_all_uses_with(whole)
        _graph.erase_dead(graph, [cat, *inputs])
        folded += 1
    return folded


class _NotBefore(ValueError):
    pass


def run(graph: Graph, report) -> None:
    for gemms in groups(graph):
        q = gemms[0].args[0]
        shapes, dtype = _graph.shape_str(q=q), _graph.dtype_str(gemms[0])
        v = _graph.val(q)
        # The grouped launch is a small-M kernel: above its rows the op would concatenate separate GEMMs, one
        # extra copy for nothing, so a graph whose M is known to be larger keeps them.
        device, rows = (v.device, v.shape[0]) if isinstance(v, torch.Tensor) else (torch.device("cpu"), None)
        verdict = guards.can_group_gemms(device)
        if verdict.ok:
            verdict = guards.can_small_m(rows, "grouped kernel")
        if not verdict.ok:
            report.reject(NAME, gemms[0].name, verdict.reason, f"{verdict.detail}: {len(gemms)} GEMMs left separate",
                          shapes, dtype)  # fmt: skip
            continue
        try:
            detail = rewrite(graph, gemms)
        except _NotBefore as e:
            report.reject(NAME, gemms[0].name, "operand_defined_later", f"{e}: left separate", shapes, dtype)
            continue
        report.apply(NAME, gemms[0].name, shapes, dtype, detail)
