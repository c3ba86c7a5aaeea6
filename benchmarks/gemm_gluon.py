"""Tuning idea 18 on the GPU: the Gluon small-M GEMM (two MMAs in flight) against the committed TABLE row.

    python benchmarks/gemm_gluon.py --ms 16,32,64 --json gemm_gluon.json
    python benchmarks/gemm_gluon.py --ms 64 --only qwen3-8b --json g.json      # a subset of the shapes

For each shape of ``gemm.py`` and M: the TABLE row's path at its config, and the Gluon kernel
(``_small_m_gluon.small_m_gluon_mm``) over a small sweep (64-row weight tiles, 4 / 6 stages, split-K 1 / 2 / 4
with the two-launch sum), each checked against the fp32 oracle first (WRONG otherwise, never chosen) and timed as
``gemm.py`` times (CUDA-graph medians, weights rotating beyond the L2); also the read floor of the same bytes.
Hopper only. Prints the best Gluon config per point and its ratio to the TABLE row: below 1 is faster.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import _script
import gemm
from _read_floor import ReadFloor
from _timing import copy_bandwidth
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _small_m_gluon as glu
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm

SWEEP = [(64, split, stages) for split in (1, 2, 4) for stages in (4, 6)]  # (block_n, split_k, stages)


def log(msg: str) -> None:
    print(f"[gemm_gluon {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_point(shape: gemm.Shape, m: int, a: arch.Arch, floor: ReadFloor, bw: float) -> dict:
    n, k = shape.n, shape.k
    _, q, xs = shape.inputs(m)
    want = ref.dequant_activation(q, xs) @ shape.w32.t()
    row = {"N": n, "K": k, "M": m, "roofline_us": shape.roofline_us(m, bw), "read_floor_us": floor.us(shape.min_bytes(m))}
    committed = bm.TABLE.get((a.name, bm.m_bucket(m), n, k))
    if committed is not None:
        row["table_config"] = f"{committed.path} {committed.config!r}"
        row["table_us"] = gemm.measure(shape, q, xs, want, committed.path, committed.config)
    gl_times = {}
    for block_n, split, stages in SWEEP:
        call = lambda i, b=block_n, s=split, st=stages: glu.small_m_gluon_mm(q, xs, *shape.w8[i], torch.bfloat16,
                                                                            block_n=b, split_k=s, stages=st)  # noqa: E731
        gl_times[(block_n, split, stages)] = gemm.timed(f"gluon bn{block_n} split{split} st{stages}", call, want,
                                                        shape.copies)  # fmt: skip
    ok = {c: v for c, v in gl_times.items() if isinstance(v, float)}
    best = min(ok, key=ok.get) if ok else None
    row["gluon_us"] = {repr(c): v for c, v in gl_times.items()}
    row["gluon_best_config"] = repr(best)
    row["gluon_best_us"] = ok.get(best)
    t = row.get("table_us")
    if best is not None and isinstance(t, float):
        row["gluon_over_table"] = ok[best] / t
    log(f"{n}x{k} M={m}: TABLE {t} us, gluon best {best} {ok.get(best)} us")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="16,32,64")
    p.add_argument("--only", default="", help="substring of the shape names to keep")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not glu.available():
        print("gemm_gluon.py needs a Hopper GPU and Triton's Gluon", file=sys.stderr)
        return 2
    a = arch.arch_of(torch.device("cuda"))
    bw = copy_bandwidth()
    floor = ReadFloor()
    rows = []
    for name, n, k in gemm.SHAPES:
        if args.only and args.only not in name:
            continue
        shape = gemm.Shape(n, k)
        for m in (int(s) for s in args.ms.split(",")):
            row = run_point(shape, m, a, floor, bw)
            row["shape"] = name
            rows.append(row)
        del shape
        torch.cuda.empty_cache()
    table = [[r["shape"], r["M"], f"{r['roofline_us']:.1f}", f"{r['read_floor_us']:.1f}", gemm._fmt(r.get("table_us")),
              gemm._fmt(r["gluon_best_us"]), r["gluon_best_config"],
              f"{r['gluon_over_table']:.3f}" if "gluon_over_table" in r else "-"] for r in rows]  # fmt: skip
    print(tabulate(table, headers=["shape", "M", "roofline", "read floor", "TABLE", "gluon best", "(bn, split, stages)",
                                   "gluon / TABLE"]))  # fmt: skip
    if args.json:
        _script.write_json(args.json, bw, "cuda", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
