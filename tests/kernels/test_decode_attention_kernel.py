"""``decode_attention``: the Triton split-KV kernel (CPU interpreter) against ``reference.decode_attention``, the
split merge, masks that broadcast or hide whole tiles, rows that see nothing (NaN, as softmax), the upto form (the
mask given as each batch row's last slot), and the ops' input checks."""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import tolerances
from attention_cases import inputs, rel_l2, token_inputs, tokens_as_masked_pair
from elementwise_checks import KERNEL_TEST_MARKS

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import decode_attention as kernel

pytestmark = KERNEL_TEST_MARKS
OP = torch.ops.fp8_fusion.decode_attention
ONE_SPLIT = kernel.AttentionConfig(programs=0)


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT, kernel.AttentionConfig(block_t=32)],
                         ids=str)
@pytest.mark.parametrize("b, hkv, r, t, d, positions", [
    (1, 2, 4, 200, 64, [150]),  # 4 programs per kv head: the merge
    (2, 2, 3, 130, 128, [5, 129]),  # rows not a power of two; one row sees 6 keys, the other all
    (3, 1, 16, 96, 32, [0, 40, 95]),  # 16 rows: a full MMA tile
    (1, 1, 2, 40, 16, [39]),  # fewer keys than a tile
])  # fmt: skip
def test_matches_reference(cfg, b, hkv, r, t, d, positions):
    q, k, v, keep, scale = inputs(b, hkv, r, t, d, positions)
    got = kernel.decode_attention(q, k, v, keep, scale, cfg)
    want = ref.decode_attention(q, k, v, keep, scale)
    assert got.shape == want.shape and got.dtype == q.dtype and got.is_contiguous()
    assert rel_l2(got, want) <= tolerances.ATTENTION_REL_L2


@pytest.mark.parametrize("rows, pairs", [(rows, min(most, 1 << 20)) for rows, table in kernel.WIDE
                                         for most, _ in table])  # fmt: skip
def test_table_rows_compute_the_reference(rows, pairs):
    # every measured config, by rows per kv head and batch rows x kv heads, at its rows
    cfg = kernel.config_for(pairs, rows)
    q, k, v, keep, scale = inputs(2, 2, rows, 300, 64, [299, 100])
    got = kernel.decode_attention(q, k, v, keep, scale, cfg)
    assert rel_l2(got, ref.decode_attention(q, k, v, keep, scale)) <= tolerances.ATTENTION_REL_L2


def test_rows_pick_their_table():
    # the rows between measured ones take the next measured table; one token's rows (G <= 16) keep TABLE
    assert kernel.config_for(8) == kernel.config_for(8, 16) == kernel.TABLE[0][1]
    assert kernel.config_for(64, 17) == kernel.config_for(64, 32) != kernel.config_for(64, 16)
    assert kernel.config_for(64, 33).programs == 0  # 64 rows at batch 8: one split per kv head, no merge


@pytest.mark.parametrize("pairs, rows, rope, wide, want", [
    (8, 4, False, 0, "batch-1"), (8, 4, True, 0, "batch-1"),  # one token: TABLE's 64-key row, RoPE or not
    (8, 16, True, 0, "batch-1"),  # 16 rows: the MMA's tile of the one-token launch, its row too
    (8, 32, True, 0, "128-key"),  # above 16 RoPE rows keep the 128-key row their timings ran on
    (8, 64, True, 0, "128-key"),
    (8, 64, False, 0, "wide"),  # without RoPE, WIDE's rows by rows (at 64 rows: 4 warps, unlike TABLE's)
    (8, 64, True, 64, "wide"),  # ROPE_WIDE_ROWS: the RoPE launch takes WIDE's rows too
    (64, 32, True, 0, "128-key"),  # 9-64 pairs: TABLE's 128-key row whatever the rows
])
def test_a_launch_takes_its_config_by_pairs_rows_and_rope(pairs, rows, rope, wide, want):
    got = kernel.launch_config(pairs, rows, rope, wide)
    expected = {"batch-1": kernel.TABLE[0][1], "128-key": kernel.TABLE[1][1],
                "wide": kernel.config_for(pairs, rows)}[want]  # fmt: skip
    assert got == expected and (want != "batch-1" or got.block_t == 64) and (want != "128-key" or got.block_t == 128)
    assert want != "wide" or got != kernel.TABLE[1][1]  # the cases tell WIDE's rows from TABLE's


def test_split_plan_covers_every_key():
    for pairs, t in [(1, 576), (8, 576), (64, 576), (512, 576), (8, 33), (2, 64 * 70)]:
        splits, per = kernel.plan(pairs, t, 132)
        assert splits * per >= t > (splits - 1) * per and per % kernel.DEFAULT.block_t == 0
        assert 1 <= splits <= kernel.MAX_SPLITS


def test_a_config_may_name_its_split_count():
    # AttentionConfig.splits: that many splits whatever the SMs, at most one a tile and MAX_SPLITS (40 -> 16 asked,
    # 5 of the 70 tiles each: 14 splits)
    for want, t, got in [(2, 576, 2), (3, 576, 3), (4, 200, 4), (4, 100, 2), (40, 64 * 70, 14)]:
        cfg = kernel.AttentionConfig(block_t=64, splits=want)
        splits, per = kernel.plan(8, t, 132, cfg)
        assert splits == got and splits * per >= t > (splits - 1) * per, (want, t)
    q, k, v, keep, scale = inputs(2, 2, 4, 300, 32, [299, 130])
    got = kernel.decode_attention_upto(q, k, v, torch.tensor([299, 130]), scale, kernel.AttentionConfig(splits=3))
    assert rel_l2(got, ref.decode_attention(q, k, v, keep, scale)) <= tolerances.ATTENTION_REL_L2


def test_more_accurate_than_the_math_form():
    """The kernel rounds fewer intermediates than the graph it replaces (score GEMM output, probabilities)."""
    q, k, v, keep, scale = inputs(2, 2, 4, 256, 128, [200, 255])
    want = ref.decode_attention(q, k, v, keep, scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    math = torch.matmul(scores.masked_fill(~keep, float("-inf")).softmax(-1).to(q.dtype), v)
    assert rel_l2(kernel.decode_attention(q, k, v, keep, scale), want) < rel_l2(math, want)


def test_mask_per_row_and_head():
    """A full [B, Hkv, R, T] mask (no broadcast): each row its own visible keys, e.g. several query tokens."""
    q, k, v, _, scale = inputs(2, 2, 4, 100, 32, [0, 0])
    keep = torch.rand(2, 2, 4, 100, generator=torch.Generator().manual_seed(1)) < 0.3
    keep[..., 0] = True
    got = kernel.decode_attention(q, k, v, keep, scale)
    assert rel_l2(got, ref.decode_attention(q, k, v, keep, scale)) <= tolerances.ATTENTION_REL_L2


def test_row_that_sees_nothing_is_nan_as_softmax():
    q, k, v, keep, scale = inputs(2, 1, 2, 150, 32, [-1, 10])
    for cfg in (kernel.DEFAULT, ONE_SPLIT):
        got = kernel.decode_attention(q, k, v, keep, scale, cfg)
        assert torch.isnan(got[0]).all() and not torch.isnan(got[1]).any()


def test_counters_are_zero_after_a_merge():
    q, k, v, keep, scale = inputs(1, 2, 4, 300, 32, [299])
    kernel.decode_attention(q, k, v, keep, scale)
    counters = kernel.tile_counters(q.device, 2)
    assert counters is not None and int(counters[:2].abs().sum()) == 0


@pytest.mark.parametrize("r, warps, want", [(4, 8, 8), (4, 4, 4), (2, 4, 4), (3, 8, 8), (16, 8, 16)])
def test_the_merge_runs_on_the_real_rows_with_the_whole_tiles_bits(monkeypatch, r, warps, want):
    # MERGE_R: the splits' merge on R rows rounded up, at least a row a warp, at most the MMA's 16; each row's sums
    # are its own, so the output and its scales are those of the merge on all 16 rows, bit for bit
    q, k, v, keep, scale = inputs(2, 2, r, 300, 32, [299, 150])
    cfg = kernel.AttentionConfig(block_t=32, num_warps=warps, programs=0, splits=5)
    real, taken, whole = kernel._decode_attention_kernel, [], [False]

    class Spy:  # records each launch's MERGE_R; with whole[0] the launch merges the MMA's whole tile instead
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                taken.append(kwargs["MERGE_R"])
                return real[grid](*args, **{**kwargs, "MERGE_R": kwargs["BLOCK_R"] if whole[0] else kwargs["MERGE_R"]})

            return launch

    monkeypatch.setattr(kernel, "_decode_attention_kernel", Spy())
    runs = []
    for whole[0] in (False, True):
        out = kernel.decode_attention(q, k, v, keep, scale, cfg)
        o8, s8 = kernel.decode_attention_upto_quant(q, k, v, torch.tensor([299, 150]), scale, 16, cfg)
        runs.append((out.view(torch.int16), o8.view(torch.uint8), s8))
    assert taken == [want] * 4
    assert all(torch.equal(a.nan_to_num(7.0) if a.is_floating_point() else a,
                           b.nan_to_num(7.0) if b.is_floating_point() else b) for a, b in zip(*runs))


def test_no_shared_counters_reads_all_keys_in_one_split(monkeypatch):
    # FP8_FUSION_TICKETS=0 (models concurrent on several streams): no merge ticket, so one split per kv head
    q, k, v, keep, scale = inputs(1, 2, 4, 300, 32, [299])
    grids, real = [], kernel._decode_attention_kernel

    class Spy:  # records each launch's grid
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(kernel, "_decode_attention_kernel", Spy())
    monkeypatch.setenv("FP8_FUSION_TICKETS", "0")
    out = kernel.decode_attention(q, k, v, keep, scale)
    assert grids == [(2, 1)]
    assert rel_l2(out, ref.decode_attention(q, k, v, keep, scale)) <= tolerances.ATTENTION_REL_L2
    monkeypatch.delenv("FP8_FUSION_TICKETS")
    kernel.decode_attention(q, k, v, keep, scale)
    assert grids[-1][1] > 1  # the default config splits these 300 keys


def test_op_runs_the_triton_kernel_and_checks_inputs():
    from fp8_fusion_pass.kernels import backends

    q, k, v, keep, scale = inputs(1, 2, 4, 64, 32, [63])
    with backends.use_backend("triton"):
        got = OP(q, k, v, keep, scale)
    assert rel_l2(got, ref.decode_attention(q, k, v, keep, scale)) <= tolerances.ATTENTION_REL_L2
    with pytest.raises(TypeError, match="bf16 or fp16"):
        OP(q.float(), k.float(), v.float(), keep, scale)
    with pytest.raises(TypeError, match="bool mask"):
        OP(q, k, v, keep.float(), scale)
    with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
        OP(q, k[:, :1], v[:, :1], keep, scale)
    with pytest.raises(ValueError, match="keep must broadcast"):
        OP(q, k, v, keep[..., :10], scale)
    with pytest.raises(ValueError, match="at most 64 query rows"):
        big = torch.zeros(1, 2, 65, 32, dtype=q.dtype)
        OP(big, k, v, keep, scale)
    with pytest.raises(ValueError, match="4-D"):
        OP(q[0], k, v, keep, scale)


UPTO = torch.ops.fp8_fusion.decode_attention_upto


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT, *(cfg for _, cfg in kernel.TABLE)], ids=str)
@pytest.mark.parametrize("b, t, positions, dtype", [
    (3, 300, [299, 63, 64], torch.int64),  # all keys; the last key of a tile; the first of the next
    (2, 200, [-1, 500], torch.int32),  # sees nothing (NaN); past the cache (every key)
    (1, 40, [0], torch.int64),  # one key, fewer keys than a tile
])  # fmt: skip
@pytest.mark.parametrize("visible", [False, True], ids=["slot_runs", "dealt_tiles"])
def test_upto_is_the_mask_it_stands_for_bit_for_bit(monkeypatch, visible, cfg, b, t, positions, dtype):
    # the same kernel, the loop ended at last[b] instead of the masked keys after it contributing exp(-inf) = 0: bit
    # for bit where its splits are the mask form's runs of slots; dealt out (SPLIT_VISIBLE, the default) the same
    # sums grouped otherwise where a split holds more than one tile (test_attention_split_visible.py)
    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", visible)
    q, k, v, keep, scale = inputs(b, 2, 4, t, 32, positions)
    last = torch.tensor(positions, dtype=dtype)
    got = kernel.decode_attention_upto(q, k, v, last, scale, cfg)
    assert torch.equal(got.isnan(), keep.any(-1, keepdim=True).logical_not().expand_as(got))
    masked = kernel.decode_attention(q, k, v, keep, scale, cfg).nan_to_num()
    if not visible:
        assert torch.equal(got.nan_to_num(), masked)
    assert rel_l2(got.nan_to_num(), masked) <= tolerances.ATTENTION_REL_L2
    want = ref.decode_attention_upto(q, k, v, last, scale)
    assert torch.equal(want.isnan(), got.isnan()) and rel_l2(got.nan_to_num(), want.nan_to_num()) <= (
        tolerances.ATTENTION_REL_L2)  # fmt: skip


def test_upto_reads_no_slot_after_last():
    # NaN in every slot after a row's position: the mask form would load them (a masked score, but p = 0 times a
    # NaN value is NaN in the p @ v sum); the upto form never loads them
    q, k, v, _, scale = inputs(2, 2, 4, 300, 32, [0, 0])
    last = torch.tensor([100, 250])
    for row, pos in enumerate(last.tolist()):
        k[row, :, pos + 1:] = float("nan")
        v[row, :, pos + 1:] = float("nan")
    for cfg in (kernel.DEFAULT, ONE_SPLIT):
        got = kernel.decode_attention_upto(q, k, v, last, scale, cfg)
        assert not got.isnan().any()
        assert rel_l2(got, ref.decode_attention_upto(q, k.nan_to_num(), v.nan_to_num(), last, scale)) <= (
            tolerances.ATTENTION_REL_L2)  # fmt: skip


def test_upto_op_runs_the_triton_kernel_and_checks_inputs():
    from fp8_fusion_pass.kernels import backends

    q, k, v, _, scale = inputs(2, 2, 4, 64, 32, [63, 10])
    last = torch.tensor([63, 10])
    with backends.use_backend("triton"):
        got = UPTO(q, k, v, last, scale)
    assert rel_l2(got, ref.decode_attention_upto(q, k, v, last, scale)) <= tolerances.ATTENTION_REL_L2
    with pytest.raises(TypeError, match="1-D int32 / int64"):
        UPTO(q, k, v, last.float(), scale)
    with pytest.raises(TypeError, match="1-D int32 / int64"):
        UPTO(q, k, v, last.view(2, 1), scale)
    with pytest.raises(ValueError, match="one entry per batch row"):
        UPTO(q, k, v, last[:1], scale)
    with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
        UPTO(q, k[:, :1], v[:, :1], last, scale)


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT], ids=str)
@pytest.mark.parametrize("d, group_size", [(128, 128), (64, 32)])
def test_upto_quant_is_the_op_then_group_quant_bit_for_bit(cfg, d, group_size):
    # the o_proj's input quant in the attention's own launch: the rounded output, then group_quant's steps
    from fp8_fusion_pass.kernels.triton.group_quant import group_quant

    q, k, v, _, scale = inputs(3, 2, 4, 200, d, [0, 0, 0])
    last = torch.tensor([199, 37, 128])
    o = kernel.decode_attention_upto(q, k, v, last, scale, cfg)
    want_q, want_s = group_quant(o, group_size)
    got_q, got_s = kernel.decode_attention_upto_quant(q, k, v, last, scale, group_size, cfg)
    assert got_q.dtype == want_q.dtype and got_q.shape == o.shape and got_s.shape == (3, 2, 4, d // group_size)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got_s, want_s)


def test_upto_quant_op_checks_the_group():
    from fp8_fusion_pass.kernels import backends, reference_backend

    q, k, v, _, scale = inputs(1, 2, 4, 64, 128, [0])
    last = torch.tensor([50])
    op = torch.ops.fp8_fusion.decode_attention_upto_quant
    with backends.use_backend("triton"):
        got_q, got_s = op(q, k, v, last, scale, 128)
    want_q, want_s = reference_backend.decode_attention_upto_quant(q, k, v, last, scale, 128)
    assert rel_l2(got_q.float() * got_s, want_q.float() * want_s) <= tolerances.ATTENTION_REL_L2 + 2**-4
    with pytest.raises(ValueError, match="multiple of the group size"):
        op(q, k, v, last, scale, 96)
    with pytest.raises(ValueError, match="power of two"):
        op(*inputs(1, 2, 4, 64, 96, [0])[:3], last, scale, 32)


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT], ids=str)
@pytest.mark.parametrize("b, hkv, g, s, t, d, group_size", [
    (2, 2, 4, 4, 64, 128, 128), (1, 2, 2, 3, 40, 64, 32), (3, 1, 8, 2, 100, 128, 64), (2, 2, 4, 1, 64, 128, 128),
    (2, 1, 4, 8, 40, 64, 64), (2, 1, 8, 8, 40, 64, 64),  # 32 rows (the pass's bound), 64 (the kernel's most)
])  # fmt: skip
def test_tokens_quant_is_the_masked_pair_bit_for_bit(cfg, b, hkv, g, s, t, d, group_size):
    # rows = (head, token) read and written at their own strides, each token's position compared per row: the same
    # splits, tiles and sums as the masked kernel on the copied q, then the copy back and group_quant
    from fp8_fusion_pass.kernels.triton.group_quant import group_quant

    q, k, v, last, scale = token_inputs(b, hkv, g, s, t, d)
    got_q, got_s = kernel.decode_attention_tokens_quant(q, k, v, last, scale, group_size, cfg)
    masked = functools.partial(kernel.decode_attention, cfg=cfg)
    want_q, want_s = tokens_as_masked_pair(q, k, v, last, scale, group_size, masked, group_quant)
    assert got_q.shape == (b, s, hkv * g, d) and got_s.shape == (b, s, hkv * g, d // group_size)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got_s.nan_to_num(-1.0), want_s.nan_to_num(-1.0))
    assert got_s.isnan().any(-1).sum() == (hkv * g if b > 1 else 0)  # row 1's first token sees nothing


def test_tokens_quant_op_runs_the_triton_kernel_and_checks_inputs():
    from fp8_fusion_pass.kernels import backends, reference_backend

    q, k, v, last, scale = token_inputs(2, 2, 4, 4, 64, 128)
    op = torch.ops.fp8_fusion.decode_attention_tokens_quant
    with backends.use_backend("triton"):
        got_q, got_s = op(q, k, v, last, scale, 128)
    want_q, want_s = reference_backend.decode_attention_tokens_quant(q, k, v, last, scale, 128)
    ok = ~want_s.isnan().any(-1)
    got, want = (x.float() * sc for x, sc in ((got_q, got_s), (want_q, want_s)))
    assert rel_l2(got[ok], want[ok]) <= tolerances.ATTENTION_REL_L2 + 2**-4
    assert torch.equal(got_s.isnan(), want_s.isnan())
    with pytest.raises(TypeError, match="2-D int32 / int64 tensor, the last slot each batch row and token"):
        op(q, k, v, last[:, 0], scale, 128)
    with pytest.raises(ValueError, match=r"last must be \[2, 4\]"):
        op(q, k, v, last[:, :2], scale, 128)
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        op(q[:, :7], k, v, last, scale, 128)
    with pytest.raises(ValueError, match="at most 64 query rows"):
        op(*token_inputs(1, 1, 8, 9, 64, 128)[:4], scale, 128)
    with pytest.raises(ValueError, match="multiple of the group size"):
        op(q, k, v, last, scale, 96)


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT], ids=str)
@pytest.mark.parametrize("b, hkv, g, s, t, d", [(2, 2, 4, 4, 64, 128), (1, 2, 2, 3, 40, 64), (3, 1, 8, 2, 100, 96),
                                                (2, 1, 8, 8, 40, 64)])  # 64 rows, the kernel's most
def test_tokens_without_the_quant_is_the_masked_op_and_the_copy(cfg, b, hkv, g, s, t, d):
    # decode_attention_tokens: the token form for an o_proj that takes q's dtype (any head dim, no groups): the masked
    # kernel on the copied q, then the copy back to [B, S, Hq, D], bit for bit
    q, k, v, last, scale = token_inputs(b, hkv, g, s, t, d)
    got = kernel.decode_attention_tokens(q, k, v, last, scale, cfg)
    masked = functools.partial(kernel.decode_attention, cfg=cfg)
    keep = torch.arange(t) <= last.unsqueeze(-1)
    keep = keep.unsqueeze(1).expand(b, g, s, t).reshape(b, 1, g * s, t)
    want = masked(q.reshape(b, hkv, g * s, d), k, v, keep, scale).reshape(b, hkv * g, s, d).transpose(1, 2)
    assert got.shape == (b, s, hkv * g, d) and got.dtype == q.dtype and got.is_contiguous()
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)) and torch.equal(got.isnan(), want.isnan())
    from fp8_fusion_pass.kernels import backends

    with backends.use_backend("triton"):
        op = torch.ops.fp8_fusion.decode_attention_tokens(q, k, v, last, scale)
    ok = ~want.isnan()
    assert torch.equal(op.isnan(), want.isnan())
    assert rel_l2(op[ok], ref.decode_attention_tokens(q, k, v, last, scale)[ok]) <= tolerances.ATTENTION_REL_L2
