"""Inputs for the decode-attention kernel tests (CPU interpreter and GPU): q rows grouped per kv head, a static
cache, and a ``key_pos <= position`` mask per batch row, as the engine form builds them."""

from __future__ import annotations

import torch


def inputs(b, hkv, r, t, d, positions, device="cpu", dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hkv, r, d, generator=g).to(device, dtype)
    k = torch.randn(b, hkv, t, d, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, t, d, generator=g).to(device, dtype)
    keep = torch.arange(t) <= torch.tensor(positions).view(b, 1, 1, 1)  # [B, 1, 1, T]
    return q, k, v, keep.to(device), d**-0.5


def rel_l2(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def rope_inputs(b, hq, hk, t, d, positions, norm: bool, device="cpu", dtype=torch.bfloat16, seed=0):
    """One decode token as the engine's qkv GEMM leaves it (q / k / v strided views of one [B, 1, (Hq + 2 Hk) D]
    output), Qwen3's norm weights when ``norm``, a RoPE table per batch row, positions [B, 1] and two caches:
    ``(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)``."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, 1, (hq + 2 * hk) * d, generator=g).to(device, dtype)
    q = qkv[..., : hq * d].view(b, 1, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, 1, hk, d)
    v = qkv[..., (hq + hk) * d :].view(b, 1, hk, d).transpose(1, 2)
    wq, wk = ((torch.randn(d, generator=g).to(device, dtype) for _ in range(2)) if norm else (None, None))
    angle = (torch.randn(b, 1, d // 2, generator=g) * 3).repeat(1, 1, 2)
    cos, sin = angle.cos().to(device, dtype), angle.sin().to(device, dtype)
    k_cache = torch.randn(b, hk, t, d, generator=g).to(device, dtype)
    v_cache = torch.randn(b, hk, t, d, generator=g).to(device, dtype)
    for i, p in enumerate(positions):  # the new token's slots hold far-off values: reading one before its write shows
        k_cache[i, :, p], v_cache[i, :, p] = 50.0, 1000.0
    pos = torch.tensor(positions, device=device).view(b, 1)
    return q, wq, k, wk, 1e-6, cos, sin, v, pos, k_cache, v_cache


def token_inputs(b, hkv, g, s, t, d, device="cpu", dtype=torch.bfloat16, seed=0):
    """A step of ``s`` tokens per row as the engine's RoPE op leaves q: ``[B, Hq, S, D]``, a transposed view of
    [B, S, Hq, D]; two caches; ``last [B, S]``, consecutive positions from a random start per row, the first
    token of row 1 seeing nothing (-1) where there is a row 1. ``(q, k, v, last, scale)``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, hkv * g, d, generator=gen).to(device, dtype).transpose(1, 2)
    k = torch.randn(b, hkv, t, d, generator=gen).to(device, dtype)
    v = torch.randn(b, hkv, t, d, generator=gen).to(device, dtype)
    last = torch.randint(0, t - s + 1, (b, 1), generator=gen) + torch.arange(s)
    if b > 1:
        last[1, 0] = -1
    return q, k, v, last.to(device), d**-0.5


def tokens_as_masked_pair(q, k, v, last, scale, group_size, attend, quant):
    """What the graph computed before ``decode_attention_tokens_quant``: q copied into grouped rows, the mask of
    ``last`` per token for the G heads, ``attend(q, k, v, keep, scale)`` (the masked op), the output copied back
    to [B, S, Hq, D] and ``quant(x, group_size)``."""
    b, hq, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    keep = torch.arange(t, device=q.device) <= last.unsqueeze(-1)
    keep = keep.unsqueeze(1).expand(b, hq // hkv, s, t).reshape(b, 1, hq // hkv * s, t)
    o = attend(q.reshape(b, hkv, hq // hkv * s, d), k, v, keep, scale)
    return quant(o.reshape(b, hq, s, d).transpose(1, 2).contiguous(), group_size)


def rope_token_inputs(b, hq, hk, s, t, d, norm: bool, device="cpu", dtype=torch.bfloat16, seed=0):
    """A step of ``s`` tokens as the engine's qkv GEMM leaves it (q / k / v strided views of one [B, S, (Hq + 2 Hk) D]
    output), Qwen3's norm weights when ``norm``, a RoPE table row per (batch row, token), positions [B, S]
    consecutive from a random start and two caches whose new slots hold far-off values (a read of one before its
    write shows): ``(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)``; each token sees up to its own
    position (``last = positions``)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, generator=g).to(device, dtype)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    v = qkv[..., (hq + hk) * d :].view(b, s, hk, d).transpose(1, 2)
    wq, wk = ((torch.randn(d, generator=g).to(device, dtype) for _ in range(2)) if norm else (None, None))
    angle = (torch.randn(b, s, d // 2, generator=g) * 3).repeat(1, 1, 2)
    cos, sin = angle.cos().to(device, dtype), angle.sin().to(device, dtype)
    k_cache = torch.randn(b, hk, t, d, generator=g).to(device, dtype)
    v_cache = torch.randn(b, hk, t, d, generator=g).to(device, dtype)
    pos = torch.randint(0, t - s + 1, (b, 1), generator=g) + torch.arange(s)
    for i in range(b):
        k_cache[i, :, pos[i]], v_cache[i, :, pos[i]] = 50.0, 1000.0
    return q, wq, k, wk, 1e-6, cos, sin, v, pos.to(device), k_cache, v_cache
