"""The decode step's RoPE + KV-cache writes + attention: two launches against ``rope_decode_attention``'s one.

    PYTHONPATH=. python benchmarks/rope_attention.py --batches 1,8,32,64
    PYTHONPATH=. python benchmarks/rope_attention.py --batches 8,32 --tokens 4     (a step verifying draft tokens)

At 8B heads (32 query, 8 kv, head_dim 128), a ``--max-seq``-slot cache with ``--context`` slots in use, for Llama
(RoPE alone) and Qwen3 (q / k norms first), with and without the o_proj's quant: "pair" is the RoPE kernel that
writes the caches (``qk_rope_cache`` / ``rms_norm_rope_cache``) then ``decode_attention_upto`` (``_quant``), "fused"
is ``rope_decode_attention``, what the ``rope_attention`` rewrite swaps in. One call per CUDA-graph replay (each
replay writes the same slots with the same values), medians of ``decode.time_replays``; each fused output is checked
against the pair's (the caches' bits, the output's relative L2). ``--heads`` / ``--models`` pick the heads and
the models here too (default 8B heads, both models).

``--cold`` (with ``--sweep``): each call of a replay reads its own copy of the caches, enough copies that one is
out of L2 again before its next call (``_timing.cache_copies``, as the GEMM benchmarks rotate weights), as in a
decode step, where every layer's weights pass through L2 between two
reads of its cache. Without it the sweep's 20 calls read one cache that L2 holds (up to batch 8 at 8B heads), so its
figures are hot-cache figures: the thirty-ninth session found the batch-1 row's 7% (hot) worth 0.03-0.1% of a step.

``--once N`` launches the fused op N times and times nothing, for a profiler (``benchmarks/attention_ncu.sh``).

``--sweep`` times the fused op alone at every ``AttentionConfig`` of ``attention_decode.SWEEP`` (20 calls per CUDA
graph, so the graph launch is not counted), per batch, at ``--heads`` (Qwen3-32B: ``64,8``, 8 query rows per kv
head where the 8B models have 4) for ``--models``, with the o_proj's quant: the configs that ``TABLE`` picks from;
with ``--tokens`` the token form's RoPE launch (``--heads 64,8 --tokens 8``: 64 rows per kv head). ``--programs``
keeps the configs of those programs per SM only (0: one split per kv head; ``s2``: those of 2 splits), and
TABLE's, so a question about one kind of config fits one call of the device machine (the whole SWEEP at 64 rows
did not).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import decode  # noqa: E402
from _timing import cache_copies  # noqa: E402
from decode import capture, log, time_replays  # noqa: E402

import fp8_fusion_pass.kernels.ops  # noqa: E402, F401

ops = torch.ops.fp8_fusion


def inputs(batch: int, norm: bool, max_seq: int, context: int, hq=32, hk=8, d=128, tokens=1):
    """A step of ``tokens`` as the qkv GEMM leaves it (strided views of one output), norm weights, tables, positions
    ``context..`` per row, caches."""
    dev = decode.DEVICE  # "cuda"; "cpu" when decode.py's dry run sets it (a smoke test of this script)
    g = torch.Generator(device=dev).manual_seed(batch)
    qkv = torch.randn(batch, tokens, (hq + 2 * hk) * d, device=dev, dtype=torch.bfloat16, generator=g)
    q = qkv[..., : hq * d].view(batch, tokens, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(batch, tokens, hk, d)
    v = qkv[..., (hq + hk) * d :].view(batch, tokens, hk, d).transpose(1, 2)
    w = [torch.randn(d, device=dev, dtype=torch.bfloat16, generator=g) if norm else None for _ in range(2)]
    angle = torch.rand(batch, tokens, d // 2, device=dev, generator=g).repeat(1, 1, 2) * 6
    cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
    kc = torch.randn(batch, hk, max_seq, d, device=dev, dtype=torch.bfloat16, generator=g)
    vc = torch.randn(kc.shape, device=dev, dtype=torch.bfloat16, generator=g)
    pos = (context + torch.arange(tokens, device=dev)).expand(batch, tokens).contiguous()
    return q, w[0], k, w[1], 1e-6, cos, sin, v, pos, kc, vc


def pair(args, group: int):
    """The RoPE kernel that writes the caches, then the attention (one token: grouped rows; more: the token form)."""
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    if wq is None:
        q_out = ops.qk_rope_cache(q, k, cos, sin, v, pos, kc, vc)
    else:
        q_out = ops.rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc)
    b, hq, s, d = q_out.shape
    scale = d**-0.5
    if s > 1 and group:
        return ops.decode_attention_tokens_quant(q_out, kc, vc, pos, scale, group)
    if s > 1:
        return ops.decode_attention_tokens(q_out, kc, vc, pos, scale), None
    q4 = q_out.reshape(b, kc.shape[1], hq // kc.shape[1], d)
    if group:
        return ops.decode_attention_upto_quant(q4, kc, vc, pos.view(-1), scale, group)
    return ops.decode_attention_upto(q4, kc, vc, pos.view(-1), scale), None


def fused(args, group: int):
    scale = args[0].shape[-1] ** -0.5
    if args[0].shape[1] > 1 and group:
        return ops.rope_decode_attention_tokens_quant(*args, args[8], scale, group)
    if args[0].shape[1] > 1:
        return ops.rope_decode_attention_tokens(*args, args[8], scale), None
    return ops.rope_decode_attention(*args, args[8].view(-1), scale, group)


def _kind(cfg) -> int | str:
    """What ``--programs`` calls a config: its programs per SM, or "sN" where it asks for N splits."""
    return f"s{cfg.splits}" if cfg.splits else cfg.programs


def sweep(batches, models, heads, max_seq: int, context: int, tokens: int = 1, programs=None,
          cold: bool = False) -> None:
    """Every SWEEP config on the fused op alone (with the quant), per (batch, model): us per call, the best first.
    ``tokens`` above 1: ``rope_decode_attention_tokens_quant`` at heads / kv heads x tokens rows per kv head;
    ``programs``: only the configs of those programs per SM (or "sN": of N splits), and TABLE's; ``cold``: each
    call on a cache copy out of L2 (``_timing.cache_copies``)."""
    from attention_decode import SWEEP
    from tabulate import tabulate

    from fp8_fusion_pass.kernels.triton import decode_attention as kernel

    hq, hk = heads
    # launches per replay; one where the replay is plain calls in the CPU interpreter (decode.py's dry run)
    reps = 20 if decode.DEVICE == "cuda" else 1
    op = kernel.rope_decode_attention_tokens_quant if tokens > 1 else kernel.rope_decode_attention
    best = []
    for batch in batches:
        for model in models:
            args = inputs(batch, model == "qwen3", max_seq, context, hq, hk, tokens=tokens)
            last, scale = args[8] if tokens > 1 else args[8].view(-1), args[0].shape[-1] ** -0.5
            chosen = kernel.launch_config(batch * hk, hq // hk * tokens, True, kernel.ROPE_WIDE_ROWS)
            configs = [c for c in SWEEP if programs is None or _kind(c) in programs or c == chosen]
            caches = cache_copies(args[9], args[10], decode.DEVICE == "cpu") if cold else [(args[9], args[10])]
            calls = max(reps, len(caches)) if decode.DEVICE == "cuda" else reps  # every copy read once a replay
            times = []
            for cfg in configs:
                def run(*a, cfg=cfg, last=last, scale=scale):
                    return [op(*a[:9], *caches[i % len(caches)], last, scale, 128, cfg) for i in range(calls)]

                op(*args, last, scale, 128, cfg)  # eager first: the merge counters
                graph, _ = capture(run, args)
                times.append((time_replays(graph, 20) * 1e3 / calls, cfg))
            times.sort(key=lambda x: x[0])
            table_us = next((us for us, c in times if c == chosen), float("nan"))
            # TABLE's in the log line too: a call cut short by its time limit never prints the table below
            log(f"sweep batch {batch} {model} {hq}/{hk} x {tokens}{' (cold caches)' if cold else ''}: TABLE's "
                f"{table_us:.2f}; "
                + "; ".join(f"{us:.2f} {c}" for us, c in times[:5]))
            best.append([batch, model, f"{hq}/{hk}", tokens, f"{times[0][0]:.2f}", str(times[0][1]),
                         f"{table_us:.2f}", f"{times[-1][0]:.2f}"])  # fmt: skip
    print(tabulate(best, headers=["batch", "model", "heads q/kv", "tokens", "best us", "config", "TABLE's us",
                                  "worst us"]))  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-seq", type=int, default=576)
    p.add_argument("--sweep", action="store_true", help="time the fused op at every attention_decode.SWEEP config")
    p.add_argument("--programs", default="", help="with --sweep: only the configs of these programs per SM (e.g. "
                   "0,1; s2 for the configs of 2 splits), and TABLE's")
    p.add_argument("--cold", action="store_true", help="with --sweep: each call reads a copy of the caches out of "
                   "L2, as in a decode step (without it, the caches stay in L2 across the calls)")
    p.add_argument("--heads", default="32,8", help="query heads, kv heads (Qwen3-32B: 64,8)")
    p.add_argument("--models", default="llama,qwen3", help="llama (RoPE alone), qwen3 (q / k norms too)")
    p.add_argument("--tokens", type=int, default=1, help="tokens per step; above 1 (verifying draft tokens) the "
                   "pair is the RoPE kernel then decode_attention_tokens(_quant), the fused op "
                   "rope_decode_attention_tokens(_quant)")
    p.add_argument("--once", type=int, default=0, metavar="N", help="only launch the fused op (with the quant, "
                   "TABLE's config) N times per batch and model, eagerly, nothing timed: what a profiler attaches "
                   "to (benchmarks/attention_ncu.sh)")
    a = p.parse_args(argv)
    torch.set_grad_enabled(False)
    heads = tuple(int(h) for h in a.heads.split(",") if h.isdigit())
    unknown = set(a.models.split(",")) - {"llama", "qwen3"}
    if unknown or len(heads) != 2 or len(a.heads.split(",")) != 2:
        p.error(f"--models takes llama / qwen3 (got {sorted(unknown)}), --heads two numbers (got {a.heads!r})")
    programs = None
    if a.programs and not a.sweep:
        p.error("--programs picks the configs of --sweep; without it there is nothing to pick")
    if a.programs:
        from attention_decode import SWEEP

        swept, words = {_kind(c) for c in SWEEP}, a.programs.split(",")
        programs = {int(n) if n.isdigit() else n for n in words}
        if not programs <= swept or len(programs) != len(words):
            p.error(f"--programs takes programs per SM of SWEEP's configs or sN for N splits {sorted(map(str, swept))}"
                    f", got {a.programs!r}")
    if a.cold and not a.sweep:
        p.error("--cold is for --sweep (the pair / fused table reads its caches hot, both sides alike)")
    if a.once and a.sweep:
        p.error("--once launches the fused op at TABLE's config; --sweep times every config: one or the other")
    if a.once:
        for batch in (int(b) for b in a.batches.split(",")):
            for model in a.models.split(","):
                args = inputs(batch, model == "qwen3", a.max_seq, a.context, *heads, tokens=a.tokens)
                for _ in range(a.once):
                    fused(args, 128)
                if decode.DEVICE == "cuda":
                    torch.cuda.synchronize()
                log(f"once: batch {batch} {model} {heads[0]}/{heads[1]} x {a.tokens}: {a.once} launches")
        return 0
    if a.sweep:
        sweep([int(b) for b in a.batches.split(",")], a.models.split(","), heads, a.max_seq, a.context, a.tokens,
              programs, a.cold)
        return 0
    rows = []
    for batch in (int(b) for b in a.batches.split(",")):
        for model in a.models.split(","):
            norm = model == "qwen3"
            for group in (0, 128):
                times, outs = {}, {}
                for name, fn in (("pair", pair), ("fused", fused)):
                    args = inputs(batch, norm, a.max_seq, a.context, *heads, tokens=a.tokens)
                    outs[name] = (*fn(args, group), args[9], args[10])  # eager first: the merge counters
                    graph, _ = capture(lambda *x, fn=fn, group=group: fn(x, group), args)
                    times[name] = time_replays(graph, 200) * 1e3
                o_p, s_p, kc_p, vc_p = outs["pair"]
                o_f, s_f, kc_f, vc_f = outs["fused"]
                deq = (lambda o, s: o.float() * s) if group else (lambda o, s: o.float())
                err = ((deq(o_f, s_f) - deq(o_p, s_p)).norm() / deq(o_p, s_p).norm()).item()
                same = torch.equal(kc_f, kc_p) and torch.equal(vc_f, vc_p)
                rows.append([batch, model, "quant" if group else "-", f"{times['pair']:.1f}", f"{times['fused']:.1f}",
                             f"{times['pair'] / times['fused']:.3f}x", same, f"{err:.1e}"])  # fmt: skip
                log(" ".join(map(str, rows[-1])))
    from tabulate import tabulate

    print(tabulate(rows, headers=["batch", "model", "o_proj quant", "pair us", "fused us", "pair / fused",
                                  "caches equal", "out rel err"]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
