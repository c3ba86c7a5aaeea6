"""Block-FP8 GEMM paths on one GPU, side by side, and the rows of ``blockscale_mm.TABLE`` that they imply.

    python benchmarks/gemm.py --json gemm.json        # full: estimated 4-6 min on one H200 (cold Triton cache)
    python benchmarks/gemm.py --quick                 # 2 shapes, 4 row counts, a small sweep
    python benchmarks/gemm.py --only qwen3-32b        # a subset of the shapes (split a run that is too long)
    python benchmarks/gemm.py --dry-run               # CPU, Triton interpreter, one tiny shape: checks the script

Estimate of the full run (reasoned, not yet timed): ~110 Triton compiles (~1.5 s each), 90 (shape, M) points of
4 paths plus ~1300 sweep candidates at ~60 ms each (capture + 10 replays).

For the Qwen3-8B / Llama-3.1-8B / Qwen3-32B projection shapes (N x K) and M in ``blockscale_mm.M_BUCKETS``:
bf16 ``torch.mm``, cuBLAS block-wise (``torch._scaled_mm`` with its layout work), the Triton tiled GEMM, the
Triton small-M GEMM (its default config, and the best of a sweep of BLOCK_N x SPLIT_K x warps x stages), and
the roofline: the minimum bytes (fp8 weight + scales + fp8 activation + scales + bf16 output) over the copy
bandwidth measured in the same run.

Timing: each candidate is captured ``reps`` times into one CUDA graph, cycling through enough weight copies
to exceed 3x the 50 MB L2, so every call reads its weight from HBM as a decode step does; the figure is the
median over replays of (replay time / reps). Every candidate is first checked against the fp32 dequantized
oracle (relative error <= 1e-2, else it is reported WRONG and never chosen).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
from tabulate import tabulate  # noqa: E402

from _timing import copy_bandwidth, time_graph  # noqa: E402

from fp8_fusion_pass import arch  # noqa: E402
from fp8_fusion_pass.kernels import reference as ref  # noqa: E402
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm  # noqa: E402
from fp8_fusion_pass.kernels.triton._blockscale_kernels import (  # noqa: E402
    SmallMConfig,
    TiledConfig,
    default_small_m_config,
    default_tiled_config,
)

# (name, N, K): per-GPU projection shapes at TP1 (merged qkv and gate_up, as the engine-form models run them).
SHAPES = [
    ("qwen3-8b qkv", 6144, 4096),
    ("qwen3-8b o", 4096, 4096),
    ("qwen3-8b gate_up", 24576, 4096),
    ("qwen3-8b down", 4096, 12288),
    ("llama3.1-8b gate_up", 28672, 4096),
    ("llama3.1-8b down", 4096, 14336),
    ("qwen3-32b qkv", 10240, 5120),
    ("qwen3-32b o", 5120, 8192),
    ("qwen3-32b gate_up", 51200, 5120),
    ("qwen3-32b down", 5120, 25600),
]
QUICK_SHAPES = [SHAPES[0], SHAPES[9]]
DEVICE = "cuda"  # "cpu" under --dry-run
ROTATE_BYTES = 150e6  # 3x the H200's 50 MB L2
CHECK_REL_ERR = 1e-2  # a wrong kernel is off by > 0.3 (K/128 % 4 on v1); bf16 rounding is ~1e-3
# Small-M sweep (22 configs, 6 compiled variants per M class): tile width x split at 4 stages; a deeper pipeline
# (6 stages: more weight bytes in flight per SM) for the default width; 8 warps for the widest tile; and
# 16-wide tiles, which reach 256 programs at N=4096 without a split (no reduce kernel) but carry only 2 KB
# per stage.
SWEEP_SMALL_M = (
    [SmallMConfig(block_n, split, 4, 4) for block_n, split in itertools.product((32, 64, 128), (1, 2, 4, 8))]
    + [SmallMConfig(64, split, 4, 6) for split in (1, 2, 4, 8)]
    + [SmallMConfig(128, split, 8, 4) for split in (1, 2, 4)]
    + [SmallMConfig(16, split, 4, 6) for split in (1, 2, 4)]
)
QUICK_SWEEP_SMALL_M = [SmallMConfig(b, s, 4, 4) for b in (64, 128) for s in (1, 4)]
SWEEP_TILED = [
    TiledConfig(64, 128, 8, 4, 4),
    TiledConfig(128, 128, 8, 8, 3),
    TiledConfig(128, 128, 8, 4, 4),
    TiledConfig(128, 256, 8, 8, 3),
    TiledConfig(64, 256, 8, 4, 3),
]


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"


def log(msg: str) -> None:
    print(f"[gemm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Shape:
    """Weight copies (fp8 + scales, and bf16) of one projection, and its fp32 dequantization for checks."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
        self.copies = max(2, math.ceil(ROTATE_BYTES / (n * k)))
        self.bf16_copies = max(2, math.ceil(ROTATE_BYTES / (2 * n * k)))
        self.w_bf16 = [torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05 for _ in range(self.bf16_copies)]
        self.w8 = [ref.quantize_weight_blockwise(self.w_bf16[i % self.bf16_copies], (128, 128), fp8, fp8_max)
                   for i in range(self.copies)]  # fmt: skip
        w_q, w_s = self.w8[0]
        self.w32 = ref.dequant_weight(w_q, w_s)

    def inputs(self, m: int):
        x = torch.randn(m, self.k, device=DEVICE, dtype=torch.bfloat16)
        q, xs = ref.group_quant(x, 128, arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE))
        return x, q, xs

    def roofline_us(self, m: int, bw: float) -> float:
        n, k = self.n, self.k
        nbytes = n * k + (n // 128) * (k // 128) * 4 + m * k + m * (k // 128) * 4 + m * n * 2
        return nbytes / bw * 1e6


def measure(shape: Shape, q, xs, want, path: str, config=None) -> float | str:
    """Microseconds per call, or "WRONG" (off the oracle ``want``) / "n/a" (cannot run the shape)."""
    try:
        y = bm.run(path, q, xs, *shape.w8[0], torch.bfloat16, config=config)
    except (ValueError, RuntimeError) as e:  # unsupported shape, or a config the compiler rejects
        log(f"  {path} {config or ''}: n/a ({str(e).splitlines()[0][:100]})")
        return "n/a"
    err = ((y.float() - want).norm() / want.norm()).item()
    if not err <= CHECK_REL_ERR:
        log(f"  {path} {config or ''}: WRONG (rel err {err:.3g})")
        return "WRONG"
    call = lambda i: bm.run(path, q, xs, *shape.w8[i], torch.bfloat16, config=config)  # noqa: E731
    return time_graph(call, shape.copies, DEVICE == "cpu")


def _best(candidates: dict) -> tuple[str, float]:
    timed = {k: v for k, v in candidates.items() if isinstance(v, float)}
    key = min(timed, key=timed.get)
    return key, timed[key]


def run(shapes, ms, small_sweep, tiled_sweep, bw: float, arch_of_run: arch.Arch):
    rows, table_rows = [], []
    for name, n, k in shapes:
        log(f"{name}: N={n} K={k}")
        shape = Shape(n, k)
        for m in ms:
            x, q, xs = shape.inputs(m)
            want = ref.dequant_activation(q, xs) @ shape.w32.t()
            cand: dict = {}
            bf16 = time_graph(lambda i: torch.mm(x, shape.w_bf16[i].t()), shape.bf16_copies, DEVICE == "cpu")
            cand[("cublas", None)] = measure(shape, q, xs, want, "cublas")
            cand[("tiled", None)] = measure(shape, q, xs, want, "tiled")
            if m <= 256:
                cand[("small_m", None)] = measure(shape, q, xs, want, "small_m")
            for cfg in small_sweep if m <= bm.SMALL_M_MAX else []:
                cand[("small_m", cfg)] = measure(shape, q, xs, want, "small_m", cfg)
            for cfg in tiled_sweep if m > bm.SMALL_M_MAX else []:
                cand[("tiled", cfg)] = measure(shape, q, xs, want, "tiled", cfg)
            (path, cfg), best = _best(cand)
            roof = shape.roofline_us(m, bw)
            cub = cand[("cublas", None)]
            small_default = default_small_m_config(n, k, a=arch_of_run)
            small = {c or small_default: v for (p, c), v in cand.items() if p == "small_m"}
            small = {c: v for c, v in small.items() if isinstance(v, float)}
            sm_cfg = min(small, key=small.get) if small else None
            if cfg is None and path != "cublas":  # a kernel default: pin it so a heuristic change cannot move it
                cfg = small_default if path == "small_m" else default_tiled_config(m, arch_of_run)
            rows.append({
                "shape": name, "N": n, "K": k, "M": m, "roofline_us": roof, "bf16_us": bf16, "cublas_us": cub,
                "tiled_us": cand[("tiled", None)], "small_m_default_us": cand.get(("small_m", None)),
                "small_m_best_us": small.get(sm_cfg), "small_m_best_config": repr(sm_cfg),
                "best_path": path, "best_config": repr(cfg), "best_us": best,
                "best_over_roofline": best / roof,
                "cublas_over_best": cub / best if isinstance(cub, float) else None,
            })  # fmt: skip
            note = f"{best:.1f} us = {best / roof:.2f}x roofline; cuBLAS {_fmt(cub)}, bf16 {bf16:.1f} us"
            table_rows.append(table_row(arch_of_run.name, m, n, k, path, cfg, note))
            log(f"  M={m}: best {path} {cfg or ''} {best:.1f} us ({best / roof:.2f}x roofline), cuBLAS {_fmt(cub)}")
        del shape
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows, table_rows


def table_row(arch_name: str, m: int, n: int, k: int, path: str, cfg, note: str) -> str:
    """One ``blockscale_mm.TABLE`` entry, as Python source, keyed by M's bucket."""
    cfg_src = "" if cfg is None else f", {cfg!r}"
    return f'    ("{arch_name}", {bm.m_bucket(m)}, {n}, {k}): Choice("{path}"{cfg_src}),  # {note}'


def _fmt(v) -> str:
    return f"{v:.1f} us" if isinstance(v, float) else str(v)


def print_report(rows, table_rows) -> None:
    cols = ["shape", "M", "roofline_us", "bf16_us", "cublas_us", "tiled_us", "small_m_default_us", "small_m_best_us",
            "best_path", "best_over_roofline", "cublas_over_best"]  # fmt: skip
    print(tabulate([[r[c] for c in cols] for r in rows], headers=cols, floatfmt=".2f"))
    small = [r for r in rows if r["M"] <= bm.SMALL_M_MAX]
    if small:
        worst = max(small, key=lambda r: r["best_over_roofline"])
        print(f"\nM <= {bm.SMALL_M_MAX}: worst best/roofline {worst['best_over_roofline']:.2f}x at {worst['shape']} "
              f"M={worst['M']} (target <= 1.5x); rows over 1.5x: "
              f"{sum(r['best_over_roofline'] > 1.5 for r in small)} of {len(small)}")  # fmt: skip
    print("\n# Paste into TABLE in fp8_fusion_pass/kernels/triton/blockscale_mm.py")
    print(f"# measured {time.strftime('%Y-%m-%d')} on {device_name()}, torch {torch.__version__}, "
          f"Triton {triton.__version__}, by `python benchmarks/gemm.py`")  # fmt: skip
    print("\n".join(table_rows))
    print("\nBest small-M config per shape and M:")
    print(tabulate([[r["shape"], r["M"], r["small_m_best_config"], r["small_m_best_us"]] for r in small],
                   headers=["shape", "M", "best config", "us"], floatfmt=".2f"))  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 shapes, M in 1,16,64,2048, a 4-config sweep")
    p.add_argument("--ms", help="comma-separated row counts (default: the table's M buckets)")
    p.add_argument("--only", help="comma-separated substrings of shape names to run (e.g. qwen3-32b)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gemm.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the correctness oracle is a true fp32 matmul
    a = arch.arch_of(DEVICE)
    ms = [int(v) for v in args.ms.split(",")] if args.ms else ([1, 16, 64, 2048] if args.quick else list(bm.M_BUCKETS))
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.only:
        shapes = [s for s in shapes if any(part in s[0] for part in args.only.split(","))]
    if args.dry_run:
        shapes, ms = [("tiny", 128, 256)], [1, 65]
    bw = copy_bandwidth(args.dry_run)
    log(f"{device_name()} ({a.name}); torch {torch.__version__}, Triton {triton.__version__}; "
        f"copy bandwidth {bw / 1e12:.2f} TB/s")  # fmt: skip
    t0 = time.time()
    small_sweep, tiled_sweep = (QUICK_SWEEP_SMALL_M, SWEEP_TILED[:2]) if args.quick else (SWEEP_SMALL_M, SWEEP_TILED)
    if args.dry_run:
        small_sweep, tiled_sweep = QUICK_SWEEP_SMALL_M[:2], SWEEP_TILED[:1]
    rows, table_rows = run(shapes, ms, small_sweep, tiled_sweep, bw, a)
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; {len(rows)} points in {time.time() - t0:.0f} s\n")
    print_report(rows, table_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth": bw, "device": device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
