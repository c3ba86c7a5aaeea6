"""``rope_decode_attention`` and ``rope_decode_attention_tokens(_quant)``: the decode-attention kernel with the step's
RoPE (Qwen3: q / k norms too) and its k / v cache writes in its prologue (CPU interpreter), against the two launches
each stands for (the ``*_rope_cache`` kernel, then ``decode_attention_upto`` or ``decode_attention_tokens_quant``),
the new slots read back after their writes, slots outside the cache or after ``last``, and the ops' input checks."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: triton.jit reads it when a kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import tolerances
from attention_cases import rel_l2, rope_inputs, rope_token_inputs
from elementwise_checks import KERNEL_TEST_MARKS
from elementwise_checks import _assert_quant_close as assert_quant_close

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels import backends, reference_backend
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import attention_configs, rms_norm_rope
from fp8_fusion_pass.kernels.triton import decode_attention as kernel

pytestmark = KERNEL_TEST_MARKS
OP = torch.ops.fp8_fusion.rope_decode_attention
TOKENS_OP = torch.ops.fp8_fusion.rope_decode_attention_tokens_quant
ONE_SPLIT = kernel.AttentionConfig(programs=0)


def _rope_cache(args):
    """The RoPE kernel writing the caches (in place); its q [B, Hq, S, D]."""
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    if wq is None:
        return rms_norm_rope.qk_rope_cache(q, k, cos, sin, v, pos, kc, vc)
    return rms_norm_rope.rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc)


def _pair(args, last, scale, group, cfg):
    """The two launches: the RoPE kernel writing the caches (in place), then the attention on its q."""
    q_out, kc, vc = _rope_cache(args), args[9], args[10]
    b, hq, _, d = q_out.shape
    q4 = q_out.reshape(b, kc.shape[1], hq // kc.shape[1], d)
    if group:
        return kernel.decode_attention_upto_quant(q4, kc, vc, last, scale, group, cfg)
    return kernel.decode_attention_upto(q4, kc, vc, last, scale, cfg), None


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT], ids=str)
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("b, hq, hk, t, d", [(2, 8, 2, 200, 64), (3, 4, 4, 40, 32)])
def test_llama_rope_then_attention_bit_for_bit(cfg, quant, b, hq, hk, t, d):
    # RoPE alone: the same roundings as the RoPE kernel, so the caches and the output are the pair's bits; the new
    # slots held far-off values before (rope_inputs), so a read of one before its write would show
    positions = [(t - 1 - 37 * i) % t for i in range(b)]
    group = d // 2 if quant else 0
    args = rope_inputs(b, hq, hk, t, d, positions, norm=False)
    last = args[8].view(-1)
    pair_args = _clone(args)
    want_o, want_s = _pair(pair_args, last, d**-0.5, group, cfg)
    got_args = _clone(args)
    got_o, got_s = kernel.rope_decode_attention(*got_args, last, d**-0.5, group, cfg)
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_args[10], pair_args[10])
    assert not torch.equal(got_args[9], args[9])  # the step did write its slots
    assert torch.equal(got_o.view(torch.uint8), want_o.view(torch.uint8))
    if group:
        assert torch.equal(got_s, want_s)
    else:
        assert got_s.shape == (b, hk, hq // hk, 0) and got_o.dtype == args[0].dtype


@pytest.mark.parametrize("group", [0, 128])
def test_qwen3_norms_rope_then_attention(group):
    # with the norms the sum of squares runs in another order than the RoPE kernel's two halves: an ulp, rarely
    args = rope_inputs(2, 8, 2, 300, 128, [299, 17], norm=True)
    last = args[8].view(-1)
    pair_args, got_args = _clone(args), _clone(args)
    want_o, want_s = _pair(pair_args, last, 128**-0.5, group, kernel.DEFAULT)
    got_o, got_s = kernel.rope_decode_attention(*got_args, last, 128**-0.5, group)
    assert torch.equal(got_args[10], pair_args[10])  # v is copied
    k_diff = (got_args[9].float() - pair_args[9].float()).abs()
    assert k_diff.max() <= 2**-7 * pair_args[9].float().abs().max()
    if group:
        assert rel_l2(got_o.float() * got_s, want_o.float() * want_s) <= 1e-2
    else:
        assert rel_l2(got_o, want_o) <= tolerances.ATTENTION_REL_L2
    want = ref.rope_decode_attention(*_clone(args), last, 128**-0.5)
    assert group or rel_l2(got_o, want) <= tolerances.ATTENTION_REL_L2


@pytest.mark.parametrize("registers", [False, True], ids=["stored", "from_registers"])
def test_the_owner_of_each_split_and_negative_slots(monkeypatch, registers):
    # seven splits of 16 keys; the new slots fall in the first, a middle and the last split, one given negative
    # (from the end); both ways the new k / v reach the key loop: stored and read back (NVIDIA, the interpreter), or
    # from registers (ROCm's path)
    monkeypatch.setattr(kernel, "new_from_registers", lambda _: registers)
    cfg = kernel.AttentionConfig(block_t=16, programs=16)
    assert kernel.plan(3 * 2, 112, kernel._sm_count(torch.device("cpu")), cfg)[0] == 7
    args = rope_inputs(3, 4, 2, 112, 32, [5, 60, 111], norm=True)
    args = (*args[:8], torch.tensor([[5], [60], [-1]]), *args[9:])  # -1: slot 111
    last = torch.tensor([5, 111, 111])
    pair_args, got_args = _clone(args), _clone(args)
    want_o, _ = _pair(pair_args, last, 32**-0.5, 0, cfg)
    got_o, _ = kernel.rope_decode_attention(*got_args, last, 32**-0.5, 0, cfg)
    assert torch.equal(got_args[10], pair_args[10]) and torch.equal(got_args[9], pair_args[9])
    assert torch.equal(got_o, want_o)


def test_one_shared_position_and_table():
    # HF's cache_position [1] and one [1, 1, D] table for every batch row, the table's D stride not 1
    args = rope_inputs(2, 4, 2, 40, 32, [7, 7], norm=False)
    table = torch.randn(1, 1, 96).to(torch.bfloat16)[..., ::3]
    args = (*args[:5], table.cos(), table.sin(), args[7], torch.tensor([7]), *args[9:])
    last = torch.tensor([7, 7])
    pair_args, got_args = _clone(args), _clone(args)
    want_o, _ = _pair(pair_args, last, 32**-0.5, 0, kernel.DEFAULT)
    got_o, _ = kernel.rope_decode_attention(*got_args, last, 32**-0.5, 0)
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_o, want_o)


def test_a_slot_outside_the_cache_writes_nothing_and_one_after_last_is_not_read():
    args = rope_inputs(2, 4, 2, 64, 32, [0, 0], norm=False)
    pos = torch.tensor([[64 + 5], [30]])  # row 0: outside [-T, T); row 1: written at 30, read up to 20 only
    args = (*args[:8], pos, *args[9:])
    last = torch.tensor([63, 20])
    got_args = _clone(args)
    got_o, _ = kernel.rope_decode_attention(*got_args, last, 32**-0.5, 0)
    assert torch.equal(got_args[9][0], args[9][0]) and torch.equal(got_args[10][0], args[10][0])
    assert not torch.equal(got_args[9][1, :, 30], args[9][1, :, 30])
    assert torch.equal(got_args[9][1, :, :30], args[9][1, :, :30])
    # row 1 attends to slots 0..20 only, which the step did not touch: the upto op over the old cache and roped q
    q_out = rms_norm_rope.qk_rope(args[0], args[2], args[5], args[6])[0].reshape(2, 2, 2, 32)
    want = kernel.decode_attention_upto(q_out, args[9], args[10], last, 32**-0.5)
    assert torch.equal(got_o[1], want[1])


def test_op_runs_the_triton_kernel_and_checks_inputs():
    args = rope_inputs(2, 8, 2, 64, 64, [63, 10], norm=True)
    last = args[8].view(-1)
    with backends.use_backend("triton"):
        got_o, got_s = OP(*_clone(args), last, 0.125, 0)
    want = ref.rope_decode_attention(*_clone(args), last, 0.125)
    assert rel_l2(got_o, want) <= tolerances.ATTENTION_REL_L2 and got_s.shape == (2, 2, 4, 0)
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    with pytest.raises(ValueError, match="both be given"):
        OP(q, wq, k, None, eps, cos, sin, v, pos, kc, vc, last, 0.125, 0)
    with pytest.raises(ValueError, match="one token per step"):
        two = torch.cat([q, q], 1), torch.cat([k, k], 1), torch.cat([v, v], 2)
        OP(two[0], wq, two[1], wk, eps, cos.expand(2, 2, 64), sin.expand(2, 2, 64), two[2], pos.expand(2, 2), kc,
           vc, last, 0.125, 0)  # fmt: skip
    with pytest.raises(ValueError, match="positive multiple of the kv heads"):
        OP(q[:, :, :7], wq, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125, 0)
    with pytest.raises(ValueError, match="group_size must be 0"):
        OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125, -1)
    with pytest.raises(ValueError, match="multiple of the group size"):
        OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125, 48)
    with pytest.raises(TypeError, match="1-D int32 / int64"):
        OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last.float(), 0.125, 0)


def _token_pair(args, last, scale, group, cfg):
    """A step of several tokens as two launches: the RoPE kernel writing the caches, then the token form on its q."""
    return kernel.decode_attention_tokens_quant(_rope_cache(args), args[9], args[10], last, scale, group, cfg)


@pytest.mark.parametrize("group", [64, 0], ids=["quant", "plain"])
@pytest.mark.parametrize("registers", [False, True], ids=["stored", "from_registers"])
@pytest.mark.parametrize("cfg", [kernel.DEFAULT, ONE_SPLIT, kernel.AttentionConfig(block_t=16, programs=16)], ids=str)
def test_tokens_rope_then_attention_bit_for_bit(monkeypatch, group, registers, cfg):
    # 3 tokens (a tile of 4 new rows, one padding), 4 heads per kv head: rows (head, token). Row 1's last token is
    # given as -1 (slot 99, from the end) and sees every slot; row 2's tokens straddle splits of 16 keys. The new
    # slots held far-off values, so a read of one before its write would show; every key of a token after its own
    # slot is a later token's, unwritten yet in eager order but written by this step: the tokens see them only up to
    # their own position. Group 0: rope_decode_attention_tokens against decode_attention_tokens (no quant).
    monkeypatch.setattr(kernel, "new_from_registers", lambda _: registers)
    args = rope_token_inputs(3, 8, 2, 3, 100, 64, norm=False, seed=3)
    args = (*args[:8], torch.tensor([[5, 6, 7], [30, 31, -1], [46, 47, 48]]), *args[9:])
    last = torch.tensor([[5, 6, 7], [30, 31, 99], [46, 47, 48]])
    pair_args, got_args = _clone(args), _clone(args)
    if group:
        want_o, want_s = _token_pair(pair_args, last, 0.125, group, cfg)
        got_o, got_s = kernel.rope_decode_attention_tokens_quant(*got_args, last, 0.125, group, cfg)
    else:
        want_o = kernel.decode_attention_tokens(_rope_cache(pair_args), pair_args[9], pair_args[10], last, 0.125, cfg)
        got_o = kernel.rope_decode_attention_tokens(*got_args, last, 0.125, cfg)
        want_s = got_s = torch.zeros(3, 3, 8, 1)  # nothing to compare (zeros: torch.empty may hold a NaN)
        assert got_o.dtype == torch.bfloat16 and got_o.is_contiguous()
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_args[10], pair_args[10])
    assert not torch.equal(got_args[9][1, :, 99], args[9][1, :, 99])  # the negative position's slot was written
    assert got_o.shape == (3, 3, 8, 64) and got_s.shape == (3, 3, 8, 1)
    assert torch.equal(got_o.view(torch.uint8), want_o.view(torch.uint8)) and torch.equal(got_s, want_s)


@pytest.mark.parametrize("tokens", [2, 4])
def test_tokens_qwen3_norms_rope_then_attention(tokens):
    # with the norms the sum of squares runs in another order than the RoPE kernel's: an ulp, rarely
    args = rope_token_inputs(2, 8, 2, tokens, 300, 128, norm=True, seed=tokens)
    last = args[8]
    pair_args, got_args = _clone(args), _clone(args)
    want_o, want_s = _token_pair(pair_args, last, 128**-0.5, 128, None)  # both with the table's config
    got_o, got_s = kernel.rope_decode_attention_tokens_quant(*got_args, last, 128**-0.5, 128)
    assert torch.equal(got_args[10], pair_args[10])  # v is copied
    k_diff = (got_args[9].float() - pair_args[9].float()).abs()
    assert k_diff.max() <= 2**-7 * pair_args[9].float().abs().max()
    assert_quant_close(got_o, got_s, want_o, want_s, scale_rel=tolerances.SCALE_REL_TOL, max_flip=0.02, max_steps=1,
                       what="vs the pair")  # fmt: skip
    want_o, want_s = reference_backend.group_quant(ref.rope_decode_attention_tokens(*_clone(args), last, 128**-0.5),
                                                   128)  # the reference attention, quantized as the op does
    assert_quant_close(got_o, got_s, want_o, want_s, scale_rel=tolerances.SCALE_REL_TOL, max_flip=0.1,
                       max_steps=None, what="vs the reference")  # a value near 0 may cross it: the dequantized bound


def test_tokens_op_runs_the_triton_kernel_and_checks_inputs():
    args = rope_token_inputs(2, 8, 2, 4, 64, 64, norm=True)
    last = args[8]
    with backends.use_backend("triton"):
        got_o, got_s = TOKENS_OP(*_clone(args), last, 0.125, 64)
    with backends.use_backend("reference"):
        want_o, want_s = TOKENS_OP(*_clone(args), last, 0.125, 64)
    assert got_o.shape == want_o.shape == (2, 4, 8, 64) and got_s.shape == want_s.shape == (2, 4, 8, 1)
    assert rel_l2(got_o.float() * got_s, want_o.float() * want_s) <= 1e-2
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    with pytest.raises(ValueError, match="group_size must be a group size"):
        TOKENS_OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125, 0)
    with pytest.raises(TypeError, match="2-D int32 / int64"):
        TOKENS_OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last[:, 0], 0.125, 64)
    with pytest.raises(ValueError, match="both be given"):
        TOKENS_OP(q, None, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125, 64)
    with pytest.raises(ValueError, match="at most 64 query rows"):
        many = [torch.cat([t] * 5, 1) for t in (q, k, cos, sin, pos, last)]
        TOKENS_OP(many[0], wq, many[1], wk, eps, many[2], many[3], torch.cat([v] * 5, 2), many[4], kc, vc, many[5],
                  0.125, 64)  # fmt: skip


def test_tokens_with_one_shared_position_row_and_table():
    # HF's cache_position [S] and one [1, S, D] table for every batch row (stride 0 over the batch), the table's D
    # stride not 1: each token still takes its own table row and slot
    args = rope_token_inputs(2, 4, 2, 3, 40, 32, norm=False)
    table = torch.randn(1, 3, 96).to(torch.bfloat16)[..., ::3]
    args = (*args[:5], table.cos(), table.sin(), args[7], torch.tensor([7, 8, 9]), *args[9:])
    last = torch.tensor([[7, 8, 9], [7, 8, 9]])
    pair_args, got_args = _clone(args), _clone(args)
    want_o, want_s = _token_pair(pair_args, last, 32**-0.5, 32, kernel.DEFAULT)
    got_o, got_s = kernel.rope_decode_attention_tokens_quant(*got_args, last, 32**-0.5, 32, kernel.DEFAULT)
    assert torch.equal(got_args[9], pair_args[9]) and torch.equal(got_args[10], pair_args[10])
    assert torch.equal(got_o.view(torch.uint8), want_o.view(torch.uint8)) and torch.equal(got_s, want_s)


PLAIN_TOKENS_OP = torch.ops.fp8_fusion.rope_decode_attention_tokens


def test_plain_tokens_op_runs_the_triton_kernel_and_checks_inputs():
    # Qwen3's norms in the prologue: against the reference op (its own roundings), then the op's checks
    args = rope_token_inputs(2, 8, 2, 4, 64, 64, norm=True)
    last = args[8]
    with backends.use_backend("triton"):
        got = PLAIN_TOKENS_OP(*_clone(args), last, 0.125)
    with backends.use_backend("reference"):
        want = PLAIN_TOKENS_OP(*_clone(args), last, 0.125)
    assert got.shape == want.shape == (2, 4, 8, 64) and got.dtype == want.dtype == torch.bfloat16
    assert rel_l2(got.float(), want.float()) <= 1e-2
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    with pytest.raises(TypeError, match="2-D int32 / int64"):
        PLAIN_TOKENS_OP(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, last[:, 0], 0.125)
    with pytest.raises(ValueError, match="both be given"):
        PLAIN_TOKENS_OP(q, wq, k, None, eps, cos, sin, v, pos, kc, vc, last, 0.125)
    with pytest.raises(ValueError, match="positive multiple of the kv heads"):
        PLAIN_TOKENS_OP(q[:, :, :7], wq, k, wk, eps, cos, sin, v, pos, kc, vc, last, 0.125)
    with pytest.raises(ValueError, match="at most 64 query rows"):
        many = [torch.cat([t] * 5, 1) for t in (q, k, cos, sin, pos, last)]
        PLAIN_TOKENS_OP(many[0], wq, many[1], wk, eps, many[2], many[3], torch.cat([v] * 5, 2), many[4], kc, vc,
                        many[5], 0.125)  # fmt: skip


def _configs_taken(monkeypatch) -> list:
    """The configs the launches take from here on (``decode_attention._launch`` asks ``launch_config``)."""
    taken, real = [], kernel.launch_config
    monkeypatch.setattr(kernel, "launch_config", lambda *a: taken.append(real(*a)) or taken[-1])
    return taken


def test_the_rope_prologue_takes_the_one_token_configs(monkeypatch):
    # the RoPE prologue spills with WIDE's 4-warp rows (offline sm_90 compile), so a RoPE launch of 32 rows at 16
    # pairs takes an 8-warp row; the same rows without RoPE take WIDE's 4-warp one
    from attention_cases import token_inputs

    taken = _configs_taken(monkeypatch)
    args = rope_token_inputs(16, 8, 1, 4, 40, 64, norm=True, seed=1)  # 8 heads x 4 tokens: 32 rows per kv head
    kernel.rope_decode_attention_tokens_quant(*args, args[8], 0.125, 64)
    kernel.decode_attention_tokens_quant(*token_inputs(16, 1, 8, 4, 40, 64)[:4], 0.125, 64)
    assert taken == [attention_configs.ROPE_TOKENS[0][1], attention_configs.config_for(16, 32)]
    assert [c.num_warps for c in taken] == [8, 4]


@pytest.mark.parametrize("wide, rows, wide_rows", [(0, 32, False), (32, 32, True), (16, 32, False), (64, 64, True)])
def test_rope_launches_take_wide_rows_up_to_their_bound(monkeypatch, wide, rows, wide_rows):
    # decode_attention.ROPE_WIDE_ROWS: a RoPE token launch of at most that many rows per kv head takes WIDE's row
    # for its rows, as the plain launches do; above it (and at 0, the default) ROPE_TOKENS'
    monkeypatch.setattr(kernel, "ROPE_WIDE_ROWS", wide)
    taken = _configs_taken(monkeypatch)
    tokens = rows // 4
    args = rope_token_inputs(2, 8, 2, tokens, 100, 64, norm=False, seed=1)
    got = kernel.rope_decode_attention_tokens_quant(*_clone(args), args[8], 0.125, 64)
    assert taken == [attention_configs.config_for(4, rows) if wide_rows else attention_configs.ROPE_TOKENS[0][1]]
    want = _token_pair(_clone(args), args[8], 0.125, 64, taken[0])  # same config
    assert_quant_close(*got, *want, scale_rel=tolerances.SCALE_REL_TOL, max_flip=0.02, max_steps=1, what="wide")


@pytest.mark.parametrize("tokens, want", [(4, "batch-1 row"), (8, "128-key row")])
def test_rope_launches_above_16_rows_keep_the_128_key_tiles_at_batch_1(monkeypatch, tokens, want):
    # TABLE's 8-pair row (64-key tiles) was timed at the MMA's 16 rows; a RoPE launch of more rows per kv head at
    # <= 8 pairs keeps the 128-key row its timings ran on (4 heads x 4 tokens: 16 rows; x 8: 32)
    taken = _configs_taken(monkeypatch)
    args = rope_token_inputs(2, 8, 2, tokens, 100, 64, norm=False, seed=1)  # 2 x 2 = 4 pairs
    kernel.rope_decode_attention_tokens_quant(*args, args[8], 0.125, 64)
    assert [c.block_t for c in taken] == [64 if want == "batch-1 row" else 128]
