"""Probe: the next GEMM's weight hinted into L2 by the launch before it (the norm, the attention), at batch 1.

    PYTHONPATH=. python benchmarks/l2_prefetch.py               # on the H200: ~1 min (the norm windows)
    PYTHONPATH=. python benchmarks/l2_prefetch.py --attention   # also the attention -> o_proj window
    PYTHONPATH=. python benchmarks/l2_prefetch.py --dry-run     # CPU, Triton interpreter: checks the script

Why: at batch 1 a decode layer's attention (7.75 us at Qwen3-32B) reads 2 MB of cache while HBM could stream ~30 MB,
and the o_proj GEMV after it then streams its 42 MB weight from HBM near the read floor. If the attention's programs
issue ``cp.async.bulk.prefetch.L2`` for the first part of that weight (``kernels/triton/_l2_prefetch.py``), the GEMV
finds it in L2 (50 MB on the H200). The question before a rewrite passes the weight to the attention: how much does
the pair gain, and at which share of the weight, and what does the attention itself lose?

Per shape (the o_proj after the attention, 512 of 576 cache slots seen, the o_proj quant in the attention's launch,
as the pass leaves it), CUDA-graph replays cycling copies of the weight and caches beyond L2, medians:
- "attn" / "gemv": each alone (the attention without and with the prefetch of the whole weight);
- "pair": the attention then ``blockscale_mm`` (the TABLE's GEMV);
- "pair pf F": the attention prefetching the first F MB of the weight, then the GEMV;
- "launch pf F": a separate prefetch launch (``l2_prefetch``) of F before the pair, to see what the launch costs.
The norm windows (the default): ``add_rms_norm_group_quant`` (2.5 us at 5120) then the qkv / gate_up GEMM, "pair"
against the norm's launch with 132 extra programs that prefetch the first MB of the GEMM's weight ("in-norm pf",
bulk; "lines": ``prefetch.global.L2`` per 128-byte line) and against a separate prefetch launch before the norm
("launch pf"); "launch alone" times that launch by itself (does it last until its bytes arrive?).
Checked first: with the prefetch, the attention's q / scales and the GEMV output bit for bit those without.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _timing import time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import ops  # noqa: F401 - registers torch.ops.fp8_fusion
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton._l2_prefetch import l2_prefetch
from fp8_fusion_pass.kernels.triton.decode_attention import decode_attention_upto_quant
from fp8_fusion_pass.kernels.triton.rms_norm_group_quant import add_rms_norm_group_quant

# (name, kv heads, query rows per kv head, head_dim, o_proj N = hidden, in-kernel prefetch MB)
ATTENTION = [("qwen3-32b", 8, 8, 128, 5120, (10, 20, 30, 42)), ("qwen3-8b / llama3.1-8b", 8, 4, 128, 4096, (8, 17))]
# (name, hidden, the GEMM after the norm: N, prefetch MB)
NORM = [("qwen3-32b qkv", 5120, 10240, (4, 8, 16)), ("qwen3-32b gate_up", 5120, 51200, (4, 8, 16, 24)),
        ("qwen3-8b qkv", 4096, 6144, (4, 8)), ("qwen3-8b gate_up", 4096, 24576, (4, 8, 16))]
L2_PROGRAMS = 132  # the norm's extra programs that prefetch (one per SM)
SLOTS, SEEN = 576, 512
ROTATE_BYTES = 200e6
G = 128
DEVICE = "cuda"  # "cpu" under --dry-run


def log(msg: str) -> None:
    print(f"[l2_prefetch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _weights(n: int, k: int) -> list:
    fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
    return [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05, (128, 128),
                                          fp8, fp8_max) for _ in range(max(3, math.ceil(ROTATE_BYTES / (n * k))))]  # fmt: skip


def _gemm(q, s, w):
    return torch.ops.fp8_fusion.blockscale_mm(q.reshape(1, -1), s.reshape(1, -1), *w, torch.bfloat16)


def _rows(name: str, w_bytes: int, t: dict) -> list[dict]:
    log(f"{name}: " + ", ".join(f"{key} {v:.2f}" for key, v in t.items()))
    return [{"shape": name, "weight MB": w_bytes / 1e6, "variant": key, "us": v, "vs pair": v / t["pair"]}
            for key, v in t.items()]


def run_attention(name: str, hkv: int, r: int, d: int, n: int, mbs) -> list[dict]:
    k = hkv * r * d
    ws = _weights(n, k)
    copies = len(ws)
    caches = [(torch.randn(1, hkv, SLOTS, d, device=DEVICE, dtype=torch.bfloat16),
               torch.randn(1, hkv, SLOTS, d, device=DEVICE, dtype=torch.bfloat16)) for _ in range(copies)]  # fmt: skip
    q = torch.randn(1, hkv, r, d, device=DEVICE, dtype=torch.bfloat16)
    last = torch.full((1,), SEEN - 1, device=DEVICE, dtype=torch.long)

    def attn(c, mb=0):
        return decode_attention_upto_quant(q, *caches[c], last, d**-0.5, G, prefetch=ws[c][0],
                                           prefetch_bytes=int(mb * 1e6))  # fmt: skip

    def pair(c, mb=0):
        return _gemm(*attn(c, mb), ws[c])

    def launched(c, mb):
        l2_prefetch(ws[c][0], int(mb * 1e6))
        return pair(c)

    oq0, s0 = attn(0)
    base = pair(0)
    for mb in mbs:
        oq, s = attn(0, mb)
        if not (torch.equal(oq.view(torch.uint8), oq0.view(torch.uint8)) and torch.equal(s, s0)
                and torch.equal(pair(0, mb), base)):  # fmt: skip
            raise SystemExit(f"{name}: with a prefetch of {mb} MB the outputs differ: WRONG")
    dry = DEVICE == "cpu"
    t = {"attn": time_graph(attn, copies, dry), f"attn pf {mbs[-1]}": time_graph(lambda c: attn(c, mbs[-1]), copies, dry),
         "gemv": time_graph(lambda c: _gemm(oq0, s0, ws[c]), copies, dry), "pair": time_graph(pair, copies, dry)}
    for mb in mbs:
        t[f"pair pf {mb}"] = time_graph(lambda c, mb=mb: pair(c, mb), copies, dry)
    t[f"launch pf {mbs[-1]}"] = time_graph(lambda c: launched(c, mbs[-1]), copies, dry)
    return _rows(f"attention -> o {n}x{k} ({name})", n * k, t)


def run_norm(name: str, hidden: int, n: int, mbs) -> list[dict]:
    ws = _weights(n, hidden)
    x, res = (torch.randn(1, hidden, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    nw = 1 + 0.1 * torch.randn(hidden, device=DEVICE, dtype=torch.bfloat16)

    def pair(c, mb=0, lines=False):  # mb > 0: the norm's launch prefetches (L2_PROGRAMS extra programs)
        q, s, _ = add_rms_norm_group_quant(x, res, nw, 1e-6, G, prefetch=(ws[c][0], int(mb * 1e6), L2_PROGRAMS, lines))
        return _gemm(q, s, ws[c])

    def launched(c, mb, lines=False):
        l2_prefetch(ws[c][0], int(mb * 1e6), lines=lines)
        return pair(c)

    base = pair(0)
    for mb in mbs:
        for lines in (False, True):
            if not torch.equal(pair(0, mb, lines), base):
                raise SystemExit(f"{name}: with the norm prefetching {mb} MB the GEMM output differs: WRONG")
    dry, copies = DEVICE == "cpu", len(ws)
    t = {"pair": time_graph(pair, copies, dry),
         f"launch alone {mbs[-1]}": time_graph(lambda c: l2_prefetch(ws[c][0], int(mbs[-1] * 1e6)), copies, dry),
         f"launch alone lines {mbs[-1]}": time_graph(lambda c: l2_prefetch(ws[c][0], int(mbs[-1] * 1e6), lines=True),
                                                     copies, dry)}  # fmt: skip
    for mb in mbs:
        t[f"launch pf {mb}"] = time_graph(lambda c, mb=mb: launched(c, mb), copies, dry)
        t[f"launch lines pf {mb}"] = time_graph(lambda c, mb=mb: launched(c, mb, True), copies, dry)
        t[f"in-norm pf {mb}"] = time_graph(lambda c, mb=mb: pair(c, mb), copies, dry)
        t[f"in-norm lines pf {mb}"] = time_graph(lambda c, mb=mb: pair(c, mb, True), copies, dry)
    return _rows(f"add_norm_quant -> {n}x{hidden} ({name})", n * hidden, t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    p.add_argument("--attention", action="store_true", help="also the attention -> o_proj window (first run's)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/l2_prefetch.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    attention = [("tiny", 2, 2, 128, 384, (0.1,))] if args.dry_run else ATTENTION
    norm = [("tiny", 256, 384, (0.1,))] if args.dry_run else NORM
    rows = [row for shape in norm for row in run_norm(*shape)]
    if args.attention or args.dry_run:
        rows += [row for shape in attention for row in run_attention(*shape)]
    print(tabulate([[r["shape"], r["weight MB"], r["variant"], r["us"], r["vs pair"]] for r in rows],
                   headers=["shape", "o_proj weight MB", "variant", "us", "/ pair"], floatfmt=".3f"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
