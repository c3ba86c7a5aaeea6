"""What the zero-fill rewrite saves: kernel launches per forward, and device time per stripped fill.

    PYTHONPATH=. python benchmarks/zero_fill.py                   # qwen3-8b shapes, 2 layers, engine form, B=1,8,64
    PYTHONPATH=. python benchmarks/zero_fill.py --form hf --batches 1
    PYTHONPATH=. python benchmarks/zero_fill.py --dry-run         # CPU, qwen3-tiny: checks the script, no numbers

The model is the per-tensor FP8 scheme (``quantize.PerTensorFP8Linear``: ``torch.zeros(1)`` then
``fp8_fusion::dynamic_per_tensor_quant`` per quantized linear, the seed PR's code shape), compiled twice with
Inductor; the only difference is ``post_grad_custom_post_pass``: ``ZeroFillPass(strip=False)`` leaves the graph
alone, ``ZeroFillPass(strip=True)`` runs ``patterns.zero_fill.run`` (nothing else of the pass runs).

- launches: ``torch.profiler`` (CUDA activity) over ``--profile-iters`` eager-launched forwards of the compiled
  model; device kernels per forward, and the kernel names whose counts differ between the two compiles.
- time: each compile's forward is captured ``--reps`` times into one CUDA graph (a decode step is replayed from
  a captured graph in serving, so per-launch CPU overhead is gone and only device time and launch gaps remain);
  the two graphs are replayed alternately ``--rounds`` times and the medians of (replay time / reps) compared.
  Saved per fill = (t_zeros - t_empty) / fills stripped.
Runs on torch 2.11 (the H200 image): only ``torch.compile(options=)``, ``CustomGraphPass``, ``torch.profiler``
and ``torch.cuda.CUDAGraph`` are used.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tabulate import tabulate  # noqa: E402
from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402

from fp8_fusion_pass.config import FusionConfig  # noqa: E402
from fp8_fusion_pass.models import build_model  # noqa: E402
from fp8_fusion_pass.patterns import zero_fill  # noqa: E402
from fp8_fusion_pass.report import FusionReport  # noqa: E402


def log(msg: str) -> None:
    print(f"[zero_fill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ZeroFillPass(CustomGraphPass):
    """The zero-fill rewrite alone (strip=True) or nothing (strip=False), with its report."""

    def __init__(self, strip: bool):
        self.strip, self.report = strip, FusionReport(graph=0)

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.strip:
            zero_fill.run(graph, self.report, FusionConfig(use_env=False))

    def uuid(self):
        return None  # bypass the FX graph cache: both variants must really compile


def _inputs(model, batch: int, device):
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device)
    if hasattr(model, "generate"):  # HF form: (input_ids,)
        return (ids,)
    return ids, torch.zeros(batch, 1, dtype=torch.long, device=device)  # engine form: (input_ids, positions)


def kernels_per_forward(fn, iters: int, device) -> Counter:
    """Kernel name -> launches per forward (CPU ops under --dry-run, where there are no kernels)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize()
    want = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    counts = Counter()
    for e in prof.key_averages():
        if e.device_type == want and (cuda or e.key.startswith("aten::")):
            counts[e.key] += e.count
    return Counter({k: v / iters for k, v in counts.items()})


def capture(fn, reps: int):
    """A CUDA graph of ``reps`` back-to-back forwards (warmed up on a side stream first, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_us(graph, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def variant(model, inputs, strip: bool, args, device) -> dict:
    torch._dynamo.reset()
    p = ZeroFillPass(strip)
    compiled = torch.compile(model, options={"post_grad_custom_post_pass": p, "fx_graph_cache": False})
    with torch.no_grad():
        out = compiled(*inputs)  # compile
        logits = out.logits if hasattr(out, "logits") else out

        def fn():
            return compiled(*inputs)

        counts = kernels_per_forward(fn, args.profile_iters, device)
        graph = capture(fn, args.reps) if device.type == "cuda" else None
    return {"strip": strip, "report": p.report, "counts": counts, "graph": graph, "fn": fn, "logits": logits}


def time_pair(a: dict, b: dict, args, device) -> tuple[float, float]:
    if device.type != "cuda":  # dry run: wall clock of one call each, only to exercise the code
        walls = []
        for v in (a, b):
            t0 = time.perf_counter()
            with torch.no_grad():
                v["fn"]()
            walls.append((time.perf_counter() - t0) * 1e6)
        return walls[0], walls[1]
    ta, tb = [], []
    for _ in range(args.rounds):  # alternate, so clock and thermal drift hit both alike
        ta.append(replay_us(a["graph"], args.reps))
        tb.append(replay_us(b["graph"], args.reps))
    return statistics.median(ta), statistics.median(tb)


def run_one(model, batch: int, args, device) -> tuple[list, list]:
    inputs = _inputs(model, batch, device)
    zeros, empty = (variant(model, inputs, strip, args, device) for strip in (False, True))
    same = torch.equal(zeros["logits"], empty["logits"])  # the rewrite must not change a bit
    if not same:
        log(f"B={batch}: WARNING logits differ between the two compiles")
    stripped = len(empty["report"].fills_stripped)
    kept = len(empty["report"].fills_kept)
    t_zeros, t_empty = time_pair(zeros, empty, args, device)
    n_zeros, n_empty = sum(zeros["counts"].values()), sum(empty["counts"].values())
    row = [batch, stripped, kept, f"{n_zeros:.0f}", f"{n_empty:.0f}", f"{n_zeros - n_empty:.0f}",
           f"{t_zeros:.1f}", f"{t_empty:.1f}", f"{(t_zeros - t_empty) / max(stripped, 1):.2f}",
           f"{100 * (t_zeros - t_empty) / t_zeros:.1f}%", "yes" if same else "NO"]
    diff = [(batch, k, f"{zeros['counts'][k]:.0f}", f"{empty['counts'][k]:.0f}")
            for k in sorted(set(zeros["counts"]) | set(empty["counts"]))
            if zeros["counts"][k] != empty["counts"][k]]
    for v in (zeros, empty):
        v["graph"] = None  # free the captured pools before the next batch
    return row, diff


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--layers", type=int, default=2, help="decoder layers kept from the preset (default 2)")
    p.add_argument("--form", choices=("engine", "hf"), default="engine",
                   help="engine: merged qkv / gate_up, 4 quantized linears per layer (serving); hf: 7 per layer")
    p.add_argument("--batches", default="1,8,64", help="decode batch sizes (tokens per forward)")
    p.add_argument("--reps", type=int, default=50, help="forwards captured per CUDA graph")
    p.add_argument("--rounds", type=int, default=21, help="alternating replays of each graph")
    p.add_argument("--profile-iters", type=int, default=10)
    p.add_argument("--dry-run", action="store_true", help="CPU, qwen3-tiny, one batch: checks the script")
    args = p.parse_args(argv)
    if args.dry_run:
        args.preset, args.batches, device = "qwen3-tiny", "1", torch.device("cpu")
    elif not torch.cuda.is_available():
        print("benchmarks/zero_fill.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    log(f"building {args.preset} ({args.layers} layers, {args.form} form, per-tensor fp8) on {device}")
    model = build_model(args.preset, form=args.form, scheme="per-tensor", layers=args.layers, device=device)
    rows, diffs = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        log(f"B={batch}: compiling with and without the rewrite, profiling, capturing")
        row, diff = run_one(model, batch, args, device)
        rows.append(row)
        diffs.extend(diff)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run: numbers mean nothing)"
    print(f"\nzero-fill rewrite: {args.preset}, {args.layers} layers, {args.form} form, per-tensor fp8, {gpu}, "
          f"torch {torch.__version__}; time = median of {args.rounds} alternating CUDA-graph replays of "
          f"{args.reps} forwards")
    print(tabulate(rows, headers=["B", "fills stripped", "kept", "kernels/fwd zeros", "kernels/fwd empty", "fewer",
                                  "us/fwd zeros", "us/fwd empty", "us saved/fill", "saved", "logits equal"]))
    if diffs:
        print("\nkernels whose launches per forward differ:")
        print(tabulate(diffs, headers=["B", "kernel", "zeros", "empty"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
