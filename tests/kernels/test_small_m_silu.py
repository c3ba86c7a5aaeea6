"""The gate/up GEMM with the silu-quant in its epilogue (``blockscale_mm_silu_mul_group_quant``).

CPU (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): the fused launch against the unfused pair it replaces
(the small-M GEMM at the same config, then ``silu_mul_group_quant``: the same sums, the same roundings, so bit
for bit) and against the reference; merged and separate gate / up weights, split-K with the in-launch sum, whole
and partial column tiles, groups of 128 and 64, zeros; the op's dispatch (measured table, M above the small-M
range, no ticket counters) and its input errors. Small I and K: the interpreter costs ~25 ms per program.
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
from fp8_fusion_pass.kernels.triton import _small_m_silu_kernels as sms
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton import blockscale_mm_silu_quant as bsq
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig
from fp8_fusion_pass.kernels.triton._gemv_silu_kernels import unsupported as gemv_silu_unsupported
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

BF16 = torch.bfloat16
OP = torch.ops.fp8_fusion.blockscale_mm_silu_mul_group_quant


def _bits(out):
    return out[0].view(torch.uint8), out[1]


def _assert_equal(a, b, what=""):
    (qa, sa), (qb, sb) = _bits(a), _bits(b)
    assert qa.shape == qb.shape and sa.shape == sb.shape, what
    assert torch.equal(qa, qb), f"{what}: {(qa != qb).sum().item()} fp8 values differ"
    assert torch.equal(sa, sb), f"{what}: scales differ"


def _gate_up(m, i, k, seed=0, group=128):
    """q, x_scale, and gate / up weights as two separate [I, K] tensors (any I) with the merged [2I, K] form."""
    q, xs, wg, sg = make_inputs(m, i, k, group, seed=seed)
    _, _, wu, su = make_inputs(m, i, k, group, seed=seed + 1)
    return q, xs, wg, sg, wu, su


def _reference(q, xs, ws, ss, group):
    y = ref.blockscale_mm_grouped(q, xs, ws, ss, BF16)
    return ref.silu_mul_group_quant(y, group, arch.fp8_dtype("cpu"), arch.fp8_max("cpu"))


@pytest.mark.parametrize(
    "m, i, k, group, config",
    [
        (1, 256, 512, 128, SmallMConfig(128, 1, 4, 2, "last")),  # one program's whole sum (MODE 0)
        (3, 384, 512, 128, SmallMConfig(128, 2, 4, 2, "last")),  # split-K, the last program's epilogue
        (17, 256, 384, 64, SmallMConfig(128, 3, 4, 2, "last")),  # 17 rows padded to 32; output groups of 64
        (65, 128, 256, 128, SmallMConfig(128, 2, 4, 2, "last")),  # two row tiles of 64: a ticket per (row, column) tile
        (2, 320, 512, 64, SmallMConfig(128, 4, 4, 2, "last")),  # 320 = 2.5 column tiles: masked groups
        (64, 128, 256, 128, SmallMConfig(128, 2, 4, 2, "last")),
        # A quant group over several programs (GROUP_TILES > 1): the last of them quantizes the group
        (1, 256, 512, 128, SmallMConfig(64, 1, 4, 2, "last")),  # 2 tiles per group, no split (MODE 0)
        (3, 384, 512, 128, SmallMConfig(32, 2, 4, 2, "last")),  # 4 tiles per group after the split-K ticket
        (65, 128, 256, 64, SmallMConfig(32, 2, 4, 2, "last")),  # groups of 64 over 2 tiles, two row tiles
    ],
)
@pytest.mark.parametrize("act_group", [128, 64])
def test_fused_launch_is_the_unfused_pair_bit_for_bit(m, i, k, group, config, act_group):
    q, xs, wg, sg, wu, su = _gate_up(m, i, k, group=act_group)
    fused = sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, group, config)
    unfused = silu_mul_group_quant(smk.small_m_mm_grouped(q, xs, [wg, wu], [sg, su], BF16, config), group)
    _assert_equal(fused, unfused, f"M={m} I={i} K={k} g={group} {config}")
    assert not smk.tile_counters(q.device, 1).any(), "every split-K and group ticket is reset for the next launch"
    # and the reference, within one fp8 step where the fp32 sums round differently
    want = _reference(q, xs, [wg, wu], [sg, su], group)
    d = (ref.dequant_activation(*fused) - ref.dequant_activation(*want)).norm() / ref.dequant_activation(*want).norm()
    assert d < 2e-2, f"rel err vs reference {d:.3g}"


@pytest.mark.parametrize(
    "m, i, k, group, act_group, config",
    [
        (3, 256, 512, 128, 128, SmallMConfig(128, 1, 4, 2, "last", tma=True)),  # MODE 0; rows past M read as zeros
        (3, 384, 512, 128, 64, SmallMConfig(128, 2, 4, 2, "last", tma=True)),  # split-K: two halves' partials
        (17, 320, 384, 64, 128, SmallMConfig(128, 3, 4, 2, "last", tma=True)),  # 2.5 column tiles: rows past I
        (65, 256, 256, 128, 128, SmallMConfig(64, 2, 4, 2, "last", tma=True)),  # a group over 2 programs, 2 row tiles
    ],
)  # fmt: skip
def test_tma_gate_and_up_tiles_equal_the_pointer_tile_bitwise(m, i, k, group, act_group, config):
    # Two descriptor tiles and two MMAs per K step against one [2 * block_n, K] pointer tile: the same products in
    # the same order per output, so not a bit may change. The merged weight's halves are read in place.
    q, xs, wg, sg, wu, su = _gate_up(m, i, k, group=act_group)
    w = torch.cat([wg, wu])
    halves = (w[:i], sg, w[i:], su)
    block_k = 128 if act_group == 128 else 64
    descs = sms._descriptors(q, halves[0], halves[2], config, smk.small_m_block_m(m), block_k)
    assert all(d is not t for d, t in zip(descs, (q, halves[0], halves[2]))), "the TMA path is the one under test"
    fused = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, group, config)
    plain = sms.small_m_mm_silu_quant(q, xs, *halves, BF16, group, dataclasses.replace(config, tma=False))
    _assert_equal(fused, plain, f"M={m} I={i} K={k} g={group} {config}")
    assert not smk.tile_counters(q.device, 1).any()
    assert _rel_err(fused, _reference(q, xs, [wg, wu], [sg, su], group)) < 2e-2


@pytest.mark.parametrize(
    "m, i, k, group, config",
    [
        (3, 256, 512, 128, SmallMConfig(128, 1, 4, 2, "last", tma=True, swap=False)),  # MODE 0, 3 rows of 64
        (17, 384, 512, 64, SmallMConfig(64, 2, 4, 2, "last", tma=True, swap=False)),  # split-K partials, groups of 64
        (65, 256, 256, 128, SmallMConfig(64, 2, 4, 2, "last", tma=True, swap=False)),  # a group over 2 programs
        (2, 320, 512, 64, SmallMConfig(32, 1, 4, 2, "last", tma=True, swap=False)),  # 10 tiles of 32 rows
    ],
)  # fmt: skip
def test_activation_rows_on_the_mma_m_side_equal_the_unfused_pair(m, i, k, group, config):
    # Tuning idea 20: the activation tile the MMA's first operand, one scale per gate / up tile, the sums transposed
    # once; against the plain GEMM at the same config (its two weights in one launch, swapped too), then the quant.
    q, xs, wg, sg, wu, su = _gate_up(m, i, k)
    sg, su = sg * torch.arange(1, sg.numel() + 1).reshape(sg.shape), su * 0.5  # a wrong block's scale must show
    fused = sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, group, config)
    unfused = silu_mul_group_quant(smk.small_m_mm_grouped(q, xs, [wg, wu], [sg, su], BF16, config), group)
    _assert_equal(fused, unfused, f"M={m} I={i} K={k} g={group} {config}")
    assert not smk.tile_counters(q.device, 1).any()
    assert _rel_err(fused, _reference(q, xs, [wg, wu], [sg, su], group)) < 2e-2


def test_activation_rows_on_the_m_side_fall_back_to_swap_ab_without_descriptors():
    # An up weight off 16 bytes: no descriptor, so the swap-AB pointer tile runs (the same products, the MMA's
    # operands in the other order: checked against the reference, not bit for bit).
    q, xs, wg, sg, wu, su = _gate_up(5, 256, 512)
    shifted = torch.empty(256 * 512 + 16, dtype=wu.dtype)[1 : 1 + 256 * 512].view(256, 512)
    shifted.copy_(wu)
    cfg = SmallMConfig(128, 2, 4, 2, "last", tma=True, swap=False)
    out = sms.small_m_mm_silu_quant(q, xs, wg, sg, shifted, su, BF16, 128, cfg)
    assert _rel_err(out, _reference(q, xs, [wg, wu], [sg, su], 128)) < 2e-2


def test_tma_falls_back_where_a_descriptor_cannot_address(monkeypatch):
    # A base off 16 bytes, or a GPU without TMA: the pointer tile runs, with the same result.
    q, xs, wg, sg, wu, su = _gate_up(5, 256, 512)
    cfg = SmallMConfig(128, 2, 4, 2, "last", tma=True)
    shifted = torch.empty(256 * 512 + 16, dtype=wu.dtype)[1 : 1 + 256 * 512].view(256, 512)
    shifted.copy_(wu)
    assert sms._descriptors(q, wg, shifted, cfg, 16, 128)[0] is q
    monkeypatch.setattr(arch, "triton_interpreting", lambda: False)
    for name, has_tma in (("sm89", False), ("gfx942", False), ("sm90", True)):
        with arch.simulate_arch(name):
            assert (sms._descriptors(q, wg, wu, cfg, 16, 128)[0] is not q) == has_tma, name
    monkeypatch.undo()
    want = sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, dataclasses.replace(cfg, tma=False))
    _assert_equal(sms.small_m_mm_silu_quant(q, xs, wg, sg, shifted, su, BF16, 128, cfg), want, "unaligned up")


def _pin(monkeypatch, m, i, k, config):
    """A TABLE row for this GEMM on the CPU (the measured rows are the H200's)."""
    monkeypatch.setitem(bsq.TABLE, (arch.arch_of("cpu").name, bm.m_bucket(m), i, k), config)


def _rel_err(out, want):
    a, b = ref.dequant_activation(*out), ref.dequant_activation(*want)
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("config", [SmallMConfig(128, 2, 4, 2, "last"), SmallMConfig(64, 2, 4, 2, "last")], ids=str)
def test_merged_weight_halves_are_read_in_place(monkeypatch, config):
    # through the public op and its TABLE dispatch; block_n 64: a quant group over two programs (GROUP_TILES)
    q, xs, wg, sg, wu, su = _gate_up(3, 256, 512)
    w, s = torch.cat([wg, wu]), torch.cat([sg, su])
    _pin(monkeypatch, 3, 256, 512, config)
    with backends.use_backend("triton"):
        merged = OP(q, xs, [w], [s], BF16, 128)
        separate = OP(q, xs, [wg, wu], [sg, su], BF16, 128)
    _assert_equal(merged, separate, "merged vs separate weights")
    _assert_equal(merged, sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, config), "the TABLE's config")
    assert _rel_err(merged, OP(q, xs, [w], [s], BF16, 128)) < 2e-2  # the reference backend


def test_zero_activation_gives_zeros_and_the_floor_scale():
    q, xs, wg, sg, wu, su = _gate_up(2, 256, 256)
    q = torch.zeros_like(q)
    qo, so = sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, SmallMConfig(128, 2, 4, 2, "last"))
    assert torch.equal(qo.float(), torch.zeros_like(qo, dtype=torch.float32))
    assert torch.equal(so, torch.full_like(so, 1e-10 / arch.fp8_max("cpu")))


def test_nan_reaches_only_its_row():
    q, xs, wg, sg, wu, su = _gate_up(2, 256, 256)
    xs = xs.clone()
    xs[0, 1] = float("nan")  # row 0's second K group: every output of row 0 is NaN, row 1 untouched
    qo, so = sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, SmallMConfig(128, 2, 4, 2, "last"))
    assert so[0].isnan().all() and not so[1].isnan().any()
    want = _reference(q, xs, [wg, wu], [sg, su], 128)
    assert torch.equal(so[1], want[1][1]) and torch.equal(_bits((qo, so))[0][1], _bits(want)[0][1])


def test_layout_the_kernel_cannot_read_in_place_is_named():
    _, _, w, s = make_inputs(2, 384, 256)  # I = 192: scale row 1 holds gate rows 128..191 and up rows 0..63
    assert "multiple of 128" in bsq.layout_unsupported([w], [s])
    assert bsq.layout_unsupported([w[:128], w[128:256]], [s[:1], s[1:2]]) is None
    assert "laid out differently" in bsq.layout_unsupported([w[:128, :128], w[128:256, :128].contiguous()],
                                                            [s[:1, :1], s[1:2, :1]])


def test_dispatch_only_a_measured_row_runs_the_fused_launch(monkeypatch):
    q, xs, wg, sg, wu, su = _gate_up(3, 256, 512)
    w, s = torch.cat([wg, wu]), torch.cat([sg, su])
    a = arch.arch_of(q.device)
    config = SmallMConfig(128, 2, 4, 2, "last")
    assert bsq.fused_config(a, "cpu", q.dtype, 3, 256, 512, 128, 128, BF16) is None  # never measured: unfused
    assert not bsq.measured(a, 3, 256, 512)
    _pin(monkeypatch, 3, 256, 512, config)
    assert bsq.fused_config(a, "cpu", q.dtype, 3, 256, 512, 128, 128, BF16) == config
    _pin(monkeypatch, 65, 256, 512, config)
    assert bsq.fused_config(a, "cpu", q.dtype, 65, 256, 512, 128, 128, BF16) is None  # above SMALL_M_MAX
    assert bsq.fused_config(a, "cpu", q.dtype, 3, 256, 512, 128, 256, BF16) is None  # block_n 128 < group 256
    _pin(monkeypatch, 3, 256, 512, None)  # "the unfused pair measured faster"
    assert bsq.fused_config(a, "cpu", q.dtype, 3, 256, 512, 128, 128, BF16) is None and bsq.measured(a, 3, 256, 512)
    called = []
    monkeypatch.setattr(bsq, "small_m_mm_silu_quant", lambda *args: called.append(args))
    with backends.use_backend("triton"):
        out = OP(q, xs, [w], [s], BF16, 128)
    assert not called
    _assert_equal(out, silu_mul_group_quant(smk.small_m_mm(q, xs, w, s, BF16, None), 128), "unfused pair")


@pytest.mark.parametrize("why", ["capture", "env"])
def test_no_ticket_counters_falls_back_to_the_unfused_pair(monkeypatch, why):
    q, xs, wg, sg, wu, su = _gate_up(3, 256, 512)
    config = SmallMConfig(128, 2, 4, 2, "last")  # split 2: the fused launch needs the counters
    _pin(monkeypatch, 3, 256, 512, config)
    if why == "capture":  # a first call inside a CUDA graph capture
        monkeypatch.setattr(sms, "tile_counters", lambda device, tiles: None)
    else:  # FP8_FUSION_TICKETS=0: models concurrent on several streams
        monkeypatch.setenv("FP8_FUSION_TICKETS", "0")
    assert sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, config) is None
    called = []
    real = bsq.silu_mul_group_quant
    monkeypatch.setattr(bsq, "silu_mul_group_quant", lambda y, g: called.append(g) or real(y, g))
    with backends.use_backend("triton"):
        out = OP(q, xs, [wg, wu], [sg, su], BF16, 128)
    assert called == [128]  # the unfused pair ran
    assert _rel_err(out, _reference(q, xs, [wg, wu], [sg, su], 128)) < 2e-2


def test_merged_weight_with_a_shared_block_row_is_not_split():
    # I = 192: the merged weight's scale row 1 holds gate rows 128..191 and up rows 0..63
    q, xs, w, s = make_inputs(2, 384, 256)
    assert bsq._gate_up([w], [s]) is None
    with backends.use_backend("triton"):
        out = OP(q, xs, [w], [s], BF16, 64)
    want = ref.silu_mul_group_quant(ref.blockscale_mm(q, xs, w, s, BF16), 64, arch.fp8_dtype("cpu"),
                                    arch.fp8_max("cpu"))
    d = (ref.dequant_activation(*out) - ref.dequant_activation(*want)).norm() / ref.dequant_activation(*want).norm()
    assert d < 2e-2


@pytest.mark.parametrize(
    "weights, group, error, match",
    [
        ("three", 128, ValueError, "one merged gate_up weight or gate and up"),
        ("odd", 128, ValueError, "one N"),
        ("unequal", 128, ValueError, "one N"),
        ("merged", 96, ValueError, "power of two"),
        ("merged", 256, ValueError, "multiple of group_size"),
    ],
)
def test_bad_inputs_raise_clear_errors(weights, group, error, match):
    q, xs, wg, sg, wu, su = _gate_up(2, 128, 256)
    w_qs, w_scales = {
        "three": ([wg, wu, wg], [sg, su, sg]),
        "odd": ([wg[:127]], [sg]),
        "unequal": ([wg, wu[:64]], [sg, su]),
        "merged": ([torch.cat([wg, wu])], [torch.cat([sg, su])]),
    }[weights]
    with pytest.raises(error, match=match):
        OP(q, xs, w_qs, w_scales, BF16, group)


def test_kernel_refuses_configs_it_cannot_run():
    q, xs, wg, sg, wu, su = _gate_up(2, 128, 256)
    for config, match in [(SmallMConfig(8, 1, 4, 2, "last"), "at least 16"),
                          (SmallMConfig(128, 2, 4, 2, "kernel"), "in-launch sum"),
                          (SmallMConfig(128, 2, 4, 2, "last", k_unroll=2, tma=True), "k_unroll 1"),
                          (SmallMConfig(128, 2, 4, 2, "last", swap=False), "tma True")]:
        with pytest.raises(ValueError, match=match):
            sms.small_m_mm_silu_quant(q, xs, wg, sg, wu, su, BF16, 128, config)


def test_every_table_row_is_a_config_the_kernel_takes():
    assert bsq.TABLE, "measured rows expected"
    for (arch_name, bucket, i, k), config in bsq.TABLE.items():
        assert arch_name == "sm90" and bucket in (1, 4, 16, 32, 64) and k % 128 == 0
        if isinstance(config, GemvConfig):  # the GEMV's rows only where the GEMV runs (M <= 4)
            assert bucket <= 4 and gemv_silu_unsupported(bucket, k, 128, i, 128, config) is None, (i, k, config)
        else:
            assert config is None or sms.unsupported(i, 128, config) is None, (i, k, config)


# The switches together in one run (a dry run costs a minute here): at M = 1 --gemv-only leaves the wide GEMVs
# alone, at M = 17 --noswap's families are the ones timed.
@pytest.mark.parametrize("flags", [[], ["--gemv-wide", "--gemv-only", "--noswap"]])
def test_benchmark_dry_run_prints_pasteable_rows(tmp_path, flags):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    out_json = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gemm_silu_quant.py"), "--dry-run",
                           "--json", str(out_json), *flags], env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WRONG" not in proc.stderr and "RACY" not in proc.stderr
    rows = proc.stdout.split("by `python benchmarks/gemm_silu_quant.py`):\n")[1]
    table = eval("{\n" + rows + "\n}", {"SmallMConfig": SmallMConfig, "GemvConfig": GemvConfig})
    assert set(table) == {("cpu", 1, 256, 512), ("cpu", 32, 256, 512)}
    if "--noswap" in flags:  # the unswapped MMA's configs were checked and timed at M = 17 (no WRONG, above)
        timed = json.loads(out_json.read_text())["rows"][1]["fused"]
        assert any("swap=False" in c and isinstance(t, float) for c, t in timed.items()), timed
    assert all(v is None or isinstance(v, (SmallMConfig, GemvConfig)) for v in table.values())
    with open(out_json) as f:
        timed_at_1 = json.load(f)["rows"][0]["fused"]
    assert any(c.startswith("GemvConfig(") and isinstance(t, float) for c, t in timed_at_1.items()), timed_at_1
    if "--gemv-only" in flags:  # at one row only the GEMV's configs, the wide family's 2-warp one among them
        assert all(c.startswith("GemvConfig(") for c in timed_at_1) and len(timed_at_1) == 2, timed_at_1
        assert isinstance(timed_at_1["GemvConfig(rows=2, k_chunk=512, warps=2, stages=1)"], float), timed_at_1
