"""The tiles a GPU launch picks, and those tiles run through the CPU interpreter.

The tile choices at every listed hidden / intermediate size and M bucket; the persistent grid sized to the
programs that fit on an SM; every GPU tile shape (rows per program > 1 with a partial last block, main + tail
tiles, the two-pass loop) giving the reference's values with poisoned outputs; and a launch that skips its tail
being caught by that comparison.
"""

from __future__ import annotations

import dataclasses
import os
import types

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import triton
from elementwise_checks import (
    EPS,
    HIDDEN,
    KERNEL_TEST_MARKS,
    _assert_activation_close,
    _assert_exact,
    _assert_kernel_quant,
    _assert_norm_fused_vs_unfused,
    _on_cpu_interpreter,
    _oracle_group_quant,
    _poisoned_outputs,
    _randn,
    cpu_only,
)

from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels import reference_backend as refb
from fp8_fusion_pass.kernels.triton import _tiles
from fp8_fusion_pass.kernels.triton import group_quant as gq_mod
from fp8_fusion_pass.kernels.triton import rms_norm as norm_mod
from fp8_fusion_pass.kernels.triton import silu_and_mul as silu_mod

pytestmark = KERNEL_TEST_MARKS


# ---------------------------------------------------------------- the GPU tile shapes, run through the interpreter


def _gpu_tiles(monkeypatch, fn, *args) -> _tiles.Tile:
    """The tile ``fn`` picks on a GPU (the interpreter budget swapped for the GPU one)."""
    with monkeypatch.context() as m:
        m.setattr(_tiles, "_budget", lambda: (_tiles.TILE, _tiles.TARGET_PROGRAMS))
        return fn(*args)


def test_gpu_tile_choices(monkeypatch):
    for k in HIDDEN + (8192,):
        for m in (1, 16, 256, 2048, 8192):
            t = _gpu_tiles(monkeypatch, _tiles.row_tile, m, k, 128)
            # every listed hidden size stays in registers: 2^a groups, or 2^a + 2^b (5120 = 32 + 8 groups)
            assert t.one_pass and (t.gpc + t.tail) * 128 == k and t.tail in (0, 8), (k, m, t)
            # persistent programs that prefetch, 32 values per thread in the main tile, >= 4 warps at large M
            assert t.per_sm > 0 and t.prefetch, t
            assert t.block_m * t.gpc * 128 == _tiles.VALUES_PER_THREAD * 32 * t.num_warps or m < 4, (k, m, t)
            if m >= 2048:
                assert t.num_warps >= _tiles.MIN_WARPS, t
    t = _gpu_tiles(monkeypatch, _tiles.row_tile, 8192, 7168, 128)  # 56 groups = 32 + 16 + 8: the two-pass loop
    assert not t.one_pass and 7168 % (t.gpc * 128) == 0, t
    for n in (3072, 3200, 5120, 12288, 14336, 25600, 28672):
        for m in (1, 16, 8192):
            t = _gpu_tiles(monkeypatch, _tiles.elementwise_tile, m, n // 128, 128)
            programs = triton.cdiv(m, t.block_m) * triton.cdiv(n // 128, t.gpc)
            assert t.block_m * t.gpc * 128 <= _tiles.TILE and (programs >= _tiles.TARGET_PROGRAMS or t.gpc == 1)
            used = (n // 128) / (triton.cdiv(n // 128, t.gpc) * t.gpc)
            assert used >= _tiles.MIN_EFFICIENCY, (n, m, t)


def test_persistent_grid_fits_the_sm(monkeypatch):
    """A persistent grid never exceeds the programs that fit on an SM (registers, warps, shared memory, 32 blocks):
    the rest would run as a serial second wave. H200 numbers: 64K registers, 64 warps, 228 KB per SM."""
    props = types.SimpleNamespace(max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
                                  shared_memory_per_multiprocessor=233472, multi_processor_count=132)  # fmt: skip
    monkeypatch.setattr(_tiles, "_device", lambda index: props)
    cuda = torch.device("cuda", 0)

    def kernel(regs, shared=0):
        return types.SimpleNamespace(n_regs=regs, metadata=types.SimpleNamespace(shared=shared))

    assert _tiles.resident_programs(kernel(96), 4, cuda) == 5  # K=4096 default tile: 96 registers, 4 warps
    assert _tiles.resident_programs(kernel(128), 4, cuda) == 4
    assert _tiles.resident_programs(kernel(156), 4, cuda) == 3  # 160 allocated: 5120 per warp
    assert _tiles.resident_programs(kernel(32), 1, cuda) == 32  # the block limit
    assert _tiles.resident_programs(kernel(40, shared=96 * 1024), 4, cuda) == 2  # shared memory
    assert _tiles.resident_programs(kernel(None), 4, cuda) is None
    if _on_cpu_interpreter():
        return  # programs() sizes grids only on a GPU launch
    tile = _tiles.Tile(1, 32, 4, per_sm=32, prefetch=True)
    _tiles.note_resident(("test",), kernel(96), tile, cuda)
    assert _tiles.programs(tile, 8192, cuda, ("test",)) == 5 * 132
    assert _tiles.programs(tile, 100, cuda, ("test",)) == 100


GPU_TILE_MS = (8192, 2048, 16, 1)  # the M buckets whose GPU tiles the interpreter replays on a small odd M


def _row_tiles(monkeypatch, k: int) -> list[_tiles.Tile]:
    """Every norm tile a GPU launch picks at K (over GPU_TILE_MS), plus a forced two-pass tile."""
    tiles = [_gpu_tiles(monkeypatch, _tiles.row_tile, m, k, 128) for m in GPU_TILE_MS]
    return list(dict.fromkeys([*tiles, _tiles.Tile(2, 8, 4, one_pass=False)]))


@cpu_only
@pytest.mark.parametrize("k,m", [(5120, 5), (4096, 3), (1024, 9), (8192, 3), (7168, 3)])
def test_gpu_tiles_give_the_same_bits(monkeypatch, k, m):
    """The tiles the GPU launches (rows per program > 1 with M not a multiple of them, the 32 + 8 group main + tail
    tiles of K = 5120, the two-pass loop, 2-D grids) through the interpreter, with poisoned outputs: every q,
    scale, residual_out and y value must be stored and match the reference. This is the configuration that failed
    on the GPU (K=5120 M=8192: scales off by 1) and that the interpreter tiles never ran."""
    x, w, r = _randn(m, k, seed=20), _randn(k, seed=21), _randn(m, k, seed=22)
    q_ref, s_ref, res_ref = refb.add_rms_norm_group_quant(x, r, w, EPS, 128)
    qn_ref, sn_ref = refb.rms_norm_group_quant(x, w, EPS, 128)
    with _poisoned_outputs():
        (q1, s1), _ = norm_mod.launch(x, w, EPS, r, 128)  # the interpreter's own tile
    for tile in _row_tiles(monkeypatch, k):
        with _poisoned_outputs():
            (q, s), res = norm_mod.launch(x, w, EPS, r, 128, tile=tile)
            (qn, sn), _ = norm_mod.launch(x, w, EPS, None, 128, tile=tile)
            y, res_u = norm_mod.launch(x, w, EPS, r, None, tile=tile)
        _assert_kernel_quant(q, s, q_ref, s_ref, f"add-norm tile {tile}", pure_quant=False)
        _assert_exact(res, res_ref, f"residual tile {tile}")
        _assert_exact(res_u, res_ref, f"unquantized residual tile {tile}")
        _assert_kernel_quant(qn, sn, qn_ref, sn_ref, f"norm tile {tile}", pure_quant=False)
        _assert_activation_close(y, ref.add_rms_norm(x, r, w, EPS)[0], f"unquantized norm tile {tile}")
        _assert_norm_fused_vs_unfused(q, s, q1, s1, f"tile {tile} vs interpreter tile")
    xs = torch.cat([x, r], -1)
    qs_ref, ss_ref = refb.silu_mul_group_quant(xs, 128)
    # small-M tiles hold 1-2 groups per program: ~25 ms of interpreter each, so only at K = 1024 (8 per row)
    ms = GPU_TILE_MS if k <= 1024 else GPU_TILE_MS[:1]
    tiles = [_gpu_tiles(monkeypatch, _tiles.elementwise_tile, mm, k // 128, 128) for mm in ms]
    for tile in dict.fromkeys([*tiles, _tiles.Tile(2, 8, 4)]):
        with _poisoned_outputs():
            q, s = gq_mod.launch(x, 128, tile=tile)
            qs, ss = silu_mod.launch(xs, 128, tile=tile)
            ys = silu_mod.launch(xs, None, tile=tile)
        _assert_kernel_quant(q, s, *_oracle_group_quant(x, 128), f"group_quant tile {tile}", pure_quant=True)
        _assert_kernel_quant(qs, ss, qs_ref, ss_ref, f"silu tile {tile}", pure_quant=False)
        _assert_activation_close(ys, ref.silu_and_mul(xs), f"silu_and_mul tile {tile}")


@cpu_only
def test_poisoned_outputs_catch_an_unwritten_tail(monkeypatch):
    """The check above can fail: a launch that skips the tail tile (TAIL forced to 0 while the main tile covers 32
    of K=5120's 40 groups, what the first GPU round ran into) leaves NaN in the last 8 groups, which the
    comparison reports; without the poison the freed buffer of the previous launch hid exactly that."""
    x, w = _randn(3, 5120, seed=23), _randn(5120, seed=24)
    tile = _gpu_tiles(monkeypatch, _tiles.row_tile, 8192, 5120, 128)
    assert tile.tail == 8
    q_ref, s_ref = refb.rms_norm_group_quant(x, w, EPS, 128)
    no_tail = dataclasses.replace(tile, tail=0)
    with _poisoned_outputs():
        (q, s), _ = norm_mod.launch(x, w, EPS, None, 128, tile=no_tail)
    assert s[:, 32:].isnan().all() and not s[:, :32].isnan().any()
    with pytest.raises(AssertionError, match="NaN positions differ"):
        _assert_kernel_quant(q, s, q_ref, s_ref, "no tail", pure_quant=False)


# ---------------------------------------------------------------- a row over several programs (decode sizes)


def _split_tiles(k: int) -> list[_tiles.Tile]:
    groups = k // 128
    main = 1 << (groups.bit_length() - 1)
    base = _tiles.Tile(1, main, 4, one_pass=True, tail=groups - main)
    splits = [s for s in (2, 5, 8, 10) if groups % s == 0 and (groups // s) & (groups // s - 1) == 0]
    return [base, *(dataclasses.replace(base, split=s) for s in splits)]


@cpu_only
@pytest.mark.parametrize("k", [5120, 4096, 1024])
def test_split_rows_are_the_one_pass_row_bit_for_bit(k):
    """Each program of a split row sums the squares of the whole row with the one-pass code, so rstd and every
    output equal the one-pass program's bit for bit (fused and unquantized, with and without the residual add),
    and every value is stored by exactly the program that owns its groups (poisoned outputs)."""
    x, w, r = _randn(3, k, seed=30), _randn(k, seed=31), _randn(3, k, seed=32)
    base, *splits = _split_tiles(k)
    assert splits, k
    runs = {}
    for tile in (base, *splits):
        with _poisoned_outputs():
            (q, s), res = norm_mod.launch(x, w, EPS, r, 128, tile=tile)
            (qn, sn), _ = norm_mod.launch(x, w, EPS, None, 128, tile=tile)
            y, _ = norm_mod.launch(x, w, EPS, r, None, tile=tile)
        runs[tile] = [q.view(torch.uint8), s, res, qn.view(torch.uint8), sn, y]
    for tile in splits:
        for name, got, want in zip(("q", "scale", "residual", "q (no add)", "scale (no add)", "y"), runs[tile],
                                   runs[base]):
            assert not got.float().isnan().any(), f"{tile}: {name} has unwritten values"
            _assert_exact(got, want, f"{tile}: {name}")


@cpu_only
def test_a_split_that_sums_part_of_the_row_is_caught(monkeypatch):
    # the check above can fail: with the sum's main tile narrowed to the first half of the row (its two programs
    # then normalise and store only that half), the stored values differ from the one-pass row's
    x, w = _randn(2, 1024, seed=33), _randn(1024, seed=34)
    base, split = _split_tiles(1024)[:2]
    monkeypatch.setattr(_tiles, "check_split", lambda *a: None)
    with _poisoned_outputs():
        want = norm_mod.launch(x, w, EPS, None, None, tile=base)[0]
        got = norm_mod.launch(x, w, EPS, None, None, tile=dataclasses.replace(split, gpc=base.gpc // 2))[0]
    stored = got[:, :512].float()
    assert not stored.isnan().any() and got[:, 512:].float().isnan().all()
    assert not torch.equal(stored, want[:, :512].float())


@pytest.mark.parametrize("tile", [
    _tiles.Tile(2, 8, 4, one_pass=True, split=2),  # two rows per program
    _tiles.Tile(1, 8, 4, one_pass=False, split=2),  # the two-pass loop
    _tiles.Tile(1, 32, 4, one_pass=True, tail=8, split=4),  # 40 groups do not divide by 4
    _tiles.Tile(1, 32, 4, one_pass=True, tail=8, split=8),  # 5 groups per program: not a power of two
])
def test_tiles_that_cannot_split_a_row_are_refused(tile):
    with pytest.raises(ValueError, match="power-of-two slices"):
        _tiles.check_split(tile, (tile.gpc + tile.tail) * 128, 128)


def test_split_rows_apply_up_to_split_max_m_only(monkeypatch):
    split = _tiles.Tile(1, 32, 4, one_pass=True, tail=8, split=10)
    monkeypatch.setattr(_tiles, "SPLIT_ROWS", {("add_rms_norm", 5120): split})
    monkeypatch.setattr(_tiles.arch, "triton_interpreting", lambda: False)
    monkeypatch.setattr(_tiles, "_budget", lambda: (_tiles.TILE, _tiles.TARGET_PROGRAMS))
    assert _tiles.row_tile(1, 5120, 128, residual=True) == split
    assert _tiles.row_tile(_tiles.SPLIT_MAX_M, 5120, 128, residual=True) == split
    assert _tiles.row_tile(_tiles.SPLIT_MAX_M + 1, 5120, 128, residual=True).split == 1
    assert _tiles.row_tile(1, 5120, 128, residual=False).split == 1  # the table is per op
    assert _tiles.row_tile(1, 5120, 64, residual=True).split == 1  # measured at group size 128
    # measured on the fused norm: the unquantized one (the compile without the pass) keeps its one-program row
    assert _tiles.row_tile(1, 5120, 128, residual=True, quant=False).split == 1
