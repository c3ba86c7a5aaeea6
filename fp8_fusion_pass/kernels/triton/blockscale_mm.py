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
    # Measured 2026-11-29 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0, copy 4.25 TB/s) by
    # `python benchmarks/gemm.py --ms 1,4,16,32,64`; each comment is the measured time of the chosen config.
    # The sweep's winners mostly used the in-launch split-K sum ("last", 6-12% faster); they are pinned to the
    # two-launch sum ("kernel") here because "last" failed under torch.compile CUDA-graph trees on the H200
    # (test_last_program_sum_under_cudagraph_trees), and decode runs under CUDA graphs.
    # 10.8 us = 1.82x roofline; cuBLAS 19.5 us, bf16 14.9 us
    ("sm90", 1, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 10.1 us = 1.70x roofline; cuBLAS 16.1 us, bf16 16.0 us
    ("sm90", 4, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 10.8 us = 1.80x roofline; cuBLAS 16.2 us, bf16 15.5 us
    ("sm90", 16, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 12.3 us = 2.03x roofline; cuBLAS 16.2 us, bf16 15.9 us
    ("sm90", 32, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 15.2 us = 2.47x roofline; cuBLAS 16.5 us, bf16 16.0 us
    ("sm90", 64, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 8.0 us = 2.03x roofline; cuBLAS 19.6 us, bf16 12.5 us
    ("sm90", 1, 4096, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'kernel', 1, False)),
    # 8.3 us = 2.09x roofline; cuBLAS 15.8 us, bf16 13.0 us
    ("sm90", 4, 4096, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 8.5 us = 2.13x roofline; cuBLAS 16.1 us, bf16 13.3 us
    ("sm90", 16, 4096, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 9.3 us = 2.29x roofline; cuBLAS 16.0 us, bf16 13.5 us
    ("sm90", 32, 4096, 4096): Choice("small_m", SmallMConfig(64, 2, 4, 6, 'kernel', 1, False)),
    # 11.4 us = 2.76x roofline; cuBLAS 16.2 us, bf16 12.0 us
    ("sm90", 64, 4096, 4096): Choice("small_m", SmallMConfig(64, 2, 4, 4, 'kernel', 1, False)),
    # 27.8 us = 1.18x roofline; cuBLAS 39.1 us, bf16 47.9 us
    ("sm90", 1, 24576, 4096): Choice("small_m", SmallMConfig(128, 1, 8, 4, 'kernel', 1, False)),
    # 27.2 us = 1.15x roofline; cuBLAS 36.7 us, bf16 48.5 us
    ("sm90", 4, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'kernel', 1, False)),
    # 27.7 us = 1.16x roofline; cuBLAS 37.7 us, bf16 49.0 us
    ("sm90", 16, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'kernel', 1, False)),
    # 28.5 us = 1.18x roofline; cuBLAS 40.1 us, bf16 49.4 us
    ("sm90", 32, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'kernel', 1, False)),
    # 31.6 us = 1.29x roofline; cuBLAS 36.3 us, bf16 50.4 us
    ("sm90", 64, 24576, 4096): Choice("tiled", TiledConfig(64, 64, 8, 4, 3)),
    # 16.7 us = 1.41x roofline; cuBLAS 30.7 us, bf16 29.3 us
    ("sm90", 1, 4096, 12288): Choice("small_m", SmallMConfig(128, 8, 8, 4, 'kernel', 1, False)),
    # 17.0 us = 1.43x roofline; cuBLAS 25.3 us, bf16 30.5 us
    ("sm90", 4, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'kernel', 1, False)),
    # 17.8 us = 1.49x roofline; cuBLAS 22.9 us, bf16 28.5 us
    ("sm90", 16, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 18.8 us = 1.57x roofline; cuBLAS 38.0 us, bf16 29.4 us
    ("sm90", 32, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 23.9 us = 1.96x roofline; cuBLAS 37.9 us, bf16 31.3 us
    ("sm90", 64, 4096, 12288): Choice("small_m", SmallMConfig(64, 6, 4, 4, 'kernel', 1, False)),
    # 30.3 us = 1.10x roofline; cuBLAS 43.1 us, bf16 54.9 us
    ("sm90", 1, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 8, 4, 'kernel', 1, False)),
    # 30.6 us = 1.11x roofline; cuBLAS 38.2 us, bf16 55.4 us
    ("sm90", 4, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'kernel', 1, False)),
    # 31.3 us = 1.13x roofline; cuBLAS 37.1 us, bf16 56.4 us
    ("sm90", 16, 28672, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'kernel', 1, False)),
    # 32.4 us = 1.15x roofline; cuBLAS 37.8 us, bf16 57.2 us
    ("sm90", 32, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'kernel', 1, False)),
    # 35.9 us = 1.26x roofline; cuBLAS 39.2 us, bf16 61.4 us
    ("sm90", 64, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'kernel', 1, False)),
    # 18.6 us = 1.34x roofline; cuBLAS 31.9 us, bf16 31.3 us
    ("sm90", 1, 4096, 14336): Choice("small_m", SmallMConfig(128, 8, 8, 4, 'kernel', 1, False)),
    # 18.8 us = 1.36x roofline; cuBLAS 30.1 us, bf16 31.6 us
    ("sm90", 4, 4096, 14336): Choice("small_m", SmallMConfig(64, 6, 4, 4, 'kernel', 1, False)),
    # 19.8 us = 1.43x roofline; cuBLAS 27.6 us, bf16 32.3 us
    ("sm90", 16, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'kernel', 1, False)),
    # 21.2 us = 1.52x roofline; cuBLAS 43.0 us, bf16 33.0 us
    ("sm90", 32, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 26.9 us = 1.90x roofline; cuBLAS 43.3 us, bf16 35.6 us
    ("sm90", 64, 4096, 14336): Choice("small_m", SmallMConfig(64, 6, 4, 4, 'kernel', 1, False)),
    # 17.3 us = 1.40x roofline; cuBLAS 24.1 us, bf16 27.4 us
    ("sm90", 1, 10240, 5120): Choice("small_m", SmallMConfig(128, 3, 4, 4, 'kernel', 1, False)),
    # 17.1 us = 1.38x roofline; cuBLAS 20.1 us, bf16 28.1 us
    ("sm90", 4, 10240, 5120): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'kernel', 1, False)),
    # 18.1 us = 1.46x roofline; cuBLAS 20.8 us, bf16 28.2 us
    ("sm90", 16, 10240, 5120): Choice("small_m", SmallMConfig(64, 2, 4, 4, 'kernel', 1, False)),
    # 19.1 us = 1.53x roofline; cuBLAS 20.7 us, bf16 28.4 us
    ("sm90", 32, 10240, 5120): Choice("small_m", SmallMConfig(64, 2, 4, 4, 'kernel', 1, False)),
    # 21.2 us = 1.67x roofline; cuBLAS 21.2 us, bf16 28.0 us
    ("sm90", 64, 10240, 5120): Choice("cublas"),
    # 14.9 us = 1.51x roofline; cuBLAS 25.2 us, bf16 25.8 us
    ("sm90", 1, 5120, 8192): Choice("small_m", SmallMConfig(128, 7, 8, 4, 'kernel', 1, False)),
    # 14.9 us = 1.51x roofline; cuBLAS 21.7 us, bf16 26.3 us
    ("sm90", 4, 5120, 8192): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 15.3 us = 1.54x roofline; cuBLAS 21.3 us, bf16 26.0 us
    ("sm90", 16, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'kernel', 1, False)),
    # 16.6 us = 1.66x roofline; cuBLAS 27.5 us, bf16 26.8 us
    ("sm90", 32, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'kernel', 1, False)),
    # 22.2 us = 2.19x roofline; cuBLAS 27.8 us, bf16 29.0 us
    ("sm90", 64, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'kernel', 1, False)),
    # 70.4 us = 1.14x roofline; cuBLAS 87.7 us, bf16 128.5 us
    ("sm90", 1, 51200, 5120): Choice("small_m", SmallMConfig(128, 1, 8, 4, 'kernel', 1, False)),
    # 70.7 us = 1.15x roofline; cuBLAS 87.5 us, bf16 129.4 us
    ("sm90", 4, 51200, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'kernel', 1, False)),
    # 67.0 us = 1.08x roofline; cuBLAS 75.7 us, bf16 130.9 us
    ("sm90", 16, 51200, 5120): Choice("small_m", SmallMConfig(256, 1, 8, 3, 'kernel', 1, False)),
    # 68.2 us = 1.09x roofline; cuBLAS 85.0 us, bf16 132.2 us
    ("sm90", 32, 51200, 5120): Choice("small_m", SmallMConfig(256, 1, 8, 3, 'kernel', 1, False)),
    # 78.3 us = 1.24x roofline; cuBLAS 78.3 us, bf16 132.2 us
    ("sm90", 64, 51200, 5120): Choice("cublas"),
    # 36.4 us = 1.18x roofline; cuBLAS 50.4 us, bf16 71.4 us
    ("sm90", 1, 5120, 25600): Choice("small_m", SmallMConfig(128, 7, 4, 4, 'kernel', 1, False)),
    # 36.1 us = 1.17x roofline; cuBLAS 44.2 us, bf16 74.4 us
    ("sm90", 4, 5120, 25600): Choice("small_m", SmallMConfig(64, 5, 4, 4, 'kernel', 1, False)),
    # 37.6 us = 1.22x roofline; cuBLAS 46.1 us, bf16 67.3 us
    ("sm90", 16, 5120, 25600): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 38.8 us = 1.25x roofline; cuBLAS 72.5 us, bf16 68.2 us
    ("sm90", 32, 5120, 25600): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'kernel', 1, False)),
    # 49.5 us = 1.58x roofline; cuBLAS 72.6 us, bf16 70.8 us
    ("sm90", 64, 5120, 25600): Choice("small_m", SmallMConfig(128, 3, 4, 4, 'kernel', 1, False)),
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
