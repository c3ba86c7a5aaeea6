"""The GEMV that quantizes its own bf16 input against the group-quant launch and the GEMM it replaces, and the
rows of ``group_quant_blockscale_mm.TABLE`` that they imply.

    python benchmarks/quant_gemm.py --ms 1 --json quant_gemm.json
    python benchmarks/quant_gemm.py --dry-run        # CPU, Triton interpreter, one tiny shape: checks the script

For the o_proj shapes of Qwen3-8B / Llama-3.1-8B and Qwen3-32B (and, for comparison, qkv and down), N x K, at
M <= 4 where ``blockscale_mm`` runs the GEMV:
- "unfused": ``group_quant`` then ``blockscale_mm`` (its TABLE path), what the graph runs without ``quant_gemm``;
- "fused": ``gemv_mm_bf16`` at the GEMV config ``blockscale_mm`` runs there, first checked to be bit for bit the
  unfused pair (WRONG otherwise);
- "sweep" (``--sweep``): ``gemv_mm_bf16`` at other GEMV configs (``SWEEP``), each checked bit for bit against
  ``group_quant`` + ``gemv_mm`` at its own config (WRONG otherwise: never chosen);
- the roofline: the fp8 weight and its scales, the bf16 activation and output, over the copy bandwidth.
Timing as ``benchmarks/gemm.py``: CUDA-graph replays cycling weight copies beyond 3x the 50 MB L2, medians.
A TABLE row names the best fused config (of "fused" and the sweep) where it beat the pair by more than
``MARGIN``, else None.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _script
from _timing import copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm, gemv_mm_bf16
from fp8_fusion_pass.kernels.triton.group_quant import group_quant

# (name, N, K) at TP1
SHAPES = [("qwen3-8b / llama3.1-8b o", 4096, 4096), ("qwen3-32b o", 5120, 8192), ("qwen3-8b qkv", 6144, 4096),
          ("llama3.1-8b down", 4096, 14336)]  # fmt: skip
DEVICE = "cuda"  # "cpu" under --dry-run
MARGIN = 0.02  # the fused launch must beat the pair by more than this (run-to-run noise ~2%)
G = 128
# --sweep: (rows, k_chunk, warps, stages). More rows per program quantize the activation fewer times in all;
# 2 warps: the plain GEMV's best at one row on most shapes (blockscale_mm.TABLE, GEMV_WIDE).
SWEEP = [(r, c, w, st) for r in (4, 8, 16, 32) for c in (512, 1024, 2048) for w in (2, 4) for st in (1, 3)]


def log(msg: str) -> None:
    print(f"[quant_gemm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sweep(x, ws, copies: int) -> dict[GemvConfig, float | str]:
    out: dict[GemvConfig, float | str] = {}
    for cfg in (GemvConfig(*f) for f in SWEEP):
        fused = lambda c, cfg=cfg: gemv_mm_bf16(x, *ws[c], torch.bfloat16, cfg)
        if not torch.equal(fused(0), gemv_mm(*group_quant(x, G), *ws[0], torch.bfloat16, cfg)):
            out[cfg] = "WRONG"
            continue
        out[cfg] = time_graph(fused, copies, DEVICE == "cpu")
    return out


def run_point(name: str, n: int, k: int, m: int, bw: float, a: arch.Arch,
              with_sweep: bool = False) -> tuple[dict, str | None]:  # fmt: skip
    fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
    copies = rotating_copies(n * k, DEVICE == "cpu")
    ws = [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05, (128, 128),
                                        fp8, fp8_max) for _ in range(copies)]  # fmt: skip
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    choice = bm.plan(a, DEVICE, fp8, m, n, k, G, torch.bfloat16)
    roof = (n * k + (n // 128) * (k // 128) * 4 + 2 * m * k + 2 * m * n) / bw * 1e6

    def pair(c):
        return bm.blockscale_mm(*group_quant(x, G), *ws[c], torch.bfloat16)

    unfused = time_graph(pair, copies, DEVICE == "cpu")
    result = {"shape": name, "M": m, "N": n, "K": k, "path": choice.path, "config": str(choice.config),
              "roofline_us": roof, "unfused_us": unfused, "fused_us": None, "best_config": None}  # fmt: skip
    timed: dict[GemvConfig, float] = {}
    if choice.path == "gemv":  # blockscale_mm's own GEMV config: bit for bit the unfused pair itself
        fused_call = lambda c: gemv_mm_bf16(x, *ws[c], torch.bfloat16, choice.config)
        if torch.equal(fused_call(0), pair(0)):
            timed[choice.config] = result["fused_us"] = time_graph(fused_call, copies, DEVICE == "cpu")
        else:
            log(f"  {name} M={m}: WRONG (not bit for bit the pair)")
            result["fused_us"] = "WRONG"
    if with_sweep:
        swept = sweep(x, ws, copies)
        result["sweep"] = {str(c): t for c, t in swept.items()}
        timed.update({c: t for c, t in swept.items() if isinstance(t, float)})
    if not timed:
        return result, None
    best = min(timed, key=timed.get)
    wins = timed[best] < unfused * (1 - MARGIN)
    result["best_config"], result["best_us"] = str(best), timed[best]
    row = (f"    # fused {timed[best]:.2f} us vs unfused {unfused:.2f} us, roofline {roof:.2f} us\n"
           f"    ({a.name!r}, {bm.m_bucket(m)}, {n}, {k}): {best if wins else None},")  # fmt: skip
    return result, row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1,4", help="comma-separated row counts (<= 4: the GEMV's)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--sweep", action="store_true", help="also time the quantizing GEMV at the SWEEP configs")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    a = arch.arch_of(DEVICE)
    ms, shapes = [int(v) for v in args.ms.split(",")], SHAPES
    if args.dry_run:
        ms, shapes = [1], [("tiny", 256, 512)]
        bm.TABLE[(a.name, 1, 256, 512)] = bm.Choice("gemv", bm.GemvConfig(4, 256, 4, 1))  # this process only
    bw = copy_bandwidth(args.dry_run)
    log(_script.setup_line(DEVICE, a.name, bw))
    rows, table = [], []
    for sname, n, k in shapes:
        for m in ms:
            log(f"{sname} M={m}")
            r, t = run_point(sname, n, k, m, bw, a, args.sweep)
            rows.append(r)
            if t:
                table.append(t)
    print(tabulate([[r["shape"], r["M"], r["path"], r["roofline_us"], r["unfused_us"], r["fused_us"] or "-",
                     r.get("best_us", "-"), r["best_config"] or "-"] for r in rows],
                   headers=["shape", "M", "blockscale_mm path", "roofline", "unfused", "fused (its config)",
                            "fused (best)", "best config"], floatfmt=".2f"))  # fmt: skip
    print(f"\nTABLE rows ({_script.provenance(DEVICE, bw, __file__)}):")
    print("\n".join(table))
    _script.write_json(args.json, bw, DEVICE, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
