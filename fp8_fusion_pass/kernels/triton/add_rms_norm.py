"""``residual + x`` then RMSNorm, one kernel: ``_rms_norm_kernel`` with ``HAS_RESIDUAL`` (see ``rms_norm.py``)."""

from __future__ import annotations

import torch

from .rms_norm import launch


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    """Returns ``(rms_norm(residual + x), residual + x)``, both contiguous, x.dtype; the sum rounds to x.dtype."""
    y, residual_out = launch(x, w, eps, residual, None)
    return y, residual_out
