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
