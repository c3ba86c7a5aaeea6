"""``rms_norm_rope``: Qwen3's per-head q / k norms and their RoPE, both tensors in one launch.

CPU: the Triton kernel under ``TRITON_INTERPRET=1`` (set by ``tests/conftest.py``) against ``reference.rms_norm_rope``
and against the engine model's own eager code, on q / k read in place from a fused qkv output (strided views),
cos / sin per batch row or shared; zeros and NaN rows; input errors; the fake under ``torch.compile``.
"""

from __future__ import annotations

import pytest
import tolerances
import torch

from fp8_fusion_pass.kernels import backends, ops  # noqa: F401  (ops registers torch.ops.fp8_fusion)
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import rms_norm_rope as rnr
from fp8_fusion_pass.models.engine import _rope

OP = torch.ops.fp8_fusion.rms_norm_rope
BF16 = torch.bfloat16
EPS = 1e-6


def _inputs(b, s, hq, hk, d, shared_tables=False, seed=0):
    """q, k as views of one [B, S, (Hq + 2 Hk) D] qkv output (as the engine splits it), weights, cos / sin."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(b, s, (hq + 2 * hk) * d, generator=g) * 3).to(BF16)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    wq, wk = ((torch.rand(d, generator=g) + 0.5).to(BF16) for _ in range(2))
    # positions from 5 on: at position 0 sin is 0 and RoPE the identity, which would hide a rotation bug
    pos = 5 + torch.arange(s)[None] + (torch.arange(1 if shared_tables else b) * 37)[:, None]
    freqs = pos[..., None].float() / (1e6 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([freqs, freqs], -1)
    return q, wq, k, wk, emb.cos().to(BF16), emb.sin().to(BF16)


def _triton(*args):
    with backends.use_backend("triton"):
        return OP(*args)


@pytest.mark.parametrize("b, s, hq, hk, d, shared", [
    (1, 1, 32, 8, 128, False),  # Qwen3-8B decode at batch 1: 40 rows, 10 programs
    (3, 2, 4, 2, 128, False),  # 36 rows: the last program's tail rows are masked
    (2, 5, 3, 1, 64, True),  # cos / sin [1, S, D] for every batch row
    (1, 2, 2, 2, 256, False),
])  # fmt: skip
def test_kernel_matches_reference_and_the_models_eager_code(b, s, hq, hk, d, shared):
    q, wq, k, wk, cos, sin = _inputs(b, s, hq, hk, d, shared)
    got = _triton(q, wq, k, wk, EPS, cos, sin)
    want = ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin)
    for g, w, heads in zip(got, want, (hq, hk)):
        assert g.shape == (b, heads, s, d) and g.is_contiguous() and g.dtype == BF16
        # the same steps and roundings; only the sum of squares' order may differ (an ulp, rarely)
        diff = (g.float() - w.float()).abs()
        assert (diff > 0).float().mean() <= tolerances.ROPE_MAX_DIFF_FRACTION
        assert torch.all(diff <= w.float().abs() * tolerances.ROPE_OUT_REL_TOL + 1e-30)
    cos_b, sin_b = cos.expand(b, -1, -1), sin.expand(b, -1, -1)
    engine_q = _rope(ref.rms_norm(q, wq, EPS).transpose(1, 2), cos_b, sin_b)  # engine.Attention's own steps
    assert torch.equal(engine_q.contiguous(), want[0])


def test_tables_and_activations_strided_in_their_last_dim():
    # transformers' rotary embedding builds the tables from a transposed matmul (freqs = (inv_freq @ positions)
    # .transpose(1, 2), then cat, cos / sin). Eager on the CPU makes them contiguous again, but on the H200 Inductor
    # handed HF's cos to the op as strides (S * D, 1, S), and the op's check refused them (a LoweringException at
    # compile time). The kernel reads any table strides.
    q, wq, k, wk, cos, sin = _inputs(2, 3, 4, 2, 64)
    cos_t, sin_t = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (cos, sin))  # same values, D-strided
    assert cos_t.stride() == (3 * 64, 1, 3) and torch.equal(cos_t, cos)
    want = ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin)
    assert all(torch.equal(g, w) for g, w in zip(_triton(q, wq, k, wk, EPS, cos_t, sin_t), want))
    # q / k strided in D too (for the same reason: the op's fake must accept whatever layout Inductor passes)
    q_t, k_t = (x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in (q, k))
    assert q_t.stride(-1) == 4 and k_t.stride(-1) == 2
    assert all(torch.equal(g, w) for g, w in zip(_triton(q_t, wq, k_t, wk, EPS, cos_t, sin_t), want))


def test_zero_and_nan_heads_stay_in_their_rows():
    q, wq, k, wk, cos, sin = _inputs(1, 2, 4, 2, 128)
    q, k = q.clone(), k.clone()
    q[0, 0, 1] = 0.0  # a zero head: rstd = 1 / sqrt(eps), output zeros
    k[0, 1, 0, 5] = float("nan")  # one NaN: that head's row only
    got = _triton(q, wq, k, wk, EPS, cos, sin)
    want = ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin)
    assert torch.equal(got[0][0, 1, 0], torch.zeros(128, dtype=BF16))
    assert got[1][0, 0, 1].isnan().all() and not got[1][0, 0, 0].isnan().any() and not got[1][0, 1].isnan().any()
    assert torch.equal(got[0].isnan(), want[0].isnan()) and torch.equal(got[1].isnan(), want[1].isnan())


def test_tracing_uses_the_fake_and_compiles():
    q, wq, k, wk, cos, sin = _inputs(2, 1, 4, 2, 64)

    def f(qkv_q, qkv_k):
        return OP(qkv_q, wq, qkv_k, wk, EPS, cos, sin)

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    want = ref.rms_norm_rope(q, wq, k, wk, EPS, cos, sin)
    assert all(torch.equal(o, w) for o, w in zip(out, want))  # the reference backend runs on the CPU


@pytest.mark.parametrize("change, error, match", [
    ("k_dtype", ValueError, "k must be"),
    ("three_dims", ValueError, r"q must be \[B, S, H, D\]"),
    ("cos_shape", ValueError, "cos must be"),
    ("sin_dtype", ValueError, "sin must be"),
    ("odd_head", ValueError, "must be even"),
    ("wq_size", ValueError, "w must be a 1-D tensor"),
    ("q_fp8", TypeError, "q must be bf16"),
])  # fmt: skip
def test_bad_inputs_raise_clear_errors(change, error, match):
    q, wq, k, wk, cos, sin = _inputs(1, 2, 4, 2, 64)
    if change == "k_dtype":
        k = k.float()
    elif change == "three_dims":
        q = q.reshape(1, 2, -1)
    elif change == "cos_shape":
        cos = cos[:, :1]
    elif change == "sin_dtype":
        sin = sin.float()
    elif change == "odd_head":
        q, k, wq, wk, cos, sin = q[..., :63], k[..., :63], wq[:63], wk[:63], cos[..., :63], sin[..., :63]
    elif change == "wq_size":
        wq = wq[:32]
    elif change == "q_fp8":
        q = q.to(torch.float8_e4m3fn)
    with pytest.raises(error, match=match):
        OP(q, wq, k, wk, EPS, cos, sin)


def test_head_size_the_kernel_cannot_take_is_named():
    # 96 = even, so the op and the reference take it; the kernel wants one power-of-two tile per row
    q, wq, k, wk, cos, sin = _inputs(1, 1, 2, 1, 96)
    assert "power of two" in rnr.unsupported(96) and rnr.unsupported(128) is None
    with pytest.raises(ValueError, match="power of two"):
        _triton(q, wq, k, wk, EPS, cos, sin)
    out = OP(q, wq, k, wk, EPS, cos, sin)  # the reference backend (the CPU's automatic choice)
    assert out[0].shape == (1, 2, 1, 96)
