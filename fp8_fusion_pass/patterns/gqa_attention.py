"""Grouped-query attention at decode: SDPA reads the KV cache itself, not a copy of it for every query head.

    before (transformers' ``sdpa_attention_forward`` with a mask, as every static-cache decode step has one)
    k_rep = reshape(clone(expand(unsqueeze(k_cache, 2), [B, Hkv, G, L, D])), [B, Hkv * G, L, D])   (v the same)
    out = sdpa(q [B, Hkv * G, S, D], k_rep, v_rep, mask [B | 1, Hkv * G | 1, S | 1, L])[0]

    after
    out = sdpa(q.reshape(B, Hkv, G * S, D), k_cache, v_cache,
               mask.expand(B, Hkv * G, S, L).reshape(B, Hkv, G * S, L))[0].reshape(B, Hkv * G, S, D)

Why: transformers passes ``enable_gqa`` to SDPA only without a mask (with one, PyTorch's GQA falls back to the math
kernel), so with a static cache every decode step first copies the whole cache to each of the G query heads of a
kv head (``repeat_kv``). On the H200 that copy took most of the HF step: 1410 of 2208 us for 4 Qwen3-8B layers at
batch 64 (``benchmarks/profile_step.py``, ``docs/benchmarks.md`` "Where a decode step's time goes"), where the
engine form, which never copies, spends a few percent. The G query heads that share a kv head can be that kv head's
query rows, G x S of them for S tokens (one at decode; a few where a step verifies draft tokens): the same dot
products over the same keys, the same softmax and sums per row, batched differently. Each row keeps its own mask
row, so at S > 1 the mask is laid out per group, a [B, Hkv, G * S, L] copy (at S = 1 a view) that grows with S while
the KV copy it saves does not: ``guards.GQA_MAX_QUERY_TOKENS`` bounds S at what was measured (the grouped form
faster up to 128 tokens, less so as S grew: ``benchmarks/gqa_tokens.py``). The kernel may block those rows
differently from G separate heads, so the result is not promised bit for bit (off in deterministic mode).

Every SDPA kernel op Inductor's post-grad graph can hold is taken (CPU flash, CUDA efficient / cuDNN / flash, the
overrideable one), each by its own argument names; the op stays the one the dispatcher chose. On the H200 that is
cuDNN's, and HF decode went 1.066x -> 2.658x at batch 64 with it (Llama-3.1-8B, pass vs no pass, one run:
``docs/benchmarks.md``, "Grouped-query attention at decode").

Guards: the switch and deterministic mode; a query length of at most ``GQA_MAX_QUERY_TOKENS``, static or marked
dynamic with a ``max=`` within it (``query_too_long``: a prefill keeps the copy; its attention is compute-bound and
its mask copy would outgrow the KV copy); static head counts and head dim, where the batch, the cache length and a
bounded token count may be symbolic (``kv_heads_dynamic``: ``dynamic=True`` makes them all symbolic); key and value
each such a copy of a 4-D cache, made for this attention alone, with the same G (``kv_copy_shared``); no causal
flag, no dropout, a mask per batch row / head / query token / key only, nothing read from the op but its output
(``attention_not_plain``); at a static batch and one token, at least ``guards.GQA_MIN_BATCH_HEADS`` batch rows x
query heads (``kv_copy_faster``: cuDNN runs a program per (batch row, kv head) pair, and with few pairs and a small
copy the copy measured faster; with more tokens it measured slower at every batch). An SDPA whose key is not a copy
is no candidate (nothing reported): MHA models, the engine form, a mask-free call that already passed ``enable_gqa``.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.operator_schemas import normalize_function

from .. import guards
from . import _graph

aten = torch.ops.aten
NAME = "gqa_attention"
# SDPA kernel op -> the name of its mask argument (None: the op takes no mask)
SDPA_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "attn_mask",
    aten._scaled_dot_product_efficient_attention.default: "attn_bias",
    aten._scaled_dot_product_cudnn_attention.default: "attn_bias",
    aten._scaled_dot_product_flash_attention.default: None,
    aten._scaled_dot_product_fused_attention_overrideable.default: "attn_bias",
}


def _static(*sizes) -> bool:
    return all(_graph.static_int(s) is not None for s in sizes)


def repeat_kv(node) -> tuple[Node, int, list[Node]] | None:
    """(cache [B, Hkv, L, D], G, the copy's nodes from the reshape back) when ``node`` is transformers'
    ``repeat_kv(cache, G)`` as post-grad spells it, else None. Sizes may be symbolic (``_check`` says which it
    needs static)."""
    if not isinstance(node, Node) or node.target not in _graph.RESHAPES:
        return None
    chain, src = [node], node.args[0]
    if isinstance(src, Node) and src.target is aten.clone.default:
        chain.append(src)
        src = src.args[0]
    if not (isinstance(src, Node) and src.target is aten.expand.default):
        return None
    chain.append(src)
    unsqueeze = src.args[0]
    if not (isinstance(unsqueeze, Node) and unsqueeze.target is aten.unsqueeze.default and unsqueeze.args[1] == 2):
        return None
    chain.append(unsqueeze)
    cache, rep, out = _graph.val(unsqueeze.args[0]), _graph.val(src), _graph.val(node)
    if not all(isinstance(t, torch.Tensor) for t in (cache, rep, out)) or (cache.dim(), rep.dim()) != (4, 5):
        return None
    b, hkv, length, d = cache.shape
    g = rep.shape[2]
    if not (_graph.shape_is(rep, (b, hkv, g, length, d)) and _graph.shape_is(out, (b, hkv * g, length, d))):
        return None
    return unsqueeze.args[0], g, chain


def _only_user_chain(chain: list[Node], sdpa: Node) -> bool:
    """The copy (reshape <- clone <- expand) feeds ``sdpa`` and nothing else; the unsqueeze is a view and may be
    shared."""
    reader = sdpa
    for node in chain[:-1]:
        if [u for u in node.users if _graph.static_size_read(u) is None] != [reader]:
            return False
        reader = node
    return True


def _mask_ok(mask, b, hq, s) -> bool:
    """A 4-D mask per batch row / head / query token / key that broadcasts over [B, Hq, S, L]."""
    m = _graph.val(mask)
    if not isinstance(m, torch.Tensor) or m.dim() != 4 or not _static(m.shape[1]):
        return False  # its keys may be symbolic, as the cache length; its tokens as the query's
    rows_ok = statically_known_true(m.shape[0] == 1) or statically_known_true(m.shape[0] == b)
    tokens_ok = statically_known_true(m.shape[2] == 1) or statically_known_true(m.shape[2] == s)
    return rows_ok and m.shape[1] in (1, hq) and tokens_ok


def _check(sdpa: Node, kw: dict, k, v) -> guards.Verdict:
    """k / v: ``repeat_kv``'s answer for the key (never None here: no copy, no candidate) and the value."""
    q = _graph.val(kw["query"])
    b, hq, s, d = q.shape
    mask_name = SDPA_OPS[sdpa.target]
    mask = kw.get(mask_name) if mask_name else None
    outputs = {u.args[1] for u in sdpa.users if u.target is operator.getitem}
    if not statically_known_true(s <= guards.GQA_MAX_QUERY_TOKENS):
        how = "" if _static(s) else (", a count known to be within it (a symbolic count: mark the token dim with "
                                     f"max={guards.GQA_MAX_QUERY_TOKENS} or less)")
        return guards.reject("query_too_long", f"query [{b}, {hq}, {s}, {d}]: the grouped rows take at most "
                             f"{guards.GQA_MAX_QUERY_TOKENS} query tokens per head{how} (decode, or a step verifying "
                             "draft tokens; guards.GQA_MAX_QUERY_TOKENS)")
    cache = _graph.val(k[0]).shape
    if not _static(hq, d, k[1], cache[1], cache[3]):
        return guards.reject("kv_heads_dynamic", f"query heads {hq}, head dim {d}, cache {list(cache)}: only the "
                             "batch, the cache length and a bounded token count may be symbolic")
    if statically_known_true(cache[2] == 1):  # the mask's last dim then loses its unit stride (H200, torch 2.11)
        return guards.reject("single_key", f"cache {list(_graph.val(k[0]).shape)}: one key per head, nothing to "
                             "save; the grouped [B, Hkv, G, 1] mask fails SDPA's last-dim stride check on the GPU")
    if v is None or k[1] != v[1] or hq % k[1] or _graph.val(k[0]).shape[1] * k[1] != hq:
        return guards.reject("kv_copy_shared", "key and value are not both a repeat_kv copy of a cache with the "
                             "query's heads per kv head")
    if not (_only_user_chain(k[2], sdpa) and _only_user_chain(v[2], sdpa)) or kw["key"] is kw["value"]:
        return guards.reject("kv_copy_shared", "the key / value copy also feeds something else")
    if kw.get("is_causal") or kw.get("dropout_p", 0.0) != 0.0:
        return guards.reject("attention_not_plain", f"is_causal={kw.get('is_causal')}, dropout_p="
                             f"{kw.get('dropout_p')}: the grouped rows would change what each query sees")
    if outputs != {0} or len(sdpa.users) != 1:
        return guards.reject("attention_not_plain", "an output besides the attention's is read (logsumexp)")
    if mask is not None and not _mask_ok(mask, b, hq, s):
        return guards.reject("attention_not_plain", f"mask {_graph.shape_str(mask=mask)} is not one per batch row "
                             "/ head / query token / key over the query heads")
    return guards.should_read_cache_grouped(b, hq // k[1], k[1], _graph.static_int(s))


def rewrite(graph: Graph, sdpa: Node, kw: dict, k, v) -> str:
    # the batch may be symbolic: every reshape leaves it to -1; the keys (the cache length) too: their count is
    # read from the mask by a node
    hq, s, d = (_graph.static_int(n) for n in _graph.val(kw["query"]).shape[1:])
    g = k[1]
    hkv = hq // g
    mask_name = SDPA_OPS[sdpa.target]
    old_out = next(iter(sdpa.users))
    with _graph.Edit(graph, before=sdpa) as e:  # query head h = kv * G + g, as repeat_kv's; row g * S + token
        if s is None:  # a token count marked dynamic (bounded, _check said): read from the query by a node
            s = e.call(aten.sym_size.int, kw["query"], 2)
        rows = g * s if isinstance(s, int) else e.call(operator.mul, s, g)
        new_kw = {**kw, "query": e.call(aten.reshape.default, kw["query"], [-1, hkv, rows, d]), "key": k[0],
                  "value": v[0]}  # fmt: skip
        mask = kw.get(mask_name) if mask_name else None
        if mask is not None:  # [B | 1, Hq | 1, S | 1, L] -> [B | 1, Hkv, G * S, L]: a view at S = 1, a copy above
            length = _graph.static_int(_graph.val(mask).shape[3])
            if length is None:
                length = e.call(aten.sym_size.int, mask, 3)
            wide = e.call(aten.expand.default, mask, [-1, hq, s, length])
            new_kw[mask_name] = e.call(aten.reshape.default, wide, [-1, hkv, rows, length])
        new = e.call(sdpa.target, **new_kw)
        out = e.call(aten.reshape.default, e.call(operator.getitem, new, 0), [-1, hq, s, d])
    old_out.replace_all_uses_with(out)
    _graph.fold_static_size_reads([*k[2], *v[2]])
    _graph.erase_dead(graph, [old_out, sdpa, *k[2], *v[2]])
    op = sdpa.target._schema.name.split("::")[-1]
    return f"{op}, {g} query heads per kv head, cache {list(_graph.val(k[0]).shape)}: reads the cache, no copy"


def run(graph: Graph, report) -> None:
    for sdpa in [n for n in graph.nodes if n.op == "call_function" and n.target in SDPA_OPS]:
        kw = normalize_function(sdpa.target, sdpa.args, sdpa.kwargs, normalize_to_only_use_kwargs=True).kwargs
        k, v = repeat_kv(kw["key"]), repeat_kv(kw["value"])
        if k is None:
            continue  # no KV copy before this attention: not a candidate
        shapes = _graph.shape_str(q=kw["query"], k=k[0])
        dtype = _graph.dtype_str(kw["query"])
        report.settle(NAME, sdpa.name, shapes, dtype, _check(sdpa, kw, k, v), "the KV copy stays",
                      rewrite, graph, sdpa, kw, k, v)
