"""On a CUDA GPU: ``rms_norm_rope`` (Qwen3's q / k norms and RoPE in one launch) at the model shapes against
``reference.rms_norm_rope`` run on the same GPU, q / k read in place from a qkv GEMM output, and replayed in a
CUDA graph. ``python -m pytest tests/kernels/test_rms_norm_rope_gpu.py -m gpu -q``.
"""

from __future__ import annotations

import pytest
import tolerances
import torch

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.kernels import reference as ref

pytestmark = pytest.mark.gpu
OP = torch.ops.fp8_fusion.rms_norm_rope
EPS = 1e-6


def _inputs(b, s, hq, hk, d=128):
    g = torch.Generator().manual_seed(0)
    qkv = (torch.randn(b, s, (hq + 2 * hk) * d, generator=g) * 3).to("cuda", torch.bfloat16)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    wq, wk = ((torch.rand(d, generator=g) + 0.5).to("cuda", torch.bfloat16) for _ in range(2))
    pos = 500 + torch.arange(s)[None] + torch.arange(b)[:, None]
    freqs = pos[..., None].float() / (1e6 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([freqs, freqs], -1)
    return q, wq, k, wk, emb.cos().to("cuda", torch.bfloat16), emb.sin().to("cuda", torch.bfloat16)


@pytest.mark.parametrize("b, s", [(1, 1), (8, 1), (64, 1), (1, 2048)])  # decode batches and a prefill
@pytest.mark.parametrize("hq, hk", [(32, 8), (64, 8), (16, 8)])  # Qwen3-8B, Qwen3-32B, Qwen3-0.6B
def test_matches_reference_at_model_shapes(b, s, hq, hk):
    q, wq, k, wk, cos, sin = _inputs(b, s, hq, hk)
    with backends.use_backend("triton"):
        got = OP(q, wq, k, wk, EPS, cos, sin)
    want = ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin)
    for g, w, x, wx in zip(got, want, (q, k), (wq, wk)):
        diff = (g.float() - w.float()).abs()
        assert g.shape == w.shape and g.is_contiguous()
        # only rstd may differ; its flips move outputs by a share of the RoPE products' sizes (tolerances.py)
        assert (diff > 0).float().mean() <= tolerances.ROPE_MAX_DIFF_FRACTION, (diff > 0).float().mean()
        assert torch.all(diff <= _product_sizes(x, wx, cos, sin) * tolerances.ROPE_PRODUCTS_REL_TOL + 1e-30)


def _product_sizes(x, w, cos, sin):
    """``|y * cos| + |rotate_half(y) * sin|`` per output, y the reference's normed x: [B, H, S, D] fp32."""
    y = ref.rms_norm(x, w, EPS).transpose(1, 2).float()
    d = y.shape[-1] // 2
    y_rot = torch.cat((y[..., d:], y[..., :d]), dim=-1)
    return y.abs() * cos.float().abs().unsqueeze(1) + y_rot.abs() * sin.float().abs().unsqueeze(1)


def test_in_cuda_graph_replays():
    q, wq, k, wk, cos, sin = _inputs(8, 1, 32, 8)
    with backends.use_backend("triton"):
        want = OP(q, wq, k, wk, EPS, cos, sin)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = OP(q, wq, k, wk, EPS, cos, sin)
    bad = 0
    for _ in range(20):
        out[0].zero_()
        out[1].zero_()
        graph.replay()
        torch.cuda.synchronize()
        bad += not (torch.equal(out[0], want[0]) and torch.equal(out[1], want[1]))
    assert bad == 0
