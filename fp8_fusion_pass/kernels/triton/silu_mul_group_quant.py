"""Fused ``silu(gate) * up`` -> 1 x G fp8 group quant: ``_silu_and_mul_kernel`` with ``QUANT`` (``silu_and_mul.py``).

One pass: reads x [..., 2I] once and writes q [..., I] and the scales, never the bf16 product (4I + I + 4I/G bytes
per bf16 row, the minimum).
"""

from __future__ import annotations

import torch

from .silu_and_mul import launch


def silu_mul_group_quant(x: torch.Tensor, group_size: int = 128):
    """Returns ``(q [..., I] fp8, scale [..., I/group_size] fp32)``, bit-exact with silu_and_mul -> group_quant."""
    return launch(x, group_size)
