"""The RoPE launches (``rms_norm_rope``, ``qk_rope`` and their KV-cache forms) vs eager vs Inductor vs the roofline.

    python benchmarks/rope_kernels.py --out DIR         # every op x per-GPU head counts x M (H200: a few minutes)
    python benchmarks/rope_kernels.py --sweep           # (rows per program, warps) candidates of the kernel
    python benchmarks/rope_kernels.py --dry-run         # CPU + Triton interpreter, tiny shapes: checks the script only
    python benchmarks/rope_kernels.py --replot DIR/rope_kernels.csv --out DIR   # only the PNG, from a CSV

The same questions as ``fused_kernels.py`` asks of the norm / silu + quant kernels (issue 7 items 1-2), for the four ops
of ``kernels/triton/rms_norm_rope.py``:
  rms_norm_rope         Qwen3's per-head q / k RMSNorms then RoPE (``norm_rope``)
  rms_norm_rope_cache   the same, k and v written into their static-cache slots (``rope_cache``)
  qk_rope               Llama's q / k RoPE (``qk_rope``)
  qk_rope_cache         the same with the cache writes
at the per-GPU head counts of Qwen3-0.6B / 8B / 32B (norm ops) and Llama-3.1-8B / 70B (RoPE alone) at TP 1, 2, 4,
8 (q heads split; k / v heads split down to one), head_dim 128, and M tokens in {1, 16, 64, 256, 2048, 8192}.
q, k and v are views of one fused qkv GEMM output, as the engine splits it; M tokens are one sequence (B = 1,
S = M: a row is a head of a token either way), the caches hold 8192 positions. Columns, in microseconds:
  fused     our one launch, at the tile ``tile_for`` picks
  eager     the plain-torch reference (``kernels/reference.py``) op by op, as the model runs without a compiler
  inductor  ``torch.compile`` of that reference: Inductor's own fusion (what the pass leaves without these
            rewrites). One compile per (op, heads), S unbacked, largest M first
  roofline  q / k (/ v) read once, cos / sin and the norm weights read once, the outputs written once, over the
            copy bandwidth of this run; read floor: a plain read of those bytes (``_read_floor.py``)
Timing as ``fused_kernels.py`` (``_timing.time_graph``): one CUDA graph, inputs rotating beyond 3x the L2, medians.
Each fused result is first checked against the reference within the RoPE contract of the GPU tests (at most 1% of
the outputs differ, each by at most 4 bf16 steps of its RoPE products; written v slots bit for bit), so no wrong
kernel is timed. Writes ``rope_kernels.csv`` and ``rope_kernels.png`` (matplotlib, if
importable) to ``--out``. ``--sweep`` times ``CANDIDATES`` per (op, heads, M), prints the best per point and a
summary per row-count bucket, and writes every candidate's time to ``rope_sweep.csv``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _plot
import _script
from _read_floor import ReadFloor
from _timing import copy_bandwidth, rotating_copies, time_graph
from tabulate import tabulate

from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import rms_norm_rope as rr

HEADS = {  # name: (q heads, kv heads), from the models' config.json; head_dim 128 for all
    "qwen3-0.6b": (16, 8),
    "qwen3-8b": (32, 8),
    "qwen3-32b": (64, 8),
    "llama3.1-8b": (32, 8),
    "llama3.1-70b": (64, 8),
}
NORM_OPS = ("rms_norm_rope", "rms_norm_rope_cache")  # Qwen3
OPS = (*NORM_OPS, "qk_rope", "qk_rope_cache")
TP = (1, 2, 4, 8)
MS = (8192, 2048, 256, 64, 16, 1)  # largest first: Inductor autotunes on its first call
D = 128
T = 8192  # cache positions
EPS = 1e-6
MAX_COPIES = 64
ROOFLINE_TARGET, PEER_TARGET = 1.25, 1.0  # issue 7
# (rows per program, warps): 2-16 values per thread at D = 128, around the reasoned (4, 4)
CANDIDATES = tuple((r, w) for r in (1, 2, 4, 8, 16, 32) for w in (1, 2, 4, 8) if 2 <= r * D // (32 * w) <= 16)
DEVICE = "cuda"


def log(msg: str) -> None:
    print(f"[rope {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def heads_of(op: str, tps=TP) -> dict[tuple[int, int], str]:
    """Per-GPU (q heads, kv heads) of op's models, each labelled with the models (and TP degrees) that run it."""
    out: dict[tuple[int, int], list[str]] = {}
    for name, (hq, hk) in HEADS.items():
        if name.startswith("qwen3") != (op in NORM_OPS):
            continue
        for tp in tps:
            if hq % tp == 0:
                out.setdefault((hq // tp, max(1, hk // tp)), []).append(f"{name}/tp{tp}" if tp > 1 else name)
    return {k: " ".join(v) for k, v in sorted(out.items())}


class Case:
    """Inputs (rotating copies of the qkv output and the tables), the caches and the minimum bytes of one point."""

    def __init__(self, op: str, hq: int, hk: int, m: int, weights):
        self.op, self.hq, self.hk, self.m = op, hq, hk, m
        self.cache = op.endswith("_cache")
        self.wq, self.wk = weights if op in NORM_OPS else (None, None)
        width = (hq + 2 * hk) * D
        in_bytes = m * width * 2 + 2 * m * D * 2  # qkv + cos + sin
        self.copies = rotating_copies(in_bytes, DEVICE == "cpu", least=1, most=MAX_COPIES)
        pos = torch.arange(m, device=DEVICE)
        freqs = (100 + pos[:, None].float()) / (1e6 ** (torch.arange(0, D, 2, device=DEVICE).float() / D))
        emb = torch.cat([freqs, freqs], -1)[None]
        # each copy its own tables too: they rotate beyond L2 with the activations
        self.inputs = [(torch.randn(1, m, width, device=DEVICE, dtype=torch.bfloat16) * 2,
                        emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16))
                       for _ in range(self.copies)]
        self.positions = pos[None]  # [1, S]
        if self.cache:
            self.k_cache, self.v_cache = (torch.zeros(1, hk, T, D, device=DEVICE, dtype=torch.bfloat16) for _ in "kv")
        moved = m * (hq + hk) * D * 2 * 2  # q, k read and written
        if self.cache:
            moved += m * hk * D * 2 * 2 + m * 8  # v read and written, the positions
        self.min_bytes = moved + 2 * m * D * 2 + (2 * D * 2 if op in NORM_OPS else 0)

    def split(self, i: int):
        qkv, cos, sin = self.inputs[i]
        q = qkv[..., : self.hq * D].view(1, self.m, self.hq, D)
        k = qkv[..., self.hq * D : (self.hq + self.hk) * D].view(1, self.m, self.hk, D)
        v = qkv[..., (self.hq + self.hk) * D :].view(1, self.m, self.hk, D).transpose(1, 2)
        return q, k, v, cos, sin

    def fused(self, i: int, tile=None):
        q, k, v, cos, sin = self.split(i)
        fn = getattr(rr, self.op)
        if self.op in NORM_OPS:
            args = (q, self.wq, k, self.wk, EPS, cos, sin)
        else:
            args = (q, k, cos, sin)
        if self.cache:
            args = (*args, v, self.positions, self.k_cache, self.v_cache)
        return fn(*args, tile=tile)

    def reference_args(self, i: int):
        return (*self.inputs[i], self.positions, *((self.k_cache, self.v_cache) if self.cache else ()))


def reference_fn(op: str, hq: int, hk: int, wq, wk):
    """The plain-torch op as a model writes it, from the qkv output: what eager runs and Inductor compiles."""

    def fn(qkv, cos, sin, positions, k_cache=None, v_cache=None):
        b, s, _ = qkv.shape
        q = qkv[..., : hq * D].view(b, s, hq, D)
        k = qkv[..., hq * D : (hq + hk) * D].view(b, s, hk, D)
        v = qkv[..., (hq + hk) * D :].view(b, s, hk, D).transpose(1, 2)
        norm = op in NORM_OPS
        if op.endswith("_cache"):
            pre = (q, wq, k, wk, EPS) if norm else (q, k)
            return getattr(ref, op)(*pre, cos, sin, v, positions, k_cache, v_cache)
        return ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin) if norm else ref.qk_rope(q, k, cos, sin)

    return fn


def _mark_s_dynamic(t: torch.Tensor) -> None:
    mark = getattr(torch._dynamo.decorators, "mark_unbacked", None) or torch._dynamo.maybe_mark_dynamic
    mark(t, 1)


def _product_sizes(x, w, cos, sin):
    """``|y cos| + |rotate_half(y) sin|`` per output ``[B, H, S, D]``, y the reference's normed x (x itself
    without a norm): where the two products cancel, an output may move by many of its own bf16 steps."""
    y = (x if w is None else ref.rms_norm(x, w, EPS)).transpose(1, 2).float()
    y_rot = torch.cat((y[..., D // 2 :], y[..., : D // 2]), dim=-1)
    return y.abs() * cos.float().abs().unsqueeze(1) + y_rot.abs() * sin.float().abs().unsqueeze(1)


def _check(case: Case, eager) -> None:
    """The fused launch agrees with the reference within the tests' RoPE contract (``tests/tolerances.py``: only
    rstd may differ, so at most 1% of the outputs, each by at most 4 bf16 steps of its RoPE products' sizes); a
    copied v slot is bit for bit."""
    q, k, v, cos, sin = case.split(0)
    if case.cache:
        q_got = case.fused(0)
        k_got, v_got = case.k_cache[:, :, : case.m].clone(), case.v_cache[:, :, : case.m].clone()
        case.k_cache.zero_(), case.v_cache.zero_()
        q_want = eager(*case.reference_args(0))
        pairs = [(q_got, q_want, q, case.wq), (k_got, case.k_cache[:, :, : case.m], k, case.wk)]
        if not torch.equal(v_got, v):
            raise AssertionError(f"{case.op} heads ({case.hq}, {case.hk}) M={case.m}: v cache slots differ")
    else:
        pairs = [(*gw, x, w) for gw, x, w in zip(zip(case.fused(0), eager(*case.reference_args(0))), (q, k),
                                                 (case.wq, case.wk))]  # fmt: skip
    for got, want, x, w in pairs:
        diff = (got.float() - want.float()).abs()
        bound = _product_sizes(x, w, cos, sin) * 4 * 2.0**-7 + 1e-30
        if (diff > 0).float().mean() > 0.01 or not bool((diff <= bound).all()):
            raise AssertionError(f"{case.op} heads ({case.hq}, {case.hk}) M={case.m}: off the reference beyond "
                                 f"the RoPE contract: {(diff > 0).float().mean().item():.2%} differ, worst "
                                 f"{(diff / bound).max().item():.2f}x the bound")  # fmt: skip


def measure(case: Case, eager, compiled, bw: float, floor: ReadFloor) -> dict:
    dry = DEVICE == "cpu"
    t_fused = time_graph(case.fused, case.copies, dry)
    t_eager = time_graph(lambda i: eager(*case.reference_args(i)), case.copies, dry)
    t_ind = float("nan")
    if compiled is not None:
        for qkv, cos, sin in case.inputs:
            for t in (qkv, cos, sin):
                _mark_s_dynamic(t)
        _mark_s_dynamic(case.positions)
        t_ind = time_graph(lambda i: compiled(*case.reference_args(i)), case.copies, dry)
    roof = case.min_bytes / bw * 1e6
    read = floor.us(case.min_bytes)
    peer = t_eager if compiled is None else min(t_eager, t_ind)
    return {
        "op": case.op, "Hq": case.hq, "Hk": case.hk, "M": case.m, "fused_us": t_fused, "eager_us": t_eager,
        "inductor_us": t_ind, "roofline_us": roof, "read_floor_us": read, "fused_over_roofline": t_fused / roof,
        "fused_over_read_floor": t_fused / read, "inductor_over_roofline": t_ind / roof,
        "eager_over_roofline": t_eager / roof,
        "fused_over_best_peer": t_fused / peer,
    }  # fmt: skip


def _weights():
    return tuple(torch.rand(D, device=DEVICE).add(0.5).to(torch.bfloat16) for _ in range(2))


def run(ops, tps, ms, bw: float, with_inductor: bool, budget_s: float) -> list[dict]:
    rows, t0 = [], time.time()
    floor = ReadFloor(DEVICE, dry_run=DEVICE == "cpu")
    torch._dynamo.config.automatic_dynamic_shapes = False  # everything static but S, marked unbacked
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    weights = _weights()
    for op in ops:
        for (hq, hk), label in heads_of(op, tps).items():
            if time.time() - t0 > budget_s:
                log(f"budget spent: {op} heads ({hq}, {hk}) and later not run")
                continue
            eager = reference_fn(op, hq, hk, *weights)
            compiled = None
            if with_inductor:
                compiled = torch.compile(reference_fn(op, hq, hk, *weights),
                                         backend="eager" if DEVICE == "cpu" else "inductor")  # fmt: skip
            for m in ms:
                case = Case(op, hq, hk, m, weights)
                _check(case, eager)
                row = {**measure(case, eager, compiled, bw, floor), "models": label}
                rows.append(row)
                log(f"{op} ({hq}, {hk}) M={m}: fused {row['fused_us']:.2f} us ({row['fused_over_roofline']:.2f}x "
                    f"roofline), eager {row['eager_us']:.1f}, inductor {row['inductor_us']:.2f}")  # fmt: skip
                del case
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


def n_rows_of(op: str, hq: int, hk: int, m: int) -> int:
    """Rows (heads of a token) one launch of op takes: q's, k's and, with the cache writes, v's."""
    return m * (hq + hk * (2 if op.endswith("_cache") else 1))


def sweep(ops, tps, ms, budget_s: float) -> list[dict]:
    """Every candidate tile per (op, heads, M): one row per candidate, with its time over the point's best."""
    rows, t0 = [], time.time()
    weights = _weights()
    for op in ops:
        for hq, hk in heads_of(op, tps):
            for m in ms:
                if time.time() - t0 > budget_s:
                    continue
                case = Case(op, hq, hk, m, weights)
                times = {tile: time_graph(lambda i, t=tile, c=case: c.fused(i, t), case.copies, DEVICE == "cpu")
                         for tile in CANDIDATES}  # fmt: skip
                n = n_rows_of(op, hq, hk, m)
                best, default = min(times, key=times.get), rr.tile_for(n, D)
                for tile, us in times.items():
                    rows.append({"op": op, "Hq": hq, "Hk": hk, "M": m, "n_rows": n, "rows": tile[0],
                                 "warps": tile[1], "us": us, "over_best": us / times[best],
                                 "is_default": tile == default})  # fmt: skip
                log(f"{op} ({hq}, {hk}) M={m}: best {best} {times[best]:.2f} us, default {default} "
                    f"{times[default]:.2f} us")  # fmt: skip
                del case
    return rows


SWEEP_BUCKETS = (512, 2048, 16384)  # n_rows bucket edges of the sweep's summary


def sweep_summary(rows: list[dict]) -> None:
    """Per n_rows bucket: each candidate's geometric mean of time over the point's best, the best three, and
    the default's."""
    edges = (0, *SWEEP_BUCKETS, float("inf"))
    for lo, hi in itertools.pairwise(edges):
        sel = [r for r in rows if lo <= r["n_rows"] < hi]
        if not sel:
            continue
        by_tile: dict[tuple[int, int], list[float]] = {}
        for r in sel:
            by_tile.setdefault((r["rows"], r["warps"]), []).append(math.log(r["over_best"]))
        gm = {t: math.exp(sum(v) / len(v)) for t, v in by_tile.items()}
        ranked = sorted(gm, key=gm.get)
        worst = {t: max(math.exp(x) for x in by_tile[t]) for t in ranked[:3]}
        default = {(r["rows"], r["warps"]) for r in sel if r["is_default"]}
        print(f"n_rows in [{lo}, {hi}): {len(sel) // len(CANDIDATES)} points; best "
              + ", ".join(f"{t} {gm[t]:.3f}x (worst {worst[t]:.2f}x)" for t in ranked[:3])
              + "; default " + ", ".join(f"{t} {gm[t]:.3f}x" for t in sorted(default)))  # fmt: skip


def report(rows: list[dict], out_dir: str, bw: float) -> None:
    cols = ["op", "Hq", "Hk", "M", "fused_us", "eager_us", "inductor_us", "roofline_us", "read_floor_us",
            "fused_over_roofline", "fused_over_read_floor", "fused_over_best_peer"]  # fmt: skip
    table = []
    for r in rows:
        flag = " ROOF" if r["M"] >= 2048 and r["fused_over_roofline"] > ROOFLINE_TARGET else ""
        flag += " PEER" if r["fused_over_best_peer"] > PEER_TARGET else ""
        table.append([r[c] for c in cols] + [flag.strip()])
    print(tabulate(table, headers=[*cols, "misses"], floatfmt=".2f"))
    print()
    big = [r for r in rows if r["M"] >= 2048]
    for title, sel, key, target in (("M >= 2048: fused / roofline", big, "fused_over_roofline", ROOFLINE_TARGET),
                                    ("M >= 2048: fused / read floor", big, "fused_over_read_floor", ROOFLINE_TARGET),
                                    ("all M: fused / best peer", rows, "fused_over_best_peer",
                                     PEER_TARGET)):  # fmt: skip
        if sel:
            worst = max(sel, key=lambda r: r[key])
            print(f"{title}: worst {worst[key]:.2f}x at {worst['op']} ({worst['Hq']}, {worst['Hk']}) M={worst['M']} "
                  f"(target <= {target}); {sum(r[key] > target for r in sel)} of {len(sel)} points miss")  # fmt: skip
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {_script.versions(DEVICE)}")
    write_csv(rows, os.path.join(out_dir, "rope_kernels.csv"))
    plot(rows, os.path.join(out_dir, "rope_kernels.png"))


def plot(rows: list[dict], path: str) -> None:
    _plot.grid(rows, OPS, (("fused", "fused"), ("inductor", "Inductor"), ("eager", "eager")),
               x_key=lambda r: (r["Hq"], r["Hk"]), x_label=lambda r: f"{r['Hq']}/{r['Hk']}",
               title=lambda op, m: f"{op} M={m} (x: q / kv heads)", path=path)  # fmt: skip


def read_csv(path: str) -> list[dict]:
    """The rows of a ``rope_kernels.csv``, numbers parsed (``report`` writes them)."""
    return _plot.read_csv(path, ints=("Hq", "Hk", "M"))


def write_csv(rows: list[dict], path: str) -> None:
    if not rows:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help=f"comma-separated subset of {', '.join(OPS)}")
    p.add_argument("--tp", default="1,2,4,8", help="TP degrees whose per-GPU head counts to run")
    p.add_argument("--ms", help="comma-separated M tokens (default 8192,2048,256,64,16,1)")
    p.add_argument("--sweep", action="store_true", help="time CANDIDATES tiles instead of the table")
    p.add_argument("--no-inductor", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no new (op, heads) after this many s")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for rope_kernels.csv")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny shapes (no real timing)")
    p.add_argument("--replot", metavar="CSV",
                   help="only draw the PNG of a rope_kernels.csv measured earlier, into --out")
    args = p.parse_args(argv)
    if args.replot:
        os.makedirs(args.out, exist_ok=True)
        plot(read_csv(args.replot), os.path.join(args.out, "rope_kernels.png"))
        return 0
    global DEVICE, HEADS, T
    DEVICE = _script.pick_device(__file__, args.dry_run)
    if DEVICE is None:
        return 2
    ops = args.ops.split(",") if args.ops else list(OPS)
    unknown = set(ops) - set(OPS)
    if unknown:
        p.error(f"unknown ops {sorted(unknown)}; known: {', '.join(OPS)}")
    tps = tuple(int(v) for v in args.tp.split(","))
    ms = [int(v) for v in args.ms.split(",")] if args.ms else list(MS)
    if args.dry_run:
        HEADS = {"qwen3-tiny": (4, 2), "llama-tiny": (4, 2)}
        ms, tps, T = [3, 1], (1,), 8
    bw = copy_bandwidth(args.dry_run)
    log(f"{_script.versions(DEVICE)}; copy bandwidth {bw / 1e12:.2f} TB/s")
    t0 = time.time()
    if args.sweep:
        rows = sweep(ops, tps, ms, args.budget_s)
        best = [r for r in rows if r["over_best"] == 1.0 or r["is_default"]]
        cols = ["op", "Hq", "Hk", "M", "n_rows", "rows", "warps", "us", "over_best", "is_default"]
        print(tabulate([[r[c] for c in cols] for r in best], headers=cols, floatfmt=".2f"))
        sweep_summary(rows)
        print(f"{_script.versions(DEVICE)}; {time.strftime('%Y-%m-%d')}")
        write_csv(rows, os.path.join(args.out, "rope_sweep.csv"))
    else:
        rows = run(ops, tps, ms, bw, not args.no_inductor, args.budget_s)
        report(rows, args.out, bw)
    log(f"{len(rows)} points in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
