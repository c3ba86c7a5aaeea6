"""``blockscale_mm`` on the Triton backend: choose, per (arch, M bucket, N, K), the fastest *correct* GEMM.

Paths (all compute ``reference.blockscale_mm``: fp32 accumulation, per-128-K promotion):
- ``cublas``: cuBLASLt block-wise through ``torch._scaled_mm`` / ``F.scaled_mm`` (``kernels/cublas.py``);
  Hopper SM90 only, with its layout rules (pad M to 4, outer-dim-major activation scales, and never v1
  when (K/128) % 4 != 0: that combination is silently wrong).
- ``tiled``: the Triton tiled GEMM (compute-bound shapes, and everything cuBLAS refuses).
- ``small_m``: the Triton swap-AB split-K GEMM for decode-sized M (``_small_m_kernels.py``: its variants, and
  each tuning idea's prediction and measurement), where the GEMM is bound by weight bytes (N*K fp8 bytes, half
  of bf16): cuBLAS block-wise took 13.3 us at M=16, N=K=4096 on the H200 against ~3.9 us of weight bytes at
  copy bandwidth and 9.1 us for a bf16 GEMM (issue 7).
- ``dequant``: the reference (dequantize, fp32 matmul); only when no kernel can run (an activation group
  below 32 values, or a device without fp8 Triton).

Choice: ``TABLE`` first (measured), else ``default_choice`` (reasoned); a choice whose path cannot run the
shape correctly (``unsupported``) falls back along cublas -> small_m / tiled -> dequant, never to a wrong one.

How ``TABLE`` is measured: ``python benchmarks/gemm.py`` on one H200 (torch 2.11, Triton 3.6) times bf16
``torch.mm``, cuBLAS block-wise, Triton tiled and Triton small-M (a sweep of BLOCK_N x SPLIT_K x warps x
stages x split-K sum x K unroll, and a GEMV for M <= 4) for the Qwen3-8B / Llama-3.1-8B / Qwen3-32B
projection shapes at M in ``M_BUCKETS``: medians of CUDA-graph replays, weights rotated through more than the 50 MB L2. Every candidate is first checked against
the fp32 oracle (and, for the in-launch split-K sum, for bitwise repeatability), so a TABLE row names a config
validated at that shape. It prints the fastest path per (M bucket, N, K) in this table's syntax; paste those
rows below with the date and the GPU.
Until then the table is empty and ``default_choice`` decides by reasoning.
"""

from __future__ import annotations

import dataclasses

import torch

from ... import arch as _arch
from .. import checks, cublas
from .. import reference as _ref
from ._blockscale_kernels import MIN_BLOCK_K, TiledConfig, promotion_block, tiled_mm, triton_unsupported
from ._small_m_kernels import FMA_MAX_M, SmallMConfig, small_m_mm

PATHS = ("cublas", "tiled", "small_m", "dequant")
# A row count uses the first bucket >= it; anything above 2048 uses the 8192 row.
M_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 2048, 8192)
# Up to here the GEMM is weight-bandwidth bound on an H200: 64 rows x 2 FLOP per weight byte is far below
# its ~1979 TFLOPS / 4.8 TB/s = 412 FLOP/byte ridge, so the small-M kernel's wasted MMA work is free.
SMALL_M_MAX = 64


@dataclasses.dataclass(frozen=True)
class Choice:
    path: str
    config: TiledConfig | SmallMConfig | None = None  # None: the kernel's default for the shape


# (arch name, M bucket, N, K) -> Choice, from ``benchmarks/gemm.py`` (see the module docstring).
# fmt: off
TABLE: dict[tuple[str, int, int, int], Choice] = {
}
# fmt: on


def m_bucket(m: int) -> int:
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def _triton_unsupported(a: _arch.Arch, device_type: str, group: int) -> str | None:
    reason = triton_unsupported(a, device_type)
    if reason is None and promotion_block(group) < MIN_BLOCK_K:
        reason = f"activation group {group} gives a K tile of {promotion_block(group)} < {MIN_BLOCK_K} (8-bit MMA k)"
    return reason


def unsupported(
    path: str, a: _arch.Arch, device_type: str, fp8: torch.dtype, n: int, k: int, group: int, out_dtype: torch.dtype
) -> str | None:
    """Why ``path`` cannot compute this GEMM correctly here (None when it can). Pure: no tensors, no device."""
    if path == "cublas":
        return cublas.blockwise_unsupported(a, device_type, fp8, n, k, group, out_dtype)
    if path in ("tiled", "small_m"):
        return _triton_unsupported(a, device_type, group)
    if path == "dequant":
        return None
    return f"unknown path {path!r}; known: {', '.join(PATHS)}"


def default_choice(a: _arch.Arch, m: int, n: int, k: int) -> Choice:
    """Reasoned, not measured: small M is weight-bandwidth bound (``SMALL_M_MAX``), where cuBLAS block-wise was
    3.4x off the roofline; above it cuBLAS on Hopper (best or tied at M >= 1024 in vLLM #49932's H20 numbers,
    ``kernels.md`` §5.3), else the Triton tiled GEMM."""
    if m <= SMALL_M_MAX:
        return Choice("small_m")
    return Choice("cublas") if a.blockwise_scaled_mm else Choice("tiled")


def _config_unsupported(choice: Choice, m: int) -> str | None:
    if isinstance(choice.config, SmallMConfig) and choice.config.fma and m > FMA_MAX_M:
        return f"the GEMV config takes M <= {FMA_MAX_M}"
    return None


def plan(
    a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, n: int, k: int, group: int, out_dtype: torch.dtype
) -> Choice:
    """The path for this GEMM: the table's, else the default, else the first legal fallback. Pure."""
    wanted = TABLE.get((a.name, m_bucket(m), n, k)) or default_choice(a, m, n, k)
    fallbacks = [wanted, Choice("small_m" if m <= SMALL_M_MAX else "tiled"), Choice("tiled"), Choice("dequant")]
    for choice in fallbacks:
        if (
            _config_unsupported(choice, m) is None
            and unsupported(choice.path, a, device_type, fp8, n, k, group, out_dtype) is None
        ):
            return choice
    raise AssertionError("unreachable: dequant is always supported")


def _shape_facts(q, x_scale, w_q):
    m, k = q.shape
    return m, w_q.shape[0], k, k // x_scale.shape[1]


def plan_for(q, x_scale, w_q, w_scale, out_dtype) -> Choice:
    """``plan`` for concrete tensors."""
    m, n, k, group = _shape_facts(q, x_scale, w_q)
    return plan(_arch.arch_of(q.device), q.device.type, q.dtype, m, n, k, group, out_dtype)


def run(path: str, q, x_scale, w_q, w_scale, out_dtype, config=None, variant: str | None = None) -> torch.Tensor:
    """Run one path (tests and ``benchmarks/gemm.py``). Raises ``ValueError`` when it cannot run the shape
    correctly, instead of computing a wrong answer. ``variant`` ("v1" / "v2") forces a cuBLAS API."""
    checks.blockscale_mm_args("blockscale_mm", q, x_scale, w_q, w_scale, out_dtype)
    return _execute(path, q, x_scale, w_q, w_scale, out_dtype, config, variant)


def _execute(path, q, x_scale, w_q, w_scale, out_dtype, config=None, variant=None) -> torch.Tensor:
    if path == "cublas":
        return cublas.blockwise_mm(q, x_scale, w_q, w_scale, out_dtype, variant)  # re-checks its own rules
    m, n, k, group = _shape_facts(q, x_scale, w_q)
    reason = unsupported(path, _arch.arch_of(q.device), q.device.type, q.dtype, n, k, group, out_dtype)
    if reason is not None:
        raise ValueError(f"blockscale_mm: path {path!r} cannot run M={m} N={n} K={k} group={group}: {reason}")
    if path == "tiled":
        return tiled_mm(q, x_scale, w_q, w_scale, out_dtype, config)
    if path == "small_m":
        return small_m_mm(q, x_scale, w_q, w_scale, out_dtype, config)
    return _ref.blockscale_mm(q, x_scale, w_q, w_scale, out_dtype)


def blockscale_mm(q, x_scale, w_q, w_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """``y [M, N] = dequant(q, x_scale) @ dequant(w_q, w_scale)^T`` (signature of ``reference_backend``)."""
    checks.blockscale_mm_args("blockscale_mm", q, x_scale, w_q, w_scale, out_dtype)
    choice = plan_for(q, x_scale, w_q, w_scale, out_dtype)
    return _execute(choice.path, q, x_scale, w_q, w_scale, out_dtype, choice.config)
