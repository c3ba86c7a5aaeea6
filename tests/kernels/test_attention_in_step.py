"""``benchmarks/attention_in_step.py``: the traced attention launches inside a captured step. Its marks are inline
PTX (GPU only); what can go wrong on the CPU's side is which launch writes where, and whether the step's launches
reach the traced copy at all."""

import os
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import attention_in_step  # noqa: E402

from fp8_fusion_pass.kernels.triton import decode_attention  # noqa: E402

SLOTS = attention_in_step.SLOTS


def test_captured_launches_keep_their_slices_and_the_others_share_a_scratch_one():
    state = {"capturing": False}
    slices = attention_in_step.TraceSlices(2, 3, "cpu", capturing=lambda: state["capturing"])
    assert slices.take().data_ptr() == slices.buf[-1].data_ptr() and slices.taken == 0  # the warm-up's
    state["capturing"] = True
    first, second = slices.take(), slices.take()
    assert (first.data_ptr(), second.data_ptr()) == (slices.buf[0].data_ptr(), slices.buf[1].data_ptr())
    with pytest.raises(RuntimeError, match="more than 2 attention launches"):
        slices.take()
    first.view(3, SLOTS)[:2, 7] = 5  # two of three programs reached their exit mark; the second launch none
    first.view(3, SLOTS)[:2, 0] = torch.tensor([11, 12])
    got = slices.launches()
    assert [len(t) for t in got] == [2, 0] and got[0][:, 0].tolist() == [11, 12]


def test_the_ops_launches_go_through_the_traced_copy_each_with_its_slice_and_back():
    calls = []

    class Traced:
        TRACE = [None]

        @staticmethod
        def _launch(*args, **kwargs):
            calls.append((Traced.TRACE[0], kwargs["upto"]))
            return "traced"

    slices = attention_in_step.TraceSlices(2, 1, "cpu", capturing=lambda: True)
    real = decode_attention._launch
    undo = attention_in_step.trace_launches(Traced, slices)
    try:
        q, cache, last = torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 4, 16), torch.zeros(1, dtype=torch.int64)
        assert decode_attention.decode_attention_upto(q, cache, cache, last, 1.0) == "traced"  # the module's global
        keep = torch.ones(1, 1, 1, 4, dtype=torch.bool)
        assert decode_attention.decode_attention(q, cache, cache, keep, 1.0) == "traced"
    finally:
        undo()
    assert decode_attention._launch is real
    assert [(t.data_ptr(), upto) for t, upto in calls] == [(slices.buf[0].data_ptr(), True),
                                                           (slices.buf[1].data_ptr(), False)]


def test_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="needs an NVIDIA GPU"):
        attention_in_step.main(["--batches", "1"])
