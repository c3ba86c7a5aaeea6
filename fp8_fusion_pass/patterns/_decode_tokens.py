"""A decode step of several tokens per row (verifying draft tokens) in the engine's layouts, in one launch.

    before (what ``decode_attention`` would leave at S > 1 tokens: the engine form's ``math`` attention)
    keep = reshape(clone(expand(unsqueeze(iota(T) <= P.unsqueeze(-1), 1), [B, G, S, T])), [B, 1, G*S, T])
    q3   = reshape(clone(q [B, Hq, S, D]), [B*Hkv, G*S, D])          (the RoPE op's q, heads and tokens apart)
    o    = <score GEMM, masked softmax, value GEMM>(q3, k_cache, v_cache, keep)
    x    = reshape(clone(permute(reshape(o, [B, Hq, S, D]), [0, 2, 1, 3])), [B*S, Hq*D]);  group_quant(x, g)

    after
    o_q, scales = fp8_fusion.decode_attention_tokens_quant(q, k_cache, v_cache, P.reshape(B, S), scale, g)
                  reshaped to what the quant returned

Why: at one token the rows of a kv head are its G heads and the head-major q and the o_proj's token-major input
are the same bytes, so ``decode_attention`` reads q as it is and its launch takes the quant. At S tokens they are
not: the graph copies q into [B, Hkv, G*S, D] rows, builds a [B, 1, G*S, T] mask per step, copies the output back
to [B, S, Hq, D] and quantizes it in a launch of its own: three launches per layer and one per step around the
attention. The op reads q and writes o_q / scales at their own strides (row r of a kv head = head r // S, token
r % S) and compares each row's slots with its token's position, so those launches go. Bit for bit the masked
kernel followed by the copy and ``group_quant`` (same splits, tiles and sums; the slots after a row's position,
which the mask zeroes, are not read).

Taken only whole: the mask is that comparison of slots with one position per (batch row, token), q reaches the
score GEMM through copies and reshapes of a [B, Hq, S, D] tensor, and the output goes through reshapes, copies and
that one permute. Where a group quant with groups within a head then reads it, the quant is the op's; where none
does (a bf16 o_proj, a per-tensor quant, heads of 64 under 128-wide groups, the output read elsewhere),
``decode_attention_tokens`` writes it in q's dtype and a quant after it stays its own launch (the report says why).
Anything else keeps ``decode_attention``'s masked form, and where the mask was a position per token its report
detail says which condition did not hold ("a position per token, but the masked form: q does not come from ...").
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import Graph, Node

from . import _decode_mask, _graph, _site

aten = torch.ops.aten
FUSED = torch.ops.fp8_fusion.decode_attention_tokens_quant.default
FUSED_PLAIN = torch.ops.fp8_fusion.decode_attention_tokens.default  # no group quant after the output to fold
_op = _graph.is_call
_SAME_ORDER = (*_graph.RESHAPES, aten.clone.default)  # nodes that keep their input's elements in row-major order
# The most tokens per step the form takes (the rows, G x S, are bounded by decode_attention.MAX_ROWS anyway); 1
# keeps the masked form with its copies at every count (``benchmarks/decode.py --set
# patterns._decode_tokens.MAX_TOKENS=1`` times the difference).
MAX_TOKENS = 16
# The most query rows per kv head (G heads x S tokens) the token form takes, where decode_attention.MAX_ROWS (the
# masked form's bound) is lower: the kernel lost to Inductor's attention at 32 rows in the masked form, with copies
# and a quant launch on both sides; the token form has neither. At 32 rows (8 tokens x 4 heads, 8B heads) it took
# 10.5 / 13.7 / 32.3 us against Inductor's attention with its copies and quant 14.5 / 20.7 / 59.7 us at batch 1 / 8 /
# 32, and the Llama-3.1-8B engine step of 8 tokens was 3.893 / 4.379 ms with 32 against 4.107 / 4.739 ms with 16
# at batch 1 / 8 (H100, 2026-12-06, `issue7.sh rows`; docs/benchmarks.md). At 64 rows (Qwen3-32B's 8 heads x 8
# tokens, the kernel's most), with the kernel's configs by rows (``decode_attention.WIDE``), it took 16.7 / 20.0 /
# 32.7 us against 15.5 / 23.7 / 110.6 (the plain form 14.3 / 16.8 / 31.8 against 14.2 / 21.3 / 107.8) at batch 1 /
# 8 / 32, and the Qwen3-32B step of 8 tokens (4 layers, the RoPE launch kept: rope_attention.MAX_TOKEN_ROWS) was
# 1.418 / 1.525 ms against 1.416 / 1.551 with 32 at batch 1 / 8 (H100, 2026-12-06, thirty-third session); at 16
# layers 3.949 / 4.315 / 6.324 ms against 3.945 / 4.429 / 7.489 at batch 1 / 8 / 32 (thirty-fourth session). At
# Llama-3.1-8B's 4 heads x 16 tokens, 16 layers: 2.246 / 2.977 ms against 2.249 / 3.072 with 32 at batch 1 / 8 (H100,
# 2026-12-07, thirty-seventh session, `issue7.sh llama64`).
MAX_ROWS = 64


def _positions(keep: Node, s4) -> tuple[Node, int, int] | None:
    """(P, offset, S) when ``keep [B, 1, G*S, T]`` is ``iota(T) <= P [B, S, 1]`` (``<``: offset -1) laid out for
    the G heads of a kv head, row r = (head r // S, token r % S): token s of batch row b sees slots
    ``0..P[b, s] + offset``. None for any other mask."""
    node = keep
    while _op(node, *_SAME_ORDER):
        node = node.args[0]
    if not _op(node, aten.expand.default):
        return None
    wide, node = _graph.val(node), node.args[0]
    if not (_op(node, aten.unsqueeze.default) and node.args[1] == 1):
        return None
    cmp = node.args[0]
    found = _decode_mask.slot_compare(cmp)
    if found is None:
        return None
    pos, offset = found
    p, c = _graph.val(pos), _graph.val(cmp)
    if not (isinstance(c, torch.Tensor) and c.dim() == 3):
        return None
    b, r, t = s4.shape[0], s4.shape[2], s4.shape[3]
    s = _graph.static_int(c.shape[1])
    g = r // s if s and isinstance(r, int) and r % s == 0 else None
    if not (g and s > 1 and _graph.shape_is(c, (b, s, t)) and _graph.shape_is(p, (b, s, 1))
            and _graph.shape_is(wide, (b, g, s, t)) and _graph.shape_is(_graph.val(keep), (b, 1, r, t))):
        return None
    return pos, offset, s


def _q_source(q3: Node, shape) -> tuple[Node, list[Node]] | None:
    """The furthest tensor of ``shape`` ([B, Hq, S, D]) that ``q3`` is, through reshapes, copies and same-shape
    expands (each keeps the elements' order, so q3's rows are its (head, token) pairs), and the nodes between."""
    node, chain, found = q3, [], None
    while True:
        if _graph.shape_is(_graph.val(node), shape):
            found = (node, list(chain))
        if not (_op(node, *_SAME_ORDER) or (_op(node, aten.expand.default) and _graph.same_shape(node, node.args[0]))):
            return found
        chain.append(node)
        node = node.args[0]


def _output_layout(out: Node, heads_first) -> tuple[Node | None, list[Node]] | None:
    """How the step's output reaches the o_proj: ``out`` (the attention's [B*Hkv, G*S, D] rows) through reshapes and
    copies around one ``permute(0, 2, 1, 3)`` of its ``heads_first`` [B, Hq, S, D] view, each read by the next
    alone, to the ``group_quant`` that reads it as [B, S, Hq, D] (the quant, the nodes between) or, where no group
    quant follows, to the last of those nodes (None, the nodes: the last holds [B, S, Hq, D]'s values in some
    shape). None where no such permute comes first."""
    node, chain, permuted = out, [], False
    while len(node.users) == 1:
        (user,) = node.users
        if _op(user, _graph.GROUP_QUANT):
            return (user, chain) if permuted else None
        if _op(user, aten.permute.default) and not permuted:
            if list(user.args[1]) != [0, 2, 1, 3] or not _graph.shape_is(_graph.val(node), heads_first):
                return None
            permuted = True
        elif not _op(user, *_SAME_ORDER):
            break
        chain.append(user)
        node = user
    return (None, chain) if permuted else None


class Declined(str):
    """Why a step of several tokens with a position per token keeps the masked form: the report's words."""


def o_proj_quant(quant: Node, d) -> tuple[int, int, list, list[Node], list[Node]] | Declined:
    """What folding the o_proj's input ``group_quant`` into an attention launch with heads ``d`` wide needs: (group,
    the quant's last dim k, its other dims as reshape sizes, its q readers, its scale readers); or why not. The
    kernel quantizes each head's row on its own, one tile per head: whole groups in a power-of-two head."""
    group, x = _site.group_size_of(quant), _graph.val(quant.args[0])
    k = _graph.static_int(x.shape[-1])
    sizes = _graph.reshape_sizes(x.shape[:-1])
    if not (isinstance(group, int) and isinstance(d, int) and d % group == 0):
        return Declined(f"heads of {d} do not hold whole {group}-wide quant groups")
    if d & (d - 1):
        return Declined(f"head dim {d} is not a power of two (the kernel's one tile per head)")
    if not (k and sizes and k % group == 0):
        return Declined(f"the quant's input {_graph.shape_str(x=x)} has a symbolic or ungrouped last dim")
    qs, ss = _graph.quant_outputs(quant)
    if len(qs) + len(ss) != len(quant.users):
        return Declined("the quant's outputs are read as a tuple")
    return group, k, sizes, qs, ss


@dataclass(frozen=True)
class Plan:
    """What the token form of one match reads and replaces (``plan``), for ``apply``: token s of batch row b sees the
    slots up to ``pos[b, s] + offset``; ``g`` heads x ``s`` tokens per kv head over ``t`` slots."""
    pos: Node
    offset: int
    s: int
    g: int
    t: object
    q: Node
    q_chain: list
    out_chain: list
    quant: Node | None  # None: decode_attention_tokens, its output in place of out_chain's last node
    group: int = 0
    k: int = 0
    sizes: list = ()
    qs: list = ()
    ss: list = ()
    kept: str = ""  # why a group quant after the output stays a launch of its own


def plan(m, keep: Node, hkv: int, d: int) -> Plan | Declined | None:
    """The token form for the match ``m`` of ``decode_attention`` whose mask is ``keep``, nothing edited: its plan;
    None where the mask is not a position per token (not a step of several tokens this form reads) and
    ``Declined(why)`` where it is but something else keeps the masked form."""
    s4 = _graph.val(m.scores)
    found = _positions(keep, s4)
    if found is None:
        return None
    pos, offset, s = found
    if s > MAX_TOKENS:
        return Declined(f"{s} tokens, above _decode_tokens.MAX_TOKENS = {MAX_TOKENS}")
    b, r, t = s4.shape[0], s4.shape[2], s4.shape[3]
    hq = hkv * (r // s)
    q = _q_source(m.q3, (b, hq, s, d))
    if q is None:
        return Declined(f"q does not come from a [B, {hq}, {s}, {d}] tensor through copies and reshapes")
    got = _output_layout(m.out, (b, hq, s, d))
    if got is None:
        return Declined("the output does not reach the o_proj through one [B, S, Hq, D] permute alone")
    (q, q_chain), (quant, out_chain) = q, got
    fold = o_proj_quant(quant, d) if quant is not None else Declined("")
    if isinstance(fold, Declined):  # the output in q's dtype; a group quant after it (reading out_chain's last
        # node) stays a launch of its own
        if _graph.reshape_sizes(_graph.val(out_chain[-1]).shape) is None:
            return Declined("the output's layout after the permute has more than one symbolic size")
        return Plan(pos, offset, s, r // s, t, q, q_chain, out_chain, None, kept=str(fold))
    return Plan(pos, offset, s, r // s, t, q, q_chain, out_chain, quant, *fold)


def apply(graph: Graph, m, p: Plan) -> str:
    """The token form of ``plan``'s match: the report's detail."""
    with _graph.Edit(graph, before=m.pv) as e:
        last = e.call(aten.reshape.default, p.pos, [-1, p.s])
        if p.offset:
            last = e.call(aten.add.Tensor, last, p.offset)
        if p.quant is None:
            end = p.out_chain[-1]
            o = e.call(FUSED_PLAIN, p.q, m.k_cache, m.v_cache, last, m.scale)
            replaced = [(end, e.call(aten.reshape.default, o, _graph.reshape_sizes(_graph.val(end).shape)))]
        else:
            both = e.call(FUSED, p.q, m.k_cache, m.v_cache, last, m.scale, p.group)
            o_q = e.call(aten.reshape.default, e.call(operator.getitem, both, 0), [*p.sizes, p.k])
            scales = e.call(aten.reshape.default, e.call(operator.getitem, both, 1), [*p.sizes, p.k // p.group])
            replaced = [(n, o_q) for n in p.qs] + [(n, scales) for n in p.ss]
    for old, new in replaced:
        old.replace_all_uses_with(new)
    gone = [n for n in m.nodes if n not in (m.k_cache, m.v_cache)]
    _graph.fold_static_size_reads(gone + p.q_chain)
    quant = [*p.qs, *p.ss, p.quant] if p.quant is not None else []
    _graph.erase_dead(graph, [*quant, *reversed(p.out_chain), *gone, m.mask, *p.q_chain])
    where = "and the output quantized in the o_proj's"
    if p.quant is None:
        where = "and the output written in the o_proj's, in q's dtype" + (f" (its quant stays a launch: {p.kept})"
                                                                         if p.kept else "")  # fmt: skip
    return (f"{p.g} heads x {p.s} tokens per kv head over a {p.t}-slot cache, slots up to each token's position, q "
            f"read in its own layout {where}: one launch")


def rewrite(graph: Graph, m, keep: Node, hkv: int, d: int) -> str | Declined | None:
    """``plan`` then ``apply``: the report's detail, or (nothing edited) ``plan``'s None / ``Declined``."""
    found = plan(m, keep, hkv, d)
    return apply(graph, m, found) if isinstance(found, Plan) else found
