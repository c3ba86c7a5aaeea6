"""A group quant that no producer took in, feeding only block-scale GEMMs: at batch 1-4, the GEMV quantizes the
activation itself.

    before (o_proj after attention: the quant the norm / silu fusions cannot reach, ``producer_not_fusable``)
    q, s = group_quant(x, 128)                     x [M, K] bf16, M <= 4
    y = blockscale_mm(q, s, W, S, bf16)

    after
    y = group_quant_blockscale_mm(x, W, S, bf16, 128)

At decode the o_proj input quant is a launch of its own, ~1.25 us in a CUDA graph before a ~7 us GEMV on the H200
(``benchmarks/profile_step.py``, Llama-3.1-8B, batch 1). The fused op's Triton implementation runs the GEMV with
the quant inside where ``kernels/triton/group_quant_blockscale_mm.TABLE`` measured that faster (the 8B o_proj at
M = 1: 8.19 against 8.93 us, ``benchmarks/quant_gemm.py --sweep``), elsewhere the pair. Its GEMV config is its
own (8 rows per program, the activation quantized half as often as at the GEMM's 4), so its sums may be
ordered differently from the unfused GEMM's: not bit-exact, off in deterministic mode.

Runs last but for ``zero_fill``, on the quants left: after ``decode_attention`` / ``rope_attention``, whose launch
quantizes its own output where the heads are whole quant groups. That fold won end to end on the H200 (2026-12-03,
``benchmarks/decode.py --also=-quant_gemm``, batch 1: Llama-3.1-8B 2.821 -> 2.807 ms, Qwen3-8B 3.006 -> 2.981 ms):
~0.5 us in the attention against ~0.9 us in the GEMV. So at decode this rewrite takes what the attention cannot:
heads narrower than a group, or an attention the pass does not own (the HF form's SDPA).

Guards: the switch and deterministic mode; the quant's q and scale feed only ``blockscale_mm`` as its (q, x_scale),
directly (``consumer_not_blockscale_mm``: no reshape between, as ``BlockFP8Linear`` writes it, so the input is
[M, K]); a bf16 input; groups of 128 and the fused op on the GEMM's backend (``no_fused_kernel``: not aiter); a
static M of at most 4 rows (``m_above_gemv``) with a measured win at that M and shape (``unfused_pair_faster``). A
symbolic M is fused: the op picks per call. A quant feeding several GEMMs gives each its own fused op (each GEMV
re-reads the few-KB activation anyway).
"""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from .. import guards
from . import _graph
from ._graph import BLOCKSCALE_MM, GROUP_QUANT
from ._site import group_size_of

FUSED = torch.ops.fp8_fusion.group_quant_blockscale_mm.default
NAME = "quant_gemm"
GROUP = 128  # the GEMV's activation group (one scale per weight block)
GEMV_MAX_M = 4  # kernels/triton/_gemv_kernels.GEMV_MAX_M (not imported: the pass must not need Triton)


def _gemms(quant: Node) -> list[Node] | None:
    """The ``blockscale_mm`` nodes reading this quant's (q, scale) as their (q, x_scale), directly; None when
    anything else reads either output."""
    qs, ss = _graph.quant_outputs(quant)
    if not qs or len(quant.users) != len(qs) + len(ss):
        return None
    gemms = {u for g in qs + ss for u in g.users}
    if any(u.target is not BLOCKSCALE_MM or u.args[0] not in qs or u.args[1] not in ss for u in gemms):
        return None
    return [n for n in quant.graph.nodes if n in gemms]  # graph order


def _check(quant: Node, gemms: list[Node]) -> guards.Verdict:
    x = _graph.val(quant.args[0])
    g = group_size_of(quant)
    verdict = guards.first_failure(
        lambda: guards.can_dtype(x),  # 2-D: blockscale_mm reads its q directly (_gemms)
        lambda: guards.OK if g == GROUP else guards.reject(
            "no_fused_kernel", f"group {g}: the quantizing GEMV takes groups of {GROUP}"),
        lambda: guards.can_fuse_on_gemm_backend("group_quant_blockscale_mm", "blockscale_mm", x.device),
        lambda: _rows(x.shape[0]),
    )
    if not verdict.ok:
        return verdict
    for gemm in gemms:
        w = _graph.val(gemm.args[2])
        verdict = guards.should_quant_in_gemm(x, w, _graph.val(gemm).dtype, g)
        if not verdict.ok:
            return verdict
    return guards.OK


def _rows(m) -> guards.Verdict:
    if isinstance(m, int) and m > GEMV_MAX_M:
        return guards.reject("m_above_gemv", f"M={m} is above the quantizing GEMV's {GEMV_MAX_M} rows")
    return guards.OK


def rewrite(graph: Graph, quant: Node, gemms: list[Node]) -> str:
    x, g = quant.args[0], group_size_of(quant)
    shapes = ", ".join(f"{list(_graph.val(gm.args[2]).shape)}" for gm in gemms)
    fused = []
    try:  # each fused op where its GEMM was (its weight may be defined after the first GEMM)
        for gemm in gemms:
            with _graph.Edit(graph, before=gemm) as e:
                fused.append(e.call(FUSED, x, gemm.args[2], gemm.args[3], gemm.args[4], g))
    except BaseException:
        for node in fused:  # no users yet: the graph is as it was
            graph.erase_node(node)
        raise
    for gemm, new in zip(gemms, fused):
        gemm.replace_all_uses_with(new)
    qs, ss = _graph.quant_outputs(quant)
    _graph.erase_dead(graph, [*gemms, *qs, *ss, quant])
    return f"{len(gemms)} GEMM(s), W {shapes}, group {g}: the quant runs inside the GEMV"


def run(graph: Graph, report) -> None:
    for quant in [n for n in graph.nodes if n.op == "call_function" and n.target is GROUP_QUANT]:
        gemms = _gemms(quant)
        shapes = _graph.shape_str(x=quant.args[0])
        dtype = _graph.dtype_str(quant.args[0])
        if gemms is None:
            if _graph.quant_consumers(quant):  # feeds something else: not this rewrite's candidate
                continue
            verdict = guards.reject("consumer_not_blockscale_mm", "a reshape between the quant and its GEMM")
        else:
            verdict = _check(quant, gemms)
        report.settle(NAME, quant.name, shapes, dtype, verdict, "the quant stays a launch", rewrite, graph, quant,
                      gemms)
