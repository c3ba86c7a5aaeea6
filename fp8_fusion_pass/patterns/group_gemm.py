"""GEMMs of one quantized activation become one grouped GEMM. Off by default: not yet measured on a GPU.

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
per Qwen3-8B layer at batch 1; the end-to-end effect has not been measured: ``FusionConfig(group_gemm=True)``,
``benchmarks/decode.py --group-gemms``.

Runs after the fusions and the "why not" scan (which read each quant's GEMM consumers). Groups hold 2 or 3
GEMMs (more are split into groups of 3) with the same out dtype and static N. Not bit-exact: the grouped launch
may split K differently from the separate ones (deterministic mode keeps it off).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.fx import Graph, Node

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
    return f"{len(gemms)} GEMMs of {q.name}: N = {' + '.join(map(str, sizes))}"


class _NotBefore(ValueError):
    pass


def run(graph: Graph, report) -> None:
    for gemms in groups(graph):
        q = gemms[0].args[0]
        shapes, dtype = _graph.shape_str(q=q), _graph.dtype_str(gemms[0])
        try:
            detail = rewrite(graph, gemms)
        except _NotBefore as e:
            report.notes.append(f"group_gemm: {gemms[0].name} left separate: {e}")
            continue
        report.apply(NAME, gemms[0].name, shapes, dtype, detail)
