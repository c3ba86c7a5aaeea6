"""What one launch costs in the benchmarks' CUDA-graph harness, and how fast a kernel that only *reads* N bytes
can be: the floor under every small-M GEMM and decode-sized kernel in ``gemm.py`` / ``fused_kernels.py``.

    python benchmarks/launch_floor.py [--json floor.json]
    python benchmarks/launch_floor.py --dry-run      # CPU, Triton interpreter: checks the script

Rows: an empty kernel (1 and 132 programs), then a streaming read of N bytes (the sizes of the decode GEMMs'
weights: the 4 MB k / v projection of Qwen3-8B up to Qwen3-32B's 262 MB gate_up) by 132 x k programs, each
summing its slab with 16-byte loads and storing one value (every byte read: the last slab is masked); the best
of k = 1, 2, 4, 8 programs per SM and two block sizes. Timing is ``_timing.time_graph`` (what every other benchmark
uses: back-to-back calls in one CUDA graph, inputs rotating beyond 3x the 50 MB L2), so "read N bytes" is what a plain
streaming read of those bytes from HBM costs here, a yardstick for kernels that must read them; the roofline of the
other tables (bytes / copy bandwidth) has no ramp, and ``read / roofline`` says how far a plain read is from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
from _read_floor import SMS, read_call
from _timing import copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

# 1 MB, then the decode GEMMs' weights: Qwen3-8B k|v, o, qkv, Llama-3.1-8B down, gate_up, Qwen3-32B gate_up
SIZES_MB = (1, 4, 16, 25, 58, 117, 262)


@triton.jit
def _empty_kernel(p):
    pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    dev = "cpu" if args.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("benchmarks/launch_floor.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    bw = copy_bandwidth(args.dry_run)
    out = torch.zeros(8 * SMS, dtype=torch.int32, device=dev)
    rows = []
    for programs in (1, SMS):
        us = time_graph(lambda i, g=programs: _empty_kernel[(g,)](out), 1, args.dry_run)
        rows.append({"kernel": f"empty, {programs} program(s)", "MB": 0, "us": us, "roofline_us": 0.0})
    sizes = (1,) if args.dry_run else SIZES_MB
    for mb in sizes:
        nbytes = int(mb * 1e6) // 4096 * 4096
        copies = rotating_copies(nbytes, args.dry_run)
        bufs = [torch.ones(nbytes // 4, dtype=torch.int32, device=dev) for _ in range(copies)]
        best = None
        for k in ((1,) if args.dry_run else (1, 2, 4, 8)):
            for block in ((256,) if args.dry_run else (512, 2048)):
                us = time_graph(read_call(bufs, out, SMS * k, block), copies, args.dry_run)
                if best is None or us < best[0]:
                    best = (us, k, block)
        roof = nbytes / bw * 1e6
        rows.append({"kernel": f"read {mb} MB ({best[1]} / SM, block {best[2]})", "MB": mb, "us": best[0],
                     "roofline_us": roof})
        del bufs
    print(tabulate([[r["kernel"], r["us"], r["roofline_us"], r["us"] / r["roofline_us"] if r["roofline_us"] else "-",
                     r["MB"] * 1e3 / r["us"] if r["MB"] else "-"] for r in rows],
                   headers=["kernel", "us per call", "roofline us", "read / roofline", "GB/s (1e9)"],
                   floatfmt=".2f"))  # fmt: skip
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu (dry run)"
    print(f"\n{name}, torch {torch.__version__}, Triton {triton.__version__}, copy {bw / 1e12:.2f} TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth": bw, "device": name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
