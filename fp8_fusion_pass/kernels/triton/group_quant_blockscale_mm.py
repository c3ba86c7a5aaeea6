"""``group_quant_blockscale_mm`` on the Triton backend: the GEMV that quantizes its own bf16 input, where that
measured faster than the group-quant launch and the GEMM it replaces; else exactly those two.

Where it matters: the attention output feeding o_proj is the one activation quant at decode that no producer can
take in (attention is Inductor's or cuDNN's kernel, not ours), so it stays a launch of its own, ~1.25 us in a CUDA
graph on the H200 before a ~7 us GEMV (``benchmarks/profile_step.py``, Llama-3.1-8B, batch 1). At M <= 4 each GEMV
program reads the activation row(s) anyway, a few KB from L2, so it can quantize them itself
(``_gemv_kernels.gemv_mm_bf16``: ``group_quant_tile``, the group-quant kernel's steps, chunk by chunk).

Choice per (arch, M bucket, N, K): the GEMV config in ``TABLE`` where the fused launch measured faster
(``benchmarks/quant_gemm.py --sweep``). It is bit for bit ``group_quant`` + ``gemv_mm`` at that config; the unfused
GEMM runs its own TABLE's config, whose sums may be ordered differently (one bf16 ulp), so the rewrite is not
bit-exact against the unfused graph. Anything else (no row, None, M > 4, a group other than 128) runs the pair:
``group_quant`` then ``blockscale_mm``. At ``blockscale_mm``'s own GEMV config the fused launch was slower at
every measured shape (the quant in every program costs more than the launch): a config of its own, with more
rows per program (the activation quantized half as often), is what won on the 8B o_proj, until the plain GEMV's
wider configs (``blockscale_mm.TABLE``, GEMV_WIDE) made the pair as fast: no H200 row wins now.
"""

from __future__ import annotations

import torch

from ... import arch as _arch
from . import blockscale_mm as _bm
from ._blockscale_kernels import SCALE_BLOCK
from ._gemv_kernels import GEMV_MAX_M, GemvConfig, gemv_mm_bf16
from .group_quant import group_quant

# (arch name, M bucket, N, K) -> the fused GEMV's config where it beat group_quant + blockscale_mm by more than 2%,
# None where it did not.
# fmt: off
TABLE: dict[tuple[str, int, int, int], GemvConfig | None] = {
    # First measured 2026-12-01 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0) by
    # `python benchmarks/quant_gemm.py --ms 1 --sweep` on commit e0e5a22 (24 GEMV configs, each bit for bit the
    # pair at its config). Microseconds, CUDA-graph medians; "pair" = group_quant + blockscale_mm (its GEMV).
    # Re-measured 2026-12-04 (same GPU and versions, copy 4.28 TB/s) by `python benchmarks/quant_gemm.py --ms 1
    # --sweep` on the tree of commit 8b1d52a (48 configs, 2 warps and 2048-value chunks too), after blockscale_mm's
    # M = 1 rows took the wider GEMV configs (its TABLE, GEMV_WIDE): the pair got faster and no fused config beats
    # it by the margin any more. Each row: the run of 8b1d52a, then the run of e0e5a22.
    # o_proj of Qwen3-8B and Llama-3.1-8B: fused 8.19 (8 / 1024, the row until now) vs pair 8.28, a tie (1.1%);
    # e0e5a22: fused 8.19 vs pair 8.93, taken then
    ('sm90', 1, 4096, 4096): None,
    # Qwen3-32B o_proj: fused 19.67 (8 / 512) vs pair 15.67; e0e5a22: 19.27 (8 / 512 / 3 stages) vs 16.56
    ('sm90', 1, 5120, 8192): None,
    # Qwen3-8B qkv (its quant is normally the norm's): fused 11.71 (8 / 512 / 3 stages) vs pair 11.17; e0e5a22:
    # 11.66 (16 / 512 / 3 stages) vs 11.64
    ('sm90', 1, 6144, 4096): None,
    # Llama-3.1-8B down: fused 22.83 (8 / 1024) vs pair 19.93; e0e5a22: 22.52 (8 / 1024 / 3 stages) vs 21.42
    ('sm90', 1, 4096, 14336): None,
}
# fmt: on


def fused_config(a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, n: int, k: int, group_size: int,
                 out_dtype: torch.dtype) -> GemvConfig | None:
    """The GEMV config the fused launch runs for this GEMM, or None when the unfused pair runs. Pure."""
    if m > GEMV_MAX_M or group_size != SCALE_BLOCK:
        return None
    if _bm.unsupported("gemv", a, device_type, fp8, n, k, group_size, out_dtype) is not None:
        return None  # no fp8 Triton here (the pair then runs on whatever can)
    return TABLE.get((a.name, _bm.m_bucket(m), n, k))


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
