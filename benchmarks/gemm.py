"""Block-FP8 GEMM paths on one GPU, side by side, and the rows of ``blockscale_mm.TABLE`` that they imply.

    python benchmarks/gemm.py --ms 1,4,16,32,64 --json gemm_small.json      # small-M sweep, all shapes
    python benchmarks/gemm.py --ms 128,256,2048,8192 --json gemm_large.json  # the rest of the M buckets
    python benchmarks/gemm.py --quick                 # 2 shapes, 4 row counts, a small sweep
    python benchmarks/gemm.py --only qwen3-32b        # a subset of the shapes (split a run that is too long)
    python benchmarks/gemm.py --dry-run               # CPU, Triton interpreter, one tiny shape: checks the script
    python benchmarks/gemm.py --ms 16,32,64 --table-only   # re-time the committed TABLE rows only (no sweep)
    python benchmarks/gemm.py --ms 16,32,64 --noswap       # tuning idea 20: the activation rows on the MMA's M side

Estimate (reasoned from round 1, where --quick took 7 s for 8 points with a warm Triton cache): small-M command
~95 Triton compiles (<= 1.5 s each) and 50 points x ~30 candidates at ~20 ms (capture + 10 replays of ~3 ms):
3-4 min; large-M command ~10 compiles and 40 points x 8 candidates (M=8192 ones take ~0.1 s): 2-3 min.

For the Qwen3-8B / Llama-3.1-8B / Qwen3-32B projection shapes (N x K) and M in ``blockscale_mm.M_BUCKETS``:
bf16 ``torch.mm``, cuBLAS block-wise (``torch._scaled_mm`` with its layout work), the Triton tiled GEMM, the
Triton small-M GEMM (its default config, and the best of the sweep in ``_gemm_sweep.py``), and the roofline: the
minimum bytes (fp8 weight + scales + fp8 activation + scales + bf16 output) over the copy bandwidth measured in
the same run, and the read floor: a plain streaming read of those bytes timed in the same run (``_read_floor.py``),
what any kernel that must read them pays here for its ramp and tail. At M <= 64 also the activation quant:
``group_quant`` + the best small-M GEMM against the small-M GEMM quantizing its bf16 input itself (``small_m_mm_bf16``),
for the pass's small-M "worth it" table.

Each point also re-times the committed ``TABLE`` row for its (M bucket, N, K) and prints it beside the run's best
("best/TABLE"): a sweep's winner is a TABLE change only against that, measured in the same run.

Timing: each candidate is captured ``reps`` times into one CUDA graph, cycling through enough weight copies
to exceed 3x the 50 MB L2, so every call reads its weight from HBM as a decode step does; the figure is the
median over replays of (replay time / reps). Every candidate is first checked against the fp32 dequantized
oracle (relative error <= 1e-2, else it is reported WRONG and never chosen); a candidate that sums split-K in
its own launch must also give bitwise the same output on repeated calls (else RACY, never chosen).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _gemm_sweep as sweep
import _script
import triton
from _read_floor import ReadFloor
from _timing import checked_time, copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._blockscale_kernels import TiledConfig, default_tiled_config
from fp8_fusion_pass.kernels.triton._gemv_kernels import GEMV_MAX_M, GemvConfig
from fp8_fusion_pass.kernels.triton._small_m_kernels import (
    SmallMConfig,
    default_small_m_config,
    small_m_mm,
    small_m_mm_bf16,
)
from fp8_fusion_pass.kernels.triton.group_quant import group_quant

# (name, N, K): per-GPU projection shapes at TP1 (merged qkv and gate_up, as the engine-form models run them).
# Llama-3.1-8B's qkv (6144 x 4096) and o (4096 x 4096) are Qwen3-8B's.
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
    # The HF form keeps q / k / v and gate / up separate (Llama-3.1-8B's q is Qwen3-8B's o shape, 4096 x 4096).
    ("qwen3-8b k|v", 1024, 4096),
    ("qwen3-8b gate|up", 12288, 4096),
    ("llama3.1-8b gate|up", 14336, 4096),
    ("qwen3-32b q_proj", 8192, 5120),
    ("qwen3-32b k|v", 1024, 5120),
    ("qwen3-32b gate|up", 25600, 5120),
]
QUICK_SHAPES = [SHAPES[0], SHAPES[9]]
DEVICE = "cuda"  # "cpu" under --dry-run
CHECK_REL_ERR = 1e-2  # a wrong kernel is off by > 0.3 (K/128 % 4 on v1); bf16 rounding is ~1e-3
REPEATS = 3  # extra calls that must reproduce a "last" split-K output bit for bit (1 on a dry run: no races there)
# The GEMV (M <= 4): rows per program x K per load step x the K loop's stages; 4 warps.
SWEEP_GEMV = [GemvConfig(r, c, 4, s) for r in (2, 4, 8) for c in (512, 1024) for s in (1, 3)]
# --gemv-wide: also 16 rows, 256 / 2048-value chunks and 2 / 8 warps, where a thread holds 8-128 weight values
# of a chunk (the committed 8 x 1024 at 4 warps holds 64; 128 and up spill or leave one program per SM).
SWEEP_GEMV_WIDE = [GemvConfig(r, c, w, s) for r in (2, 4, 8, 16) for c in (256, 512, 1024, 2048) for w in (2, 4, 8)
                   for s in (1, 3) if 8 <= r * c // (32 * w) <= 128]  # fmt: skip
SWEEP_TILED = [
    TiledConfig(64, 128, 8, 4, 4),
    TiledConfig(128, 128, 8, 8, 3),
    TiledConfig(128, 128, 8, 4, 4),
    TiledConfig(128, 256, 8, 8, 3),
    TiledConfig(64, 256, 8, 4, 3),
]


def log(msg: str) -> None:
    print(f"[gemm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Shape:
    """Weight copies (fp8 + scales, and bf16) of one projection, and its fp32 dequantization for checks."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
        self.copies = rotating_copies(n * k, DEVICE == "cpu")
        self.bf16_copies = rotating_copies(2 * n * k, DEVICE == "cpu")
        self.w_bf16 = [torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05 for _ in range(self.bf16_copies)]
        self.w8 = [ref.quantize_weight_blockwise(self.w_bf16[i % self.bf16_copies], (128, 128), fp8, fp8_max)
                   for i in range(self.copies)]  # fmt: skip
        w_q, w_s = self.w8[0]
        self.w32 = ref.dequant_weight(w_q, w_s)

    def inputs(self, m: int):
        x = torch.randn(m, self.k, device=DEVICE, dtype=torch.bfloat16)
        q, xs = ref.group_quant(x, 128, arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE))
        return x, q, xs

    def min_bytes(self, m: int) -> int:
        n, k = self.n, self.k
        return n * k + (n // 128) * (k // 128) * 4 + m * k + m * (k // 128) * 4 + m * n * 2

    def roofline_us(self, m: int, bw: float) -> float:
        return self.min_bytes(m) / bw * 1e6


def timed(what: str, call, want, copies: int, repeatable: bool = False) -> float | str:
    """Microseconds per ``call(i)`` (i: weight copy), or "WRONG" (off the oracle ``want``), "RACY" (not
    bitwise repeatable where it must be) or "n/a" (cannot run the shape)."""
    repeats = (REPEATS if DEVICE == "cuda" else 1) if repeatable else 0
    rel_err = lambda y: ((y.float() - want).norm() / want.norm()).item()
    return checked_time(what, call, copies, rel_err, CHECK_REL_ERR, repeats, log=log, dry_run=DEVICE == "cpu")


def measure(shape: Shape, q, xs, want, path: str, config=None) -> float | str:
    call = lambda i: bm.run(path, q, xs, *shape.w8[i], torch.bfloat16, config=config)
    last = isinstance(config, SmallMConfig) and config.reduce == "last" and config.split_k > 1
    return timed(f"{path} {config or ''}", call, want, shape.copies, repeatable=last)


def _best(candidates: dict):
    ok = {key: v for key, v in candidates.items() if isinstance(v, float)}
    key = min(ok, key=ok.get) if ok else None
    return key, ok.get(key)


def _best_small_verified(shape: Shape, q, xs, small: dict, cand: dict):
    """The fastest small-M config, once its in-launch split-K sum equals its two-launch twin's bit for bit (same
    partials, same order); one that does not is marked RACY in ``small`` and ``cand`` and never chosen."""
    while True:
        cfg, t = _best(small)
        if cfg is None or cfg.split_k == 1:
            return cfg, t
        y = bm.run("small_m", q, xs, *shape.w8[0], torch.bfloat16, config=cfg)
        if torch.equal(y, bm.run("small_m", q, xs, *shape.w8[0], torch.bfloat16, config=sweep.with_kernel_reduce(cfg))):
            return cfg, t
        log(f"  small_m {cfg}: RACY (differs from its two-launch twin)")
        small[cfg] = cand[("small_m", cfg)] = "RACY"


def small_m_extras(shape: Shape, x, q, xs, want, best: SmallMConfig) -> dict:
    """At the best small-M config: its two-launch twin (idea 1), group_quant + GEMM, and the bf16-input GEMM."""
    w8 = shape.w8
    out = {"best_kernel_reduce_us": measure(shape, q, xs, want, "small_m", sweep.with_kernel_reduce(best))}
    gq = lambda i: small_m_mm(*group_quant(x, 128), *w8[i], torch.bfloat16, best)
    out["quant_gemm_us"] = timed("group_quant + small_m", gq, want, shape.copies)
    bf16_cfg = dataclasses.replace(best, swap=True)  # a bf16 input is quantized along the swap-AB tile
    fused = lambda i: small_m_mm_bf16(x, *w8[i], torch.bfloat16, 128, bf16_cfg)
    out["bf16_in_us"] = timed(f"small_m_bf16 {bf16_cfg}", fused, want, shape.copies, repeatable=best.split_k > 1)
    return out


def run_point(shape: Shape, m: int, families, tiled_sweep, bw: float, a: arch.Arch, floor: ReadFloor,
              gemv_sweep=(), row_split=()) -> tuple[dict, str]:
    n, k = shape.n, shape.k
    x, q, xs = shape.inputs(m)
    want = ref.dequant_activation(q, xs) @ shape.w32.t()
    cand: dict = {}
    bf16 = time_graph(lambda i: torch.mm(x, shape.w_bf16[i].t()), shape.bf16_copies, DEVICE == "cpu")
    cand[("cublas", None)] = measure(shape, q, xs, want, "cublas")
    cand[("tiled", None)] = measure(shape, q, xs, want, "tiled")
    small_default = default_small_m_config(n, k, a=a)
    if m <= 256:
        cand[("small_m", small_default)] = measure(shape, q, xs, want, "small_m", small_default)
    small: dict = {}
    committed = bm.TABLE.get((a.name, bm.m_bucket(m), n, k))  # the TABLE's row, re-timed in this run
    if m <= bm.SMALL_M_MAX:
        last_default = dataclasses.replace(small_default, reduce="last")
        mine = [committed.config] if committed is not None and committed.path == "small_m" else []
        for cfg in dict.fromkeys([last_default, *mine, *sweep.candidates(n, k, m, families, row_split=row_split)]):
            small[cfg] = cand[("small_m", cfg)] = measure(shape, q, xs, want, "small_m", cfg)
    for cfg in tiled_sweep if m > bm.SMALL_M_MAX else []:
        cand[("tiled", cfg)] = measure(shape, q, xs, want, "tiled", cfg)
    gemv: dict = {}
    # the committed GEMV row too: the M = 1 rows hold GEMV_WIDE configs, which the default sweep lacks
    mine_gemv = [committed.config] if committed is not None and committed.path == "gemv" else []
    for cfg in dict.fromkeys([*mine_gemv, *gemv_sweep]) if m <= GEMV_MAX_M else []:
        gemv[cfg] = cand[("gemv", cfg)] = measure(shape, q, xs, want, "gemv", cfg)
    sm_cfg, sm_best = _best_small_verified(shape, q, xs, small, cand)
    (path, cfg), best = _best(cand)
    if cfg is None and path == "tiled":  # a kernel default: pin it so a heuristic change cannot move it
        cfg = default_tiled_config(m, a)
    roof = shape.roofline_us(m, bw)
    read = floor.us(shape.min_bytes(m))
    cub = cand[("cublas", None)]
    row = {
        "N": n, "K": k, "M": m, "roofline_us": roof, "bf16_us": bf16, "cublas_us": cub,
        "tiled_us": cand[("tiled", None)], "small_m_default_us": cand.get(("small_m", small_default)),
        "small_m_default_last_us": small.get(dataclasses.replace(small_default, reduce="last")),
        "small_m_best_us": sm_best, "small_m_best_config": repr(sm_cfg),
        "gemv_best_us": _best(gemv)[1], "gemv_best_config": repr(_best(gemv)[0]),
        "gemv_us": {repr(c): v for c, v in gemv.items()},
        "best_path": path, "best_config": repr(cfg), "best_us": best, "best_over_roofline": best / roof,
        "read_floor_us": read, "best_over_read_floor": best / read,
        "cublas_over_best": cub / best if isinstance(cub, float) else None,
        "ideas": sweep.idea_ratios({c: v for c, v in small.items() if isinstance(v, float)}),
    }  # fmt: skip
    if committed is not None:
        row["table_config"] = f"{committed.path} {committed.config!r}"
        row["table_us"] = cand.get((committed.path, committed.config))
    if sm_cfg is not None:
        row.update(small_m_extras(shape, x, q, xs, want, sm_cfg))
    note = f"{best:.1f} us = {best / roof:.2f}x roofline; cuBLAS {_fmt(cub)}, bf16 {bf16:.1f} us"
    log(f"  M={m}: best {path} {cfg or ''} {best:.1f} us ({best / roof:.2f}x roofline), cuBLAS {_fmt(cub)}")
    return row, table_row(a.name, m, n, k, path, cfg, note)


def table_point(shape: Shape, m: int, a: arch.Arch) -> dict:
    """``--table-only``: the committed TABLE row alone, checked against the oracle like every candidate: no sweep,
    a few seconds of device time per point instead of a minute."""
    n, k = shape.n, shape.k
    _, q, xs = shape.inputs(m)
    want = ref.dequant_activation(q, xs) @ shape.w32.t()
    row = {"N": n, "K": k, "M": m}
    committed = bm.TABLE.get((a.name, bm.m_bucket(m), n, k))
    if committed is None:
        return row
    row["table_config"] = f"{committed.path} {committed.config!r}"
    row["table_us"] = measure(shape, q, xs, want, committed.path, committed.config)
    log(f"  M={m}: TABLE {row['table_config']} {_fmt(row['table_us'])}")
    return row


def run(shapes, ms, families, tiled_sweep, bw: float, a: arch.Arch, gemv_sweep=(), row_split=()):
    rows, table_rows = [], []
    floor = ReadFloor(DEVICE, dry_run=DEVICE == "cpu")
    for name, n, k in shapes:
        log(f"{name}: N={n} K={k}")
        shape = Shape(n, k)
        for m in ms:
            row, trow = run_point(shape, m, families, tiled_sweep, bw, a, floor, gemv_sweep, row_split)
            rows.append({"shape": name, **row})
            table_rows.append(trow)
        del shape
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows, table_rows


def table_row(arch_name: str, m: int, n: int, k: int, path: str, cfg, note: str) -> str:
    """One ``blockscale_mm.TABLE`` entry, as Python source keyed by M's bucket, under a comment line with ``note``.
    Configs are written positionally (field order of their dataclass) to keep rows within 120 columns."""
    cfg_src = ""
    if cfg is not None:
        cfg_src = f", {type(cfg).__name__}({', '.join(repr(getattr(cfg, f.name)) for f in dataclasses.fields(cfg))})"
    return f'    # {note}\n    ("{arch_name}", {bm.m_bucket(m)}, {n}, {k}): Choice("{path}"{cfg_src}),'


def _fmt(v) -> str:
    return f"{v:.1f} us" if isinstance(v, float) else str(v)


def _ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def print_report(rows, table_rows) -> None:
    cols = ["shape", "M", "roofline_us", "bf16_us", "cublas_us", "tiled_us", "small_m_default_us", "small_m_best_us",
            "gemv_best_us", "best_path", "read_floor_us", "best_over_roofline", "best_over_read_floor",
            "cublas_over_best", "table_us"]  # fmt: skip
    print(tabulate([[r.get(c) for c in cols] for r in rows], headers=cols, floatfmt=".2f"))
    timed_table = [r for r in rows if isinstance(r.get("table_us"), float)]
    if timed_table:
        print("\nThe committed TABLE row, re-timed in this run, against this run's best:")
        cells = [[r["shape"], r["M"], r["table_config"], r["table_us"], r["best_us"], r["best_us"] / r["table_us"]]
                 for r in timed_table]  # fmt: skip
        print(tabulate(cells, headers=["shape", "M", "TABLE row", "TABLE us", "best us", "best/TABLE"], floatfmt=".3f"))
    small = [r for r in rows if r["M"] <= bm.SMALL_M_MAX]
    if small:
        worst = max(small, key=lambda r: r["best_over_roofline"])
        print(f"\nM <= {bm.SMALL_M_MAX}: worst best/roofline {worst['best_over_roofline']:.2f}x at {worst['shape']} "
              f"M={worst['M']} (target <= 1.5x); rows over 1.5x: "
              f"{sum(r['best_over_roofline'] > 1.5 for r in small)} of {len(small)}; rows slower than cuBLAS: "
              f"{sum((r['cublas_over_best'] or 9) < 1 for r in small)}")  # fmt: skip
        worst = max(small, key=lambda r: r["best_over_read_floor"])
        print(f"M <= {bm.SMALL_M_MAX}: worst best/read floor {worst['best_over_read_floor']:.2f}x at {worst['shape']} "
              f"M={worst['M']}; rows over 1.5x the read floor: "
              f"{sum(r['best_over_read_floor'] > 1.5 for r in small)} of {len(small)}")  # fmt: skip
        print("\nTuning ideas (docs/small_m_tuning.md): time with / time without, < 1 = the idea helps")
        ideas = list(sweep.IDEAS)
        print(
            tabulate(
                [
                    [
                        r["shape"],
                        r["M"],
                        _ratio(r["small_m_default_last_us"], r["small_m_default_us"]),
                        _ratio(r["small_m_best_us"], r.get("best_kernel_reduce_us")),
                        *[r["ideas"][i] for i in ideas],
                    ]
                    for r in small
                ],
                headers=["shape", "M", "last/kernel @default", "last/kernel @best", *ideas],
                floatfmt=".3f",
            )
        )
        print("\nActivation quant at the best small-M config: bf16-input GEMM vs group_quant + GEMM vs fp8 GEMM")
        print(tabulate(
            [[r["shape"], r["M"], r["small_m_best_us"], r.get("quant_gemm_us"), r.get("bf16_in_us"),
              _ratio(r.get("bf16_in_us"), r["best_us"]), _ratio(r.get("bf16_in_us"), r.get("quant_gemm_us"))]
             for r in small],
            headers=["shape", "M", "fp8 GEMM", "quant+GEMM", "bf16-in GEMM", "bf16-in/best fp8", "bf16-in/quant+GEMM"],
            floatfmt=".2f"))  # fmt: skip
        worth = [
            f"({r['N']}, {r['K']}) M={r['M']}" for r in small if (_ratio(r.get("bf16_in_us"), r["best_us"]) or 9) < 1
        ]
        print(f"small_m.py 'worth it' (bf16 input faster than the best fp8-input GEMM): {', '.join(worth) or 'none'}")
    print("\n# Paste into TABLE in fp8_fusion_pass/kernels/triton/blockscale_mm.py")
    print(f"# measured {time.strftime('%Y-%m-%d')} on {_script.device_name(DEVICE)}, torch {torch.__version__}, "
          f"Triton {triton.__version__}, by `python benchmarks/gemm.py`")  # fmt: skip
    print("\n".join(table_rows))
    print("\nBest small-M config per shape and M:")
    print(tabulate([[r["shape"], r["M"], r["small_m_best_config"], r["small_m_best_us"]] for r in small],
                   headers=["shape", "M", "best config", "us"], floatfmt=".2f"))  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 shapes, M in 1,16,64,2048, a 4-family sweep")
    p.add_argument("--ms", help="comma-separated row counts (default: the table's M buckets)")
    p.add_argument("--only", help="comma-separated substrings of shape names to run (e.g. qwen3-32b)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--small-only", action="store_true", help="no tiled sweep (M <= 64 runs)")
    p.add_argument("--gemv-wide", action="store_true", help="sweep the GEMV (M <= 4) over SWEEP_GEMV_WIDE")
    p.add_argument("--table-only", action="store_true", help="no sweep: time each point's committed TABLE row")
    p.add_argument("--noswap", action="store_true", help="sweep only the small-M configs with the activation rows on "
                   "the MMA's M side (tuning idea 20), against the TABLE row; no tiled sweep")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the correctness oracle is a true fp32 matmul
    a = arch.arch_of(DEVICE)
    ms = [int(v) for v in args.ms.split(",")] if args.ms else ([1, 16, 64, 2048] if args.quick else list(bm.M_BUCKETS))
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.only:
        shapes = [s for s in shapes if any(part in s[0] for part in args.only.split(","))]
    families, tiled_sweep = (sweep.QUICK_FAMILIES, SWEEP_TILED[:2]) if args.quick else (sweep.FAMILIES, SWEEP_TILED)
    gemv_sweep = SWEEP_GEMV_WIDE if args.gemv_wide else SWEEP_GEMV
    row_split = () if args.quick else sweep.ROW_SPLIT_FAMILIES
    if args.small_only:  # the small-M paths only: M <= 64, no tiled sweep
        tiled_sweep = []
    if args.noswap:
        families, row_split, tiled_sweep = sweep.NOSWAP_FAMILIES, (), []
    if args.dry_run:
        shapes, ms, families, tiled_sweep = [("tiny", 128, 512)], [1, 65], sweep.DRY_FAMILIES, SWEEP_TILED[:1]
        gemv_sweep = [GemvConfig(4, 256)]  # (M = 1 / 65: no M where the rows split applies)
    bw = copy_bandwidth(args.dry_run)
    log(_script.setup_line(DEVICE, a.name, bw))
    t0 = time.time()
    if args.table_only:
        rows = []
        for name, n, k in shapes:
            log(f"{name}: N={n} K={k}")
            shape = Shape(n, k)
            rows += [{"shape": name, **table_point(shape, m, a)} for m in ms]
            del shape
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        print(tabulate([[r["shape"], r["M"], r.get("table_config"), r.get("table_us")] for r in rows],
                       headers=["shape", "M", "TABLE row", "us"], floatfmt=".2f"))  # fmt: skip
        _script.write_json(args.json, bw, DEVICE, rows)
        return 0
    rows, table_rows = run(shapes, ms, families, tiled_sweep, bw, a, gemv_sweep, row_split)
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; {len(rows)} points in {time.time() - t0:.0f} s\n")
    print_report(rows, table_rows)
    _script.write_json(args.json, bw, DEVICE, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
