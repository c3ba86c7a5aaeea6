"""Probe: the residual add + RMSNorm + group quant made inside the GEMV's launch by one of its programs, while the
others wait with their first weight chunk in flight, against the norm launch then the GEMV. One row (batch 1), the
qkv and gate_up shapes (the GEMVs that follow a norm).

    python benchmarks/norm_gemv.py                 # on the H200: ~40 s
    python benchmarks/norm_gemv.py --dry-run       # CPU, Triton interpreter, one tiny shape: checks the script

- "pair": ``add_rms_norm_group_quant`` (the pass's op), then ``gemv_mm`` at the TABLE's GEMV config for the shape;
- "fused": ``norm_gemv.add_rms_norm_quant_gemv`` at the same config (``--maxnreg``: also with registers capped);
- "gemv": the GEMV alone (the floor the fused launch approaches if the norm hides under the weight loads).
Checked first: the residual sum bit for bit the pair's, q within one fp8 step (the count that differ reported), the
output's relative error. Timing as ``gemv_norm_tail.py``: CUDA-graph replays cycling weight copies beyond the L2,
medians.
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

from _timing import time_graph  # noqa: E402
from tabulate import tabulate  # noqa: E402

from fp8_fusion_pass import arch  # noqa: E402
from fp8_fusion_pass.kernels import reference as ref  # noqa: E402
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm  # noqa: E402
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm  # noqa: E402
from fp8_fusion_pass.kernels.triton.norm_gemv import add_rms_norm_quant_gemv  # noqa: E402
from fp8_fusion_pass.kernels.triton.rms_norm_group_quant import add_rms_norm_group_quant  # noqa: E402

SHAPES = [  # (name, N, K = hidden)
    ("qwen3-32b qkv", 10240, 5120), ("qwen3-32b gate_up", 51200, 5120),
    ("8b qkv", 6144, 4096), ("qwen3-8b gate_up", 24576, 4096), ("llama3.1-8b gate_up", 28672, 4096),
]  # fmt: skip
DEVICE = "cuda"  # "cpu" under --dry-run
ROTATE_BYTES = 150e6
G = 128
EPS = 1e-6


def log(msg: str) -> None:
    print(f"[norm_gemv {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_point(name: str, n: int, k: int, config: GemvConfig, maxnregs: list, modes: list) -> list[dict]:
    fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
    copies = max(2, math.ceil(ROTATE_BYTES / (n * k)))
    ws = [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05, (128, 128),
                                        fp8, fp8_max) for _ in range(copies)]  # fmt: skip
    x = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    norm_w = 1 + 0.1 * torch.randn(k, device=DEVICE, dtype=torch.bfloat16)
    xq, xs = ref.group_quant(x, G, fp8, fp8_max)
    dry = DEVICE == "cpu"

    def gemv(c):
        return gemv_mm(xq, xs, *ws[c], torch.bfloat16, config)

    def pair(c):
        q, s, res = add_rms_norm_group_quant(x, residual, norm_w, EPS, G)
        return gemv_mm(q, s, *ws[c], torch.bfloat16, config), q, s, res

    o1, q1, s1, r1 = pair(0)
    rows = []
    base = {"shape": name, "config": str(config), "gemv_us": time_graph(gemv, copies, dry),
            "pair_us": time_graph(pair, copies, dry)}  # fmt: skip
    for maxnreg, mode in [(r, m) for r in maxnregs for m in modes]:
        def fused(c, maxnreg=maxnreg, mode=mode):
            return add_rms_norm_quant_gemv(x, residual, norm_w, EPS, *ws[c], torch.bfloat16, config, maxnreg, mode)

        o2, q2, s2, r2 = fused(0)
        differ, err = "-", float("nan")
        if mode == 0:  # modes 1 / 2 time the launch without the norm: their q is not made
            steps = (q1.float() - q2.float()).abs() / torch.maximum(q1.float().abs(), q2.float().abs()).clamp_min(1e-30)
            if not torch.equal(r1, r2) or int((steps > 0.2).sum()):
                raise SystemExit(f"{name}: the fused launch's residual sum / quant differ from the pair's: WRONG")
            err = ((o2.float() - o1.float()).norm() / o1.float().norm()).item()
            differ = int((q1.view(torch.uint8) != q2.view(torch.uint8)).sum())
        rows.append({**base, "maxnreg": maxnreg or "-", "mode": mode, "fused_us": time_graph(fused, copies, dry),
                     "q_differing": differ, "out_rel_err": err})
        log(str(rows[-1]))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    p.add_argument("--maxnreg", default="", help="comma-separated register caps to try beside none (e.g. 96)")
    p.add_argument("--modes", default="0", help="0 the fused kernel; 1 without the norm; 2 without the wait too")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/norm_gemv.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    a = arch.arch_of(DEVICE)
    shapes = [("tiny", 256, 640)] if args.dry_run else SHAPES  # 640 = 512 + 128: a main and a tail tile
    maxnregs = [None] + [int(r) for r in args.maxnreg.split(",") if r]
    rows = []
    for name, n, k in shapes:
        choice = bm.plan(a, DEVICE, arch.fp8_dtype(DEVICE), 1, n, k, G, torch.bfloat16)
        config = choice.config if choice.path == "gemv" else GemvConfig(8, 1024, 4, 1)
        if args.dry_run:
            config = GemvConfig(4, 256, 4, 1)
        log(f"{name}: GEMV {config}")
        rows += run_point(name, n, k, config, maxnregs, [int(m) for m in args.modes.split(",")])
    print(tabulate([[r["shape"], r["config"], r["gemv_us"], r["pair_us"], r["maxnreg"], r["mode"], r["fused_us"],
                     r["pair_us"] - r["fused_us"], r["q_differing"], f"{r['out_rel_err']:.1e}"] for r in rows],
                   headers=["GEMV", "config", "GEMV us", "norm + GEMV us", "maxnreg", "mode", "fused us", "saved us",
                            "q differing", "out rel err"], floatfmt=".2f"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
