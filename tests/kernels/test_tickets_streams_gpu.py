"""On a CUDA GPU: the small-M GEMM's in-launch split-K sum ("last") on two streams at once.

Each stream repeats one GEMM on its own inputs, both queued behind a sleep so that they run side by side on the GPU;
every output is compared bit for bit with the same GEMM run alone. Each stream has its own ticket counters
(``tile_counters``), and ``FP8_FUSION_TICKETS=0`` uses none: either way no output may differ.
``PYTHONPATH=.:tests python tests/kernels/test_tickets_streams_gpu.py`` also prints what one buffer shared by both
streams gives (the counters before bc2b23a's successor): two launches at once take each other's tickets. On the
H200 (2026-12-04) 376 and 288 of 400 outputs differed that way, 0 of 400 with ``FP8_FUSION_TICKETS=0``.
"""

from __future__ import annotations

import os

import pytest
import torch
from gemm_helpers import make_inputs

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig

pytestmark = pytest.mark.gpu
CONFIG = SmallMConfig(64, 4, 4, 4, "last")  # 64 N tiles x 4 splits: each output tile's ticket taken 4 times
ROUNDS = 200
SLEEP_CYCLES = 1 << 30  # ~0.5 s at the H200's clock: longer than enqueueing 2 x ROUNDS launches


def wrong_outputs(rounds: int = ROUNDS, shared: bool = False) -> int:
    """Outputs of two streams' overlapping GEMMs that differ from the same GEMM run alone; ``shared``: both
    streams' launches take their tickets from one buffer."""
    inputs = [make_inputs(16, 4096, 4096, seed=seed) for seed in (0, 1)]
    alone = [smk.small_m_mm(*args, torch.bfloat16, CONFIG) for args in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
    if shared:
        one = torch.zeros(smk.COUNTER_SLOTS, dtype=torch.int32, device="cuda")
        for stream in streams:
            smk._counters[(one.device, stream.cuda_stream)] = one
    torch.cuda.synchronize()
    for stream in streams:  # both queues fill while the GPU sleeps (the launches outlast their kernels), then
        with torch.cuda.stream(stream):  # drain side by side
            torch.cuda._sleep(SLEEP_CYCLES)
    outs: list[list[torch.Tensor]] = [[], []]
    for _ in range(rounds):
        for i, (stream, args) in enumerate(zip(streams, inputs)):
            with torch.cuda.stream(stream):
                outs[i].append(smk.small_m_mm(*args, torch.bfloat16, CONFIG))
    torch.cuda.synchronize()
    if shared:  # its tickets may be left taken: no later launch on these (pooled) streams may find it
        for stream in streams:
            del smk._counters[(one.device, stream.cuda_stream)]
    return sum(not torch.equal(y, alone[i]) for i in range(2) for y in outs[i])


@pytest.mark.parametrize("tickets", ["1", "0"])
def test_two_streams_at_once_are_right(monkeypatch, tickets):
    monkeypatch.setenv(smk.TICKETS_ENV, tickets)
    assert wrong_outputs() == 0


if __name__ == "__main__":
    for tickets, shared in (("1", True), ("1", False), ("0", False)):
        os.environ[smk.TICKETS_ENV] = tickets
        what = "one buffer for both streams" if shared else f"{smk.TICKETS_ENV}={tickets}"
        print(f"{what}: {wrong_outputs(shared=shared)} of {2 * ROUNDS} outputs differ from the GEMM alone")
