"""Decode attention over a static KV cache: which formulation the engine model should use.

    PYTHONPATH=. python benchmarks/attention_decode.py --batches 1,8,64

One decode step's attention at Qwen3-8B / Llama-3.1-8B shapes (32 query heads, 8 KV heads, head_dim 128) over a
static cache of ``--max-seq`` slots with ``--context`` of them valid, each formulation compiled by Inductor and
timed as back-to-back CUDA-graph replays (``decode.capture`` / ``decode.time_replays``), every output checked
against the fp32 math reference:
- ``sdpa_mask``: the engine's first form, SDPA with a boolean ``key_pos <= query_pos`` mask (cuDNN on the H200);
- ``sdpa_efficient``: the same call under ``sdpa_kernel(EFFICIENT_ATTENTION)``;
- ``math``: q @ k^T, masked fp32 softmax, @ v, left to Inductor (two GEMMs and a fused softmax);
- ``flex``: ``flex_attention`` with the mask as a ``score_mod`` (Inductor's flex-decoding template, split over
  the keys);
- ``fused``: ``fp8_fusion::decode_attention`` (``kernels/triton/decode_attention.py``) called on the engine's
  grouped q and mask: the kernel the ``decode_attention`` rewrite swaps in;
- ``fused_upto``: ``fp8_fusion::decode_attention_upto`` on the positions themselves (no mask; the key loop ends
  at the position), its splits runs of the cache's slots (``decode_attention.SPLIT_VISIBLE`` off, as before the
  thirty-eighth session);
- ``fused_upto_visible``: the same with ``SPLIT_VISIBLE`` on (the default: the key tiles up to the position dealt
  out to the splits): what the rewrite swaps in for the engine's ``slot <= position`` mask. The two differ where
  ``--max-seq`` is well past ``--context``, e.g. 4096 against 500;
- ``upto+quant`` / ``upto_quant``: the upto op then ``group_quant`` of its output (the o_proj's input quant, two
  launches), against ``decode_attention_upto_quant`` (one); their error is that of the dequantized output;
- ``math+pass``: ``math`` compiled with the pass (``fp8_fusion_pass.backend``), so the rewrite itself is timed;
- at several tokens (``--tokens``), with q as the RoPE op leaves it (a transposed view of [B, S, H, D]) and the
  output laid out and quantized for the o_proj: ``masked+quant`` (what the graph ran before the token form: q copied
  into grouped rows, the masked op, the output copied back, ``group_quant``) and ``math+quant`` (the same with
  Inductor's math attention: what the graph keeps above ``decode_attention.MAX_ROWS``) against ``tokens_quant``
  (``decode_attention_tokens_quant``, one launch); their error is that of the dequantized output. With no quant to
  fold (a per-tensor or bf16 o_proj): ``masked+copy`` and ``math+copy`` (the same graphs without the quant) against
  ``tokens`` (``decode_attention_tokens``).

``--sweep`` times every ``AttentionConfig`` of ``SWEEP`` on the kernel alone (20 calls per CUDA graph, so the
graph launch is not counted), per batch, and prints the best: the upto form (``--sweep-mask``: the mask form; with
``--heads`` / ``--tokens`` the rows of a step verifying draft tokens, each token's own mask row). Each config's
output is held to fp32 attention (``CHECK_REL_ERR``): one off it is reported WRONG and never ranked. ``--cold``:
each call on its own copy of the caches, together past 3x L2 (``_timing.cache_copies``), as in a decode step;
without it the calls read one cache that L2 holds up to batch 8 (the thirty-ninth session's finding: a hot sweep's
winner can be worth little in the step; ``rope_attention.py --sweep --cold`` is the RoPE launch's).
Roofline: the valid K/V bytes read once over the copy bandwidth.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import decode  # noqa: E402
from _timing import cache_copies, copy_bandwidth  # noqa: E402
from decode import capture, log, time_replays  # noqa: E402

from fp8_fusion_pass.kernels import reference as reference_mod  # noqa: E402
from fp8_fusion_pass.kernels.triton import decode_attention as kernel  # noqa: E402
from fp8_fusion_pass.models.engine import decode_attention  # noqa: E402

# the forms that read one position per batch row
ONE_TOKEN = ("fused_upto", "fused_upto_visible", "upto+quant", "upto_quant")
# several tokens per row, the output the o_proj's input: quantized for a block-FP8 o_proj, else plain [B, S, H, D]
TOKENS = ("masked+quant", "math+quant", "tokens_quant", "masked+copy", "math+copy", "tokens")
# The sweep's check of each config against fp32 attention (relative L2): the kernel rounds p and the output, ~2.3e-3
# (as tests/tolerances.py ATTENTION_REL_L2: a wrong max, sum or merge gives > 0.1).
CHECK_REL_ERR = 6e-3
SWEEP = [kernel.AttentionConfig(bt, w, st, p) for bt in (16, 32, 64, 128) for w in (4, 8) for st in (2, 3)
         for p in (0, 1, 2, 4)]  # fmt: skip (programs 0: one split per kv head)
# Split counts that no ``programs`` gives at batch 1 / 8 (8 / 64 pairs: 1 program per SM is 17 / 3 splits, capped
# by the tiles): 2-4 splits of 64- / 128-key tiles, added in the thirty-eighth session once the merge's cost stopped
# growing by ~500 cycles a split (docs/benchmarks.md, "Inside the attention launch")
SWEEP += [kernel.AttentionConfig(bt, w, st, 0, s) for bt in (64, 128) for w in (4, 8) for st in (2, 3)
          for s in (2, 3, 4)]  # fmt: skip


def grouped_keep(positions, groups: int, t: int):
    """The mask of the engine's grouped rows: ``positions [B, S]`` -> ``keep [B, 1, G x S, T]``, row (query head g,
    token i) seeing the slots up to token i's position, as the rewrite lays them out (at one token a view)."""
    b, s = positions.shape
    keep = (torch.arange(t, device=positions.device) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, S, T]
    return keep.expand(b, groups, s, t).reshape(b, 1, groups * s, t) if s > 1 else keep


def fused(q, k_cache, v_cache, positions, scale):
    """The engine's grouped q and mask (``engine.decode_attention``) handed to the fused op."""
    b, h, s, d = q.shape
    hkv, t = k_cache.shape[1], k_cache.shape[2]
    keep = grouped_keep(positions, h // hkv, t)
    o = torch.ops.fp8_fusion.decode_attention(q.reshape(b, hkv, h // hkv * s, d), k_cache, v_cache, keep, scale)
    return o.reshape(b, h, s, d)


def fused_upto(q, k_cache, v_cache, positions, scale):
    """The engine's grouped q and its one token's positions handed to the upto op."""
    b, h, s, d = q.shape
    hkv = k_cache.shape[1]
    assert s == 1, "the upto form is one query token per batch row"
    o = torch.ops.fp8_fusion.decode_attention_upto(q.reshape(b, hkv, h // hkv, d), k_cache, v_cache,
                                                   positions.reshape(b), scale)  # fmt: skip
    return o.reshape(b, h, s, d)


def upto_quant(q, k_cache, v_cache, positions, scale, fused: bool):
    b, h, _, d = q.shape
    hkv = k_cache.shape[1]
    args = (q.reshape(b, hkv, h // hkv, d), k_cache, v_cache, positions.reshape(b), scale)
    if fused:
        return torch.ops.fp8_fusion.decode_attention_upto_quant(*args, 128)
    return torch.ops.fp8_fusion.group_quant(torch.ops.fp8_fusion.decode_attention_upto(*args), 128)


def tokens_step(q, k_cache, v_cache, positions, scale, impl: str):
    """``q [B, H, S, D]`` (the RoPE op's transposed view) to the o_proj's input ``[B, S, H, D]``, quantized with its
    scales ``[B, S, H, 1]`` for the ``+quant`` / ``_quant`` forms: ``decode_attention_tokens(_quant)``, or the masked
    op (``masked+``) or Inductor's math form (``math+``, what the graph keeps above ``_decode_tokens.MAX_ROWS``)
    between two copies (and the quant)."""
    b, h, s, d = q.shape
    if impl == "tokens_quant":
        return torch.ops.fp8_fusion.decode_attention_tokens_quant(q, k_cache, v_cache, positions, scale, 128)
    if impl == "tokens":
        return torch.ops.fp8_fusion.decode_attention_tokens(q, k_cache, v_cache, positions, scale)
    if impl.startswith("math+"):
        o = decode_attention(q, k_cache, v_cache, positions, scale, "math")
    else:
        o = fused(q, k_cache, v_cache, positions, scale)
    x = o.transpose(1, 2).reshape(b, s, h * d)
    if impl.endswith("+copy"):
        return x.reshape(b, s, h, d)
    o, sc = torch.ops.fp8_fusion.group_quant(x, 128)
    return o.reshape(b, s, h, d), sc.reshape(b, s, h, d // 128)


def compiled(impl: str, scale: float):
    torch._dynamo.reset()
    if impl in TOKENS:
        return torch.compile(lambda q, kc, vc, pos: tokens_step(q, kc, vc, pos, scale, impl))
    if impl in ("upto+quant", "upto_quant"):
        return torch.compile(lambda q, kc, vc, pos: upto_quant(q, kc, vc, pos, scale, impl == "upto_quant"))
    if impl in ("fused", "fused_upto", "fused_upto_visible"):
        op = fused if impl == "fused" else fused_upto
        return torch.compile(lambda q, kc, vc, pos: op(q, kc, vc, pos, scale))
    if impl == "math+pass":
        from fp8_fusion_pass import backend

        return torch.compile(lambda q, kc, vc, pos: decode_attention(q, kc, vc, pos, scale, "math"),
                             backend=backend())
    return torch.compile(lambda q, kc, vc, pos, impl=impl: decode_attention(q, kc, vc, pos, scale, impl))


def sweep(batches, context: int, max_seq: int, mask: bool, heads: int = 32, tokens: int = 1,
          cold: bool = False) -> None:
    """Every SWEEP config on the kernel alone, per batch: us per call, the best first. ``mask``: the mask form
    (else the upto form, one token only); ``heads`` / ``tokens``: the query rows per kv head, heads / 8 x tokens,
    each token's rows seeing the slots up to its own position (a step verifying draft tokens); ``cold``: each call
    on a copy of the caches out of L2."""
    from tabulate import tabulate

    dev = decode.DEVICE
    hkv, d = 8, 128
    r = heads // hkv * tokens
    if tokens > 1 and not mask:
        raise SystemExit("--sweep at more than one token: the mask form (--sweep-mask); upto reads one position a row")
    best = []
    for batch in batches:
        g = torch.Generator(device=dev).manual_seed(batch)
        q = torch.randn(batch, hkv, r, d, device=dev, dtype=torch.bfloat16, generator=g)
        k_cache = torch.randn(batch, hkv, max_seq, d, device=dev, dtype=torch.bfloat16, generator=g)
        v_cache = torch.randn_like(k_cache)
        if mask:  # rows (query head, token): token i sees the slots up to context + i, as fused() lays them out
            seen = grouped_keep(context + torch.arange(tokens, device=dev).view(1, tokens), heads // hkv, max_seq)
        else:
            seen = torch.full((batch,), context, device=dev)
        call = kernel.decode_attention if mask else kernel.decode_attention_upto
        keep = seen if mask else torch.arange(max_seq, device=dev) <= seen.view(-1, 1, 1, 1)
        want = reference_mod.decode_attention(q.float(), k_cache, v_cache, keep, d**-0.5)  # fp32 throughout
        caches = cache_copies(k_cache, v_cache, dev == "cpu") if cold else [(k_cache, v_cache)]
        reps = max(20, len(caches)) if dev == "cuda" else 1  # the interpreter (a test): each config once
        times, wrong = [], []
        for cfg in SWEEP:
            def calls(q, _k, _v, seen, cfg=cfg, call=call):  # call i on cache copy i (the same values in each)
                return [call(q, *caches[i % len(caches)], seen, d**-0.5, cfg) for i in range(reps)]

            graph, outs = capture(calls, (q, k_cache, v_cache, seen))
            us = time_replays(graph, 20) * 1e3 / reps  # first: a captured graph's outputs hold values once replayed
            err = ((outs[0].float() - want).norm() / want.norm()).item()
            if not err <= CHECK_REL_ERR:  # a config wrong at these rows is reported, never ranked
                wrong.append(f"{cfg} ({err:.1e})")
                continue
            times.append((us, cfg))
        if wrong:
            log(f"sweep batch {batch}: WRONG against fp32 attention: " + "; ".join(wrong))
        if not times:
            raise SystemExit(f"sweep batch {batch}: every config WRONG against fp32 attention")
        times.sort(key=lambda x: x[0])
        sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 4
        splits = [kernel.plan(batch * hkv, max_seq, sms, c)[0] for _, c in times[:3]]
        chosen = kernel.config_for(batch * hkv, r)
        default = next((us for us, c in times if c == chosen), float("nan"))
        log(f"sweep batch {batch}{' (cold caches)' if cold else ''}: "
            + "; ".join(f"{us:.2f} {c}" for us, c in times[:5]))
        best.append([batch, f"{times[0][0]:.2f}", str(times[0][1]), splits[0], f"{default:.2f}", f"{times[-1][0]:.2f}",
                     len(wrong)])
    print(f"{r} query rows per kv head ({heads} query heads, 8 kv heads, {tokens} token(s)), "
          f"{'mask' if mask else 'upto'} form")
    print(tabulate(best, headers=["batch", "best us", "config", "splits", "TABLE's us", "worst us", "WRONG"]))


def reference(q, k_cache, v_cache, positions, scale):
    """``q [B, H, S, D]`` as the engine's grouped rows through ``kernels.reference.decode_attention`` (fp32)."""
    b, h, s, d = q.shape
    hkv = k_cache.shape[1]
    keep = grouped_keep(positions, h // hkv, k_cache.shape[2])
    o = reference_mod.decode_attention(q.reshape(b, hkv, h // hkv * s, d), k_cache, v_cache, keep, scale)
    return o.reshape(b, h, s, d)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-seq", type=int, default=576)
    p.add_argument("--impls", default="sdpa_mask,sdpa_efficient,math,flex,fused,fused_upto,fused_upto_visible,"
                                      "upto+quant,upto_quant,"
                                      "math+pass," + ",".join(TOKENS))
    p.add_argument("--tokens", type=int, default=1, help="query tokens per row (more than one: a step verifying draft "
                   "tokens; the one-token forms, ONE_TOKEN, are left out)")
    p.add_argument("--heads", type=int, default=32, help="query heads (over 8 kv heads): 32 for the 8B models, 64 for "
                   "Qwen3-32B")
    p.add_argument("--sweep", action="store_true", help="time SWEEP's kernel configs instead (the upto form)")
    p.add_argument("--sweep-mask", action="store_true", help="with --sweep: the mask form")
    p.add_argument("--cold", action="store_true", help="with --sweep: each call on a copy of the caches out of L2")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.cold and not args.sweep:
        p.error("--cold is for --sweep (the table's impls read their caches alike)")
    if args.sweep:
        sweep([int(b) for b in args.batches.split(",")], args.context, args.max_seq, args.sweep_mask, args.heads,
              args.tokens, args.cold)
        return 0
    dev = decode.DEVICE  # "cuda"; "cpu" where a test sets it (the table's code end to end, wall-clock times)
    bw = copy_bandwidth(dry_run=dev == "cpu")
    h, hkv, d, s = args.heads, 8, 128, args.tokens
    impls = [i for i in args.impls.split(",") if i not in (TOKENS if s == 1 else ONE_TOKEN)]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        g = torch.Generator(device=dev).manual_seed(batch)
        q = torch.randn(batch, h, s, d, device=dev, dtype=torch.bfloat16, generator=g)
        k_cache = torch.randn(batch, hkv, args.max_seq, d, device=dev, dtype=torch.bfloat16, generator=g)
        v_cache = torch.randn_like(k_cache)
        positions = args.context + torch.arange(s, device=dev).expand(batch, s)  # token i sees the slots up to it
        want = reference(q, k_cache, v_cache, positions, d**-0.5)
        roof_us = 2 * batch * hkv * (args.context + s) * d * 2 / bw * 1e6
        for impl in impls:
            try:
                fn = compiled(impl, d**-0.5)
                q_in = q.transpose(1, 2).contiguous().transpose(1, 2) if impl in TOKENS else q  # as RoPE leaves it
                # read at launch: fused_upto's splits are runs of the cache's slots, fused_upto_visible's the dealt
                # tiles (the default since the thirty-eighth session); every other impl launches the default
                visible = kernel.SPLIT_VISIBLE
                if impl.startswith("fused_upto"):
                    kernel.SPLIT_VISIBLE = impl.endswith("_visible")
                try:
                    graph, out = capture(fn, (q_in, k_cache, v_cache, positions))
                finally:
                    kernel.SPLIT_VISIBLE = visible
                us = time_replays(graph, 200) * 1e3
                if isinstance(out, (tuple, list)):  # fp8 and its scales: the dequantized output
                    out = out[0].float() * out[1]
                if impl in TOKENS:  # [B, S, H, D], the o_proj's layout
                    out = out.transpose(1, 2)
                out = out.reshape(want.shape)
                err = ((out.float() - want.float()).norm() / want.float().norm()).item()
                rows.append([batch, impl, f"{us:.1f}", f"{roof_us:.2f}", f"{us / roof_us:.1f}x", f"{err:.1e}"])
            except Exception as e:  # report and go on: one formulation failing must not hide the others
                rows.append([batch, impl, "FAILED", f"{roof_us:.2f}", "-", f"{type(e).__name__}: {str(e)[:80]}"])
            log(" ".join(map(str, rows[-1])))
    from tabulate import tabulate

    print(f"{h} query heads, 8 kv heads, {s} token(s) per row: {h // 8 * s} query rows per kv head")
    print(tabulate(rows, headers=["batch", "impl", "us", "roofline us", "x roofline", "rel err vs fp32"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
