"""The gate/up GEMM takes the SiLU-and-mul and the down projection's input quant into its epilogue.

    before (after the silu fusion; HF gate / up after group_gemm)
    y = blockscale_mm(q, s, W_gate_up, S, bf16)         or  blockscale_mm_grouped(q, s, [W_gate, W_up], ...)
    q2, s2 = silu_mul_group_quant(reshape(y, [B, S, 2I]), 128)

    after
    q2, s2 = blockscale_mm_silu_mul_group_quant(q, s, [W_gate_up], [S], bf16, 128)     # [M, I], [M, I/128]
    q2, s2 = reshape(q2, [B, S, I]), reshape(s2, [B, S, I/128])

At decode the silu-quant is a launch of its own after the gate/up GEMM, ~1.3 us in a CUDA graph on the H200; the
fused op's Triton implementation runs it inside the GEMM's launch where ``blockscale_mm_silu_quant.TABLE``
measured that faster, and the unfused pair elsewhere. Measured (``benchmarks/gemm_silu_quant.py``, H200): on
Qwen3-32B's gate_up 0.90-0.96x the two launches at M <= 32, and all 64 layers of its decode step at batch 1 went
from 1.037x to 1.079x with the pass (6.8 us per layer, ``benchmarks/decode.py``). Since then the GEMV path gives
the unfused GEMM that time at M = 1 (a tie), and TMA tiles made both GEMMs faster at M = 16-64: the table fuses
Qwen3-32B and Llama-3.1-8B at M = 16 / 32 (0.96-0.98x), and, with the activation rows on the MMA's M side, all three
at M = 33-64 (0.95-0.98x). On Qwen3-8B's gate_up the fused launch ties the pair at M = 4-32, so the table keeps two
launches there and the report says ``unfused_pair_faster``.

Runs after ``group_gemm`` (whose grouped gate / up output it also takes). Guards: the switch, deterministic mode
(not bit-exact: the fused launch's GEMM config may differ from the separate GEMM's, and so its sum order);
the GEMM's output feeds only this silu-quant, through reshapes that keep its last dim; its weights are the
silu's two halves (one merged [2I, K] or two [I, K]); the fused op on the backend that runs the GEMM
(``guards.can_fuse_on_gemm_backend``: not aiter) and, on Triton, a weight layout the kernel reads in place
(``can_fuse_gemm_epilogue``: ``no_fused_kernel``); a static M within the small-M range (``m_above_small_m``)
with a measured fused config (``should_fuse_gemm_epilogue``: ``unfused_pair_faster``). A symbolic M is fused:
the op picks per call.
"""

from __future__ import annotations

import itertools
import operator

import torch
from torch.fx import Graph, Node

from .. import guards
from . import _graph
from ._graph import BLOCKSCALE_MM
from ._site import group_size_of

aten = torch.ops.aten
SILU_QUANT = torch.ops.fp8_fusion.silu_mul_group_quant.default
GROUPED = torch.ops.fp8_fusion.blockscale_mm_grouped.default
FUSED = torch.ops.fp8_fusion.blockscale_mm_silu_mul_group_quant.default
NAME = "gemm_silu_quant"


def _gemm_of(silu: Node):
    """(gemm node, weights, scales, reshape chain) when the silu-quant's input is a gate/up GEMM's output."""
    gemm, chain = _graph.strip_reshapes(silu.args[0])
    if not isinstance(gemm, Node) or gemm.op != "call_function":
        return None
    if gemm.target is BLOCKSCALE_MM:
        return gemm, [gemm.args[2]], [gemm.args[3]], chain
    if gemm.target is GROUPED and len(gemm.args[2]) == 2:
        return gemm, list(gemm.args[2]), list(gemm.args[3]), chain
    return None


def _only_user(node: Node, user: Node) -> bool:
    return list(node.users) == [user]


def _halves_match(weights: list) -> bool:
    """gate and up: two static [I, K] weights of one I, or one static [2I, K] weight (the silu splits it there)."""
    ns = [w.shape[0] if isinstance(w, torch.Tensor) else None for w in weights]
    if not all(isinstance(n, int) for n in ns):
        return False
    return ns[0] % 2 == 0 if len(ns) == 1 else ns[0] == ns[1]


def _check(silu: Node, gemm: Node, weights, scales, chain: list[Node]) -> guards.Verdict:
    path = [gemm, *reversed(chain), silu]  # each node's one user is the next
    if not all(_only_user(a, b) for a, b in itertools.pairwise(path)):
        return guards.reject("extra_consumer", f"the GEMM output {gemm.name} also feeds something else")
    if not _graph.keeps_last_dim(chain):
        return guards.reject("reshape_changes_last_dim", "a reshape between the GEMM and the silu-quant")
    w_vals, s_vals = [_graph.val(w) for w in weights], [_graph.val(s) for s in scales]
    if not _halves_match(w_vals):
        return guards.reject("unrecognized_spelling", "the silu's gate / up halves are not the GEMM's weights: "
                             f"N = {[tuple(w.shape) for w in w_vals if isinstance(w, torch.Tensor)]}")
    q, x_scale = gemm.args[0], gemm.args[1]
    qv = _graph.val(q)
    return guards.first_failure(  # the GEMM's backend: blockscale_mm's (a grouped one exists only where it matches)
        lambda: guards.can_fuse_on_gemm_backend("blockscale_mm_silu_mul_group_quant", "blockscale_mm", qv.device),
        lambda: guards.can_fuse_gemm_epilogue(w_vals, s_vals),
        lambda: guards.can_small_m(qv.shape[0], "fused kernel"),
        lambda: _should_fuse(qv, _graph.val(x_scale), w_vals, _graph.val(gemm).dtype, group_size_of(silu)),
    )


def _should_fuse(qv, x_scale, w_vals, out_dtype, group_size: int) -> guards.Verdict:
    if not isinstance(qv.shape[0], int):
        return guards.OK  # symbolic M: the op chooses per call
    return guards.should_fuse_gemm_epilogue(qv, x_scale, w_vals, out_dtype, group_size)


def rewrite(graph: Graph, silu: Node, gemm: Node, weights, scales, chain: list[Node]) -> str:
    q, x_scale, out_dtype = gemm.args[0], gemm.args[1], gemm.args[-1]
    g = group_size_of(silu)
    lead = list(chain[0].args[1][:-1]) if chain else None  # the silu input's leading dims, as the graph spells them
    out_q, out_s = _graph.val(silu)
    with _graph.Edit(graph, before=silu) as e:
        fused = e.call(FUSED, q, x_scale, weights, scales, out_dtype, g)
        new = [e.call(operator.getitem, fused, 0), e.call(operator.getitem, fused, 1)]
        if lead is not None:
            new = [e.call(aten.reshape.default, new[0], [*lead, out_q.shape[-1]]),
                   e.call(aten.reshape.default, new[1], [*lead, out_s.shape[-1]])]
    for user in list(silu.users):
        user.replace_all_uses_with(new[user.args[1]])
    _graph.erase_dead(graph, [*silu.users, silu])
    n = sum(_graph.val(w).shape[0] for w in weights)
    return f"{len(weights)} weight(s), N = {n}, group {g}: the silu-quant runs in the GEMM's launch"


def run(graph: Graph, report) -> None:
    for silu in [n for n in graph.nodes if n.op == "call_function" and n.target is SILU_QUANT]:
        found = _gemm_of(silu)
        if found is None:
            continue  # fed by something else than a GEMM: not a candidate (nothing to explain)
        gemm, weights, scales, chain = found
        shapes, dtype = _graph.shape_str(q=gemm.args[0], y=gemm), _graph.dtype_str(gemm)
        if not all(u.target is operator.getitem for u in silu.users):  # defensive: post-grad graphs index tuples
            verdict = guards.reject("extra_consumer", f"{silu.name}'s (q, scale) tuple is used whole")
        else:
            verdict = _check(silu, gemm, weights, scales, chain)
        report.settle(NAME, gemm.name, shapes, dtype, verdict, "left as two launches",
                      rewrite, graph, silu, gemm, weights, scales, chain)
