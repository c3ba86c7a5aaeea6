"""On a CUDA GPU: the small-M GEMM's in-launch split-K sum ("last") on two streams at once, with and without the
shared ticket counters (``FP8_FUSION_TICKETS``, ``_small_m_kernels.py``'s docstring).

Each stream repeats one GEMM on its own inputs, both launched back to back so that they overlap on the GPU; every
output is compared bit for bit with the same GEMM run alone. With ``FP8_FUSION_TICKETS=0`` the launches share no
state, so no output may differ. ``PYTHONPATH=.:tests python tests/kernels/test_tickets_streams_gpu.py`` prints
how many differ with the counters shared, where two launches at once can take each other's tickets (what the switch
is for): on the H200, 376 and 288 of 400 in two runs, and 0 of 400 with the switch (2026-12-04).
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


def wrong_outputs(rounds: int = ROUNDS) -> int:
    """Outputs of two streams' overlapping GEMMs that differ from the same GEMM run alone."""
    inputs = [make_inputs(16, 4096, 4096, seed=seed) for seed in (0, 1)]
    alone = [smk.small_m_mm(*args, torch.bfloat16, CONFIG) for args in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
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
    return sum(not torch.equal(y, alone[i]) for i in range(2) for y in outs[i])


def test_two_streams_at_once_are_right_without_shared_tickets(monkeypatch):
    monkeypatch.setenv(smk.TICKETS_ENV, "0")
    assert wrong_outputs() == 0


if __name__ == "__main__":
    for value in ("1", "0"):
        os.environ[smk.TICKETS_ENV] = value
        print(f"{smk.TICKETS_ENV}={value}: {wrong_outputs()} of {2 * ROUNDS} outputs differ from the GEMM alone")
