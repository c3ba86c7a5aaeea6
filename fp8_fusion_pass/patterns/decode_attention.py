"""Decode attention written as plain torch (score GEMM, masked fp32 softmax, value GEMM) => one fused launch.

    before (the engine form's ``math`` attention; any model that spells attention this way at decode)
    s = bmm(q [B*Hkv, R, D], k_cache^T [B*Hkv, D, T]).view(B, Hkv, R, T).float() * scale
    p = softmax(where(~keep, -inf, s), -1).to(q.dtype)            (post-grad: amax, sub, exp, sum, div)
    o = bmm(p.view(B*Hkv, R, T), v_cache [B*Hkv, T, D])

    after
    o = fp8_fusion.decode_attention(q.view(B, Hkv, R, D), k_cache, v_cache, keep, scale).view(B*Hkv, R, D)
    o = fp8_fusion.decode_attention_upto(q.view(B, Hkv, R, D), k_cache, v_cache, P.view(B), scale).view(...)
        instead, where keep is ``arange(T) <= P``, one position P[b] per batch row (a decode step's causal mask):
        no mask is built or read, and no cache slot after P[b]

    o_q, scales = fp8_fusion.decode_attention_tokens_quant(q [B, Hq, S, D], k_cache, v_cache, P [B, S], scale, g)
        instead, at S > 1 tokens with a position per token whose output only the o_proj's input quant reads: q as
        the RoPE op left it, the quantized output in the o_proj's layout, no copy of either (``_decode_tokens.py``)

R is the query rows of a kv head (its G query heads x the step's tokens). Why: those are three or four launches
and the [B, Hkv, R, T] scores written and read twice; the fused op (``kernels/triton/decode_attention.py``) reads
the cache once, split over the keys so that batch 1 fills the GPU, in one launch. The op's numerics are closer to
the fp32 reference than the graph it replaces (it rounds neither the scores nor the probabilities' sum to bf16),
but not equal to it, so deterministic mode keeps the rewrite off.

A candidate is a bmm whose first operand is a softmax over the last dim (amax, sub, exp, sum, div; on CUDA Inductor
has already turned the max and the sum into one ``prepare_softmax_online``) rounded to a half dtype; either bmm may
be Inductor's row-padded one (``pad_mm``: ``bmm(cat([a, zeros], 1), b)[:, :m]``, or the rows padded by
``constant_pad_nd``, as torch 2.11-2.13 write it). Guards, each with its reason:
the softmax's input is fp32 ``scale * scores`` (or the scores alone) where a boolean mask puts -inf, the scores a bmm of
the same batch, keys a [B, Hkv, T, D] tensor transposed and values a [B, Hkv, T, D] tensor, nothing else reading any
step and a 4-D mask (``attention_not_plain``; an additive mask, as HF's eager attention adds, is one of these); q / k /
v bf16 or fp16 (``dtype_not_bf16``); static head dim and kv heads (``kv_heads_dynamic``; a symbolic kv head count of the
cache's own is pinned by a guard where that makes the rows static: ``_pin_kv_heads``); at most ``MAX_ROWS`` rows per kv
head (``attention_rows_above_decode``: at prefill the rows are many and the GEMMs are compute-bound, which the decode
kernel is not built for), a symbolic token count only where the shape env bounds the rows by it
(``attention_rows_dynamic``: a token dim marked dynamic with ``max=``; one compile then serves every count); a kernel
for the device (``no_fused_kernel``).
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import guard_int, statically_known_true

from .. import guards
from ..kernels import attention_ops
from . import _decode_mask, _decode_tokens, _graph

aten = torch.ops.aten
prims = torch.ops.prims
NAME = "decode_attention"
FUSED = torch.ops.fp8_fusion.decode_attention.default
FUSED_UPTO = torch.ops.fp8_fusion.decode_attention_upto.default
FUSED_UPTO_QUANT = torch.ops.fp8_fusion.decode_attention_upto_quant.default
# Query rows per kv head the rewrite takes (one MMA tile): decode, G heads x a few tokens. The op takes up to 64
# (ATTENTION_MAX_ROWS), but at 32 rows (8 tokens x 4 heads, or 4 x 8) the kernel lost to Inductor's math form at
# batch 1 / 8 (12.1 / 16.6 against 9.1 / 13.6 us; won at batch 32, 36.0 against 47.3) and the Llama-3.1-8B engine
# step of 8 tokens at batch 8 with it was 4.667 ms against 4.629 without (H100, 2026-12-06; docs/benchmarks.md,
# "8 query heads per kv head at batch 1"). No kernel config closes that: the sweep's best at 32 rows, kernel alone,
# 9.85 / 12.87 us against the table's 9.93 / 14.15 (docs/benchmarks.md, "Fewer than 32 copied heads ...").
MAX_ROWS = 16
CONVERT = prims.convert_element_type.default
HALF = (torch.bfloat16, torch.float16)


class _NotPlain(Exception):
    """The subgraph is a candidate but not the plain form the op computes; the message says which step."""


_op = _graph.is_call


def _last_dim(node: Node) -> bool:
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    rank = _graph.val(node.args[0]).dim()
    return keep and list(dims or []) in ([-1], [rank - 1])


def _online_softmax_op():
    try:
        import torch._inductor.inductor_prims  # noqa: F401  (registers prims.prepare_softmax_online)

        return prims.prepare_softmax_online.default
    except (ImportError, AttributeError):  # a torch without Inductor's online softmax: only the plain spelling
        return None


ONLINE_SOFTMAX = _online_softmax_op()


def softmax_input(probs: Node) -> tuple[Node, list[Node]] | None:
    """(x, the softmax's nodes) when ``probs`` is post-grad's softmax of x over the last dim, else None. Two
    spellings: ``exp(x - amax(x)) / sum(exp(...))`` (the decomposition; Inductor keeps it on the CPU) and, on
    CUDA with ``config.online_softmax`` (the default), ``prepare_softmax_online(x)`` giving the max and the sum
    (Inductor's post-grad ``prepare_softmax`` replacement)."""
    if not _op(probs, aten.div.Tensor):
        return None
    e, total = probs.args
    if not (_op(e, aten.exp.default) and _op(e.args[0], aten.sub.Tensor)):
        return None
    sub = e.args[0]
    x, top = sub.args
    if _op(total, aten.sum.dim_IntList) and total.args[0] is e and _last_dim(total):
        if _op(top, aten.amax.default) and top.args[0] is x and _last_dim(top):
            return x, [probs, total, e, sub, top]
        return None
    if ONLINE_SOFTMAX is None or not (_op(top, operator.getitem) and _op(total, operator.getitem)):
        return None
    prep = top.args[0]
    if not (_op(prep, ONLINE_SOFTMAX) and total.args[0] is prep and (top.args[1], total.args[1]) == (0, 1)):
        return None
    rank = _graph.val(x).dim()
    if prep.args[0] is not x or prep.args[1] not in (-1, rank - 1):
        return None
    return x, [probs, total, e, sub, top, prep]


def _is_neg_inf(node) -> bool:
    if isinstance(node, float):
        return node == -math.inf
    return _op(node, aten.full.default) and list(node.args[0]) == [] and node.args[1] == -math.inf


def _masked(x: Node, chain: list[Node]) -> tuple[Node, Node, bool]:
    """(scores, mask node, True when the mask marks what is hidden) of ``where(mask, -inf, s)`` /
    ``where(mask, s, -inf)``."""
    if not _op(x, aten.where.self):
        raise _NotPlain("the softmax input is not scores with -inf where a boolean mask says (an additive mask?)")
    cond, a, b = x.args
    chain.append(x)
    if _is_neg_inf(a):
        return b, cond, True
    if _is_neg_inf(b):
        return a, cond, False
    raise _NotPlain("the softmax input's where() fills neither side with -inf")


def _zeros(node) -> bool:
    return _op(node, aten.zeros.default) or (_op(node, aten.full.default) and node.args[1] == 0)


def _rows_padded(node) -> Node | None:
    """``a`` when ``node`` is ``a`` with zero rows appended on dim 1 (of a 3-D [batch, rows, K] operand), in either
    of ``pad_mm``'s spellings: ``cat([a, zeros], 1)`` (``pad_dim``) or ``constant_pad_nd(a, [0, 0, 0, p, 0, 0])``
    (``pad_mat1`` of a bmm: the pad list runs from the last dim back, each dim's (before, after)); else None."""
    if _op(node, aten.cat.default):
        parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        if len(parts) == 2 and dim == 1 and _zeros(parts[1]):
            return parts[0]
        return None
    if _op(node, aten.constant_pad_nd.default):
        pad = list(node.args[1])
        value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
        # K (last dim) untouched, rows padded after only, the batch dim (if listed) untouched
        if value == 0 and len(pad) in (4, 6) and pad[:3] == [0, 0, 0] and not any(pad[4:]):
            return node.args[0]
    return None


def _padded_input(node: Node) -> Node:
    """The tensor a ``cat`` / ``constant_pad_nd`` pads (a cat's first part)."""
    return node.args[0][0] if _op(node, aten.cat.default) else node.args[0]


def _probabilities(node: Node, chain: list[Node]) -> tuple[Node, tuple[Node, list[Node]]] | None:
    """(the rounding node, ``softmax_input`` of what it rounds) when ``node`` (through views, added to ``chain``) is a
    softmax over the last dim rounded to a half dtype, a value GEMM's operand; else None."""
    probs = _graph.through_views(node, chain)
    if not (_op(probs, CONVERT) and probs.args[1] in HALF):
        return None
    found = softmax_input(probs.args[0])
    return None if found is None else (probs, found)


def _unpadded(out: Node) -> tuple[Node, Node, list[Node]] | None:
    """(bmm, its first operand, the padding's nodes) when ``out`` is a bmm, or Inductor's row-padded one,
    ``bmm(pad_rows(a), b)[:, :m]`` = ``bmm(a, b)`` (``_rows_padded``): ``pad_mm`` pads a bmm's rows to a multiple of
    8 on CUDA where a benchmark at compile time finds the padded GEMM faster (an 8B model's 4 rows per kv head, as
    timing noise decides, or always with ``force_shape_pad``). Whole-input slices (``x[:, ...]`` on dim 0) are gone
    by then: post-grad's remove_noop_ops."""
    if _op(out, aten.bmm.default):
        return out, out.args[0], []
    if not (_op(out, aten.slice.Tensor) and _op(out.args[0], aten.bmm.default) and len(out.args[0].users) == 1):
        return None
    bmm, pad = out.args[0], out.args[0].args[0]
    dim = out.args[1] if len(out.args) > 1 else 0
    start = out.args[2] if len(out.args) > 2 else None
    step = out.args[4] if len(out.args) > 4 else 1
    a = _rows_padded(pad)
    if not (dim == 1 and start in (0, None) and step == 1 and a is not None):
        return None
    if not _graph.shape_is(_graph.val(out), (*_graph.val(a).shape[:2], _graph.val(bmm).shape[2])):
        return None
    return bmm, a, [out, pad]


def _scaled(s: Node, chain: list[Node]) -> tuple[Node, Node, float, Node]:
    """(bmm, its first operand, scale, the scores as the softmax reads them) of ``bmm(...).view(...).float() *
    scale`` (the scale may be absent: 1.0)."""
    scale = 1.0
    if _op(s, aten.mul.Tensor) and isinstance(s.args[1], (int, float)) and not isinstance(s.args[1], bool):
        chain.append(s)
        s, scale = s.args[0], float(s.args[1])
    if not (_op(s, CONVERT) and s.args[1] == torch.float32):
        raise _NotPlain("the scores are not the score GEMM's output widened to fp32 (times a number)")
    chain.append(s)
    found = _unpadded(_graph.through_views(s.args[0], chain))
    if found is None:
        raise _NotPlain("the scores are not one bmm's output")
    bmm, q3, padding = found
    chain += padding + [bmm]
    return bmm, q3, scale, s.args[0]


def _cache(node: Node, transposed: bool, chain: list[Node]) -> Node:
    """The [B, Hkv, T, D] tensor a bmm operand views (``transposed``: through ``permute(0, 1, 3, 2)``)."""
    src = _graph.through_views(node, chain)
    if transposed:
        if not (_op(src, aten.permute.default) and list(src.args[1]) == [0, 1, 3, 2]):
            raise _NotPlain("the keys are not a [B, Hkv, T, D] tensor transposed")
        chain.append(src)
        src = src.args[0]
    if _graph.val(src) is None or _graph.val(src).dim() != 4:
        raise _NotPlain("the keys / values are not a 4-D [B, Hkv, T, D] cache")
    return src


class Match:
    """Everything the rewrite needs, found walking back from the value bmm."""

    def __init__(self, pv: Node):
        # out: the node whose readers the op's output takes over, pv itself or the slice of Inductor's padded bmm
        self.pv, self.out, self.nodes = pv, pv, [pv]
        operand, users = pv.args[0], list(pv.users)
        padded = _unpadded(users[0]) if len(users) == 1 and _op(users[0], aten.slice.Tensor) else None
        if padded is not None:
            _, operand, (self.out, pad) = padded
            self.nodes = [self.out, pv, pad]  # out first: nothing after it is the match's own reader
        elif (_op(operand, aten.cat.default, aten.constant_pad_nd.default)
              and _probabilities(_padded_input(operand), [])):
            # a softmax times values, padded in a way _rows_padded does not read: say so, not a silent skip
            how = list(operand.args[1]) if _op(operand, aten.constant_pad_nd.default) else "cat"
            raise _NotPlain(f"the value GEMM's probabilities are padded ({how} -> {_graph.shape_str(p=operand)}) in a "
                            "form the rewrite does not read")  # fmt: skip
        got = _probabilities(operand, self.nodes)
        if got is None:
            raise LookupError  # not a softmax times values: no candidate
        probs, found = got
        self.nodes.append(probs)
        x, steps = found
        self.nodes += steps
        try:  # a softmax times values from here on: a candidate, so whatever stops the match is reported
            scores, self.mask, self.hides = _masked(x, self.nodes)
            self.qk, self.q3, self.scale, self.scores = _scaled(scores, self.nodes)
            self.k_cache = _cache(self.qk.args[1], True, self.nodes)
            self.v_cache = _cache(pv.args[1], False, self.nodes)
        except (AttributeError, IndexError, TypeError) as e:  # e.g. a node without a fake value
            raise _NotPlain(f"a step of the scores could not be read ({type(e).__name__}: {e})") from e
        self.out_dtype = probs.args[1]

    def check(self) -> guards.Verdict:
        q3, s4 = _graph.val(self.q3), _graph.val(self.scores)
        kc, vc, mask = _graph.val(self.k_cache), _graph.val(self.v_cache), _graph.val(self.mask)
        dtypes = {q3.dtype, kc.dtype, vc.dtype, self.out_dtype}
        if len(dtypes) != 1 or q3.dtype not in HALF:
            return guards.reject("dtype_not_bf16", f"q / k / v / probabilities {sorted(map(str, dtypes))}: the fused "
                                 "attention takes one half dtype, bf16 or fp16")
        if s4.dim() != 4:
            return guards.reject("attention_not_plain", f"scores {_graph.shape_str(s=s4)} are not [B, Hkv, R, T]")
        b, hkv, r, t = s4.shape
        d = q3.shape[-1]
        if _pin_kv_heads(hkv, r):
            b, hkv, r, t = s4.shape
        if any(_graph.static_int(n) is None for n in (hkv, d)):
            return guards.reject("kv_heads_dynamic", f"kv heads {hkv}, rows {r}, head dim {d}: only the batch, the "
                                 "cache length and a bounded token count may be symbolic")
        hkv, d = _graph.static_int(hkv), _graph.static_int(d)
        if _graph.static_int(r) is None:  # a symbolic token count: taken where its range keeps it within the tile
            if not statically_known_true(r <= MAX_ROWS):
                return guards.reject("attention_rows_dynamic", f"{r} query rows per kv head, a symbolic token count "
                                     f"({_upper(r)}): the kernel takes at most {MAX_ROWS}; a token dim marked "
                                     "dynamic with max= keeps them within it")
        elif (r := _graph.static_int(r)) > MAX_ROWS and not self._token_form(r, hkv, d):
            return guards.reject("attention_rows_above_decode", f"{r} query rows per kv head, above {MAX_ROWS}: a "
                                 "prefill, or a step verifying more draft tokens (at 32 rows the kernel measured "
                                 "slower than Inductor's GEMMs and softmax at batch 1-8; patterns.decode_attention."
                                 f"MAX_ROWS; the token form takes up to _decode_tokens.MAX_ROWS = "
                                 f"{_decode_tokens.MAX_ROWS})")
        if d > attention_ops.ATTENTION_MAX_HEAD_DIM:
            return guards.reject("attention_not_plain", f"head dim {d} above {attention_ops.ATTENTION_MAX_HEAD_DIM}")
        if not (_graph.shape_is(kc, (b, hkv, t, d)) and _graph.shape_is(vc, (b, hkv, t, d))):
            return guards.reject("attention_not_plain", f"keys {list(kc.shape)} / values {list(vc.shape)} are not "
                                 f"[B, Hkv, T, D] over the scores' [B, Hkv, R, T] = {list(s4.shape)}")
        if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4
                and all(statically_known_true(m == 1) or statically_known_true(m == n)
                        for m, n in zip(mask.shape, s4.shape))):  # fmt: skip
            shape = list(mask.shape) if isinstance(mask, torch.Tensor) else mask
            return guards.reject("attention_not_plain", f"mask {shape} is not a 4-D bool mask over [B, Hkv, R, T]")
        on_device = guards.can_run_kernel("decode_attention", q3.device)
        if not on_device.ok:
            return on_device
        readers = [n for n in self.nodes[1:] if n not in (self.k_cache, self.v_cache)]
        for n in readers:
            extra = [u for u in n.users if u not in self.nodes and _graph.static_size_read(u) is None]
            if extra:
                return guards.reject("attention_not_plain", f"{n.name} is also read by {extra[0].name}")
        return guards.OK

    def token_keep(self) -> Node | None:
        """The keep mask the token form reads (``_decode_tokens``), or None where the mask is no candidate for it."""
        if not self.hides:
            return self.mask
        return self.mask.args[0] if _op(self.mask, aten.bitwise_not.default) else None

    def _token_form(self, r: int, hkv: int, d: int) -> bool:
        """Above MAX_ROWS, whether the step is the token form within its own bound (``_decode_tokens.MAX_ROWS``):
        there no copy, mask or quant launch is left beside the attention."""
        keep = self.token_keep()
        return (r <= _decode_tokens.MAX_ROWS and keep is not None
                and isinstance(_decode_tokens.plan(self, keep, hkv, d), _decode_tokens.Plan))  # fmt: skip


def _upper(n: torch.SymInt) -> str:
    """The largest value the shape env allows ``n`` (a token dim marked with ``max=``), in words."""
    upper = n.node.shape_env.bound_sympy(n.node.expr).upper
    return f"at most {int(upper)}" if upper.is_Integer else "unbounded"  # not is_finite: torch's int_oo says it is


def _pin_kv_heads(hkv, r) -> bool:
    """A symbolic kv head count is fixed to the number it has, by a guard, where that makes the rows per kv head
    static too: True if so. ``dynamic=True`` makes every cache dim symbolic, and where nothing in the model fixed
    the heads (an engine reading them from the cache's shape, with no RoPE-cache rewrite whose op checks them
    against k's) the rows are ``heads // s``. One model's caches always have its kv heads: the guard costs no
    recompile, and a cache with another count gets its own compile (the guard fails), never this graph. A symbol
    the batch or the cache length shares (duck sizing: batch 4 and 4 kv heads) is pinned with them, which costs no
    compile either: Dynamo already guards those sizes equal, and the kv heads can take one value."""
    if not isinstance(hkv, torch.SymInt) or _graph.static_int(hkv) is not None:
        return False
    symbols = hkv.node.expr.free_symbols  # one, but maybe in an unsimplified view's ((s**2)//s)
    rows = r.node.expr.free_symbols if isinstance(r, torch.SymInt) else set()
    if len(symbols) != 1 or not rows <= symbols:
        return False  # the rows vary besides (a symbolic token count): as it was, kv_heads_dynamic
    (s,) = symbols
    env = hkv.node.shape_env
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val  # var_to_val: torch 2.11-2.12
    if s not in hints:
        return False
    guard_int(env.create_symintnode(s, hint=int(hints[s])))  # the symbol itself: every size of it becomes a number
    return True


def _in_order(node: Node) -> bool:
    """``node`` keeps its input's elements in row-major order: a reshape, or a permute that moves only size-1
    dims (the engine's o.transpose(1, 2) at one token)."""
    if _op(node, *_graph.RESHAPES):
        return True
    if not _op(node, aten.permute.default):
        return False
    sizes = _graph.val(node.args[0]).shape
    moved = [d for d in node.args[1] if not statically_known_true(sizes[d] == 1)]
    return moved == sorted(moved)


def _fold_quant(graph: Graph, op: Node) -> bool:
    """The o_proj's input quant into the attention's launch: ``group_quant(x, g)`` where x is ``op``'s output
    through reshapes and size-1 permutes read by nothing else becomes ``decode_attention_upto_quant``'s outputs,
    reshaped to what the quant returned. Bit for bit the pair (the op rounds its output first, as the pair did)."""
    node, chain = op, []
    while len(node.users) == 1:
        (user,) = node.users
        if _op(user, _graph.GROUP_QUANT):
            break
        if not _in_order(user):
            return False
        chain.append(user)
        node = user
    else:
        return False
    quant = next(iter(node.users))
    fold = _decode_tokens.o_proj_quant(quant, _graph.static_int(_graph.val(op).shape[-1]))
    if isinstance(fold, _decode_tokens.Declined):
        return False
    group, k, sizes, qs, ss = fold
    with _graph.Edit(graph, before=quant) as e:
        both = e.call(FUSED_UPTO_QUANT, *op.args, group)
        q = e.call(aten.reshape.default, e.call(operator.getitem, both, 0), [*sizes, k])
        sc = e.call(aten.reshape.default, e.call(operator.getitem, both, 1), [*sizes, k // group])
    for old, new in [(n, q) for n in qs] + [(n, sc) for n in ss]:
        old.replace_all_uses_with(new)
    _graph.erase_dead(graph, [*qs, *ss, quant, *chain, op])
    return True


def rewrite(graph: Graph, m: Match, masks: dict) -> str:
    """``masks``: structural key -> the keep mask (or ``last``) an earlier site of this graph passed its op. Every
    layer builds the same mask from the same positions; one node for all of them is one Inductor kernel per step
    (none for ``last``: a view of the positions), not one per layer."""
    kc = _graph.val(m.k_cache)
    _, hkv, t, d = kc.shape
    r = _graph.val(m.q3).shape[1]
    hkv, d = _graph.static_int(hkv), _graph.static_int(d)  # static: check() said so
    tokens = None
    if m.token_keep() is not None:  # several tokens in the engine's layouts: no copies
        tokens = _decode_tokens.rewrite(graph, m, m.token_keep(), hkv, d)
        if tokens is not None and not isinstance(tokens, _decode_tokens.Declined):
            return tokens
    upto = None
    if m.hides and _op(m.mask, aten.bitwise_not.default):
        keep = _decode_mask.one_row(m.mask.args[0])
        upto = _decode_mask.upto(keep)
        key = _graph.structural_key(keep)
    elif not m.hides:
        keep = _decode_mask.one_row(m.mask)
        upto = _decode_mask.upto(keep)
        key = (None, _graph.structural_key(keep))
    else:
        keep, key = m.mask, (aten.bitwise_not.default, _graph.structural_key(m.mask))
    shared = masks.get(key)
    with _graph.Edit(graph, before=m.pv) as e:
        # a symbolic row count (bounded, check() said) as a graph value: the batch may be the reshape's -1
        rows = _graph.static_int(r)
        rows = e.call(aten.sym_size.int, m.q3, 1) if rows is None else rows
        q4 = e.call(aten.reshape.default, m.q3, [-1, hkv, rows, d])
        if shared is not None and not shared._erased:
            keep = shared
        elif upto is not None:
            pos, offset = upto
            keep = e.call(aten.reshape.default, pos, [-1])
            if offset:
                keep = e.call(aten.add.Tensor, keep, offset)
        elif m.hides and keep is m.mask:
            keep = e.call(aten.bitwise_not.default, m.mask)
        o = e.call(FUSED_UPTO if upto is not None else FUSED, q4, m.k_cache, m.v_cache, keep, m.scale)
        out = e.call(aten.reshape.default, o, [-1, rows, d])
    masks.setdefault(key, keep)
    m.out.replace_all_uses_with(out)
    gone = [n for n in m.nodes if n not in (m.k_cache, m.v_cache)]
    _graph.fold_static_size_reads(gone)
    _graph.erase_dead(graph, gone + [m.mask])
    seen = "slots up to each batch row's position (no mask, no slot after it read)" if upto else "a mask"
    quant = ""
    if upto is not None:
        try:  # the attention is rewritten already: a fold that fails (Edit: as it was) must not undo its report
            quant = " and the quant of its output" if _fold_quant(graph, o) else ""
        except Exception as e:  # noqa: BLE001 - failure isolation, as the pass does per match
            quant = f" (its output's quant stays a launch: folding it raised {type(e).__name__}: {e})"
    declined = f" (a position per token, but the masked form: {tokens})" if tokens is not None else ""
    return f"{r} query rows per kv head over a {t}-slot cache, {seen}, scale {m.scale:.6g}{quant}: one launch{declined}"


def run(graph: Graph, report) -> None:
    masks: dict = {}
    for pv in [n for n in graph.nodes if _op(n, aten.bmm.default)]:
        if pv._erased:  # the score GEMM of a site rewritten before it
            continue
        try:
            m = Match(pv)
        except LookupError:
            continue  # not a softmax times values: not a candidate
        except _NotPlain as e:
            report.reject(NAME, pv.name, "attention_not_plain", f"{e}: the GEMMs and softmax stay", "", "")
            continue
        except (AttributeError, IndexError, TypeError):
            continue  # an operand without a fake value: not a shape we can judge
        q3, kc = _graph.val(m.q3), _graph.val(m.k_cache)
        shapes, dtype = _graph.shape_str(q=q3, k=kc), _graph.dtype_str(m.q3)
        report.settle(NAME, pv.name, shapes, dtype, m.check(), "the GEMMs and softmax stay", rewrite, graph, m, masks)

