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
