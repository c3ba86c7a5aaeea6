"""Fused norm / silu + 1x128 group-quant kernels vs the unfused Triton pair vs Inductor vs the roofline (issue 7).

    python benchmarks/fused_kernels.py --quick        # 2 norm + 2 silu sizes, M in 1, 2048, 8192 (~1 min)
    python benchmarks/fused_kernels.py --out DIR      # full: 5 hidden + 15 intermediate sizes x 6 M (~5 min, H200)
    python benchmarks/fused_kernels.py --sweep        # tile candidates at K 4096, 5120, 12288, 25600 (~4 min)
    python benchmarks/fused_kernels.py --sweep --ops group_quant --sizes 4096,12288   # the unfused pair's quant too
    python benchmarks/fused_kernels.py --sweep --ms 1,4 --sizes 4096,5120,8192 \\
        --ops rms_norm_group_quant,add_rms_norm_group_quant   # a row over several programs at decode sizes: SPLIT_ROWS
    python benchmarks/fused_kernels.py --ops silu_mul_group_quant --sizes 25600,12800
    python benchmarks/fused_kernels.py --dry-run      # CPU + Triton interpreter, tiny shapes: checks the script only

For each fused op (``rms_norm_group_quant``, ``add_rms_norm_group_quant``, ``silu_mul_group_quant``), at the
Qwen3-0.6B / 1.7B / 8B / 32B and Llama-3.1-8B / 70B hidden sizes (norms; TP does not shard them) and intermediate
sizes at TP 1, 2, 4, 8 (silu), and M in {1, 16, 64, 256, 2048, 8192}, it times:
  fused     our Triton kernel (``kernels/triton``), the tile its launcher picks
  unfused   our two Triton kernels: rms_norm / add_rms_norm / silu_and_mul, then group_quant
  inductor  ``torch.compile`` of the plain-torch reference (``kernels/reference.py``): Inductor's own fusion.
            One compile per (op, size): M is marked unbacked (no recompiles), automatic dynamic shapes are off (K
            stays static), and the largest M runs first, so Inductor autotunes its kernels at M = 8192.
  roofline  minimum bytes (inputs read once, outputs written once) / copy bandwidth measured in this run
            (a 2 GiB device-to-device copy, read + write counted; ``_timing.copy_bandwidth``).
  read floor  a plain streaming read of those minimum bytes, timed in this run (``_read_floor.py``): what any
            kernel moving them pays here for its ramp and tail, which the roofline leaves out.
Timing (``_timing.time_graph``): calls captured into one CUDA graph, cycling through input copies that together
exceed 3x the 50 MB L2 (at most 64 copies: M = 1 shapes stay L2-resident and launch-bound), median over replays.

Writes ``kernels.csv`` and ``kernels.png`` (matplotlib, if importable) to ``--out`` (default ``$OUT``, else
``.``), and prints the table: time / roofline and fused / best peer, with the issue-7 targets (<= 1.25x roofline
at M >= 2048, <= 1.0x the best peer everywhere) flagged. ``--sweep`` (``_kernel_sweep.py``) times tile candidates
at M in 8192, 2048, 256, 16 and prints the winners as a ``MEASURED`` block for ``kernels/triton/_tiles.py``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _kernel_sweep
import _plot
import _script
from _read_floor import ReadFloor
from _timing import copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import group_quant as gq
from fp8_fusion_pass.kernels.triton import rms_norm as rn
from fp8_fusion_pass.kernels.triton import silu_and_mul as sm

MODELS = {  # name: (hidden, intermediate), from the models' config.json
    "qwen3-0.6b": (1024, 3072),
    "qwen3-1.7b": (2048, 6144),
    "qwen3-8b": (4096, 12288),
    "qwen3-32b": (5120, 25600),
    "llama3.1-8b": (4096, 14336),
    "llama3.1-70b": (8192, 28672),
}
TP = (1, 2, 4, 8)
MS = (8192, 2048, 256, 64, 16, 1)  # largest first: Inductor autotunes on its first call
SWEEP_MS = (8192, 2048, 256, 16)  # one or two M per _tiles.BUCKETS bucket
G = 128
EPS = 1e-6
MAX_COPIES = 64
ROOFLINE_TARGET, PEER_TARGET = 1.25, 1.0  # issue 7
# The norms' numerics contract (docs/numerics.md, tests/tolerances.py): the normalised value is rounded to bf16
# twice, so another reduction order may move a scale by two bf16 steps, 2^-6. A 1% bound was tighter than that
# and stopped a run at 1.04% (rms_norm_group_quant K=2048 M=2048, H200, 2026-12-01, no fp8 value moved).
SCALE_REL_TOL = 2.0**-6
OPS = ("rms_norm_group_quant", "add_rms_norm_group_quant", "silu_mul_group_quant")
SWEEP_ONLY_OPS = ("group_quant",)  # the unfused pair's quant: its tiles can be swept too
DEVICE = "cuda"


def log(msg: str) -> None:
    print(f"[kernels {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sizes_of(op: str) -> dict[int, str]:
    """Per-GPU sizes of op, each labelled with the models (and TP degrees) that run it."""
    out: dict[int, list[str]] = {}
    for name, (hidden, inter) in MODELS.items():
        if op == "group_quant":  # quantizes a norm output (hidden) or a silu output (intermediate, TP 1)
            out.setdefault(hidden, []).append(f"{name} hidden")
            out.setdefault(inter, []).append(f"{name} intermediate")
            continue
        if op != "silu_mul_group_quant":
            out.setdefault(hidden, []).append(name)
            continue
        for tp in TP:
            if inter % tp == 0 and (inter // tp) % G == 0:
                out.setdefault(inter // tp, []).append(f"{name}/tp{tp}" if tp > 1 else name)
    return {k: " ".join(v) for k, v in sorted(out.items())}


# ---------------------------------------------------------------- the three implementations of each op


class Case:
    """Inputs (rotating copies), the three implementations and the minimum bytes of one (op, K, M)."""

    def __init__(self, op: str, k: int, m: int, w: torch.Tensor):
        self.op, self.k, self.m, self.w = op, k, m, w
        width = 2 * k if op == "silu_mul_group_quant" else k  # group_quant: x [m, k]
        nbytes_in = m * width * 2 * (2 if op == "add_rms_norm_group_quant" else 1)
        self.copies = rotating_copies(nbytes_in, DEVICE == "cpu", least=1, most=MAX_COPIES)
        self.inputs = []
        for _ in range(self.copies):
            x = torch.randn(m, width, device=DEVICE, dtype=torch.bfloat16)
            r = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16) if op == "add_rms_norm_group_quant" else None
            self.inputs.append((x, r))
        # min bytes: inputs once, q (1 B), scales (4 B per group), residual_out (2 B), the norm weight (2 B)
        out = m * k + m * (k // G) * 4 + (2 * m * k if op == "add_rms_norm_group_quant" else 0)
        self.min_bytes = nbytes_in + out + (2 * k if "norm" in op else 0)

    def fused(self, i: int, tile=None):
        x, r = self.inputs[i]
        if self.op == "silu_mul_group_quant":
            return sm.launch(x, G, tile=tile)
        if self.op == "group_quant":
            return gq.launch(x, G, tile=tile)
        (q, s), res = rn.launch(x, self.w, EPS, r, G, tile=tile)
        return (q, s) if r is None else (q, s, res)

    def unfused(self, i: int):
        x, r = self.inputs[i]
        if self.op == "silu_mul_group_quant":
            return gq.group_quant(sm.silu_and_mul(x), G)
        y, res = rn.launch(x, self.w, EPS, r, None)
        return (*gq.group_quant(y, G), res)


def inductor_fn(op: str, a: arch.Arch):
    """Inductor's fusion of the reference. One compiled function per (op, K): the caller makes a fresh one."""
    fp8, fp8_max = a.fp8_dtype, a.fp8_max
    if op == "rms_norm_group_quant":
        fn = lambda x, r, w: ref.rms_norm_group_quant(x, w, EPS, G, fp8, fp8_max)
    elif op == "add_rms_norm_group_quant":
        fn = lambda x, r, w: ref.add_rms_norm_group_quant(x, r, w, EPS, G, fp8, fp8_max)
    else:
        fn = lambda x, r, w: ref.silu_mul_group_quant(x, G, fp8, fp8_max)
    return torch.compile(fn, backend="eager" if DEVICE == "cpu" else "inductor")


def _mark_m_dynamic(t: torch.Tensor | None) -> None:
    if t is None:
        return
    mark = getattr(torch._dynamo.decorators, "mark_unbacked", None) or torch._dynamo.maybe_mark_dynamic
    mark(t, 0)


def _check(case: Case, a: arch.Arch) -> None:
    """The fused kernel agrees with the reference (scales within ``SCALE_REL_TOL``, < 1% of fp8 values off, the same
    NaNs): never time a wrong kernel. The first GPU round caught unwritten scales here (off by exactly 1: zeroed
    memory)."""
    x, r = case.inputs[0]
    got = case.fused(0)
    if case.op == "silu_mul_group_quant":
        want = ref.silu_mul_group_quant(x, G, a.fp8_dtype, a.fp8_max)
    elif case.op == "group_quant":
        want = ref.group_quant(x, G, a.fp8_dtype, a.fp8_max)
    elif r is None:
        want = ref.rms_norm_group_quant(x, case.w, EPS, G, a.fp8_dtype, a.fp8_max)
    else:
        want = ref.add_rms_norm_group_quant(x, r, case.w, EPS, G, a.fp8_dtype, a.fp8_max)
    err = ((got[1] - want[1]).abs() / want[1]).max().item()
    qg, qw = got[0].float(), want[0].float()
    off = ((qg != qw) & ~(qg.isnan() & qw.isnan())).float().mean().item()
    if not (err <= SCALE_REL_TOL and off <= 1e-2):
        raise AssertionError(f"{case.op} K={case.k} M={case.m}: scales off the reference by {err:.3g}, "
                             f"{off:.2%} of fp8 values differ")  # fmt: skip


# ---------------------------------------------------------------- the run


def measure(case: Case, compiled, bw: float, floor: ReadFloor) -> dict:
    """One row: the three implementations of ``case``, its roofline and read floor, in microseconds per call."""
    dry = DEVICE == "cpu"
    t_fused = time_graph(case.fused, case.copies, dry)
    t_unfused = time_graph(case.unfused, case.copies, dry)
    t_ind = float("nan")
    if compiled is not None:
        for x, r in case.inputs:
            _mark_m_dynamic(x)
            _mark_m_dynamic(r)
        t_ind = time_graph(lambda i: compiled(*case.inputs[i], case.w), case.copies, dry)
    roof = case.min_bytes / bw * 1e6
    read = floor.us(case.min_bytes)
    peer = t_unfused if compiled is None else min(t_unfused, t_ind)
    return {
        "op": case.op, "K": case.k, "M": case.m, "fused_us": t_fused, "unfused_us": t_unfused, "inductor_us": t_ind,
        "roofline_us": roof, "fused_over_roofline": t_fused / roof, "unfused_over_roofline": t_unfused / roof,
        "inductor_over_roofline": t_ind / roof, "fused_over_best_peer": t_fused / peer,
        "read_floor_us": read, "fused_over_read_floor": t_fused / read,
    }  # fmt: skip


def run(ops, sizes_filter, ms, bw: float, with_inductor: bool) -> list[dict]:
    a = arch.arch_of(DEVICE)
    rows = []
    floor = ReadFloor(DEVICE, dry_run=DEVICE == "cpu")
    torch._dynamo.config.automatic_dynamic_shapes = False  # K static; M is marked unbacked explicitly
    for name in ("recompile_limit", "cache_size_limit"):  # one cache entry per (op, K); the name moved over time
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    for op in ops:
        for k, label in sizes_of(op).items():
            if sizes_filter and k not in sizes_filter:
                continue
            w = torch.randn(k, device=DEVICE, dtype=torch.bfloat16) * 0.5 + 1
            compiled = inductor_fn(op, a) if with_inductor else None
            for m in ms:
                case = Case(op, k, m, w)
                _check(case, a)
                row = {**measure(case, compiled, bw, floor), "models": label}
                rows.append(row)
                log(f"{op} K={k} M={m}: fused {row['fused_us']:.1f} us ({row['fused_over_roofline']:.2f}x roofline), "
                    f"unfused {row['unfused_us']:.1f}, inductor {row['inductor_us']:.1f}, "
                    f"roofline {row['roofline_us']:.1f}")  # fmt: skip
                del case
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- report


def report(rows: list[dict], out_dir: str, bw: float) -> None:
    cols = ["op", "K", "M", "fused_us", "unfused_us", "inductor_us", "roofline_us", "read_floor_us",
            "fused_over_roofline", "fused_over_read_floor", "fused_over_best_peer"]  # fmt: skip
    table = []
    for r in rows:
        flag = ""
        if r["M"] >= 2048 and r["fused_over_roofline"] > ROOFLINE_TARGET:
            flag += " ROOF"
        if r["fused_over_best_peer"] > PEER_TARGET:
            flag += " PEER"
        table.append([r[c] for c in cols] + [flag.strip()])
    print(tabulate(table, headers=[*cols, "misses"], floatfmt=".2f"))
    print()
    _summary("M >= 2048: fused / roofline", [r for r in rows if r["M"] >= 2048], "fused_over_roofline", ROOFLINE_TARGET)
    _summary("M >= 2048: fused / read floor", [r for r in rows if r["M"] >= 2048], "fused_over_read_floor",
             ROOFLINE_TARGET)
    _summary("all M: fused / best peer", rows, "fused_over_best_peer", PEER_TARGET)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {_script.versions(DEVICE)}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "kernels.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    plot(rows, os.path.join(out_dir, "kernels.png"))


def _summary(title: str, rows: list[dict], key: str, target: float) -> None:
    if not rows:
        return
    worst = max(rows, key=lambda r: r[key])
    misses = sum(r[key] > target for r in rows)
    print(f"{title}: worst {worst[key]:.2f}x at {worst['op']} K={worst['K']} M={worst['M']} (target <= {target}); "
          f"{misses} of {len(rows)} points miss")  # fmt: skip


def plot(rows: list[dict], path: str) -> None:
    _plot.grid(rows, OPS, (("fused", "fused"), ("unfused", "unfused pair"), ("inductor", "Inductor")),
               x_key=lambda r: r["K"], x_label=lambda r: str(r["K"]),
               title=lambda op, m: f"{op.replace('_group_quant', '+q')} M={m}", path=path)  # fmt: skip


def read_csv(path: str) -> list[dict]:
    """The rows of a ``kernels.csv``, numbers parsed (``report`` writes them)."""
    return _plot.read_csv(path, ints=("K", "M"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="K 4096, 5120 (norms), 12288, 25600 (silu); M 1, 2048, 8192")
    p.add_argument("--ops", help=f"comma-separated subset of {', '.join(OPS)}")
    p.add_argument("--sizes", help="comma-separated K (norms: hidden; silu: intermediate per GPU)")
    p.add_argument("--ms", help="comma-separated M (default 8192,2048,256,64,16,1)")
    p.add_argument("--sweep", action="store_true", help="time tile candidates of the kernels instead (_kernel_sweep)")
    p.add_argument("--budget-s", type=float, default=420.0, help="--sweep: start no new point after this many s")
    p.add_argument("--no-inductor", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for kernels.csv / kernels.png")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny shapes (no real timing)")
    p.add_argument("--replot", metavar="CSV", help="only draw the PNG of a kernels.csv measured earlier, into --out")
    args = p.parse_args(argv)
    if args.replot:
        os.makedirs(args.out, exist_ok=True)
        plot(read_csv(args.replot), os.path.join(args.out, "kernels.png"))
        return 0
    global DEVICE, MODELS
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    ops = args.ops.split(",") if args.ops else list(OPS)
    known = OPS + SWEEP_ONLY_OPS if args.sweep else OPS
    unknown = set(ops) - set(known)
    if unknown:
        p.error(f"unknown ops {sorted(unknown)}; known: {', '.join(known)}")
    sizes = {int(v) for v in args.sizes.split(",")} if args.sizes else set()
    ms = [int(v) for v in args.ms.split(",")] if args.ms else list(MS)
    if args.quick or args.sweep:
        sizes = sizes or {4096, 5120, 12288, 25600}
    if args.quick and not args.ms:
        ms = [8192, 2048, 1]
    if args.sweep and not args.ms:
        ms = list(SWEEP_MS)
    if args.dry_run:
        MODELS = {"tiny": (256, 384)}
        ms, sizes = [5, 1], set()
    bw = copy_bandwidth(args.dry_run)
    log(f"{_script.versions(DEVICE)}; copy bandwidth {bw / 1e12:.2f} TB/s")
    t0 = time.time()
    if args.sweep:
        rows = _kernel_sweep.run(Case, ops, sizes_of, sizes, ms, bw, args.dry_run, args.budget_s)
        _kernel_sweep.print_table(rows, f"{_script.versions(DEVICE)}; {time.strftime('%Y-%m-%d')}; "
                                  f"copy bandwidth {bw / 1e12:.2f} TB/s")  # fmt: skip
    else:
        rows = run(ops, sizes, ms, bw, with_inductor=not args.no_inductor)
        report(rows, args.out, bw)
    log(f"{len(rows)} points in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
