"""Fused RMSNorm (+ residual add) -> 1 x G fp8 group quant: ``_rms_norm_kernel`` with ``QUANT`` (``rms_norm.py``).

The normalised row never goes to HBM: the kernel reads x (and the residual) once and writes q, the scales and
(add variant) residual_out, the minimum traffic: 2K + K + 4K/G bytes per bf16 row (+ 4K with a residual).
"""

from __future__ import annotations

import torch

from .rms_norm import launch


def rms_norm_group_quant(x: torch.Tensor, w: torch.Tensor, eps: float, group_size: int = 128):
    """Returns ``(q [..., K] fp8, scale [..., K/group_size] fp32)``, both contiguous."""
    (q, scale), _ = launch(x, w, eps, None, group_size)
    return q, scale


def add_rms_norm_group_quant(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, group_size: int = 128
):
    """Returns ``(q, scale, residual_out)`` with ``residual_out = residual + x`` rounded to x.dtype."""
    (q, scale), residual_out = launch(x, w, eps, residual, group_size)
    return q, scale, residual_out
