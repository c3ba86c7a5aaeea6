"""Where a decode step's GPU time goes: per-kernel and per-category device time, pass vs no pass vs bf16.

    PYTHONPATH=. python benchmarks/profile_step.py --preset qwen3-8b --forms engine,hf --layers 4 --batches 1,64

Same compile and capture as ``decode.py`` (regional layer compiles, the step captured into one CUDA graph);
``torch.profiler`` records the kernels of ``--steps`` replays (CUPTI reports the kernels inside a graph). The
figures are device time per step (kernel durations summed), next to the time per step of back-to-back replays,
so ``step - kernels`` is the time between kernels.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import decode
from decode import EngineRunner, HFRunner, capture, compile_regions, log, time_replays

from fp8_fusion_pass.models import build_model, engine

# First matching substring names the category (kernel names as Inductor / Triton / cuBLAS / flash emit them).
CATEGORIES = [
    # Our Triton GEMMs: small-M, its silu-quant epilogue, its split-K sum, the GEMV and the tiled kernel (TABLE's
    # "tiled" rows; before 2026-12-01 it fell through to "other": 4 x 33 us at Qwen3-8B batch 64).
    ("gemm ours (Triton)", ("_small_m_kernel", "_small_m_silu_quant_kernel", "_splitk_reduce", "_gemv_kernel",
                            "_blockscale_mm_kernel")),
    ("gemm other", ("gemm", "cutlass", "nvjet", "_tiled", "sm90_xmma", "scaled_mm", "cublas", "matmul")),
    ("quant (standalone)", ("group_quant_kernel", "_group_quant")),
    ("norm(+quant)", ("rms_norm",)),
    ("silu(+quant)", ("silu",)),
    ("attention", ("fmha", "flash", "attention", "efficient", "sdpa")),
    ("inductor fused", ("triton_poi", "triton_red", "triton_per", "triton_tem")),
]


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k.lower() in low for k in keys):
            return cat
    return "other"


def step_sequence(events: list[tuple[str, float, float]], steps: int) -> list[tuple[str, float, float | None]] | None:
    """The step's launches in order, each with its mean us over ``steps`` replays and the mean idle us from its end
    to the next launch's start (None for the step's last launch), from (name, start, us) kernel events: the only way
    to tell one GEMM of a layer from another, as CUPTI names a kernel but not its shapes. The gap is what tells
    whether a launch made shorter shortens the step or only moves the next launch's wait (docs/benchmarks.md, "The
    merge on the real rows, timed"). None where the replays' orders differ (concurrent launches), so that no
    position stands for two launches."""
    events = sorted(events, key=lambda e: e[1])
    if not events or len(events) % steps:
        return None
    n = len(events) // steps
    names = [e[0] for e in events[:n]]
    if any([e[0] for e in events[r * n:(r + 1) * n]] != names for r in range(1, steps)):
        return None

    def gap(r: int, i: int) -> float:
        _, start, us = events[r * n + i]
        return events[r * n + i + 1][1] - (start + us)

    return [(name, sum(events[r * n + i][2] for r in range(steps)) / steps,
             sum(gap(r, i) for r in range(steps)) / steps if i < n - 1 else None)
            for i, name in enumerate(names)]  # fmt: skip


def profile(graph, steps: int) -> tuple[dict, int, list | None]:
    """{kernel name: (us per step, launches per step)} over ``steps`` replays, the kernel events seen, and the
    step's launches in order (``step_sequence``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    events = []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA or "memcpy" in ev.name.lower():
            continue
        events.append((ev.name, ev.time_range.start, ev.device_time))
        per[ev.name][0] += ev.device_time / steps
        per[ev.name][1] += 1 / steps
    return {k: (v[0], v[1]) for k, v in per.items()}, len(events), step_sequence(events, steps)


def by_kernel(sequence: list[tuple[str, float, float | None]]) -> list[tuple[str, int, float, float | None]]:
    """Per kernel name, in first-launch order: its launches a step, their mean us, and the mean gap after them (over
    the launches that have one): a layer's launches of one kernel read as one line, for A/Bs of a kernel."""
    seen: dict[str, list] = {}
    for name, us, gap in sequence:
        row = seen.setdefault(name, [0, 0.0, []])
        row[0] += 1
        row[1] += us
        if gap is not None:
            row[2].append(gap)
    return [(name, n, us / n, sum(gaps) / len(gaps) if gaps else None) for name, (n, us, gaps) in seen.items()]


def print_sequence(sequence: list[tuple[str, float, float | None]] | None) -> None:
    if sequence is None:
        print("  (no launch order: the replays ran their kernels in different orders)")
        return
    print("  launch       us    gap us  kernel (gap: from its end to the next launch's start)")
    for i, (name, us, gap) in enumerate(sequence):
        print(f"  {i:4d} {us:10.2f} {'' if gap is None else f'{gap:9.2f}':>9}  {name[:100]}")
    print("  by kernel: launches a step, mean us, mean gap us after it")
    for name, n, us, gap in by_kernel(sequence):
        print(f"  by kernel {n:4d} {us:10.2f} {'' if gap is None else f'{gap:9.2f}':>9}  {name[:100]}")


def report(label: str, wall_ms: float, kernels: dict, top_n: int = 12) -> dict:
    cats: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name, (us, n) in kernels.items():
        c = cats[category(name)]
        c[0] += us
        c[1] += n
    device_us = sum(us for us, _ in kernels.values())
    launches = sum(n for _, n in kernels.values())
    print(f"\n== {label}: step {wall_ms * 1e3:.1f} us, kernels {device_us:.1f} us/step, "
          f"{launches:.0f} launches/step, gaps {wall_ms * 1e3 - device_us:.1f} us")
    for cat, (us, n) in sorted(cats.items(), key=lambda kv: -kv[1][0]):
        print(f"  {cat:<20} {us:9.1f} us  {n:6.0f} launches")
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top_n]
    for name, (us, n) in top:
        print(f"    {us:8.1f} us {n:5.0f}x  {name[:110]}")
    return {c: v[0] for c, v in cats.items()} | {"wall": wall_ms * 1e3, "device": device_us, "launches": launches}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--forms", default="engine,hf")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--attention", choices=engine.DECODE_ATTENTION_IMPLS, default=engine.DECODE_ATTENTION,
                   help="engine form: how a decode step attends (benchmarks/attention_decode.py)")
    p.add_argument("--variants", default="block,block+pass,bf16",
                   help="block, block+pass, bf16, or block+pass with +REWRITE / -REWRITE items (as decode.py --also): "
                        "block+pass-norm_rope")
    p.add_argument("--without", default="", help="as decode.py --without")
    p.add_argument("--top", type=int, default=12, help="kernels listed per step, the longest first")
    p.add_argument("--inductor", default="", help="as decode.py --inductor")
    p.add_argument("--sequence", action="store_true", help="also each step's launches in order, each one's mean us "
                   "(which GEMM of a layer is which: the kernel names alone do not say)")
    args = p.parse_args(argv)
    engine.DECODE_ATTENTION = args.attention
    decode.PASS_CONFIG = decode.pass_config(args.without)
    decode.INDUCTOR_OPTIONS = decode.inductor_options(args.inductor)
    torch.set_grad_enabled(False)
    summary = []
    for form in args.forms.split(","):
        for variant in args.variants.split(","):
            scheme, config = variant.split("+")[0], decode.variant_config(variant)
            torch.manual_seed(0)
            model = build_model(args.preset, form=form, scheme=scheme, layers=args.layers, device="cuda")
            torch._dynamo.reset()
            compile_regions(model, config)
            for batch in (int(b) for b in args.batches.split(",")):
                log(f"{form} {variant} batch {batch}")
                runner = (EngineRunner if form == "engine" else HFRunner)(model, batch, args.context + 64,
                                                                          args.context)
                graph, _ = capture(runner.step_fn(), runner.args())
                wall_ms = time_replays(graph, 20)
                kernels, seen, sequence = profile(graph, args.steps)
                label = f"{args.preset} x{args.layers} layers, {form}, {variant}, batch {batch}"
                row = report(label, wall_ms, kernels, args.top) if seen else {"wall": wall_ms * 1e3}
                if args.sequence and seen:
                    print_sequence(sequence)
                summary.append((form, variant, batch, row))
                del runner, graph
            del model
            torch.cuda.empty_cache()
    print("\nsummary (us per step): form variant batch | wall device launches | by category")
    for form, variant, batch, row in summary:
        cats = ", ".join(f"{k} {v:.0f}" for k, v in row.items() if k not in ("wall", "device", "launches"))
        print(f"{form:6} {variant:11} {batch:3} | {row['wall']:8.1f} {row.get('device', 0):8.1f} "
              f"{row.get('launches', 0):5.0f} | {cats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
