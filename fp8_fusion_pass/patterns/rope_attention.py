"""The decode step's RoPE and KV-cache writes into its attention's launch: ``*_rope_cache`` then the attention.

    before (what ``rope_cache`` and ``decode_attention`` leave at one query token; at S tokens the token form)
    af = auto_functionalized_v2(qk_rope_cache | rms_norm_rope_cache, q=.., k=.., v=.., positions=..,
                                _all_bases=[k_cache, v_cache])
    o = decode_attention_upto(reshape(af[0], [B, Hkv, R, D]), af[1], af[2], last, scale)
        (or decode_attention_upto_quant(..., g) -> (o_q, scales): the o_proj's quant folded in)

    after
    af = auto_functionalized_v2(rope_decode_attention, q=.., wq=.. or None, k=.., ..., last=last, scale=scale,
                                group_size=g or 0, _all_bases=[k_cache, v_cache])
    o = af[0] (o_q = af[0], scales = af[1]); the new caches af[2], af[3] (their copy_ back unchanged)

    at S tokens (verifying draft tokens): decode_attention_tokens_quant(af[0] [B, Hq, S, D], af[1], af[2], last [B, S],
    scale, g) becomes rope_decode_attention_tokens_quant(q, .., last=last, ...) the same way, o_q / scales [B, S, Hq,
    D]; decode_attention_tokens (no quant: a bf16 / per-tensor o_proj) becomes rope_decode_attention_tokens, o alone

Why: after the other rewrites a decode layer's attention is two launches of ours, the RoPE kernel that writes k / v
into their slots and the attention that reads them back. Both are latency-bound at decode (1.5 us for the RoPE on
the H200 at batch 8, ~6-10 us for the attention), so one launch saves the RoPE's launch and its round trip through
HBM: the attention program whose keys hold the new slot computes k / v itself, stores them there and, after a
barrier, reads them back in its key loop (``kernels/triton/decode_attention.py``). The RoPE steps are
``rms_norm_rope``'s, each product rounded as eager rounds it, so the caches get the pair's bits up to the order of the
norm's sum of squares; the attention is ``decode_attention_upto``'s. Not promised bit-exact (Qwen3's norms sum their
squares in another order; on a GPU the fused kernel is compiled apart from the two it replaces), so deterministic mode
keeps it off.

Guards, each with its reason (``rope_attention_not_single``): one token per step, or the token form reading the RoPE
op's q [B, Hq, S, D] as it is; the RoPE op's q read by this attention alone, through reshapes that keep its [B, Hq, 1,
D] order, as [B, Hkv, Hq / Hkv, D]; the attention reading
the caches that op wrote, whole (no view of a cache base); its outputs read one by one; a head dim the kernel takes
(a power of two of at least 16). With q / k norms, at most ``MAX_NORM_PAIRS`` batch rows x kv heads; in the token
form at most ``MAX_TOKEN_ROWS`` query rows per kv head, ``MAX_NORM_TOKEN_ROWS`` with the norms
(``unfused_pair_faster``: each measured slower above).
A kernel for the device (``no_fused_kernel``).
"""

from __future__ import annotations

import operator

import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized_v2
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .. import guards
from . import _graph

_ops = torch.ops.fp8_fusion
aten = torch.ops.aten
NAME = "rope_attention"
FUSED = _ops.rope_decode_attention.default
FUSED_TOKENS = _ops.rope_decode_attention_tokens_quant.default
FUSED_TOKENS_PLAIN = _ops.rope_decode_attention_tokens.default
ATTENTION = (_ops.decode_attention_upto.default, _ops.decode_attention_upto_quant.default)
MASKED = _ops.decode_attention.default  # reads a mask, not slots up to a position: the fused kernel takes positions
TOKENS = _ops.decode_attention_tokens_quant.default  # several tokens per step (verifying draft tokens)
TOKENS_PLAIN = _ops.decode_attention_tokens.default  # the same without the quant (a bf16 / per-tensor o_proj)
QUANTIZED = (_ops.decode_attention_upto_quant.default, TOKENS)  # outputs (o_q, scales)
_FUSED_FOR = {**dict.fromkeys(ATTENTION, FUSED), TOKENS: FUSED_TOKENS, TOKENS_PLAIN: FUSED_TOKENS_PLAIN}
ROPE_CACHE = (_ops.qk_rope_cache.default, _ops.rms_norm_rope_cache.default)
_op = _graph.is_call
# With Qwen3's q / k norms in the prologue, one launch measured slower above this many (batch row, kv head) pairs:
# the Qwen3-8B engine step at batch 64 (512 pairs) took 5.163 ms with it, 4.854-4.862 ms without it in the runs
# before; at batch 1-32 (8-256 pairs) it was 0.6-1.4% faster (H200, 2026-12-03, docs/benchmarks.md, "The RoPE in
# the attention's launch"). Llama's RoPE alone was faster at every batch, 1-64.
MAX_NORM_PAIRS = 256
# The token form's rows per kv head (G heads x S tokens) whose RoPE the attention's prologue takes: each program
# RoPEs its kv head's rows (and, with q / k norms, norms them) before its key loop, once per split of its keys. On
# TABLE's 8-warp rows (the RoPE launches' since 2908c3b), Qwen3-32B steps of 16 layers, H100, 2026-12-07 (thirty-fourth
# session; docs/benchmarks.md, "The RoPE in the token form's launch by rows, on 8 warps"): at 64 rows (8 heads x 8
# tokens) 3.946 / 4.476 ms at batch 1 / 8 against 3.949 / 4.315 with the RoPE launch kept; at 32 rows (8 heads x 4
# tokens, 2 interleaved rounds) 3.882 / 4.225 against 3.897 / 4.128. The ops alone at 32 rows (Qwen3-32B's heads):
# with the norms the pair / fused time ratio was 0.99-1.00x at batch 1, 0.76x at 8, 1.02x at 32; RoPE alone 1.07-1.16x,
# 0.98-1.05x, 1.08-1.10x; at 64 rows RoPE alone lost at batch 8 too (0.74 / 0.92x). At 16 rows (the 8B models' 4
# heads x 4 tokens) both won in the engine (1.006-1.019x, thirty-second session). The 8B models' own 32 rows (4 heads
# x 8 tokens, 16 layers, H100, thirty-sixth session, "The 8B models' 8-token steps at 32 rows") agree: Qwen3-8B with
# its norms in the launch 2.012 / 2.357 / 3.382 ms at batch 1 / 8 / 32 against 2.023 / 2.299 / 3.400 without, Llama's
# RoPE alone 2.079 / 2.327 / 3.550 against 2.090 / 2.366 / 3.609. So: with the norms at most 16 rows, RoPE alone at
# most 32.
MAX_TOKEN_ROWS = 32
MAX_NORM_TOKEN_ROWS = 16


def _rope_op_of_q(node: Node) -> Node | None:
    """The auto_functionalized_v2 node of a ``*_rope_cache`` op when ``node`` is its q output, else None."""
    if not (_op(node, operator.getitem) and node.args[1] == 0):
        return None
    af = node.args[0]
    return af if _op(af, auto_functionalized_v2) and af.args and af.args[0] in ROPE_CACHE else None


def _rope_q(att: Node) -> tuple[Node | None, list[Node]]:
    """(the auto_functionalized_v2 node of a ``*_rope_cache`` op, the views between its q output and ``att``), or
    (None, []) when the attention's q is not that op's q through reshapes / same-shape expands."""
    chain = []
    node = _graph.through_views(att.args[0], chain)
    af = _rope_op_of_q(node)
    return (af, [node, *chain]) if af is not None else (None, [])


# What lies between a RoPE op's q and an attention that reads it as other rows: a copy or permute (several tokens
# per step put each kv head's G heads x S tokens together)
_LAYOUT = (aten.clone.default, aten.permute.default, aten.expand.default, *_graph.RESHAPES)


def _rope_q_through_copies(att: Node) -> Node | None:
    """The ``*_rope_cache`` op whose q the attention reads through any layout ops (copies and permutes too): a
    candidate ``_rope_q`` does not take, which the report must name."""
    node = att.args[0]
    while _op(node, *_LAYOUT):
        node = node.args[0]
    return _rope_op_of_q(node)


def _outputs(af: Node) -> dict[int, Node]:
    return {u.args[1]: u for u in af.users if _op(u, operator.getitem)}


def _check(att: Node, af: Node, q_chain: list[Node]) -> guards.Verdict:
    def no(detail: str) -> guards.Verdict:
        return guards.reject("rope_attention_not_single", f"{detail}: the RoPE and the attention stay two launches")

    if att.target is MASKED:
        return no("the attention reads a mask, not every slot up to each row's position (the fused kernel's)")
    outs = _outputs(af)
    if len(outs) != len(af.users):
        return no("the RoPE op's outputs are read as a tuple")
    if att.target in QUANTIZED and not all(_op(u, operator.getitem) for u in att.users):
        return no("the attention's outputs are read as a tuple")
    views = {k: v for k, v in af.kwargs.items() if k.startswith(("_k_cache_", "_v_cache_"))}
    if views != {"_k_cache_base_index": 0, "_v_cache_base_index": 1}:
        return no(f"the RoPE op writes views of its cache bases ({views}), not the bases whole")
    if (att.args[1], att.args[2]) != (outs.get(1), outs.get(2)):
        return no("the attention does not read the caches this RoPE op wrote")
    readers = [u for n in q_chain for u in n.users if u not in (*q_chain, att) and _graph.static_size_read(u) is None]
    if readers:
        return no(f"the RoPE op's q is also read by {readers[0].name}")
    q = _graph.val(af.kwargs["q"])
    q4 = _graph.val(att.args[0])
    b, s, hq, d = q.shape
    hkv = _graph.val(att.args[1]).shape[1]
    hq, d, hkv = (_graph.static_int(n) or n for n in (hq, d, hkv))  # a size fixed in this graph is an int
    if att.target in (TOKENS, TOKENS_PLAIN):  # the RoPE op's q [B, Hq, S, D] as it is (the token form: any strides)
        if not _graph.shape_is(q4, (b, hq, s, d)):
            return no(f"the attention reads q as {tuple(q4.shape)}, not the RoPE op's [B, Hq, S, D]")
        rows = hq // hkv * s if isinstance(hq, int) and isinstance(hkv, int) else None
        normed = af.kwargs.get("wq") is not None
        most, what, seen = ((MAX_NORM_TOKEN_ROWS, "RoPE and q / k norms", "Qwen3-32B's and Qwen3-8B's steps at 32 rows")
                            if normed else (MAX_TOKEN_ROWS, "RoPE", "the ops alone at 64 rows"))  # fmt: skip
        if not (rows is not None and statically_known_true(rows <= most)):
            many = "symbolic" if rows is None else rows
            return guards.reject("unfused_pair_faster", f"{hq} query heads over {hkv} kv heads x {s} tokens: {many} "
                                 f"rows per kv head, above {most}, whose {what} in the attention's prologue measured "
                                 f"slower than the RoPE launch ({seen}, batch 8); the RoPE and the attention stay two "
                                 "launches")  # fmt: skip
    elif not statically_known_true(s == 1):
        return no(f"{s} tokens per step, not one")
    elif not (isinstance(hq, int) and isinstance(hkv, int) and hq == hkv * q4.shape[2]):
        return no(f"q's {hq} heads are not the attention's {hkv} kv heads x {q4.shape[2]} rows")
    if not (isinstance(d, int) and d >= 16 and d & (d - 1) == 0):
        return no(f"head dim {d} is not a power of two of at least 16 (the fused kernel's one tile per head)")
    if af.kwargs.get("wq") is not None and not statically_known_true(b * hkv <= MAX_NORM_PAIRS):
        return guards.reject("unfused_pair_faster", f"{b} x {hkv} (batch x kv heads) not known to be at most "
                             f"{MAX_NORM_PAIRS}, with q / k norms: measured slower in one launch above that (Qwen3-8B "
                             "at batch 64); the RoPE and the attention stay two launches")  # fmt: skip
    return guards.can_run_kernel(_FUSED_FOR[att.target].overloadpacket.__name__, q.device)


def rewrite(graph: Graph, att: Node, af: Node, q_chain: list[Node]) -> str:
    """The fused op where the attention was, reading what both read; the attention's readers and the caches'
    readers (their ``copy_`` back included) take its outputs; then a stable topological sort."""
    kw = af.kwargs
    outs = _outputs(af)
    quant = att.target in QUANTIZED
    group = att.args[5] if quant else 0
    op = _FUSED_FOR[att.target]
    # the fused op's schema says what it takes and returns: auto_functionalized_v2 gives its returns, then the bases
    grouped = {"group_size": group} if any(a.name == "group_size" for a in op._schema.arguments) else {}
    with _graph.Edit(graph, before=att) as e:
        new = e.call(auto_functionalized_v2, op, q=kw["q"], wq=kw.get("wq"), k=kw["k"], wk=kw.get("wk"),
                     eps=kw.get("eps", 0.0), cos=kw["cos"], sin=kw["sin"], v=kw["v"], positions=kw["positions"],
                     last=att.args[3], scale=att.args[4], **grouped, _k_cache_base_index=0, _v_cache_base_index=1,
                     _all_bases=list(kw["_all_bases"]))  # fmt: skip
        o, *rest = (e.call(operator.getitem, new, i) for i in range(len(op._schema.returns) + 2))
        scales, (k_cache, v_cache) = rest[:-2], rest[-2:]  # scales: [] for an op returning o alone
    if quant:
        for u in list(att.users):  # the pair's getitems: 0 the fp8 output, 1 its scales
            u.replace_all_uses_with(o if u.args[1] == 0 else scales[0])
    else:
        att.replace_all_uses_with(o)
    outs[1].replace_all_uses_with(k_cache)
    outs[2].replace_all_uses_with(v_cache)
    _graph.fold_static_size_reads(q_chain)
    _graph.erase_dead(graph, [*att.users, att, *reversed(q_chain), outs[1], outs[2], af])
    stable_topological_sort(graph)
    norm = "q / k norms, " if kw.get("wq") is not None else ""
    what = f"{norm}RoPE and the k / v cache writes in the attention's launch{' (and its quant)' if quant else ''}"
    return what + (f" ({_graph.val(kw['q']).shape[1]} tokens per step)" if op is not FUSED else "")


def run(graph: Graph, report) -> None:
    for att in [n for n in graph.nodes if _op(n, *ATTENTION, MASKED, TOKENS, TOKENS_PLAIN)]:
        af, q_chain = _rope_q(att)
        if af is None:
            af = _rope_q_through_copies(att)
            if af is not None:  # the RoPE op's q, laid out as other rows: more than one token per step
                report.reject(NAME, att.name, "rope_attention_not_single", "the attention reads the RoPE op's q "
                              "through a copy or permute, not as its [B, Hq, 1, D] rows grouped per kv head (more "
                              "than one token per step?): the RoPE and the attention stay two launches",
                              _graph.shape_str(q=af.kwargs["q"], k=att.args[1]), _graph.dtype_str(af.kwargs["q"]))
            continue  # else its q is no RoPE op's: not a candidate
        shapes = _graph.shape_str(q=af.kwargs["q"], k=att.args[1])
        report.settle(NAME, att.name, shapes, _graph.dtype_str(af.kwargs["q"]), _check(att, af, q_chain), "",
                      rewrite, graph, att, af, q_chain)  # fmt: skip
