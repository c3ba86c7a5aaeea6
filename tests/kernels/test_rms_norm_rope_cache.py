"""``rms_norm_rope_cache``: ``rms_norm_rope`` with the static KV-cache writes in the same launch (and
``qk_rope`` / ``qk_rope_cache``, the same launch without the norms, Llama's).

CPU: the Triton kernel under ``TRITON_INTERPRET=1`` (``tests/conftest.py``) against ``reference.rms_norm_rope_cache``
and against the kernel's own ``rms_norm_rope`` (the same launch without the writes: q and the written k bit for
bit); positions per batch row, shared ([S] as HF's ``cache_position``, [1, S]), int32, negative, out of range;
every other slot untouched; input errors. The GPU twin is ``test_rms_norm_rope_cache_gpu.py``.
"""

from __future__ import annotations

import pytest
import tolerances
import torch

from fp8_fusion_pass.kernels import backends, ops  # noqa: F401  (ops registers torch.ops.fp8_fusion)
from fp8_fusion_pass.kernels import reference as ref

CACHED = torch.ops.fp8_fusion.rms_norm_rope_cache
ROPE = torch.ops.fp8_fusion.rms_norm_rope
QK_CACHED = torch.ops.fp8_fusion.qk_rope_cache
QK_ROPE = torch.ops.fp8_fusion.qk_rope
BF16 = torch.bfloat16
EPS = 1e-6


def cache_inputs(b, s, hq, hk, d, t, device="cpu", seed=0):
    """q, k, v as views of one qkv output (v transposed to [B, Hk, S, D], as the engine and HF pass it), weights,
    cos / sin, and two caches [B, Hk, T, D] filled with values no write produces."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(b, s, (hq + 2 * hk) * d, generator=g) * 3).to(device, BF16)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    v = qkv[..., (hq + hk) * d :].view(b, s, hk, d).transpose(1, 2)
    wq, wk = ((torch.rand(d, generator=g) + 0.5).to(device, BF16) for _ in range(2))
    freqs = (5 + torch.arange(s))[None, :, None].float() / (1e6 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([freqs, freqs], -1)
    caches = [torch.full((b, hk, t, d), fill, dtype=BF16, device=device) for fill in (-7.0, 9.0)]
    return (q, wq, k, wk, EPS, emb.cos().to(device, BF16), emb.sin().to(device, BF16), v), caches


def check_against_reference_and_rope(args, caches, positions, norm=True):
    """The Triton launch against the reference (exact cache contents for v, the reference's k within the rope
    contract) and against the kernel's own rms_norm_rope (q and the written k bit for bit). ``norm=False``: the
    same for qk_rope_cache (``args`` then without weights and eps)."""
    want_caches = [c.clone() for c in caches]
    want_q = (ref.rms_norm_rope_cache if norm else ref.qk_rope_cache)(*args, positions, *want_caches)
    with backends.use_backend("triton"):
        got_q = (CACHED if norm else QK_CACHED)(*args, positions, *caches)
        own_q, own_k = ROPE(*args[:7]) if norm else QK_ROPE(*args[:4])
    assert torch.equal(got_q, own_q)
    k_only = [c.clone() for c in want_caches]
    ref.write_cache(k_only[0], own_k, positions)  # the kernel's k at the reference's slots
    assert torch.equal(caches[0], k_only[0]), "k cache"
    assert torch.equal(caches[1], want_caches[1]), "v cache"
    if norm:  # only rstd may differ from the reference (its bounds are test_rms_norm_rope*.py's, on rms_norm_rope)
        assert (got_q != want_q).float().mean() <= tolerances.ROPE_MAX_DIFF_FRACTION
    else:  # no rstd: every step rounded as eager
        assert torch.equal(got_q, want_q)


@pytest.mark.parametrize("b, s, positions", [
    (2, 1, [[5], [9]]),  # decode: one token per batch row, each at its own position ([B, S], the engine's)
    (3, 2, [[0, 1], [6, 7], [-2, -1]]),  # negative positions count from the end, as indexing does
    (2, 3, [4, 5, 6]),  # [S]: one position per token for every row (HF's cache_position)
    (2, 3, [[1, 3, 5]]),  # [1, S]
])  # fmt: skip
def test_writes_the_slots_and_nothing_else(b, s, positions):
    args, caches = cache_inputs(b, s, 4, 2, 64, t=11)
    check_against_reference_and_rope(args, caches, torch.tensor(positions))


def _no_norm(args):
    q, _, k, _, _, cos, sin, v = args
    return q, k, cos, sin, v


@pytest.mark.parametrize("positions", [[[5], [9]], [4]])
def test_qk_rope_cache_llama(positions):
    # Llama: RoPE without norms; every step rounds as eager, so qk_rope is the reference bit for bit
    args, caches = cache_inputs(2, 1, 4, 2, 64, t=11)
    check_against_reference_and_rope(_no_norm(args), caches, torch.tensor(positions), norm=False)
    q, k, cos, sin, _ = _no_norm(args)
    with backends.use_backend("triton"):
        got = QK_ROPE(q, k, cos, sin)
    assert all(torch.equal(g, w) for g, w in zip(got, ref.qk_rope(q, k, cos, sin)))


def test_int32_positions_and_qwen3_8b_heads():
    args, caches = cache_inputs(3, 1, 32, 8, 128, t=20)
    check_against_reference_and_rope(args, caches, torch.tensor([[19], [0], [7]], dtype=torch.int32))


def test_every_tile_gives_the_same_bits():
    # tile_for picks rows per program and warps by the launch's size (8-row tiles from 2048 rows, H200-measured);
    # a row's arithmetic is the same in every tile, so each candidate, over a row count none of them divides
    # (3 x 1 x (5 + 2 x 3) = 33 rows), must give the same bits, and the masked tail row writes nothing.
    from fp8_fusion_pass.kernels.triton import rms_norm_rope as rnr

    args, caches = cache_inputs(3, 1, 5, 3, 64, t=4)
    positions = torch.tensor([[3], [0], [1]])
    outs = []
    for tile in ((1, 1), (4, 4), (8, 4), (16, 8), (32, 8)):
        cs = [c.clone() for c in caches]
        q = rnr.rms_norm_rope_cache(*args, positions, *cs, tile=tile)
        outs.append((q, *cs, *rnr.qk_rope(*_no_norm(args)[:4], tile=tile)))
    assert all(all(torch.equal(a, b) for a, b in zip(outs[0], o)) for o in outs[1:])
    check_against_reference_and_rope(args, [c.clone() for c in caches], positions)


def test_caches_and_v_strided_in_their_last_dim():
    # the launcher takes contiguous-row loads and stores (UNIT_D) only when every row's D stride is 1; a D-strided
    # v or cache takes the strided path, with the same bits
    args, caches = cache_inputs(2, 2, 4, 2, 64, t=6)
    positions = torch.tensor([[5, 0], [2, 3]])
    v = args[7]
    v_t = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    caches_t = [c.transpose(-1, -2).contiguous().transpose(-1, -2) for c in caches]
    assert v_t.stride(-1) != 1 and caches_t[0].stride(-1) != 1
    check_against_reference_and_rope((*args[:7], v_t), caches_t, positions)
    want = [c.clone() for c in caches]
    with backends.use_backend("triton"):
        CACHED(*args, positions, *want)
    assert all(torch.equal(a, b) for a, b in zip(caches_t, want))


def test_out_of_range_positions_write_nothing():
    # eager indexing raises here; the kernel must not write outside the cache (nor anywhere else)
    args, caches = cache_inputs(2, 1, 4, 2, 64, t=8)
    before = [c.clone() for c in caches]
    with backends.use_backend("triton"):
        CACHED(*args, torch.tensor([[8], [-9]]), *caches)
    assert all(torch.equal(c, c0) for c, c0 in zip(caches, before))
    with pytest.raises(IndexError):
        ref.rms_norm_rope_cache(*args, torch.tensor([[8], [0]]), *before)


@pytest.mark.parametrize("change, match", [
    (lambda a, c, p: (a, [c[0][:, :1], c[1][:, :1]], p), "k_cache must be"),
    (lambda a, c, p: (a, [c[0], c[1][..., :32].contiguous()], p), "v_cache must be"),
    (lambda a, c, p: (a, [c[0], c[1].float()], p), "v_cache must be"),
    (lambda a, c, p: ((*a[:7], a[7][:, :1]), c, p), "v must be"),
    (lambda a, c, p: (a, c, p.float()), "positions must be"),
    (lambda a, c, p: (a, c, p[:, None]), "positions must be"),
])  # fmt: skip
def test_bad_inputs_raise_clear_errors(change, match):
    args, caches = cache_inputs(2, 1, 4, 2, 64, t=8)
    args, caches, positions = change(args, caches, torch.tensor([[1], [2]]))
    for backend in ("triton", "reference"):
        with backends.use_backend(backend), pytest.raises(ValueError, match=match):
            CACHED(*args, positions, *caches)


def test_a_marked_dynamic_batch_equal_to_the_tokens_stays_symbolic():
    """The op's checks under Dynamo with the batch marked dynamic (an engine serving any batch) at batch 2 = 2
    tokens: comparing ``positions [B, S]`` with ``[S]`` item by item compared the symbolic B with S, and that guard
    specialized the batch (ConstraintViolationError; the twelfth long decode soak's finding)."""
    args, caches = cache_inputs(2, 2, 4, 2, 64, t=8)
    q, wq, k, wk, eps, cos, sin, v = (a.clone() if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)
    positions = torch.tensor([[3, 4], [5, 6]])
    for t in (q, k, v, positions, *caches):
        torch._dynamo.mark_dynamic(t, 0)

    def step(q, k, v, positions, k_cache, v_cache):
        return CACHED(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)

    torch._dynamo.reset()
    want = [c.clone() for c in caches]
    want_q = ref.rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, positions, *want)
    got_q = torch.compile(step, backend="eager", fullgraph=True)(q, k, v, positions, *caches)
    assert torch.equal(caches[1], want[1])
    assert (got_q != want_q).float().mean() <= tolerances.ROPE_MAX_DIFF_FRACTION


# ---------------------------------------------------------------- on a CUDA GPU (`pytest -m gpu`)


@pytest.mark.gpu
@pytest.mark.parametrize("b, s", [(1, 1), (8, 1), (64, 1), (1, 2048)])  # decode batches and a prefill
@pytest.mark.parametrize("hq, hk", [(32, 8), (64, 8)])  # Qwen3-8B, Qwen3-32B
def test_gpu_at_model_shapes(b, s, hq, hk):
    positions = (torch.arange(s)[None] + 7 * torch.arange(b)[:, None] + 500).cuda()  # every row its own slots
    args, caches = cache_inputs(b, s, hq, hk, 128, t=int(positions.max()) + 64, device="cuda")
    check_against_reference_and_rope(args, caches, positions)
    if hq == 32:  # Llama-3.1-8B's heads: the same launch without the norms
        check_against_reference_and_rope(_no_norm(args), [c.clone() for c in caches], positions, norm=False)


@pytest.mark.gpu
def test_gpu_in_cuda_graph_replays():
    args, caches = cache_inputs(8, 1, 32, 8, 128, t=64, device="cuda")
    positions = torch.arange(8, device="cuda")[:, None] * 7
    with backends.use_backend("triton"):
        want_q = CACHED(*args, positions, *caches)
        want = [c.clone() for c in caches]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            q = CACHED(*args, positions, *caches)
    rows, at = torch.arange(8)[:, None], positions.cpu()
    bad = 0
    for i in range(20):
        for c in caches:
            c.fill_(float(i))
        q.zero_()
        graph.replay()
        torch.cuda.synchronize()
        expected = [torch.full_like(w, float(i)) for w in want]
        for e, w in zip(expected, want):
            e[rows, :, at] = w[rows, :, at]  # the written slots as the eager launch wrote them, the rest refilled
        bad += not (torch.equal(q, want_q) and all(torch.equal(c, e) for c, e in zip(caches, expected)))
    assert bad == 0
