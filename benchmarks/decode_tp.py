"""Tensor-parallel decode benchmark: block-FP8 engine model sharded over GPUs, with the pass vs without, one run.

    # 2 GPUs (one process per GPU, spawned here: no torchrun needed), both presets, batches 1 8 32 64:
    PYTHONPATH=. python benchmarks/decode_tp.py --tp 2 --presets qwen3-8b,qwen3-32b --batches 1,8,32,64
    # 1 GPU: the same harness, unsharded model, no process group (--group: a 1-rank NCCL group and the TP model,
    # which checks the functional all-reduce under CUDA graphs on one GPU):
    PYTHONPATH=. python benchmarks/decode_tp.py --tp 1 --presets qwen3-8b,qwen3-32b [--group]
    # CPU smoke test of the whole script (gloo, tiny preset, wall clock, no CUDA graphs; numbers mean nothing):
    PYTHONPATH=. python benchmarks/decode_tp.py --dry-run --tp 2 --presets qwen3-tiny --batches 1 --steps 2

Each rank builds the unsharded model from the preset and seed (same weights on every rank), shards it with
``models.tp.tensor_parallel`` (column-parallel qkv / gate_up, row-parallel o / down + all-reduce, vocab-parallel
lm_head), and owns its decode loop: a static KV cache filled to ``--context`` tokens, then one compiled step per
token under CUDA graphs (Inductor ``triton.cudagraphs``, ``torch.compiler.cudagraph_mark_step_begin()`` before
each step). Both variants compile the same way; the only difference is the post-grad pass, wrapped in a
``CollectiveAudit`` that checks the pass fused nothing across an all-reduce. Step time per rank is the median of
``--steps`` event-timed steps; the table shows the slowest rank.

NVLink multicast stays off (``../.library/device/KINDS.md``: a program using it can take a shared host's GPUs out
of service): ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` are
forced below before torch is imported, and spawned ranks inherit them.

Time: a full qwen3-32b (64 layers) compiles 8 graphs per preset (4 batches x 2 variants), so ``--layers``
defaults to 12 to finish both presets in about 8 minutes on 2 H200s (``--layers 0``: all layers); the table says
how many layers ran. ``--budget-s`` skips the remaining (preset, batch) units once the next one would overrun.
"""

from __future__ import annotations

import os

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)  # before torch / NCCL are loaded; forced, not defaulted

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]

from fp8_fusion_pass import report  # noqa: E402
from fp8_fusion_pass.models import build_model  # noqa: E402
from fp8_fusion_pass.models.presets import get_preset  # noqa: E402
from fp8_fusion_pass.models.tp import TPShardError, tensor_parallel  # noqa: E402
from fp8_fusion_pass.models.tp_graph import CollectiveAudit  # noqa: E402


def log(rank: int, msg: str) -> None:
    print(f"[decode_tp {time.strftime('%H:%M:%S')} rank {rank}] {msg}", file=sys.stderr, flush=True)


class Runner:
    """One decode step's inputs: a static KV cache of this rank's kv heads, filled up to ``context`` tokens."""

    def __init__(self, model, batch: int, context: int, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(batch)  # same tokens and cache on every rank
        self.model, self.cache = model, model.new_kv_cache(batch, context + 64)
        for t in self.cache.k + self.cache.v:
            t.normal_(generator=gen)
        self.ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device, generator=gen)
        self.pos = torch.full((batch, 1), context, device=device, dtype=torch.long)

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.cache.k + self.cache.v)

    def step_fn(self):
        model, cache = self.model, self.cache
        return lambda ids, pos: model(ids, pos, cache)


def compile_step(fn, with_pass: bool, cudagraphs: bool):
    from fp8_fusion_pass.fusion_pass import FP8FusionPass

    audit = CollectiveAudit(FP8FusionPass() if with_pass else None)
    options = {"triton.cudagraphs": cudagraphs, "post_grad_custom_post_pass": audit}
    # No fullgraph=True: a graph break on some torch version should cost speed, not the whole run; the fused
    # counts are merged over however many graphs there are.
    return torch.compile(fn, options=options, dynamic=False), audit


def time_wall(step, args, steps: int) -> tuple[float, torch.Tensor]:
    """--dry-run: wall-clock median on the CPU, only to exercise the script."""
    out, times = step(*args), []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = step(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2], out.detach().float().clone()


def run_rank(rank: int, world: int, args, store: str | None) -> None:
    os.environ.update(MULTICAST_OFF)
    torch.set_grad_enabled(False)
    dry = args.dry_run
    device = torch.device("cpu") if dry else torch.device("cuda", rank)
    if not dry:
        torch.cuda.set_device(device)
    grouped = world > 1 or args.group
    if grouped:
        dist.init_process_group("gloo" if dry else "nccl", init_method=f"file://{store}", rank=rank,
                               world_size=world)
        warm = torch.ones(1, device=device)
        dist.all_reduce(warm)  # create the communicator now, never inside a CUDA-graph capture
        assert warm.item() == world
    from _timing import copy_bandwidth
    from decode import time_steps, weight_bytes

    bw = copy_bandwidth(dry_run=dry)
    start, rows, last_unit = time.monotonic(), [], 0.0
    try:
        for preset in args.presets:
            layers = args.layers or get_preset(preset).layers
            log(rank, f"{preset}: building {layers} layers on {device}")
            model = build_model(preset, form="engine", scheme="block", layers=layers, device=device, seed=0)
            try:
                model = tensor_parallel(model) if grouped else model
            except TPShardError as e:
                rows.append(dict(preset=preset, layers=layers, batch="-", skipped=f"refused: {e}"))
                continue
            if not dry:
                torch.cuda.empty_cache()  # the unsharded projections are gone: give their memory back
            wbytes = weight_bytes(model)
            for batch in args.batches:
                go = [time.monotonic() - start + last_unit <= args.budget_s]
                if grouped:
                    dist.broadcast_object_list(go, src=0)  # every rank takes the same decision
                if not go[0]:
                    rows.append(dict(preset=preset, layers=layers, batch=batch, skipped="time budget"))
                    continue
                t_unit = time.monotonic()
                rows.append(run_unit(rank, model, preset, layers, batch, args, device, wbytes, bw, time_steps))
                last_unit = time.monotonic() - t_unit
                log(rank, f"{preset} batch {batch}: {last_unit:.0f} s (2 compiles + timing)")
            del model
            if not dry:
                torch.cuda.empty_cache()
        gathered = [None] * world
        if grouped:
            dist.all_gather_object(gathered, rows)
        else:
            gathered = [rows]
        if rank == 0:
            print_table(gathered, world, args)
    finally:
        if grouped:
            dist.destroy_process_group()


def run_unit(rank, model, preset, layers, batch, args, device, wbytes, bw, time_steps) -> dict:
    runner = Runner(model, batch, args.context, device)
    row = dict(preset=preset, layers=layers, batch=batch, roofline_ms=(wbytes + runner.kv_bytes()) / bw * 1e3)
    logits = {}
    for with_pass in (False, True):
        key = "pass" if with_pass else "base"
        torch._dynamo.reset()
        report.clear_reports()
        step, audit = compile_step(runner.step_fn(), with_pass, cudagraphs=not args.dry_run)
        t0 = time.monotonic()
        timer = time_wall if args.dry_run else time_steps
        row[f"{key}_ms"], logits[key] = timer(step, (runner.ids, runner.pos), args.steps)
        row[f"{key}_wall_s"] = time.monotonic() - t0
        row[f"{key}_violations"] = [v for a in audit.audits for v in a.violations]
        row[f"{key}_all_reduces"] = sum(a.all_reduces for a in audit.audits)
        reports = report.all_reports()
        if with_pass:
            row["fused"] = report.merged(reports).counts() if reports else {}
            for r in reports:
                log(rank, f"{preset} batch {batch} {r.summary_line()}")
        del step
    row["err"] = ((logits["pass"] - logits["base"]).norm() / logits["base"].norm()).item()
    return row


def print_table(per_rank: list[list[dict]], world: int, args) -> None:
    from tabulate import tabulate

    table, notes = [], []
    for i, row in enumerate(per_rank[0]):
        ranks = [rows[i] for rows in per_rank]
        if "skipped" in row:
            notes.append(f"{row['preset']} batch {row['batch']}: skipped ({row['skipped']})")
            continue
        base, fused = max(r["base_ms"] for r in ranks), max(r["pass_ms"] for r in ranks)
        violations = sum(len(r["base_violations"]) + len(r["pass_violations"]) for r in ranks)
        same = all(r["fused"] == row["fused"] for r in ranks)
        table.append([
            row["preset"], f"{row['layers']}/{get_preset(row['preset']).layers}", world, row["batch"],
            f"{base:.3f}", f"{fused:.3f}", f"{base / fused:.3f}x", f"{row['roofline_ms']:.3f}", f"{row['err']:.1e}",
            " ".join(f"{k}={v}" for k, v in row["fused"].items() if k.endswith("quant")) + ("" if same else " DIFFER"),
            f"{row['pass_all_reduces']} ar, {'OK' if not violations else f'{violations} VIOLATIONS'}",
        ])
    print(tabulate(table, headers=["preset", "layers", "tp", "batch", "ms/step", "ms/step +pass", "speed-up",
                                   "roofline ms/rank", "logits rel err", "fused per rank (rank 0)",
                                   "collectives"]))
    if args.layers:
        print(f"note: {args.layers} decoder layers per model (--layers), not the full model: ms/step is not the "
              "full model's; the speed-up is diluted by the un-fused lm_head / embedding share.")
    print("ms/step: median of --steps CUDA-graph steps, slowest rank; roofline: this rank's weight + KV bytes over "
          "copy bandwidth." if not args.dry_run else "dry run: CPU wall clock, numbers mean nothing.")
    for n in notes:
        print("note:", n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=2, help="ranks = GPUs (1: unsharded, no process group)")
    p.add_argument("--presets", default="qwen3-8b,qwen3-32b")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--layers", type=int, default=12, help="decoder layers per model (0: all; default 12, see doc)")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache at each step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=450.0, help="skip remaining units past this wall time")
    p.add_argument("--dry-run", action="store_true", help="CPU + gloo, wall clock, no CUDA graphs")
    p.add_argument("--group", action="store_true",
                   help="with --tp 1: a 1-rank process group and the TP model (o / down all-reduce over one GPU), "
                        "to check NCCL collectives under CUDA graphs on a single GPU")
    args = p.parse_args(argv)
    args.presets = args.presets.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    for name in args.presets:
        get_preset(name)  # fail on a typo before spawning anything
    if not args.dry_run and torch.cuda.device_count() < args.tp:
        print(f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}; {'CPU dry run' if args.dry_run else torch.cuda.get_device_name()}; "
          f"tp {args.tp}; {', '.join(f'{k}={v}' for k, v in MULTICAST_OFF.items())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:  # FileStore rendezvous: no port to pick, nothing left behind
        store = os.path.join(tmp, "store")
        if args.tp == 1:
            run_rank(0, 1, args, store)
        else:
            torch.multiprocessing.spawn(run_rank, args=(args.tp, args, store), nprocs=args.tp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
