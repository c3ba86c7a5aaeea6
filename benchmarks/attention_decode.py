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
  the keys).
Roofline: the valid K/V bytes read once over the copy bandwidth.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _timing import copy_bandwidth  # noqa: E402
from decode import capture, log, time_replays  # noqa: E402

from fp8_fusion_pass.models.engine import decode_attention  # noqa: E402


def reference(q, k_cache, v_cache, positions, scale):
    b, h, s, d = q.shape
    rep = h // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(rep, 1)
    v = v_cache.float().repeat_interleave(rep, 1)
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    mask = torch.arange(k.shape[2], device=q.device) <= positions.view(b, 1, s, 1)
    return (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v).to(q.dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-seq", type=int, default=576)
    p.add_argument("--impls", default="sdpa_mask,sdpa_efficient,math,flex")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    bw = copy_bandwidth()
    h, hkv, d = 32, 8, 128
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        g = torch.Generator(device="cuda").manual_seed(batch)
        q = torch.randn(batch, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k_cache = torch.randn(batch, hkv, args.max_seq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v_cache = torch.randn_like(k_cache)
        positions = torch.full((batch, 1), args.context, device="cuda", dtype=torch.long)
        want = reference(q, k_cache, v_cache, positions, d**-0.5)
        roof_us = 2 * batch * hkv * (args.context + 1) * d * 2 / bw * 1e6
        for impl in args.impls.split(","):
            torch._dynamo.reset()
            fn = torch.compile(lambda q, kc, vc, pos, impl=impl: decode_attention(q, kc, vc, pos, d**-0.5, impl))
            try:
                graph, out = capture(fn, (q, k_cache, v_cache, positions))
                us = time_replays(graph, 200) * 1e3
                err = ((out.float() - want.float()).norm() / want.float().norm()).item()
                rows.append([batch, impl, f"{us:.1f}", f"{roof_us:.2f}", f"{us / roof_us:.1f}x", f"{err:.1e}"])
            except Exception as e:  # report and go on: one formulation failing must not hide the others
                rows.append([batch, impl, "FAILED", f"{roof_us:.2f}", "-", f"{type(e).__name__}: {str(e)[:80]}"])
            log(" ".join(map(str, rows[-1])))
    from tabulate import tabulate

    print(tabulate(rows, headers=["batch", "impl", "us", "roofline us", "x roofline", "rel err vs fp32"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
