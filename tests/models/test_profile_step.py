"""``benchmarks/profile_step.py`` files every kernel by name: each of our Triton GEMM kernels must land in the GEMM
category (the tiled kernel did not, and its 4 x 33 us per Qwen3-8B step at batch 64 read as "other")."""

from __future__ import annotations

import os
import sys

import pytest

from fp8_fusion_pass.kernels.triton import _blockscale_kernels, _gemv_kernels, _small_m_kernels, _small_m_silu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

GEMMS = [
    _blockscale_kernels._blockscale_mm_kernel,
    _gemv_kernels._gemv_kernel,
    _small_m_kernels._small_m_kernel,
    _small_m_kernels._splitk_reduce_kernel,
    _small_m_silu_kernels._small_m_silu_quant_kernel,
]


@pytest.mark.parametrize("kernel", GEMMS, ids=lambda k: k.fn.__name__)
def test_our_gemm_kernels_count_as_gemms(kernel):
    import profile_step

    assert profile_step.category(kernel.fn.__name__) == "gemm ours (Triton)"


def test_other_kernels_keep_their_categories():
    import profile_step

    assert profile_step.category("_rms_norm_kernel") == "norm(+quant)"
    assert profile_step.category("_silu_and_mul_kernel") == "silu(+quant)"
    assert profile_step.category("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT") == "gemm other"
    assert profile_step.category("triton_poi_fused_add_cat_mul_neg_slice_0") == "inductor fused"


def test_the_step_sequence_is_each_positions_mean_in_launch_order():
    import profile_step

    # two replays of a 3-launch step, handed over out of order (the profiler groups events by stream / thread)
    events = [("b", 12.0, 3.0), ("a", 0.0, 1.0), ("c", 14.0, 5.0), ("a", 10.0, 3.0), ("b", 2.0, 1.0), ("c", 4.0, 7.0)]
    assert [(name, us) for name, us, _ in profile_step.step_sequence(events, 2)] == [("a", 2.0), ("b", 2.0), ("c", 6.0)]
    # replays whose orders differ name no launch by position; nor do events that do not split into the replays
    swapped = [("a", 0.0, 1.0), ("b", 1.0, 1.0), ("b", 10.0, 1.0), ("a", 11.0, 1.0)]
    assert profile_step.step_sequence(swapped, 2) is None
    assert profile_step.step_sequence(events[:5], 2) is None
    assert profile_step.step_sequence([], 2) is None


def test_each_launch_carries_its_mean_gap_to_the_next_launch_of_its_step():
    import profile_step

    # replay 1: a [0, 1) b [3, 4) c [4, 9); replay 2: a [20, 22) b [23, 24) c [26, 27); the step's last has no gap
    events = [("a", 0.0, 1.0), ("b", 3.0, 1.0), ("c", 4.0, 5.0), ("a", 20.0, 2.0), ("b", 23.0, 1.0), ("c", 26.0, 1.0)]
    assert profile_step.step_sequence(events, 2) == [("a", 1.5, 1.5), ("b", 1.0, 1.0), ("c", 3.0, None)]


def test_by_kernel_averages_each_kernels_launches_and_the_gaps_after_them():
    import profile_step

    sequence = [("gemv", 10.0, 1.0), ("attn", 6.0, 0.5), ("gemv", 20.0, 2.0), ("attn", 8.0, None)]
    assert profile_step.by_kernel(sequence) == [("gemv", 2, 15.0, 1.5), ("attn", 2, 7.0, 0.5)]
