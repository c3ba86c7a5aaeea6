"""The GEMV with the silu-quant in its epilogue (``_gemv_silu_kernels.py``), M <= 4.

CPU (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): against the unfused pair it replaces (``gemv_mm`` on
the merged weight at twice the config's rows, then ``silu_mul_group_quant``: bit for bit) and the reference; a quant
group over one or many programs, groups of 128 / 64 / 32, non-power-of-two M; zeros and NaN; the op's dispatch to it
from a ``GemvConfig`` TABLE row; the shapes and configs it refuses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gemm_helpers import make_inputs

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, ops  # noqa: F401  (ops registers torch.ops.fp8_fusion)
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm
from fp8_fusion_pass.kernels.triton._gemv_silu_kernels import gemv_silu_quant
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

BF16 = torch.bfloat16
OP = torch.ops.fp8_fusion.blockscale_mm_silu_mul_group_quant


def _gate_up(m, i, k, seed=0):
    q, xs, wg, sg = make_inputs(m, i, k, 128, seed=seed)
    _, _, wu, su = make_inputs(m, i, k, 128, seed=seed + 1)
    return q, xs, wg, sg, wu, su


def _assert_equal(a, b, what=""):
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)), f"{what}: fp8 values differ"
    assert torch.equal(a[1], b[1]), f"{what}: scales differ"


def _pair(q, xs, wg, sg, wu, su, group, config):
    # gate and up rows are one tile of twice the rows: the GEMV at that config sums each row the same way
    wide = dataclasses.replace(config, rows=2 * config.rows)
    return silu_mul_group_quant(gemv_mm(q, xs, torch.cat([wg, wu]), torch.cat([sg, su]), BF16, wide), group)


def _rel_err(out, want):
    a, b = ref.dequant_activation(*out), ref.dequant_activation(*want)
    return ((a - b).norm() / b.norm()).item()


def _reference(q, xs, wg, sg, wu, su, group):
    y = ref.blockscale_mm_grouped(q, xs, [wg, wu], [sg, su], BF16)
    return ref.silu_mul_group_quant(y, group, arch.fp8_dtype("cpu"), arch.fp8_max("cpu"))


@pytest.mark.parametrize(
    "m, i, k, group, config",
    [
        (1, 256, 512, 128, GemvConfig(4, 256, 4, 1)),  # 32 programs per group: the last one quantizes it
        (3, 384, 512, 64, GemvConfig(8, 512, 4, 1)),  # M = 3 padded to 4 rows; groups of 64 over 8 programs
        (4, 256, 384, 32, GemvConfig(16, 256, 4, 1)),  # K = 384 in chunks of 256: a masked tail chunk
        (2, 256, 384, 128, GemvConfig(128, 128, 4, 1)),  # rows = G: each program quantizes its own group
        (1, 256, 256, 64, GemvConfig(128, 256, 4, 1)),  # two groups in one program
    ],
)
def test_fused_gemv_is_the_unfused_pair_bit_for_bit(m, i, k, group, config):
    q, xs, wg, sg, wu, su = _gate_up(m, i, k)
    fused = gemv_silu_quant(q, xs, wg, sg, wu, su, BF16, group, config)
    _assert_equal(fused, _pair(q, xs, wg, sg, wu, su, group, config), f"M={m} I={i} K={k} g={group} {config}")
    assert not smk.tile_counters(q.device, 1).any(), "every group ticket is reset for the next launch"
    assert _rel_err(fused, _reference(q, xs, wg, sg, wu, su, group)) < 2e-2


def test_a_group_over_many_programs_leaves_its_counters_empty():
    # 64 programs per quant group of 128 meet by a ticket; the last resets its counter for the next launch
    m, i, k, config = 3, 256, 256, GemvConfig(2, 256, 2, 1)  # K: one chunk (the tickets are the point)
    q, xs, wg, sg, wu, su = _gate_up(m, i, k, seed=5)
    want = _pair(q, xs, wg, sg, wu, su, 128, config)
    for _ in range(2):
        _assert_equal(gemv_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, config), want, "2 rows per program")
        assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0


def test_zero_activation_gives_zeros_and_the_floor_scale():
    q, xs, wg, sg, wu, su = _gate_up(2, 256, 256)
    qo, so = gemv_silu_quant(torch.zeros_like(q), xs, wg, sg, wu, su, BF16, 128, GemvConfig(8, 256, 4, 1))
    assert torch.equal(qo.float(), torch.zeros_like(qo, dtype=torch.float32))
    assert torch.equal(so, torch.full_like(so, 1e-10 / arch.fp8_max("cpu")))


def test_nan_reaches_only_its_row():
    q, xs, wg, sg, wu, su = _gate_up(2, 256, 256)
    xs = xs.clone()
    xs[0, 1] = float("nan")  # row 0's second K group: every output of row 0 is NaN, row 1 untouched
    qo, so = gemv_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, GemvConfig(8, 256, 4, 1))
    assert so[0].isnan().all() and not so[1].isnan().any()
    _assert_equal((qo[1:], so[1:]), _pair(q[1:], xs[1:], wg, sg, wu, su, 128, GemvConfig(8, 256, 4, 1)), "row 1")


@pytest.mark.parametrize("weights", ["merged", "separate"])
def test_the_op_runs_a_gemv_table_row(monkeypatch, weights):
    q, xs, wg, sg, wu, su = _gate_up(1, 256, 512)
    config = GemvConfig(8, 512, 4, 1)
    monkeypatch.setitem(bsq.TABLE, (arch.arch_of("cpu").name, bm.m_bucket(1), 256, 512), config)
    assert bsq.fused_config(arch.arch_of("cpu"), "cpu", q.dtype, 1, 256, 512, 128, 128, BF16) == config
    w_qs, w_scales = ([torch.cat([wg, wu])], [torch.cat([sg, su])]) if weights == "merged" else ([wg, wu], [sg, su])
    with backends.use_backend("triton"):
        got = OP(q, xs, w_qs, w_scales, BF16, 128)
    _assert_equal(got, gemv_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, config), "the TABLE's GEMV")


def test_a_gemv_row_is_not_used_above_four_rows(monkeypatch):
    # bucket 16 holds M = 5..16: a GemvConfig row there must leave the op on the unfused pair, never the GEMV
    a = arch.arch_of("cpu")
    monkeypatch.setitem(bsq.TABLE, (a.name, 16, 256, 512), GemvConfig(8, 512, 4, 1))
    assert bsq.fused_config(a, "cpu", arch.fp8_dtype("cpu"), 5, 256, 512, 128, 128, BF16) is None
    monkeypatch.setitem(bsq.TABLE, (a.name, 4, 256, 512), GemvConfig(8, 512, 4, 1))
    assert bsq.fused_config(a, "cpu", arch.fp8_dtype("cpu"), 4, 256, 512, 128, 128, BF16) is not None


@pytest.mark.parametrize(
    "m, i, group, config, match",
    [
        (5, 256, 128, GemvConfig(8, 256, 4, 1), "M <= 4"),
        (1, 256, 128, GemvConfig(512, 256, 4, 1), "must divide I=256"),  # rows > I
        (1, 192, 128, GemvConfig(8, 256, 4, 1), "divide I=192"),  # I not a multiple of the output group
        (1, 384, 128, GemvConfig(256, 256, 4, 1), "must divide I=384"),
    ],
)
def test_kernel_refuses_what_it_cannot_run(m, i, group, config, match):
    q, xs, wg, sg, wu, su = _gate_up(m, i, 256)
    with pytest.raises(ValueError, match=match):
        gemv_silu_quant(q, xs, wg, sg, wu, su, BF16, group, config)
