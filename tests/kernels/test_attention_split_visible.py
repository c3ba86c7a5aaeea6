"""``decode_attention.SPLIT_VISIBLE``: the upto forms' key tiles dealt out to the splits in turn, up to the last key
a row sees, rather than runs of the cache's slots (CPU interpreter). Which splits saw keys is read from the
partials the launch allocates; outputs against the reference and against the runs; the RoPE forms' new k / v
written once each, by the split whose tiles hold the slot (seen or not); the mask form untouched."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import tolerances
from attention_cases import inputs, rel_l2, rope_inputs, rope_token_inputs
from elementwise_checks import KERNEL_TEST_MARKS

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import decode_attention as kernel
from fp8_fusion_pass.kernels.triton import rms_norm_rope

pytestmark = KERNEL_TEST_MARKS
MANY = kernel.AttentionConfig(block_t=16, programs=16)  # as many splits as the plan allows (16 at 2 pairs)


def _split_keys(monkeypatch, visible: bool, run) -> list[list[bool]]:
    """``run()`` under ``SPLIT_VISIBLE = visible``; per (batch row x kv head), which of its splits saw a key (a row's
    sum above 0 in the partials the launch allocated)."""
    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", visible)
    made, real = [], kernel._partials
    monkeypatch.setattr(kernel, "_partials", lambda *a: made.append(real(*a)) or made[-1])
    run()
    (_, ml), = made
    return (ml[:, :, 1, :] > 0).any(-1).tolist()  # any row's sum


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def test_the_visible_keys_spread_over_every_split(monkeypatch):
    # 101 of 4096 slots seen: runs of the slots (256 keys each) leave all 101 to the first split of each kv head;
    # dealt out, the seven 16-key tiles they fill go to the first seven splits
    q, k, v, keep, scale = inputs(1, 2, 4, 4096, 32, [100])
    last = torch.tensor([100])
    outs = {}
    for visible in (False, True):
        seen = _split_keys(monkeypatch, visible,
                           lambda: outs.setdefault(visible, kernel.decode_attention_upto(q, k, v, last, scale, MANY)))
        assert len(seen[0]) == 16
        assert seen == ([[True] * 7 + [False] * 9] * 2 if visible else [[True] + [False] * 15] * 2)
    want = ref.decode_attention(q, k, v, keep, scale)
    assert all(rel_l2(out, want) <= tolerances.ATTENTION_REL_L2 for out in outs.values())


@pytest.mark.parametrize("positions", [[63, 63], [50, 63]])
def test_where_the_visible_keys_fill_the_slots_splits_the_two_agree_bit_for_bit(monkeypatch, positions):
    # 64 slots, 16-key tiles, four splits: one tile each either way, for 64 seen keys and for 51 (still four tiles)
    q, k, v, _, scale = inputs(2, 1, 4, 64, 32, positions)
    last = torch.tensor(positions)
    run = {}
    for visible in (False, True):
        seen = _split_keys(monkeypatch, visible,
                           lambda: run.setdefault(visible, kernel.decode_attention_upto(q, k, v, last, scale, MANY)))
        assert seen == [[True] * 4] * 2
    assert torch.equal(run[True], run[False])


def test_rows_of_one_launch_split_their_own_keys(monkeypatch):
    # batch rows seeing 20, 300 and no keys (last -1): each row's tiles over its splits, the third row's NaN
    q, k, v, keep, scale = inputs(3, 1, 2, 512, 32, [19, 299, 0])
    last = torch.tensor([19, 299, -1])
    out = {}
    seen = _split_keys(monkeypatch, True, lambda: out.setdefault(0, kernel.decode_attention_upto(q, k, v, last, scale,
                                                                                                  MANY)))  # fmt: skip
    assert len(seen[0]) == 16 and [sum(row) for row in seen] == [2, 16, 0]  # 20 keys: 2 tiles; 300: 19 tiles
    want = ref.decode_attention(q[:2], k[:2], v[:2], keep[:2], scale)
    assert rel_l2(out[0][:2], want) <= tolerances.ATTENTION_REL_L2 and out[0][2].isnan().all()


def test_no_slot_after_last_is_read(monkeypatch):
    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", True)
    q, k, v, keep, scale = inputs(2, 2, 4, 300, 32, [40, 130])
    k[0, :, 41:], v[1, :, 131:] = float("nan"), float("nan")
    got = kernel.decode_attention_upto(q, k, v, torch.tensor([40, 130]), scale, MANY)
    want = ref.decode_attention(q, k.nan_to_num(), v.nan_to_num(), keep, scale)
    assert not got.isnan().any() and rel_l2(got, want) <= tolerances.ATTENTION_REL_L2


def test_the_mask_form_keeps_the_slots_splits(monkeypatch):
    q, k, v, keep, scale = inputs(1, 2, 4, 1024, 32, [100])
    got = {v_: _split_keys(monkeypatch, v_, lambda: kernel.decode_attention(q, k, v, keep, scale, MANY))
           for v_ in (False, True)}  # fmt: skip
    assert got[True] == got[False] == [[True] * 2 + [False] * 14] * 2  # 101 keys of 64-key splits


@pytest.mark.parametrize("registers", [False, True], ids=["stored", "from_registers"])
def test_rope_slots_have_one_writer_each(monkeypatch, registers):
    # 400 slots, last 40 / 200 / 10: row 0 writes slot 40 (its last seen key), row 1 slot 200, row 2 slot 300, past
    # every key it sees (0..10), which the split whose tiles hold it writes all the same; the caches and output are
    # the pair's (RoPE kernel, then the upto op with the same splits), bit for bit
    monkeypatch.setattr(kernel, "new_from_registers", lambda _: registers)
    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", True)
    args = rope_inputs(3, 4, 2, 400, 32, [40, 200, 300], norm=False)
    last = torch.tensor([40, 200, 10])
    pair_args, got_args = _clone(args), _clone(args)
    q_out = rms_norm_rope.qk_rope_cache(pair_args[0], pair_args[2], *pair_args[5:])
    want = kernel.decode_attention_upto(q_out.reshape(3, 2, 2, 32), pair_args[9], pair_args[10], last, 32**-0.5, MANY)
    got, _ = kernel.rope_decode_attention(*got_args, last, 32**-0.5, 0, MANY)
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_args[10], pair_args[10])
    for row, slot in enumerate((40, 200, 300)):
        assert not torch.equal(got_args[9][row, :, slot], args[9][row, :, slot])  # written
    assert torch.equal(got, want)


def test_rope_tokens_split_their_visible_keys(monkeypatch):
    # 3 tokens a row on a 256-slot cache: the token form's RoPE launch against the RoPE kernel then the token form,
    # both on the visible splits, bit for bit
    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", True)
    args = rope_token_inputs(2, 8, 2, 3, 256, 64, norm=False, seed=5)
    last = args[8]
    pair_args, got_args = _clone(args), _clone(args)
    q_out = rms_norm_rope.qk_rope_cache(pair_args[0], pair_args[2], *pair_args[5:])
    want_o, want_s = kernel.decode_attention_tokens_quant(q_out, pair_args[9], pair_args[10], last, 0.125, 64, MANY)
    got_o, got_s = kernel.rope_decode_attention_tokens_quant(*got_args, last, 0.125, 64, MANY)
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_args[10], pair_args[10])
    assert torch.equal(got_o.view(torch.uint8), want_o.view(torch.uint8)) and torch.equal(got_s, want_s)


def test_the_token_form_splits_the_keys_its_latest_token_sees(monkeypatch):
    # 3 tokens a row, 512 slots, 16-key tiles: row 0's tokens see up to 40 / 41 / 42 (43 keys: 3 tiles, 3 splits),
    # row 1's first token nothing and its others up to 299 / 300 (19 tiles: all 16 splits); against the reference
    from attention_cases import token_inputs, tokens_as_masked_pair

    q, k, v, _, scale = token_inputs(2, 2, 4, 3, 512, 32)
    last = torch.tensor([[40, 41, 42], [-1, 299, 300]])
    out = {}
    seen = _split_keys(monkeypatch, True, lambda: out.setdefault(0, kernel.decode_attention_tokens_quant(
        q, k, v, last, scale, 32, MANY)))  # fmt: skip
    assert [sum(row) for row in seen] == [3, 3, 16, 16]  # (batch row, kv head) pairs: 3 tiles, 19 tiles
    got = out[0][0].float() * out[0][1].repeat_interleave(32, -1)
    want = tokens_as_masked_pair(q, k, v, last, scale, 32, ref.decode_attention, lambda x, _: x)  # no quant
    assert rel_l2(got[1, 1:], want[1, 1:]) <= 4e-2 and rel_l2(got[0], want[0]) <= 4e-2  # fp8 steps: 2.5e-2 seen
    assert got[1, 0].isnan().all()  # its token sees nothing: NaN, as softmax over nothing
