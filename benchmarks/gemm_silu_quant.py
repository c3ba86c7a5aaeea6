"""The gate/up GEMM with the silu-quant in its epilogue against the two launches it replaces, and the rows of
``blockscale_mm_silu_quant.TABLE`` that they imply.

    python benchmarks/gemm_silu_quant.py --ms 1,4,16,32,64 --json gemm_silu.json
    python benchmarks/gemm_silu_quant.py --ms 1 --gemv-only --gemv-wide   # the GEMV with the epilogue, wider sweep
    python benchmarks/gemm_silu_quant.py --ms 16,32,64 --noswap   # tuning idea 20: activation rows on the M side
    python benchmarks/gemm_silu_quant.py --dry-run        # CPU, Triton interpreter, one tiny shape: checks the script

For the merged gate_up shapes of Qwen3-8B, Llama-3.1-8B and Qwen3-32B (I x K) at decode row counts:
- "unfused": ``blockscale_mm`` (its TABLE choice for the merged [2I, K] shape) then ``silu_mul_group_quant``,
  what the graph runs without ``gemm_silu_quant``;
- "fused": ``small_m_mm_silu_quant`` over a sweep of configs (128, 64 or 32 output columns per program; warps,
  stages, pointer or TMA tiles, and split-K at ~66-396 programs) and, at M <= 4, ``gemv_silu_quant`` (the GEMV with the
  same epilogue, ``GEMV_FAMILIES``), each first checked against the reference (the dequantized outputs within
  ``CHECK_REL_ERR``) and, with a split-K or group ticket, for bitwise repeatability (RACY otherwise): never chosen if it
  fails;
- the roofline: weight + scale bytes, the activation, and the fp8 output with its scales, over the copy bandwidth.
Timing as ``benchmarks/gemm.py``: CUDA-graph replays cycling weight copies beyond 3x the 50 MB L2, medians.
A TABLE row names the best fused config where it beat the unfused pair by more than ``MARGIN``, else None.
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

import _script
from _timing import checked_time, copy_bandwidth, rotating_copies
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
from fp8_fusion_pass.kernels.triton._gemv_kernels import GEMV_MAX_M, GemvConfig
from fp8_fusion_pass.kernels.triton._gemv_silu_kernels import gemv_silu_quant
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig, split_plan
from fp8_fusion_pass.kernels.triton._small_m_silu_kernels import small_m_mm_silu_quant
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

# (name, I, K): gate_up [2I, K] of each model at TP1 (the engine form's merged weight).
SHAPES = [("qwen3-8b gate_up", 12288, 4096), ("llama3.1-8b gate_up", 14336, 4096), ("qwen3-32b gate_up", 25600, 5120)]
# (block_n, warps, stages, tma). block_n 64 / 32: a quant group over 2 / 4 programs, the plain GEMM's 128- / 64-row
# weight tile instead of 256 rows (GROUP_TILES in _small_m_silu_kernels.py). tma: a gate and an up tile by the
# copy engine per K step (_k_loop_pair; block_n >= 64, where each MMA is a wgmma as the pair's GEMM is).
FAMILIES = [(128, 4, 3, False), (128, 8, 3, False), (128, 8, 4, False), (128, 8, 2, False), (128, 4, 4, False),
            (64, 4, 4, False), (64, 4, 3, False), (32, 4, 4, False),
            (128, 4, 3, True), (128, 4, 4, True), (128, 8, 3, True), (128, 8, 4, True), (64, 4, 4, True),
            (64, 4, 3, True)]  # fmt: skip
# --noswap (tuning idea 20): the activation rows on the MMA's M side, TMA tiles (block_n, warps, stages, tma, swap)
NOSWAP_FAMILIES = [(128, 4, 4, True, False), (128, 4, 3, True, False), (128, 8, 4, True, False),
                   (64, 4, 4, True, False), (64, 4, 6, True, False), (32, 4, 4, True, False)]  # fmt: skip
PROGRAM_TARGETS = (66, 132, 264, 396)
# The GEMV with the epilogue (_gemv_silu_kernels.py), M <= GEMV_MAX_M: (rows, k_chunk, warps, stages), around the
# GEMV's own TABLE configs at M = 1 (rows 8, k_chunk 512 / 1024, 1 or 3 stages). Each program reads 2 x rows rows.
GEMV_FAMILIES = [(2, 1024, 4, 1), (4, 1024, 4, 1), (4, 512, 4, 1), (4, 1024, 4, 3), (8, 512, 4, 1), (8, 1024, 4, 1),
                 (8, 1024, 4, 3), (16, 512, 4, 1)]  # fmt: skip
# --gemv-wide: 512 / 2048-value chunks and 2 warps too, as the plain GEMV's wider sweep (gemm.py, SWEEP_GEMV_WIDE)
# whose 2-warp 2048-value configs took most of blockscale_mm.TABLE's M = 1 rows; here a thread holds the gate and
# the up values, 2 x rows x k_chunk / (32 x warps), kept within 16-128 (more spills or leaves one program per SM).
GEMV_WIDE_FAMILIES = [(r, c, w, s) for r in (2, 4, 8) for c in (512, 1024, 2048) for w in (2, 4) for s in (1, 3)
                      if 16 <= 2 * r * c // (32 * w) <= 128]  # fmt: skip
DEVICE = "cuda"  # "cpu" under --dry-run
CHECK_REL_ERR = 2e-2  # of the dequantized output; a wrong kernel is off by > 0.3, one fp8 step is ~6%, rarely
REPEATS = 3  # on a dry run 1: the interpreter runs one program at a time, so it cannot race (the check still runs)
MARGIN = 0.02  # fused must beat the unfused pair by more than this to get a TABLE row (run-to-run noise ~2%)
G = 128


def log(msg: str) -> None:
    print(f"[gemm_silu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def candidates(i: int, k: int, families=FAMILIES) -> list[SmallMConfig]:
    """Fused configs for one gate/up shape: ``families`` (block_n, warps, stages, tma[, swap]), each at the splits
    of PROGRAM_TARGETS."""
    k_tiles = k // 128
    out = []
    for block_n, warps, stages, tma, *swap in families:
        n_tiles = math.ceil(i / block_n)
        splits = {split_plan(k_tiles, max(1, round(t / n_tiles)), 1)[0] for t in PROGRAM_TARGETS}
        out += [SmallMConfig(block_n, s, warps, stages, "last", tma=tma, swap=all(swap)) for s in sorted(splits)]
    return list(dict.fromkeys(out))


class Shape:
    def __init__(self, i: int, k: int):
        self.i, self.k = i, k
        fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
        self.copies = rotating_copies(2 * i * k, DEVICE == "cpu")
        w = torch.randn(2 * i, k, device=DEVICE, dtype=torch.bfloat16) * 0.05
        self.w8 = [ref.quantize_weight_blockwise(w.roll(c, 0), (128, 128), fp8, fp8_max) for c in range(self.copies)]

    def halves(self, c: int):
        w, s = self.w8[c]
        i = self.i
        return w[:i], s[: i // 128], w[i:], s[i // 128:]

    def roofline_us(self, m: int, bw: float) -> float:
        i, k = self.i, self.k
        nbytes = 2 * i * k + (2 * i // 128) * (k // 128) * 4 + m * k + m * (k // 128) * 4 + m * i + m * (i // G) * 4
        return nbytes / bw * 1e6


def _dequant(out):
    return ref.dequant_activation(*out).double()


def _same(a, b) -> bool:  # the fp8 codes bit for bit (NaN-safe through uint8), and the scales
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


def timed(what: str, call, want, copies: int, repeatable: bool) -> float | str:
    repeats = (REPEATS if DEVICE == "cuda" else 1) if repeatable else 0
    rel_err = lambda out: ((_dequant(out) - want).norm() / want.norm()).item()
    return checked_time(what, call, copies, rel_err, CHECK_REL_ERR, repeats, _same, log, dry_run=DEVICE == "cpu")


def _launch(cfg):
    return gemv_silu_quant if isinstance(cfg, GemvConfig) else small_m_mm_silu_quant


def run_point(name: str, shape: Shape, m: int, families, gemv_families, bw: float, a: arch.Arch,
              with_table_row: bool = False) -> tuple[dict, str]:  # fmt: skip
    x = torch.randn(m, shape.k, device=DEVICE, dtype=torch.bfloat16)
    q, xs = ref.group_quant(x, 128, arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE))
    w, s = shape.w8[0]
    want = _dequant(ref.silu_mul_group_quant(ref.blockscale_mm(q, xs, w, s, torch.bfloat16), G,
                                             arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)))  # fmt: skip
    unfused = timed("unfused", lambda c: silu_mul_group_quant(bm.blockscale_mm(q, xs, *shape.w8[c], torch.bfloat16),
                                                              G), want, shape.copies, False)  # fmt: skip
    fused = {}
    gemvs = [GemvConfig(*f) for f in gemv_families] if m <= GEMV_MAX_M else []
    committed = bsq.TABLE.get((a.name, bm.m_bucket(m), shape.i, shape.k))  # --noswap: timed beside its rivals
    mine = [committed] if with_table_row and isinstance(committed, SmallMConfig) else []
    for cfg in list(dict.fromkeys(mine + candidates(shape.i, shape.k, families))) + gemvs:
        call = lambda c, cfg=cfg: _launch(cfg)(q, xs, *shape.halves(c), torch.bfloat16, G, cfg)
        # a split-K or a group ticket: checked for bitwise repeatability
        repeat = isinstance(cfg, GemvConfig) or cfg.split_k > 1 or cfg.block_n < G
        fused[cfg] = timed(f"fused {cfg}", call, want, shape.copies, repeat)
    ok = {c: t for c, t in fused.items() if isinstance(t, float)}
    best = min(ok, key=ok.get) if ok else None
    best_us = ok.get(best)
    roof = shape.roofline_us(m, bw)
    wins = isinstance(unfused, float) and best_us is not None and best_us < unfused * (1 - MARGIN)
    note = (f"fused {best_us:.1f} us vs unfused {unfused if isinstance(unfused, str) else f'{unfused:.1f}'} us, "
            f"roofline {roof:.1f} us" if best_us is not None else "no fused config ran")  # fmt: skip
    row = f"    # {note}\n    ({a.name!r}, {bm.m_bucket(m)}, {shape.i}, {shape.k}): {best if wins else None},"
    result = {"shape": name, "M": m, "I": shape.i, "K": shape.k, "unfused_us": unfused, "fused_best_us": best_us,
              "fused_best_config": str(best), "roofline_us": roof, "fused_wins": wins,
              "fused": {str(c): t for c, t in fused.items()}}  # fmt: skip
    return result, row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1,4,16,32,64", help="comma-separated row counts")
    p.add_argument("--only", help="comma-separated substrings of shape names")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--gemv-wide", action="store_true", help="the GEMV with the epilogue over GEMV_WIDE_FAMILIES")
    p.add_argument("--gemv-only", action="store_true", help="at M <= 4, time no swap-AB config (only the GEMV)")
    p.add_argument("--noswap", action="store_true", help="only the fused configs with the activation rows on the "
                   "MMA's M side (tuning idea 20) and the committed TABLE row, against the unfused pair")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    a = arch.arch_of(DEVICE)
    ms = [int(v) for v in args.ms.split(",")]
    shapes, families = SHAPES, FAMILIES
    gemv_families = GEMV_WIDE_FAMILIES if args.gemv_wide else GEMV_FAMILIES
    if args.only:
        shapes = [s for s in shapes if any(part in s[0] for part in args.only.split(","))]
    if args.noswap:
        families = NOSWAP_FAMILIES
    if args.dry_run:
        shapes, ms = [("tiny", 256, 512)], [1, 17]
        gemv_families = [(4, 256, 4, 1), (2, 512, 2, 1)] if args.gemv_wide else [(4, 256, 4, 1)]
        families = [(128, 4, 2, False), (64, 4, 2, False), (64, 4, 2, True)]
        families += [(64, 4, 2, True, False)] if args.noswap else []
    bw = copy_bandwidth(args.dry_run)
    log(_script.setup_line(DEVICE, a.name, bw))
    rows, table = [], []
    for sname, i, k in shapes:
        shape = Shape(i, k)
        for m in ms:
            log(f"{sname} M={m}")
            swap_ab = [] if args.gemv_only and m <= GEMV_MAX_M else families
            r, t = run_point(sname, shape, m, swap_ab, gemv_families, bw, a, args.noswap)
            rows.append(r)
            table.append(t)
    print(tabulate([[r["shape"], r["M"], r["roofline_us"], r["unfused_us"], r["fused_best_us"],
                     (r["fused_best_us"] / r["unfused_us"]) if isinstance(r["unfused_us"], float)
                     and r["fused_best_us"] else "-", r["fused_best_config"]] for r in rows],
                   headers=["shape", "M", "roofline", "unfused", "fused", "fused / unfused", "best config"],
                   floatfmt=".2f"))  # fmt: skip
    print(f"\nTABLE rows ({_script.provenance(DEVICE, bw, __file__)}):")
    print("\n".join(table))
    _script.write_json(args.json, bw, DEVICE, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
