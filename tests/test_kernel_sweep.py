"""``benchmarks/_kernel_sweep.py`` (``fused_kernels.py --sweep``) on the CPU: the tile candidates it times are
ones the launchers accept, and a split row reaches ``SPLIT_ROWS`` only where it beat every unsplit tile at every
point by more than 3%."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _kernel_sweep as ks  # noqa: E402

from fp8_fusion_pass.kernels.triton import _tiles  # noqa: E402


@pytest.mark.parametrize("k", [1024, 3072, 4096, 5120, 8192])
def test_split_candidates_pass_the_launchers_check(k):
    splits = ks.split_candidates(k)
    assert splits, k  # every one-pass hidden size of the presets has a split
    for tile in splits:
        _tiles.check_split(tile, k, ks.G)  # raises for a tile the launcher would refuse
        assert (tile.gpc, tile.tail) == _tiles.one_pass_groups(k, ks.G)


@pytest.mark.parametrize("k", [7168, 12288, 25600])  # 56 groups (tail 24), past MAX_ONE_PASS_K
def test_two_pass_rows_have_no_split_and_only_two_pass_tiles(k):
    assert _tiles.one_pass_groups(k, ks.G) is None
    assert ks.split_candidates(k) == []
    assert all(not t.one_pass for t in ks.row_candidates(k))


@pytest.mark.parametrize("k", [4096, 5120])
def test_one_pass_row_candidates_cover_the_whole_row(k):
    main, tail = _tiles.one_pass_groups(k, ks.G)
    for tile in ks.row_candidates(k):
        assert tile.one_pass and (tile.gpc, tile.tail) == (main, tail) and tile.split == 1


def _row(op, m, times):
    best = min(times, key=times.get)
    return {"op": op, "K": 5120, "M": m, "all": times, "best_us": times[best]}


def test_split_winner_needs_more_than_three_percent_at_every_point():
    one = _tiles.Tile(1, 32, 4, True, 8, per_sm=0, prefetch=False)
    s5, s10 = (_tiles.Tile(1, 32, 4, True, 8, split=s) for s in (5, 10))
    op = "add_rms_norm_group_quant"
    won = [_row(op, 1, {one: 2.0, s5: 1.5, s10: 1.6}), _row(op, 4, {one: 2.2, s5: 1.9, s10: 2.1})]
    assert ks.split_winners(won) == {("add_rms_norm", 5120): (s5, won)}
    close = [_row(op, 1, {one: 2.0, s5: 1.5, s10: 1.6}), _row(op, 4, {one: 2.0, s5: 1.98, s10: 1.99})]
    assert ks.split_winners(close) == {}  # 1% at M = 4: the one-program row stays
    larger_m = [_row(op, 16, {one: 2.0, s5: 1.0})]  # past SPLIT_MAX_M: not a split point at all
    assert ks.split_winners(larger_m) == {}
