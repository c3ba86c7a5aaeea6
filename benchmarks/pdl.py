"""Programmatic dependent launch (``FP8_FUSION_PDL``, ``kernels/triton/_pdl.py``) at decode: off vs on, side by side.

    python benchmarks/pdl.py                      # Qwen3-8B qkv / o / gate_up / down, M in 1, 16, 64
    python benchmarks/pdl.py --ms 1 --json pdl.json
    python benchmarks/pdl.py --dry-run            # CPU + Triton interpreter, tiny shapes: checks the script only

Estimate: 12 points x 2 kinds x 3 variants, each a capture and 10 replays of ~3 ms, plus ~20 Triton compiles: ~1 min.

For each Qwen3-8B projection (N x K) and M, in one CUDA graph per variant (``_timing.time_graph``: calls captured
back to back, cycling through weight copies that together exceed 3x the 50 MB L2, so every GEMM reads its weight
from HBM as a decode step does; median over replays of replay time / calls), it times
  gemm   the small-M GEMM alone, back to back (each launch depends on the one before: it reuses its freed output)
  chain  the GEMM after the kernel that produces its input in a decode step: rms_norm_group_quant -> GEMM for
         K = hidden (qkv, gate_up; o is timed the same way though attention feeds it), silu_mul_group_quant ->
         down GEMM for K = intermediate
with PDL off, on, and on without the GEMM's L2 weight prefetch (``FP8_FUSION_PDL_PREFETCH=0``). Each variant's
output is first checked bitwise against PDL off (else DIFF, not timed). The GEMM config is ``blockscale_mm.TABLE``'s
small-M row for the shape (else the kernel default), so PDL is measured on the configs decode runs. The roofline is
the fp8 weight bytes (+ scales) over the copy bandwidth measured in the same run (``_timing.copy_bandwidth``).
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
import triton
from _timing import copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _pdl
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig, default_small_m_config, small_m_mm
from fp8_fusion_pass.kernels.triton.rms_norm_group_quant import rms_norm_group_quant
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

# (name, N, K, producer of the GEMM's input in the chain): Qwen3-8B at TP1, merged qkv and gate_up.
SHAPES = [
    ("qwen3-8b qkv", 6144, 4096, "norm"),
    ("qwen3-8b o", 4096, 4096, "norm"),
    ("qwen3-8b gate_up", 24576, 4096, "norm"),
    ("qwen3-8b down", 4096, 12288, "silu"),
]
DRY_SHAPES = [("tiny", 128, 256, "norm"), ("tiny down", 128, 512, "silu")]
MS = (1, 16, 64)
VARIANTS = {"off": (False, True), "pdl": (True, True), "pdl, no prefetch": (True, False)}  # _pdl.switched args
EPS = 1e-6
DEVICE = "cuda"  # "cpu" under --dry-run


def log(msg: str) -> None:
    print(f"[pdl {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def gemm_config(a: arch.Arch, m: int, n: int, k: int) -> SmallMConfig:
    """The measured small-M config for this shape (TABLE's, or SMALL_M_BEST's where TABLE names the GEMV), else the
    kernel's default. PDL is a small-M kernel feature."""
    choice = bm.small_m_plan(a, "cuda", torch.float8_e4m3fn, m, n, k, 128, torch.bfloat16)
    if choice is not None and choice.config is not None:
        return choice.config
    return default_small_m_config(n, k, a=a)


class Point:
    """One (projection, M): weight copies, the producer's input, and the two timed calls."""

    def __init__(self, n: int, k: int, producer: str, m: int, cfg: SmallMConfig, dry_run: bool):
        fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
        self.copies = rotating_copies(n * k, dry_run)
        self.w8 = [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05,
                                                 (128, 128), fp8, fp8_max) for _ in range(self.copies)]  # fmt: skip
        self.cfg = cfg
        if producer == "norm":  # x [M, K] -> rms_norm_group_quant
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            w = 1 + 0.1 * torch.randn(k, device=DEVICE, dtype=torch.bfloat16)
            self.produce = lambda: rms_norm_group_quant(x, w, EPS)
        else:  # gate_up [M, 2K] -> silu_mul_group_quant
            h = torch.randn(m, 2 * k, device=DEVICE, dtype=torch.bfloat16)
            self.produce = lambda: silu_mul_group_quant(h)
        self.q, self.xs = self.produce()
        self.weight_bytes = n * k + triton.cdiv(n, 128) * triton.cdiv(k, 128) * 4

    def gemm(self, i: int) -> torch.Tensor:
        return small_m_mm(self.q, self.xs, *self.w8[i], torch.bfloat16, self.cfg)

    def chain(self, i: int) -> torch.Tensor:
        return small_m_mm(*self.produce(), *self.w8[i], torch.bfloat16, self.cfg)


def time_variants(point: Point, kind: str, dry_run: bool) -> dict:
    """Microseconds per call for each variant, or "DIFF" where its output is not bitwise PDL off's."""
    call = getattr(point, kind)
    out: dict = {}
    want = None
    for variant, switches in VARIANTS.items():
        with _pdl.switched(*switches):
            y = call(0)
            if want is None:
                want = y
            elif not torch.equal(y, want):
                log(f"  {kind} PDL {variant}: DIFF (output differs from PDL off)")
                out[variant] = "DIFF"
                continue
            out[variant] = time_graph(call, point.copies, dry_run)
    return out


def _ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def run(shapes, ms, bw: float, a: arch.Arch, dry_run: bool) -> list[dict]:
    rows = []
    for name, n, k, producer in shapes:
        log(f"{name}: N={n} K={k}")
        for m in ms:
            cfg = gemm_config(a, m, n, k)
            point = Point(n, k, producer, m, cfg, dry_run)
            roof = point.weight_bytes / bw * 1e6
            for kind in ("gemm", "chain"):
                t = time_variants(point, kind, dry_run)
                what = "GEMM" if kind == "gemm" else f"{producer}_quant -> GEMM"
                rows.append({"shape": name, "M": m, "what": what, "config": repr(cfg), "roofline_us": roof,
                             **{f"{v} us": t[v] for v in VARIANTS},
                             "pdl/off": _ratio(t["pdl"], t["off"]),
                             "no prefetch/off": _ratio(t["pdl, no prefetch"], t["off"]),
                             "off/roofline": _ratio(t["off"], roof),
                             "pdl/roofline": _ratio(t["pdl"], roof)})  # fmt: skip
                log(f"  M={m} {what}: " + ", ".join(f"{v} {t[v]:.2f} us" if isinstance(t[v], float) else f"{v} {t[v]}"
                                                    for v in VARIANTS))  # fmt: skip
            del point
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_report(rows: list[dict]) -> None:
    cols = ["shape", "M", "what", "roofline_us", *(f"{v} us" for v in VARIANTS), "pdl/off", "no prefetch/off",
            "off/roofline", "pdl/roofline"]  # fmt: skip
    print(tabulate([[r[c] for c in cols] for r in rows], headers=cols, floatfmt=".2f"))
    timed = [r for r in rows if r["pdl/off"] is not None]
    diffs = sum("DIFF" in (r[f"{v} us"] for v in VARIANTS) for r in rows)
    if timed:
        best = min(timed, key=lambda r: r["pdl/off"])
        worst = max(timed, key=lambda r: r["pdl/off"])
        saved = [r["off us"] - r["pdl us"] for r in timed if r["what"] != "GEMM"]
        print(f"\npdl/off: best {best['pdl/off']:.3f} ({best['shape']} M={best['M']} {best['what']}), worst "
              f"{worst['pdl/off']:.3f} ({worst['shape']} M={worst['M']} {worst['what']}); chains: "
              f"{sum(s > 0 for s in saved)} of {len(saved)} faster, mean {sum(saved) / max(1, len(saved)):+.2f} us "
              f"saved per chain; outputs differing from PDL off: {diffs}")  # fmt: skip
    print("\nGEMM configs (blockscale_mm.TABLE's small-M row, else the default):")
    print(tabulate(sorted({(r["shape"], r["M"], r["config"]) for r in rows}), headers=["shape", "M", "config"]))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated row counts (default 1,16,64)")
    p.add_argument("--only", help="comma-separated substrings of shape names to run (e.g. down)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny shapes (no timing)")
    return p.parse_args(argv)


def unavailable(dry_run: bool) -> str | None:
    """Why PDL cannot be measured here (None under --dry-run, where every variant runs with PDL off)."""
    if dry_run:
        return None
    if not torch.cuda.is_available():
        return "benchmarks/pdl.py needs a CUDA GPU (or --dry-run)"
    with _pdl.switched(True):
        ok = _pdl.pdl_enabled("cuda")
    return None if ok else f"PDL needs CUDA capability >= 9, this is {arch.arch_of('cuda').name}"


def main(argv=None) -> int:
    args = parse_args(argv)
    reason = unavailable(args.dry_run)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    a = arch.arch_of(DEVICE)
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    if args.only:
        shapes = [s for s in shapes if any(part in s[0] for part in args.only.split(","))]
    ms = [1] if args.dry_run else [int(v) for v in args.ms.split(",")]
    bw = copy_bandwidth(args.dry_run)
    device = _script.device_name(DEVICE)
    log(_script.setup_line(DEVICE, a.name, bw))
    t0 = time.time()
    rows = run(shapes, ms, bw, a, args.dry_run)
    print(f"\n{device}, torch {torch.__version__}, Triton {triton.__version__}, copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"{len(rows)} rows in {time.time() - t0:.0f} s\n")  # fmt: skip
    print_report(rows)
    _script.write_json(args.json, bw, DEVICE, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
