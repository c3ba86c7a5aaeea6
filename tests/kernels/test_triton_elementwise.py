"""Triton kernels of the non-GEMM ops against ``reference.py``, under the CPU interpreter and (marked gpu) on CUDA.

Covers: every kernel on fresh random and adversarial inputs at real hidden / intermediate sizes, M = 1 and odd M,
3-D inputs, group 64 and 128; fused vs unfused (silu bit-exact, norm within the DESIGN.md bound); fakes vs real
outputs; validation errors; the per-tensor quant overwriting its scale. ``TestCuda`` runs these checks and those of
``test_triton_casts.py`` on the GPU. The tolerance table, the oracles and the checks are in
``elementwise_checks.py``; the GPU tile shapes run through the interpreter are in ``test_triton_tiles.py``.
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from elementwise_checks import (
    BF16,
    EPS,
    HIDDEN,
    INTERMEDIATE,
    KERNEL_TEST_MARKS,
    LEADS,
    OPS,
    _adversarial,
    _assert_activation_close,
    _assert_exact,
    _assert_norm_fused_vs_unfused,
    _poisoned_outputs,
    _randn,
    _with_triton,
    check_casts,
    check_division,
    check_group_quant,
    check_per_tensor_quant,
    check_rms_norm_group_quant,
    check_scale,
    check_silu_mul_group_quant,
    cpu_only,
)
from interpreter_caps import require_fnuz_interpreter
from torch._subclasses.fake_tensor import FakeTensorMode

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _tiles
from fp8_fusion_pass.kernels.triton import rms_norm as norm_mod
from fp8_fusion_pass.kernels.triton.dynamic_per_tensor_quant import SINGLE_PROGRAM_MAX

pytestmark = KERNEL_TEST_MARKS


# ---------------------------------------------------------------- every kernel vs the reference, CPU interpreter


def _cases(sizes, leads, extra_g64):
    return [(k, lead, 128) for k in sizes for lead in leads] + [(k, (3,), 64) for k in extra_g64]


@cpu_only
@pytest.mark.parametrize("k,lead,g", _cases(HIDDEN, LEADS, (1024, 5120)))
def test_group_quant(k, lead, g):
    check_group_quant(_randn(*lead, k, seed=k), g)


@cpu_only
@pytest.mark.parametrize("residual", [False, True], ids=["rms", "add_rms"])
@pytest.mark.parametrize("k,lead,g", _cases(HIDDEN, LEADS, (1024, 5120)))
def test_rms_norm_group_quant(k, lead, g, residual):
    x, w = _randn(*lead, k, seed=k), _randn(k, seed=1) * 0.5 + 1
    check_rms_norm_group_quant(x, w, g, _randn(*lead, k, seed=2) if residual else None)


@cpu_only
@pytest.mark.parametrize("i,lead,g", _cases(HIDDEN, LEADS, (1024, 5120)) + [(i, (1,), 128) for i in INTERMEDIATE])
def test_silu_mul_group_quant(i, lead, g):
    check_silu_mul_group_quant(_randn(*lead, 2 * i, seed=i) * 3, g)


@cpu_only
@pytest.mark.parametrize("k", HIDDEN)
def test_adversarial_inputs(k):
    x = _adversarial(9, k)
    w = _randn(k, seed=1) * 0.5 + 1
    check_group_quant(x, 128)
    check_rms_norm_group_quant(x, w, 128)
    check_rms_norm_group_quant(x, w, 64, residual=_adversarial(9, k, seed=3))
    check_silu_mul_group_quant(torch.cat([x, _adversarial(9, k, seed=4)], -1), 128)


@cpu_only
@pytest.mark.parametrize("n", [(1, 4096), (17, 5120), (SINGLE_PROGRAM_MAX + 1,)], ids=["one-program", "two", "edge"])
def test_dynamic_per_tensor_quant(n):
    check_per_tensor_quant(_randn(*n, seed=5) * 7)


@cpu_only
def test_dynamic_per_tensor_quant_adversarial():
    x = _adversarial(9, 4096)
    check_per_tensor_quant(x)  # holds inf and NaN: every value NaN
    x[2:4] = 0
    check_per_tensor_quant(x[:, :2048].contiguous())  # an inf but no NaN
    check_per_tensor_quant(torch.zeros(5, 256, dtype=BF16))  # all zero: floor scale, zeros


@cpu_only
def test_e4m3fnuz_on_simulated_gfx942():
    require_fnuz_interpreter()
    x, w = _adversarial(9, 1024), _randn(1024, seed=1)
    with arch.simulate_arch("gfx942"):
        assert arch.arch_of("cpu").fp8_dtype == torch.float8_e4m3fnuz
        check_group_quant(_randn(17, 5120, seed=6) * 100, 128)
        check_group_quant(x, 64)
        check_rms_norm_group_quant(x, w, 128, residual=_randn(9, 1024, seed=7))
        check_silu_mul_group_quant(_randn(3, 2048, seed=8) * 3, 128)
        check_per_tensor_quant(x[:, :512].contiguous())
        check_per_tensor_quant(_randn(17, 4096, seed=9))


@cpu_only
def test_unquantized_ops_take_any_width():
    """rms_norm / add_rms_norm / silu_and_mul have no group: widths that are not a multiple of 128 are masked."""
    x, r, w = _randn(5, 200, seed=14), _randn(5, 200, seed=15), _randn(200, seed=16)
    _assert_activation_close(_with_triton(OPS.rms_norm, x, w, EPS), ref.rms_norm(x, w, EPS), "rms_norm K=200")
    y, res = _with_triton(OPS.add_rms_norm, x, r, w, EPS)
    y_ref, res_ref = ref.add_rms_norm(x, r, w, EPS)
    _assert_activation_close(y, y_ref, "add_rms_norm K=200")
    _assert_exact(res, res_ref, "add_rms_norm K=200 residual_out")
    _assert_activation_close(_with_triton(OPS.silu_and_mul, x), ref.silu_and_mul(x), "silu_and_mul I=100")


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_and_fp32_activations(dtype):
    x, w = _randn(5, 1024, seed=10, dtype=dtype), _randn(1024, seed=11, dtype=dtype)
    check_group_quant(x, 128)
    check_rms_norm_group_quant(x, w, 128, residual=_randn(5, 1024, seed=12, dtype=dtype))
    check_silu_mul_group_quant(_randn(5, 2048, seed=13, dtype=dtype), 128)


# ---------------------------------------------------------------- fakes, validation, backend selection


def _fake_cases(device):
    x, w, r = _randn(2, 3, 256, device=device), _randn(256, device=device), _randn(2, 3, 256, device=device, seed=1)
    fp8 = arch.arch_of(device).fp8_dtype
    return {
        "rms_norm": (x, w, EPS),
        "add_rms_norm": (x, r, w, EPS),
        "silu_and_mul": (x,),
        "group_quant": (x, 64),
        "rms_norm_group_quant": (x, w, EPS, 128),
        "add_rms_norm_group_quant": (x, r, w, EPS, 64),
        "silu_mul_group_quant": (x, 128),
        "dynamic_per_tensor_quant": (torch.empty(x.shape, dtype=fp8, device=device), x, torch.empty(1, device=device)),
    }


def check_fakes(device):
    for name, args in _fake_cases(device).items():
        real = _with_triton(getattr(OPS, name), *args)
        with FakeTensorMode() as mode:
            fake = getattr(OPS, name)(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        if name == "dynamic_per_tensor_quant":  # mutates out and scale in place, returns nothing (real and fake)
            assert real is None and fake is None
            continue
        real, fake = [t if isinstance(t, tuple) else (t,) for t in (real, fake)]
        assert len(real) == len(fake), name
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride(), r.device) == (f.shape, f.dtype, f.stride(), f.device), name


@cpu_only
def test_fakes_match_the_triton_outputs():
    check_fakes("cpu")
    with backends.use_backend("triton"):  # opcheck runs real and fake through the dispatcher and compares them
        x = _randn(3, 256)
        torch.library.opcheck(OPS.silu_mul_group_quant.default, (x, 64), test_utils=("test_faketensor",))
        torch.library.opcheck(OPS.add_rms_norm_group_quant.default, (x, x, x[0], EPS, 128),
                              test_utils=("test_faketensor",))  # fmt: skip


@cpu_only
@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: OPS.group_quant(_randn(3, 256).to(torch.int32), 128), "must be bf16, fp16 or fp32"),
        (lambda: OPS.rms_norm_group_quant(_randn(3, 320), _randn(320), EPS, 128), "multiple of group_size"),
        (lambda: OPS.silu_mul_group_quant(_randn(3, 192), 64), "multiple of group_size"),
        (
            lambda: OPS.add_rms_norm_group_quant(_randn(256, 256).t(), _randn(256, 256), _randn(256), EPS, 128),
            "contiguous in its last dim",
        ),
        (lambda: OPS.rms_norm(_randn(3, 256), _randn(256, device="meta"), EPS), "one device"),
        (lambda: OPS.silu_and_mul(_randn(3, 255)), "must be even"),
        (lambda: OPS.dynamic_per_tensor_quant(torch.empty(3, 256), _randn(3, 256), torch.empty(1)), "out must be"),
    ],
    ids=["dtype", "k-vs-group", "silu-k-vs-group", "last-dim", "devices", "odd", "out-dtype"],
)
def test_bad_input_raises_the_ops_error(call, message):
    with backends.use_backend("triton"), pytest.raises((ValueError, TypeError), match=message):
        call()


@cpu_only
def test_triton_is_selected_on_the_cpu_under_the_interpreter():
    cpu = torch.device("cpu")
    assert backends.unavailable_reason("triton", cpu) is None
    with backends.use_backend("triton"):
        assert backends.backend_for("silu_mul_group_quant", cpu) == "triton"
        assert backends.get_kernel("rms_norm_group_quant", cpu).__module__.endswith("triton.rms_norm_group_quant")


# ---------------------------------------------------------------- the same checks on CUDA


@pytest.mark.gpu
class TestCuda:
    """The checks above on the GPU, with the GPU tiles, real M and every listed hidden / intermediate size."""

    DEV = "cuda"

    @pytest.mark.parametrize("fp8", [torch.float8_e4m3fn], ids=["e4m3fn"])
    @pytest.mark.parametrize("emulate", [False, True], ids=["hardware", "emulated"])
    def test_casts(self, fp8, emulate):
        check_casts(fp8, self.DEV, emulate)

    def test_division(self):
        check_division(self.DEV)
        check_scale(self.DEV)

    @pytest.mark.parametrize("m", [1, 17, 4097])  # 4097: the large-M tiles (>= 2 rows per program), a partial last
    @pytest.mark.parametrize("k", HIDDEN + (8192,))
    def test_norm_family(self, k, m):
        x, w = _randn(m, k, device=self.DEV, seed=k), _randn(k, device=self.DEV, seed=1) * 0.5 + 1
        check_group_quant(x, 128)
        check_rms_norm_group_quant(x, w, 128)
        check_rms_norm_group_quant(x, w, 64, residual=_randn(m, k, device=self.DEV, seed=2))

    @pytest.mark.parametrize("m", [1, 17, 2048])
    @pytest.mark.parametrize("i", (1536, 3200, 3584, 12288, 14336, 25600, 28672))  # odd group counts, TP shards
    def test_silu(self, i, m):
        check_silu_mul_group_quant(_randn(m, 2 * i, device=self.DEV, seed=i) * 3, 128)

    @pytest.mark.parametrize("k", HIDDEN)
    def test_adversarial(self, k):
        x, w = _adversarial(9, k, device=self.DEV), _randn(k, device=self.DEV, seed=1)
        check_group_quant(x, 128)
        check_rms_norm_group_quant(x, w, 128, residual=_adversarial(9, k, device=self.DEV, seed=3))
        check_silu_mul_group_quant(torch.cat([x, _adversarial(9, k, device=self.DEV, seed=4)], -1), 64)
        check_per_tensor_quant(x)

    def test_3d_and_group_64(self):
        x, w = _randn(2, 33, 5120, device=self.DEV), _randn(5120, device=self.DEV)
        check_group_quant(x, 64)
        check_rms_norm_group_quant(x, w, 64, residual=_randn(2, 33, 5120, device=self.DEV, seed=3))
        check_silu_mul_group_quant(torch.cat([x, x], -1), 64)

    @pytest.mark.parametrize("n", [(1, 4096), (4096, 4096), (SINGLE_PROGRAM_MAX + 1,)])
    def test_per_tensor(self, n):
        check_per_tensor_quant(_randn(*n, device=self.DEV, seed=5) * 7)

    def test_both_norm_paths(self):
        """One-pass and two-pass tiles agree (the DESIGN.md bound) at every hidden size."""
        for k in HIDDEN + (8192,):
            x, w = _randn(2048, k, device=self.DEV), _randn(k, device=self.DEV)
            with _poisoned_outputs():
                (q1, s1), _ = norm_mod.launch(x, w, EPS, None, 128)
                (q2, s2), _ = norm_mod.launch(x, w, EPS, None, 128, tile=_tiles.Tile(2, 8, 4, one_pass=False))
            _assert_norm_fused_vs_unfused(q1, s1, q2, s2, f"K={k} one-pass vs two-pass")

    @pytest.mark.parametrize("k,splits", [(4096, (2, 4, 8, 16)), (5120, (5, 10, 20)), (8192, (4, 8, 16))])
    @pytest.mark.parametrize("m", [1, 3])
    def test_split_rows_are_the_one_pass_row_bit_for_bit(self, k, splits, m):
        """A row over several programs (``_tiles.SPLIT_ROWS``) against the one-pass program of the same tile, compiled
        for this GPU: the sum of squares is the same code, so every output must be the same bits."""
        x, r = _randn(m, k, device=self.DEV, seed=40), _randn(m, k, device=self.DEV, seed=41)
        w = _randn(k, device=self.DEV, seed=42) * 0.5 + 1
        groups = k // 128
        main = 1 << (groups.bit_length() - 1)
        for warps in (2, 4, 8):
            base = _tiles.Tile(1, main, warps, one_pass=True, tail=groups - main)
            outs = {}
            for tile in (base, *(dataclasses.replace(base, split=s) for s in splits)):
                with _poisoned_outputs():
                    (q, s), res = norm_mod.launch(x, w, EPS, r, 128, tile=tile)
                    y, _ = norm_mod.launch(x, w, EPS, None, None, tile=tile)
                outs[tile] = (q.view(torch.uint8), s, res, y)
            for tile, got in outs.items():
                for name, a, b in zip(("q", "scale", "residual", "y"), got, outs[base]):
                    assert torch.equal(a, b), f"K={k} M={m} {tile}: {name} differs from the one-pass row"

    def test_fakes(self):
        check_fakes(self.DEV)
