"""A fresh process that compiles one tiny model with the fp8 fusion backend and writes what happened as JSON.

Used by ``test_cache_safety.py`` and ``test_concurrency.py`` (a compile "in a fresh process" must not see the
parent's in-memory caches; only ``TORCHINDUCTOR_CACHE_DIR`` is shared). Not a test module.

    python tests/reliability_worker.py --model qwen3-tiny --form engine --layers 1 [--disable silu_quant]
        [--inject replacement:silu_quant] [--barrier DIR --parties 2] --out result.json

Writes: the pass's uuid, Inductor / AOTAutograd cache counters, the fusion counts of every report of a graph the
pass ran on (none when the compiled graph came from the cache: a hit skips the pass, and the backend adds a report
marked ``cache_hit`` instead, counted in ``cache_hit_reports``), and the logits (a .pt file next to ``--out``) with
their sha256.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve()
WORKER_TIMEOUT_S = 300  # a cold compile is ~20 s here; generous for a loaded box


def spawn(tmp_path: pathlib.Path, name: str, *args: str, env: dict | None = None) -> dict:
    """Run this script in a fresh process with ``tmp_path/inductor-cache`` as the Inductor cache dir (FX graph
    cache on, FP8_FUSION_DISABLE not inherited unless in ``env``); returns its JSON."""
    out = tmp_path / f"{name}.json"
    inherited = {k: v for k, v in os.environ.items() if k != "FP8_FUSION_DISABLE"}
    full_env = {**inherited, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache"),
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    proc = subprocess.run([sys.executable, str(WORKER), "--out", str(out), *args], check=False, cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _barrier(directory: str | None, parties: int, timeout_s: float = 120.0) -> None:
    """Every process arrives, then all go: their compiles overlap (file-based, no shared memory needed)."""
    if not directory:
        return
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(d.glob("ready-*"))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {d}: {len(list(d.glob('ready-*')))} of {parties} arrived")
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen3-tiny")
    p.add_argument("--form", default="engine")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--disable", default="", help="comma-separated FusionConfig switches turned off")
    p.add_argument("--inject", default="", help="stage:fusion for fusion_pass.inject_failure")
    p.add_argument("--barrier", default="")
    p.add_argument("--parties", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    import fp8_fusion_pass
    from fp8_fusion_pass import report as report_mod
    from fp8_fusion_pass.config import FusionConfig
    from fp8_fusion_pass.fusion_pass import inject_failure
    from fp8_fusion_pass.models import build_model, example_inputs

    torch._inductor.config.compile_threads = 1  # no worker pool: 2 shared cores
    off = {n: False for n in args.disable.split(",") if n}
    config = FusionConfig(**off)
    backend = fp8_fusion_pass.backend(config)
    model = build_model(args.model, form=args.form, scheme="block", layers=args.layers)
    inputs = example_inputs(model, batch=2, seq=5)
    inject = contextlib.nullcontext()
    if args.inject:
        stage, fusion = args.inject.split(":")
        inject = inject_failure(stage, fusion)
    _barrier(args.barrier, args.parties)
    with inject, torch.no_grad():
        uuid = backend.fusion_pass.uuid()  # inside: the key this compile is cached under
        out = torch.compile(model, backend=backend)(*inputs)
    logits = out if torch.is_tensor(out) else out.logits
    out_path = pathlib.Path(args.out)
    torch.save(logits, out_path.with_suffix(".pt"))
    counters = torch._dynamo.utils.counters
    ran = [r for r in report_mod.all_reports() if not getattr(r, "cache_hit", False)]
    result = {
        "pid": os.getpid(),
        "uuid": uuid,
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
        "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        # reports of graphs the pass ran on; a graph served from the FX graph cache gets a report marked
        # cache_hit instead (the pass did not run), counted separately
        "reports": [r.counts() for r in ran],
        "rejection_reasons": [r.rejection_reasons() for r in ran],
        "cache_hit_reports": sum(getattr(r, "cache_hit", False) for r in report_mod.all_reports()),
        "logits_sha256": hashlib.sha256(logits.float().numpy().tobytes()).hexdigest(),
    }
    out_path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
