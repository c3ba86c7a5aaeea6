"""On a CUDA GPU: ``decode_attention`` (split-KV decode attention) at the 8B / 32B / 0.6B decode shapes against
``reference.decode_attention`` on the same GPU, the split merge replayed in a CUDA graph, and every config the
benchmark sweeps. ``python -m pytest tests/kernels/test_attention_kernel_gpu.py -m gpu -q``."""

from __future__ import annotations

import os
import sys

import pytest
import tolerances
import torch
from attention_cases import inputs, rel_l2, token_inputs, tokens_as_masked_pair

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import decode_attention as kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import attention_decode  # noqa: E402  (its SWEEP: every config the benchmark may time is checked here)

pytestmark = pytest.mark.gpu
OP = torch.ops.fp8_fusion.decode_attention
UPTO = torch.ops.fp8_fusion.decode_attention_upto


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b", [1, 8, 64])
@pytest.mark.parametrize("hkv, r, t", [(8, 4, 576), (8, 8, 576), (8, 2, 4096), (8, 4, 33)])
def test_matches_reference_at_model_shapes(dtype, b, hkv, r, t):
    positions = [(t - 1 - 7 * i) % t for i in range(b)]
    q, k, v, keep, scale = inputs(b, hkv, r, t, 128, positions, "cuda", dtype)
    with backends.use_backend("triton"):
        got = OP(q, k, v, keep, scale)
        upto = UPTO(q, k, v, torch.tensor(positions, device="cuda"), scale)
    want = ref.decode_attention(q, k, v, keep, scale)
    assert rel_l2(got, want) <= tolerances.ATTENTION_REL_L2 and rel_l2(upto, want) <= tolerances.ATTENTION_REL_L2


@pytest.mark.parametrize("cfg", attention_decode.SWEEP, ids=str)
def test_every_swept_config(cfg):
    q, k, v, keep, scale = inputs(2, 8, 4, 576, 128, [511, 300], "cuda")
    got = kernel.decode_attention(q, k, v, keep, scale, cfg)
    upto = kernel.decode_attention_upto(q, k, v, torch.tensor([511, 300], device="cuda"), scale, cfg)
    want = ref.decode_attention(q, k, v, keep, scale)
    # not bit for bit the mask form on the GPU: with 32-key tiles one row of 8 differed by an ulp (H200, 2026-12-03;
    # the interpreter test shows the two forms compute the same thing)
    assert rel_l2(got, want) <= tolerances.ATTENTION_REL_L2 and rel_l2(upto, want) <= tolerances.ATTENTION_REL_L2


@pytest.mark.parametrize("b", [1, 8, 64])
def test_upto_quant_is_the_op_then_group_quant(b):
    # the same kernel with the quant in its epilogue: each row (one head, D = 128) one group; compared after
    # dequantizing, since the two compiles of the kernel may round the bf16 output an ulp apart (as upto vs mask did)
    from fp8_fusion_pass.kernels.triton.group_quant import group_quant

    positions = [(575 - 7 * i) % 576 for i in range(b)]
    q, k, v, _, scale = inputs(b, 8, 4, 576, 128, positions, "cuda")
    last = torch.tensor(positions, device="cuda")
    want_q, want_s = group_quant(kernel.decode_attention_upto(q, k, v, last, scale), 128)
    got_q, got_s = kernel.decode_attention_upto_quant(q, k, v, last, scale, 128)
    assert got_q.dtype == want_q.dtype and got_s.shape == want_s.shape == (b, 8, 4, 1)
    assert rel_l2(got_q.float() * got_s, want_q.float() * want_s) <= 1e-2


@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("g, s", [(4, 4), (8, 2), (4, 2), (4, 8), (8, 8)])  # 16 ... 64 rows (the kernel's most)
def test_tokens_quant_is_the_masked_pair(b, g, s):
    # q read and o_q / scales written at their own strides, a position per token: against the masked kernel on the
    # copied q, the copy back and group_quant, after dequantizing (two compiles of the kernel may round the bf16
    # output an ulp apart, as upto vs mask did); the token that sees nothing NaN in both
    from fp8_fusion_pass.kernels.triton.group_quant import group_quant

    q, k, v, last, scale = token_inputs(b, 8, g, s, 576, 128, "cuda")
    got_q, got_s = kernel.decode_attention_tokens_quant(q, k, v, last, scale, 128)
    want_q, want_s = tokens_as_masked_pair(q, k, v, last, scale, 128, kernel.decode_attention, group_quant)
    assert got_q.shape == want_q.shape == (b, s, 8 * g, 128) and torch.equal(got_s.isnan(), want_s.isnan())
    ok = ~want_s.isnan().any(-1)
    got, want = (x.float() * sc for x, sc in ((got_q, got_s), (want_q, want_s)))
    assert rel_l2(got[ok], want[ok]) <= 1e-2


@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("g, s, d", [(4, 4, 128), (4, 4, 64), (8, 2, 128), (4, 8, 128), (8, 8, 128)])
def test_tokens_without_the_quant_is_the_masked_op_and_the_copy(b, g, s, d):
    # decode_attention_tokens (an o_proj reading q's dtype; heads of 64 too): the masked kernel on the copied q, then
    # the copy back to [B, S, Hq, D]; within 1e-2 (two compiles may round an ulp apart), NaN where nothing is seen
    q, k, v, last, scale = token_inputs(b, 8, g, s, 576, d, "cuda")
    got = kernel.decode_attention_tokens(q, k, v, last, scale)
    keep = torch.arange(576, device="cuda") <= last.unsqueeze(-1)
    keep = keep.unsqueeze(1).expand(b, g, s, 576).reshape(b, 1, g * s, 576)
    want = kernel.decode_attention(q.reshape(b, 8, g * s, d), k, v, keep, scale).reshape(b, 8 * g, s, d)
    want = want.transpose(1, 2)
    assert got.shape == (b, s, 8 * g, d) and torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert rel_l2(got[ok], want[ok]) <= 1e-2


def test_in_cuda_graph_replays_with_the_merge():
    q, k, v, keep, scale = inputs(1, 8, 4, 576, 128, [511], "cuda")
    last = torch.tensor([511], device="cuda")
    with backends.use_backend("triton"):
        want = OP(q, k, v, keep, scale)  # eager first: allocates the merge counters outside the graph
        want_upto = UPTO(q, k, v, last, scale)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = OP(q, k, v, keep, scale)
            out_upto = UPTO(q, k, v, last, scale)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(out_upto, want_upto)  # the merge adds splits in order
    assert int(kernel.tile_counters(q.device, 8)[:8].abs().sum()) == 0


def _rope_cache_op(args):
    """The RoPE op that writes the caches (Qwen3's with its norms, else Llama's), as the pass leaves it without
    rope_attention; its q [B, Hq, S, D]."""
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    if wq is None:
        return torch.ops.fp8_fusion.qk_rope_cache(q, k, cos, sin, v, pos, kc, vc)
    return torch.ops.fp8_fusion.rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc)


@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("b", [1, 8, 64])
@pytest.mark.parametrize("group", [0, 128])
def test_rope_decode_attention_is_the_rope_cache_op_then_the_attention(norm, b, group):
    # the pair as the pass leaves it without rope_attention: the RoPE kernel writing the caches, then the attention
    from attention_cases import rope_inputs

    positions = [(575 - 7 * i) % 576 for i in range(b)]
    args = rope_inputs(b, 32, 8, 576, 128, positions, norm, "cuda")
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    last = pos.view(-1)
    kc2, vc2 = kc.clone(), vc.clone()
    with backends.use_backend("triton"):
        q4 = _rope_cache_op(args).reshape(b, 8, 4, 128)
        want = (torch.ops.fp8_fusion.decode_attention_upto_quant(q4, kc, vc, last, 128 ** -0.5, group) if group
                else (UPTO(q4, kc, vc, last, 128 ** -0.5),))  # fmt: skip
        got = torch.ops.fp8_fusion.rope_decode_attention(q, wq, k, wk, eps, cos, sin, v, pos, kc2, vc2, last,
                                                         128 ** -0.5, group)  # fmt: skip
    # the caches: the RoPE kernel's bits (Llama); Qwen3's norm sums its squares in another order: within a bf16 ulp
    # of the largest cache value (an ulp of a value itself, rarely)
    assert torch.equal(vc, vc2) and (torch.equal(kc, kc2) or norm)
    assert (kc.float() - kc2.float()).abs().max() <= 2 ** -7 * kc.float().abs().max()
    if group:
        assert rel_l2(got[0].float() * got[1], want[0].float() * want[1]) <= 1e-2
    else:
        assert got[1].shape == (b, 8, 4, 0) and rel_l2(got[0], want[0]) <= 1e-2


def _same_key_tiles(device: torch.device, pairs: int, rows: int, t: int) -> bool:
    """Whether the token form (``config_for(pairs, rows)``) and its RoPE launch (TABLE's rows) walk the keys in the
    same tiles and splits on the same warps: the sums of the one are then the other's, bit for bit. Other warps
    can sum a tile's rows in another order (H100, 2026-12-07: at batch 8, 32 rows, Llama's bf16 output was the token
    form's bits on TABLE's 8 warps, not on WIDE's 4, with the same tiles and splits; relative L2 <= 8.4e-6)."""
    sms = kernel._sm_count(device)
    plain, rope = (kernel.launch_config(pairs, rows, r, kernel.ROPE_WIDE_ROWS) for r in (False, True))

    def walk(cfg):
        return cfg.block_t, cfg.num_warps, kernel.plan(pairs, t, sms, cfg)

    return walk(plain) == walk(rope)


@pytest.mark.parametrize("quant", [True, False], ids=["quant", "plain"])
@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3"])
# (32, 64, 8): the one cell whose Qwen3 caches differed from the pair's in rope_attention.py (the norm's order, H100,
# thirty-fourth session); there WIDE's 32-key tiles and TABLE's 64-key ones give Llama's output other roundings too
@pytest.mark.parametrize("b, hq, s", [(1, 32, 4), (8, 32, 4), (32, 32, 4), (8, 64, 2), (8, 32, 8), (1, 64, 8),
                                     (32, 64, 8)])
def test_rope_tokens_is_the_rope_cache_op_then_the_token_form(quant, norm, b, hq, s):
    # a step of S tokens as the pass leaves it without rope_attention: the RoPE kernel, then the token form (plain:
    # rope_decode_attention_tokens against decode_attention_tokens, no quant)
    from attention_cases import rope_token_inputs

    args = rope_token_inputs(b, hq, 8, s, 576, 128, norm, "cuda")
    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = args
    kc2, vc2 = kc.clone(), vc.clone()
    ops = torch.ops.fp8_fusion
    with backends.use_backend("triton"):
        q_out = _rope_cache_op(args)
        if quant:
            want = ops.decode_attention_tokens_quant(q_out, kc, vc, pos, 128**-0.5, 128)
            got = ops.rope_decode_attention_tokens_quant(q, wq, k, wk, eps, cos, sin, v, pos, kc2, vc2, pos,
                                                         128**-0.5, 128)  # fmt: skip
        else:
            want = ops.decode_attention_tokens(q_out, kc, vc, pos, 128**-0.5), torch.ones(())
            got = ops.rope_decode_attention_tokens(q, wq, k, wk, eps, cos, sin, v, pos, kc2, vc2, pos,
                                                   128**-0.5), torch.ones(())  # fmt: skip
    assert torch.equal(vc, vc2) and (torch.equal(kc, kc2) or norm)
    assert (kc.float() - kc2.float()).abs().max() <= 2**-7 * kc.float().abs().max()
    assert got[0].shape == (b, s, hq, 128) and got[0].dtype == (want[0].dtype if quant else q.dtype)
    # Llama, both launches in the same key tiles: the RoPE kernel's roundings, the token form's splits and sums
    if not norm and _same_key_tiles(q.device, b * 8, hq // 8 * s, kc.shape[2]):
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    widen = (lambda t: t.repeat_interleave(128, -1)) if quant else (lambda t: t)  # noqa: E731
    assert rel_l2(got[0].float() * widen(got[1]), want[0].float() * widen(want[1])) <= 1e-2


def test_rope_decode_attention_in_cuda_graph_replays():
    from attention_cases import rope_inputs

    q, wq, k, wk, eps, cos, sin, v, pos, kc, vc = rope_inputs(8, 32, 8, 576, 128, [511] * 8, True, "cuda")
    def call():
        return torch.ops.fp8_fusion.rope_decode_attention(q, wq, k, wk, eps, cos, sin, v, pos, kc, vc, pos.view(-1),
                                                          128**-0.5, 128)  # fmt: skip

    with backends.use_backend("triton"):
        want = call()  # eager first: the merge counters are allocated outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(out[1], want[1])


@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("b", [1, 8, 32])
def test_visible_splits_on_a_long_cache(monkeypatch, norm, b):
    # decode_attention.SPLIT_VISIBLE: 4096 slots, positions 500 .. 500 - 7 (b - 1): the upto op against the
    # reference, the RoPE launch against the RoPE-cache op then the upto op (both on the visible splits; their caches
    # the pair's, as above), and one call under a CUDA graph replayed as its eager call
    from attention_cases import rope_inputs

    monkeypatch.setattr(kernel, "SPLIT_VISIBLE", True)
    positions = [500 - 7 * i for i in range(b)]
    q, k, v, keep, scale = inputs(b, 8, 4, 4096, 128, positions, "cuda")
    last = torch.tensor(positions, device="cuda")
    with backends.use_backend("triton"):
        assert rel_l2(UPTO(q, k, v, last, scale), ref.decode_attention(q, k, v, keep, scale)) <= \
            tolerances.ATTENTION_REL_L2  # fmt: skip
        args = rope_inputs(b, 32, 8, 4096, 128, positions, norm, "cuda")
        qr, wq, kr, wk, eps, cos, sin, vr, pos, kc, vc = args
        kc2, vc2 = kc.clone(), vc.clone()
        q4 = _rope_cache_op(args).reshape(b, 8, 4, 128)
        want = torch.ops.fp8_fusion.decode_attention_upto_quant(q4, kc, vc, last, 128**-0.5, 128)

        def call():
            return torch.ops.fp8_fusion.rope_decode_attention(qr, wq, kr, wk, eps, cos, sin, vr, pos, kc2, vc2, last,
                                                              128**-0.5, 128)  # fmt: skip

        got = call()  # eager first: the merge counters are allocated outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(vc, vc2) and (kc.float() - kc2.float()).abs().max() <= 2**-7 * kc.float().abs().max()
    assert rel_l2(got[0].float() * got[1], want[0].float() * want[1]) <= 1e-2
    assert torch.equal(replayed[0].view(torch.uint8), got[0].view(torch.uint8)) and torch.equal(replayed[1], got[1])


@pytest.mark.parametrize("norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("b, hq", [(1, 32), (8, 32), (1, 64), (8, 64), (64, 32)])
def test_the_merge_on_the_real_rows_changes_no_bit(monkeypatch, norm, b, hq):
    # MERGE_R (the splits' merge on the real rows rounded up, at least a row a warp) against the merge on the MMA's
    # whole tile, at the model shapes and TABLE's configs: the output bits, the scales and the caches
    from attention_cases import rope_inputs

    positions = [min(575, 500 + 9 * i) for i in range(b)]
    args = rope_inputs(b, hq, 8, 576, 128, positions, norm, "cuda")
    last = torch.tensor(positions, device="cuda")
    real, whole, runs = kernel._decode_attention_kernel, [False], []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                return real[grid](*a, **{**kw, "MERGE_R": kw["BLOCK_R"] if whole[0] else kw["MERGE_R"]})

            return launch

    monkeypatch.setattr(kernel, "_decode_attention_kernel", Spy())
    for whole[0] in (False, True):
        a = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
        o, s = torch.ops.fp8_fusion.rope_decode_attention(*a, last, 128**-0.5, 128)
        runs.append((o.view(torch.uint8), s, a[9], a[10]))
    for first, other in zip(*runs):
        assert torch.equal(first, other)
