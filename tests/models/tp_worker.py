"""One rank of the CPU tensor-parallel check (gloo), started as a process by ``test_tp.py``.

    python tests/models/tp_worker.py --rank R --world 2 --store DIR/store --out DIR [--device cuda]

Per rank: build the unsharded engine model (same preset and seed on every rank, so the same weights), run it
eagerly as the reference, shard a copy with ``tensor_parallel``, then run the shard eagerly, compiled without the
pass and compiled with the pass, each compile wrapped in a ``CollectiveAudit``. Writes ``rank{R}.pt``: logits of
every variant, the pass's report counts, the audits, and how long each part took. The parent asserts.
``--device cuda``: one GPU per rank over NCCL, with NVLink multicast off (``NCCL_NVLS_ENABLE=0`` and the other
switches ``../.library/device/KINDS.md`` names), set before the process group starts.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from fp8_fusion_pass import report  # noqa: E402
from fp8_fusion_pass.models import build_model, example_inputs  # noqa: E402
from fp8_fusion_pass.models.tp import tensor_parallel  # noqa: E402
from fp8_fusion_pass.models.tp_graph import CollectiveAudit  # noqa: E402


def compiled(model, inner):
    """``torch.compile`` with Inductor, one whole graph, the audit (around the pass or nothing) as post pass."""
    audit = CollectiveAudit(inner)
    torch._dynamo.reset()
    fn = torch.compile(model, fullgraph=True, dynamic=False, options={"post_grad_custom_post_pass": audit})
    return fn, audit


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="file for the FileStore rendezvous (no port to pick)")
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="qwen3-tiny")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)  # ranks share the box's cores; oversubscription only slows both down
    t0 = time.perf_counter()
    times = {}
    device = torch.device("cpu") if args.device == "cpu" else torch.device("cuda", args.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl", init_method=f"file://{args.store}",
                            rank=args.rank, world_size=args.world)
    try:
        ref = build_model(args.preset, form="engine", scheme="block", layers=args.layers, seed=0, device=device)
        inputs = example_inputs(ref, batch=2, seq=8)
        out = {"reference": ref(*inputs)}
        tp_model = tensor_parallel(copy.deepcopy(ref))
        out["eager"] = tp_model(*inputs)
        times["build+eager"] = time.perf_counter() - t0

        t = time.perf_counter()
        fn, audit_off = compiled(tp_model, None)
        out["compiled"] = fn(*inputs)
        times["compile without pass"] = time.perf_counter() - t

        from fp8_fusion_pass.fusion_pass import FP8FusionPass

        t = time.perf_counter()
        report.clear_reports()
        fn, audit_on = compiled(tp_model, FP8FusionPass())
        out["compiled+pass"] = fn(*inputs)
        times["compile with pass"] = time.perf_counter() - t
        reports = report.all_reports()
        for r in reports:  # each rank's compile has its own report: print it with the rank
            print(f"[rank {args.rank}] {r.summary_line()}", flush=True)
        result = {
            "logits": {k: v.float().cpu() for k, v in out.items()},
            "counts": [r.counts() for r in reports],
            "rejections": [r.rejection_reasons() for r in reports],
            "audit_off": [a.to_dict() for a in audit_off.audits],
            "audit_on": [a.to_dict() for a in audit_on.audits],
            "times": times,
        }
        torch.save(result, os.path.join(args.out, f"rank{args.rank}.pt"))
        print(f"[rank {args.rank}] times {', '.join(f'{k} {v:.1f}s' for k, v in times.items())}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
