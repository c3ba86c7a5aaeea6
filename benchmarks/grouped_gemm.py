"""HF's separate q / k / v and gate / up GEMMs at decode: one grouped launch (the GEMV or the small-M kernel)
against the separate launches and the merged weight's GEMM, at the row counts where ``blockscale_mm_grouped``
runs the GEMV (M = 1) and the small-M kernel (M = 2-4).

    python benchmarks/grouped_gemm.py --ms 1 --json grouped_gemm.json
    python benchmarks/grouped_gemm.py --dry-run        # CPU, Triton interpreter, one tiny shape: checks the script

For each group of weights (N_i x K) of Qwen3-8B, Llama-3.1-8B and Qwen3-32B at TP1:
- "separate": ``blockscale_mm`` per weight (each its TABLE path), what the graph runs without ``group_gemm``;
- "grouped GEMV": ``gemv_mm_grouped`` at the merged shape's TABLE config, what ``blockscale_mm_grouped`` runs there
  since cd6548b, first checked bit for bit against the separate GEMVs at that config (WRONG otherwise);
- "grouped small-M": ``small_m_mm_grouped`` at ``blockscale_mm.small_m_plan``'s config (``SMALL_M_BEST`` beside a
  GEMV row: what it ran there before cd6548b; the TABLE's small-M row at M = 2-4: what it runs there);
- "merged GEMV": ``blockscale_mm`` on one merged [sum N_i, K] weight (the engine form's), the loop the grouped
  GEMV runs;
- the roofline: weight and scale bytes, activation and output, over the copy bandwidth.
Timing as ``benchmarks/gemm.py``: CUDA-graph replays cycling weight copies beyond 3x the 50 MB L2, medians.
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
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm, gemv_mm_grouped
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig, small_m_mm_grouped

# (name, [N_i], K) at TP1: the HF form's separate projections
SHAPES = [("qwen3-8b q|k|v", [4096, 1024, 1024], 4096), ("qwen3-8b gate|up", [12288, 12288], 4096),
          ("llama3.1-8b q|k|v", [4096, 1024, 1024], 4096), ("llama3.1-8b gate|up", [14336, 14336], 4096),
          ("qwen3-32b q|k|v", [8192, 1024, 1024], 5120), ("qwen3-32b gate|up", [25600, 25600], 5120)]  # fmt: skip
DEVICE = "cuda"  # "cpu" under --dry-run
G = 128


def log(msg: str) -> None:
    print(f"[grouped_gemm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_point(name: str, ns: list[int], k: int, m: int, bw: float, a: arch.Arch) -> dict:
    fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
    n = sum(ns)
    copies = rotating_copies(n * k, DEVICE == "cpu")
    merged = [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05,
                                            (128, 128), fp8, fp8_max) for _ in range(copies)]  # fmt: skip
    starts = [sum(ns[:i]) for i in range(len(ns))]
    parts = [([w[s:s + ni] for s, ni in zip(starts, ns)], [sc[s // 128:(s + ni) // 128] for s, ni in zip(starts, ns)])
             for w, sc in merged]  # fmt: skip
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    q, xs = ref.group_quant(x, G, fp8, fp8_max)
    plan = bm.plan(a, DEVICE, fp8, m, n, k, G, torch.bfloat16)
    small = bm.small_m_plan(a, DEVICE, fp8, m, n, k, G, torch.bfloat16)
    roof = (n * k + (n // 128) * (k // 128) * 4 + m * k + 2 * m * n) / bw * 1e6
    out = {"shape": name, "M": m, "N": ns, "K": k, "merged_plan": str(plan), "roofline_us": roof,
           "pass_runs": "grouped GEMV" if plan.path == "gemv" else "grouped small-M" if small else "separate"}
    out["separate_us"] = time_graph(lambda c: [bm.blockscale_mm(q, xs, w, s, torch.bfloat16)
                                               for w, s in zip(*parts[c])], copies, DEVICE == "cpu")  # fmt: skip
    out["merged_us"] = time_graph(lambda c: bm.blockscale_mm(q, xs, *merged[c], torch.bfloat16), copies,
                                  DEVICE == "cpu")  # fmt: skip
    if small is not None:
        out["grouped_small_m_us"] = time_graph(
            lambda c: small_m_mm_grouped(q, xs, *parts[c], torch.bfloat16, small.config), copies, DEVICE == "cpu")
    if plan.path == "gemv":
        cfg = plan.config or GemvConfig()
        got = gemv_mm_grouped(q, xs, *parts[0], torch.bfloat16, cfg)
        want = torch.cat([gemv_mm(q, xs, w, s, torch.bfloat16, cfg) for w, s in zip(*parts[0])], -1)
        grouped = lambda c: gemv_mm_grouped(q, xs, *parts[c], torch.bfloat16, cfg)
        out["grouped_gemv_us"] = time_graph(grouped, copies, DEVICE == "cpu") if torch.equal(got, want) else "WRONG"
    return out


def _us(v) -> str:
    # one format for every time column: tabulate's floatfmt skips a column that also holds "-" or "WRONG"
    # (and its number parsing is off at the call, or it would re-format these strings)
    return str(v) if isinstance(v, str) else f"{v:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1", help="comma-separated row counts (the GEMV's: <= 4)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    a = arch.arch_of(DEVICE)
    ms, shapes = [int(v) for v in args.ms.split(",")], SHAPES
    if args.dry_run:
        ms, shapes = [1], [("tiny q|k|v", [256, 128, 128], 256)]
        # this process only; 16 rows a program: 32 programs, each ~25 ms of Python under the interpreter
        bm.TABLE[(a.name, 1, 512, 256)] = bm.Choice("gemv", GemvConfig(16, 256, 4, 1))
        bm.SMALL_M_BEST[(a.name, 1, 512, 256)] = SmallMConfig(64, 1, 4, 2, "last")
    bw = copy_bandwidth(args.dry_run)
    log(_script.setup_line(DEVICE, a.name, bw))
    rows = []
    for sname, ns, k in shapes:
        for m in ms:
            log(f"{sname} M={m}")
            rows.append(run_point(sname, ns, k, m, bw, a))
    cols = ["roofline_us", "separate_us", "grouped_small_m_us", "grouped_gemv_us", "merged_us"]
    print(tabulate([[r["shape"], r["M"], *(_us(r.get(c, "-")) for c in cols), r["pass_runs"]] for r in rows],
                   headers=["weights", "M", "roofline", "separate", "grouped small-M", "grouped GEMV", "merged",
                            "the pass runs"], disable_numparse=True))  # fmt: skip
    print(f"\n({_script.provenance(DEVICE, bw, __file__)})")
    _script.write_json(args.json, bw, DEVICE, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
