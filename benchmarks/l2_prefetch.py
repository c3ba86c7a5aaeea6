"""The next GEMM's weight hinted into L2 by the fused norm's launch before it, at batch 1 (``l2_prefetch``).

    PYTHONPATH=. python benchmarks/l2_prefetch.py               # on the H200: ~30 s
    PYTHONPATH=. python benchmarks/l2_prefetch.py --dry-run     # CPU, Triton interpreter: checks the script

Why: at batch 1 the GEMV after a norm streams its weight from HBM near the read floor, and the norm's launch
(~2.5 us) reads a few KB: HBM idles meanwhile. ``add_rms_norm_group_quant(..., prefetch=W)`` adds one program per SM
to the norm's launch that issues ``cp.async.bulk.prefetch.L2`` for W's first bytes (``kernels/triton/
_l2_prefetch.py``), so the GEMV finds them in L2.

Per shape (the norm at the model's hidden size, then the qkv or gate_up GEMM as ``blockscale_mm`` runs it), CUDA-graph
replays cycling copies of the weight beyond L2, medians:
- "pair": the norm, then the GEMM;
- "in-norm pf MB": the norm's launch hinting the weight's first MB, then the GEMM (the library's: 8 MB);
- "launch pf MB": a prefetch launch of its own before the pair; "launch alone": that launch by itself.
Checked first: with the hint, the GEMM output bit for bit the pair's.

Measured (H200, 2026-12-03, docs/benchmarks.md "The next GEMM's weight into L2 at batch 1"). The first run (commit
56735bf, ``--attention`` there) also had the decode attention issue the hint for the o_proj's weight from its own
programs before its key loop: the attention then waited behind the prefetch, slower at every size; removed.
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
from fp8_fusion_pass.kernels.triton.rms_norm import launch

# (name, hidden, the GEMM after the norm: N, prefetch MB)
NORM = [("qwen3-32b qkv", 5120, 10240, (4, 8, 16)), ("qwen3-32b gate_up", 5120, 51200, (4, 8, 16, 24)),
        ("qwen3-8b qkv", 4096, 6144, (4, 8)), ("qwen3-8b gate_up", 4096, 24576, (4, 8, 16))]
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


def run_norm(name: str, hidden: int, n: int, mbs) -> list[dict]:
    ws = _weights(n, hidden)
    x, res = (torch.randn(1, hidden, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    nw = 1 + 0.1 * torch.randn(hidden, device=DEVICE, dtype=torch.bfloat16)

    def pair(c, mb=0):  # mb > 0: the norm's launch hints the weight's first mb MB
        (q, s), _ = launch(x, nw, 1e-6, res, G, prefetch=ws[c][0] if mb else None, prefetch_nbytes=int(mb * 1e6))
        return _gemm(q, s, ws[c])

    def launched(c, mb):
        l2_prefetch(ws[c][0], int(mb * 1e6))
        return pair(c)

    base = pair(0)
    for mb in mbs:
        if not torch.equal(pair(0, mb), base):
            raise SystemExit(f"{name}: with the norm hinting {mb} MB the GEMM output differs: WRONG")
    dry, copies = DEVICE == "cpu", len(ws)
    t = {"pair": time_graph(pair, copies, dry),
         f"launch alone {mbs[-1]}": time_graph(lambda c: l2_prefetch(ws[c][0], int(mbs[-1] * 1e6)), copies, dry)}
    for mb in mbs:
        t[f"in-norm pf {mb}"] = time_graph(lambda c, mb=mb: pair(c, mb), copies, dry)
    for mb in mbs[:2]:
        t[f"launch pf {mb}"] = time_graph(lambda c, mb=mb: launched(c, mb), copies, dry)
    return _rows(f"add_norm_quant -> {n}x{hidden} ({name})", n * hidden, t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/l2_prefetch.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    norm = [("tiny", 256, 384, (0.1,))] if args.dry_run else NORM
    rows = [row for shape in norm for row in run_norm(*shape)]
    print(tabulate([[r["shape"], r["weight MB"], r["variant"], r["us"], r["vs pair"]] for r in rows],
                   headers=["norm -> GEMM", "weight MB", "variant", "us", "/ pair"], floatfmt=".3f"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
