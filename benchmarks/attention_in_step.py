"""The decode attention launch's phase clocks inside a whole engine step, as ``attention_timeline.py`` reads them
for the launch alone.

    PYTHONPATH=. python benchmarks/attention_in_step.py --preset llama3.1-8b --layers 4 --batches 8

Why: three changes that shortened the RoPE launch alone by 0.3-0.5 us (the sweep's batch-1 row, q's math on its
real rows, the cold sweep's batch-8 row) moved the engine step by under 0.1 us a launch, while the merge's change
(what the last split does after its ticket) moved it by ~1.2 (docs/benchmarks.md, "Each launch of a step in
order"). What bounds the launch in a step is then not what the launch alone shows. Here the step (``decode.py``'s
compile and capture, with the pass) runs ``attention_timeline.py``'s traced copy of ``decode_attention.py``: every
attention launch the graph captures writes its programs' clocks into a slice of its own, so each layer's launch
reads as one launch alone does, with the caches, L2 and the kernels before it as a step leaves them. The marks
cost a few stores and (inside the RoPE prologue) two reductions a program, in both readings alike. NVIDIA only.

Run (H100, forty-first session, ``issue7.sh instep``): the launch runs in the step as alone with L2 flushed, every
phase within 6%, its span the median program's chain of phases (docs/benchmarks.md, "The merge on the real rows,
timed: kept; the attention launch inside the step").
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import attention_timeline  # noqa: E402
import decode  # noqa: E402
from decode import EngineRunner, capture, compile_regions, log, time_replays  # noqa: E402

from fp8_fusion_pass.kernels.triton import decode_attention  # noqa: E402
from fp8_fusion_pass.models import build_model  # noqa: E402

SLOTS = attention_timeline.SLOTS


class TraceSlices:
    """One buffer of per-launch slices, ``programs`` programs' slots each. A launch made while a CUDA graph is being
    captured takes the next slice and keeps it (the graph's replays write there); any other launch (the compile's,
    the warm-up's) writes a scratch slice that is never read."""

    def __init__(self, launches: int, programs: int, device, capturing=torch.cuda.is_current_stream_capturing):
        self.buf = torch.zeros(launches + 1, programs * SLOTS, dtype=torch.int64, device=device)
        self.taken = 0
        self.capturing = capturing

    def take(self) -> torch.Tensor:
        if not self.capturing():
            return self.buf[-1]
        if self.taken == self.buf.shape[0] - 1:
            raise RuntimeError(f"attention_in_step: more than {self.taken} attention launches in the captured step")
        self.taken += 1
        return self.buf[self.taken - 1]

    def launches(self) -> list[torch.Tensor]:
        """Each captured launch's [programs that ran, SLOTS] clocks, in capture order (a program's exit timer is
        never 0; slots past the launch's programs stay 0)."""
        host = self.buf[: self.taken].view(self.taken, -1, SLOTS).cpu()
        return [tr[tr[:, 7] != 0] for tr in host]


def trace_launches(traced, slices: TraceSlices):
    """Route ``decode_attention``'s launches through the traced copy, each with a slice; returns the undo."""
    real = decode_attention._launch

    def launch(*args, **kwargs):
        traced.TRACE[0] = slices.take()
        return traced._launch(*args, **kwargs)

    decode_attention._launch = launch

    def undo():
        decode_attention._launch = real

    return undo


def _summary(traces: list[torch.Tensor]) -> list[list]:
    """``attention_timeline.summarize`` of the readings where the launch's programs ran to their merge."""
    ran = [tr for tr in traces if len(tr) and int(tr[:, 9].sum()) > 0]
    return attention_timeline.summarize(ran, None) if ran else []


def main(argv=None) -> int:
    from tabulate import tabulate

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama3.1-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--replays", type=int, default=20, help="readings: each after 3 back-to-back replays")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attention_in_step.py needs an NVIDIA GPU (its marks are inline PTX)")
    torch.set_grad_enabled(False)
    traced = attention_timeline.traced_module()
    torch.manual_seed(0)
    model = build_model(a.preset, form="engine", scheme="block", layers=a.layers, device="cuda")
    torch._dynamo.reset()
    compile_regions(model, decode.variant_config("block+pass"))
    for batch in (int(b) for b in a.batches.split(",")):
        hkv = model.config.num_key_value_heads
        slices = TraceSlices(4 * a.layers, batch * hkv * decode_attention.MAX_SPLITS, "cuda")
        undo = trace_launches(traced, slices)
        try:
            runner = EngineRunner(model, batch, a.context + 64, a.context)
            graph, _ = capture(runner.step_fn(), runner.args())
        finally:
            undo()
        if slices.taken == 0:
            print(f"\nbatch {batch}: no attention launch in the captured step (is the pass's attention rewrite on?)")
            continue
        step_ms = time_replays(graph, 20)
        readings: list[list[torch.Tensor]] = [[] for _ in range(slices.taken)]
        for _ in range(a.replays):
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            for i, tr in enumerate(slices.launches()):
                readings[i].append(tr)
        programs = {len(r[0]) for r in readings}
        if programs == {0}:  # the exit marks are the splits' (after the merge ticket): one split reaches none
            print(f"\nbatch {batch}: no program reached its exit mark (one split per kv head?): nothing to read")
            continue
        log(f"{a.preset} x{a.layers} layers, batch {batch}: {slices.taken} attention launches a step, "
            f"{sorted(programs)} programs each; step {step_ms * 1e3:.1f} us with the marks")
        # every layer's launch together (the same shapes), then the first and last layer's apart
        rows = _summary([tr for r in readings for tr in r])
        first, last = _summary(readings[0]) or rows, _summary(readings[-1]) or rows
        table = [[r[0], r[1], r[2], f[1], la[1]] for r, f, la in zip(rows, first, last)]
        print(f"\n{a.preset} batch {batch}, in the step (cycles; median over {a.replays} readings x "
              f"{slices.taken} launches)")
        print(tabulate(table, headers=["", "median program", "slowest program", "first layer's median",
                                       "last layer's median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
