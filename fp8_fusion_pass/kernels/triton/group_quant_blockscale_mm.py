"""``group_quant_blockscale_mm`` on the Triton backend: the GEMV that quantizes its own bf16 input, where that
measured faster than the group-quant launch and the GEMM it replaces; else exactly those two.

Where it matters: the attention output feeding o_proj is the one activation quant at decode that no producer can
take in (attention is Inductor's or cuDNN's kernel, not ours), so it stays a launch of its own, ~1.25 us in a CUDA
graph on the H200 before a ~7 us GEMV (``benchmarks/profile_step.py``, Llama-3.1-8B, batch 1). At M <= 4 each GEMV
program reads the activation row(s) anyway, a few KB from L2, so it can quantize them itself
(``_gemv_kernels.gemv_mm_bf16``: ``group_quant_tile``, the group-quant kernel's steps, chunk by chunk).

Choice per (arch, M bucket, N, K): ``TABLE`` says whether the fused launch was measured faster; the GEMV config is
the one ``blockscale_mm`` runs for that GEMM (its own TABLE's GEMV row), so the fused launch is bit for bit the
unfused pair. Anything else (no row, False, M > 4, a group other than 128, a plan that is not the GEMV) runs the
pair: ``group_quant`` then ``blockscale_mm``.
"""

from __future__ import annotations

import torch

from ... import arch as _arch
from . import blockscale_mm as _bm
from ._blockscale_kernels import SCALE_BLOCK
from ._gemv_kernels import GEMV_MAX_M, GemvConfig, gemv_mm_bf16
from .group_quant import group_quant

OP = "group_quant_blockscale_mm"

# (arch name, M bucket, N, K) -> True where the fused GEMV beat group_quant + blockscale_mm (measured by
# ``benchmarks/quant_gemm.py``), False where it did not.
# fmt: off
TABLE: dict[tuple[str, int, int, int], bool] = {
}
# fmt: on


def fused_config(a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, n: int, k: int, group_size: int,
                 out_dtype: torch.dtype) -> GemvConfig | None:
    """The GEMV config the fused launch runs for this GEMM, or None when the unfused pair runs. Pure."""
    if m > GEMV_MAX_M or group_size != SCALE_BLOCK or not TABLE.get((a.name, _bm.m_bucket(m), n, k)):
        return None
    choice = _bm.plan(a, device_type, fp8, m, n, k, group_size, out_dtype)
    if choice.path != "gemv":
        return None
    return choice.config or GemvConfig()


def measured(a: _arch.Arch, m: int, n: int, k: int) -> bool:
    """Has ``TABLE`` a row for this GEMM: for the report's wording."""
    return (a.name, _bm.m_bucket(m), n, k) in TABLE


def group_quant_blockscale_mm(x, w_q, w_scale, out_dtype: torch.dtype, group_size: int = 128) -> torch.Tensor:
    """``blockscale_mm(*group_quant(x, group_size), w_q, w_scale, out_dtype)``; inputs validated by the op."""
    m, k = x.shape
    config = fused_config(_arch.arch_of(x.device), x.device.type, w_q.dtype, m, w_q.shape[0], k, group_size,
                          out_dtype)  # fmt: skip
    if config is not None:
        return gemv_mm_bf16(x, w_q, w_scale, out_dtype, config)
    q, x_scale = group_quant(x, group_size)
    return _bm.blockscale_mm(q, x_scale, w_q, w_scale, out_dtype)
