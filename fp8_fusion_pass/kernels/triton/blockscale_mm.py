"""``blockscale_mm`` on the Triton backend: choose, per (arch, M bucket, N, K), the fastest *correct* GEMM.

Paths (all compute ``reference.blockscale_mm``: fp32 accumulation, per-128-K promotion):
- ``cublas``: cuBLASLt block-wise through ``torch._scaled_mm`` / ``F.scaled_mm`` (``kernels/cublas.py``);
  Hopper SM90 only, with its layout rules (pad M to 4, outer-dim-major activation scales, and never v1
  when (K/128) % 4 != 0: that combination is silently wrong).
- ``tiled``: the Triton tiled GEMM (compute-bound shapes, and everything cuBLAS refuses).
- ``small_m``: the Triton swap-AB split-K GEMM for decode-sized M (``_small_m_kernels.py``; each tuning idea's
  prediction and measurement in ``docs/small_m_tuning.md``), where the GEMM is bound by weight bytes (N*K fp8
  bytes, half of bf16): cuBLAS block-wise took 13.3 us at M=16, N=K=4096 on the H200 against ~3.9 us of weight
  bytes at copy bandwidth and 9.1 us for a bf16 GEMM (issue 7).
- ``gemv``: for M <= 4, the Triton GEMV (``_gemv_kernels.py``): a few whole weight rows per program, thousands of
  programs, one launch, shaped like a streaming-read kernel; the TABLE's choice at M = 1 on most shapes.
- ``dequant``: the reference (dequantize, fp32 matmul); only when no kernel can run (an activation group
  below 32 values, or a device without fp8 Triton).

Choice: ``TABLE`` first (measured), else ``default_choice`` (reasoned); a choice whose path cannot run the
shape correctly (``unsupported``) falls back along cublas -> small_m / tiled -> dequant, never to a wrong one.

How ``TABLE`` is measured: ``python benchmarks/gemm.py`` on one H200 (torch 2.11, Triton 3.6) times bf16
``torch.mm``, cuBLAS block-wise, Triton tiled and Triton small-M (a sweep of BLOCK_N x SPLIT_K x warps x
stages x split-K sum x K unroll, and a GEMV for M <= 4) for the Qwen3-8B / Llama-3.1-8B / Qwen3-32B
projection shapes at M in ``M_BUCKETS``: medians of CUDA-graph replays, weights rotated through more than the 50 MB L2.
Every candidate is first checked against the fp32 oracle (and, for the in-launch split-K sum, for bitwise
repeatability), so a TABLE row names a config validated at that shape. It prints the fastest path per (M bucket, N, K)
in this table's syntax; paste those rows below with the date and the GPU.
Until then the table is empty and ``default_choice`` decides by reasoning.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from ... import arch as _arch
from .. import checks, cublas
from .. import reference as _ref
from ._blockscale_kernels import MIN_BLOCK_K, TiledConfig, promotion_block, tiled_mm, triton_unsupported
from ._gemv_kernels import GEMV_MAX_M, GemvConfig, gemv_mm
from ._gemv_kernels import unsupported as _gemv_unsupported
from ._small_m_kernels import FMA_MAX_M, SmallMConfig, small_m_mm

PATHS = ("cublas", "tiled", "small_m", "gemv", "dequant")
# A row count uses the first bucket >= it; anything above 2048 uses the 8192 row.
M_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 2048, 8192)
# Up to here the GEMM is weight-bandwidth bound on an H200: 64 rows x 2 FLOP per weight byte is far below
# its ~1979 TFLOPS / 4.8 TB/s = 412 FLOP/byte ridge, so the small-M kernel's wasted MMA work is free.
SMALL_M_MAX = 64


@dataclasses.dataclass(frozen=True)
class Choice:
    path: str
    config: TiledConfig | SmallMConfig | GemvConfig | None = None  # None: the kernel's default for the shape


# (arch name, M bucket, N, K) -> Choice, from ``benchmarks/gemm.py`` (see the module docstring).
# fmt: off
TABLE: dict[tuple[str, int, int, int], Choice] = {
    # GEMV_WIDE: every M = 1 row was re-measured 2026-12-03 (same GPU and versions, copy 4.28 TB/s) by
    # `python benchmarks/gemm.py --ms 1 --small-only --gemv-wide` on the tree of this row's commit: the GEMV swept
    # over 2 / 8 warps, 256 / 2048-value chunks and 16 rows too (80 configs, SWEEP_GEMV_WIDE). It won all 16
    # shapes, the three down projections too (from the TMA small-M rows below), by 2-22% over the committed rows
    # re-timed in the same run (Qwen3-32B o 14.25 -> 12.77 us, Qwen3-8B o 7.24 -> 6.46, k|v 4.68 -> 3.66); most
    # winners hold 4 rows x 2048 values on 2 warps. Each is now within 0.89-1.04x a plain read of its bytes (the
    # 1024-row k|v 1.24-1.29x). The DOWN_M1 paragraph below tells the rows those replaced.
    # NOSWAP: the M = 64 rows marked "idea 20" were measured 2026-12-04 (same GPU and versions, copy 4.28 TB/s) by
    # `python benchmarks/gemm.py --ms 16,32,64 --noswap` on the tree of commit 242506f: the activation rows on the
    # MMA's M side (SmallMConfig.swap False) against the committed row re-timed in the same run ("the row before"),
    # taken where faster by more than 3% (12 of 16 shapes, 3-17%; no M = 16 / 32 point, where swap-AB stays best).
    # DOWN_M1: the three down projections' M = 1 / 4 rows were re-measured 2026-12-03 (same GPU and versions, copy
    # 4.25 TB/s) by `python benchmarks/gemm.py --ms 1,4 --only down --small-only` on the tree of commit 6fa7570:
    # the TMA family (measured at M >= 16 until then) took M = 1 from 16.9 / 19.3 / 37.6 us to 16.1 / 17.9 / 34.5
    # (Qwen3-8B / Llama-3.1-8B / Qwen3-32B; 1.03-1.12x their read floors); at M = 4 Llama's took TMA tiles, the
    # other two pointer loads with two K tiles per iteration (17.1 / 19.2 / 37.0 -> 16.1 / 18.2 / 34.2 us).
    # The other 13 M = 1 shapes with the TMA family among the candidates (`gemm.py --ms 1 --small-only`, same day,
    # commit c151632): it ties the GEMV rows below within 0-3% (the spread between runs), so they stay.
    # M buckets 1 and 4: measured 2026-12-01 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0, copy 4.28 TB/s)
    # by `python benchmarks/gemm.py --ms 1,4 --small-only` on commit f4ba5ab with the GEMV path (_gemv_kernels.py)
    # among the candidates: it won at M = 1 on 13 of 16 shapes (all but the three down projections), by 1-14%;
    # at M = 4 it was 1.7-2.3x slower than the small-M GEMM (its CUDA-core multiply-adds grow with M), which
    # keeps those rows.
    # GEMV_WIDE: 8.7 us = 1.48x roofline; cuBLAS 19.4 us, bf16 15.0 us
    ("sm90", 1, 6144, 4096): Choice("gemv", GemvConfig(4, 2048, 4, 1)),
    # 10.4 us = 1.76x roofline; cuBLAS 16.2 us, bf16 16.1 us
    ("sm90", 4, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 6.5 us = 1.65x roofline; cuBLAS 19.2 us, bf16 12.5 us
    ("sm90", 1, 4096, 4096): Choice("gemv", GemvConfig(4, 2048, 2, 1)),
    # 8.3 us = 2.11x roofline; cuBLAS 15.6 us, bf16 13.1 us
    ("sm90", 4, 4096, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 25.2 us = 1.07x roofline; cuBLAS 38.6 us, bf16 49.6 us
    ("sm90", 1, 24576, 4096): Choice("gemv", GemvConfig(4, 2048, 2, 1)),
    # 27.9 us = 1.18x roofline; cuBLAS 35.3 us, bf16 49.9 us
    ("sm90", 4, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False)),
    # GEMV_WIDE: 14.7 us = 1.25x roofline; cuBLAS 30.5 us, bf16 29.7 us
    ("sm90", 1, 4096, 12288): Choice("gemv", GemvConfig(4, 2048, 2, 1)),
    # 16.1 us = 1.36x roofline; cuBLAS 25.3 us, bf16 29.5 us (DOWN_M1 above)
    ("sm90", 4, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 2, False, False)),
    # GEMV_WIDE: 28.9 us = 1.05x roofline; cuBLAS 42.1 us, bf16 56.3 us
    ("sm90", 1, 28672, 4096): Choice("gemv", GemvConfig(4, 2048, 2, 1)),
    # 31.4 us = 1.14x roofline; cuBLAS 38.4 us, bf16 56.8 us
    ("sm90", 4, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 16.7 us = 1.22x roofline; cuBLAS 31.7 us, bf16 31.8 us
    ("sm90", 1, 4096, 14336): Choice("gemv", GemvConfig(4, 2048, 2, 1)),
    # 18.2 us = 1.31x roofline; cuBLAS 28.5 us, bf16 31.6 us (DOWN_M1 above)
    ("sm90", 4, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'last', 1, False, True)),
    # GEMV_WIDE: 15.2 us = 1.24x roofline; cuBLAS 24.1 us, bf16 27.7 us
    ("sm90", 1, 10240, 5120): Choice("gemv", GemvConfig(16, 1024, 4, 3)),
    # 17.3 us = 1.41x roofline; cuBLAS 20.2 us, bf16 28.4 us
    ("sm90", 4, 10240, 5120): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 12.8 us = 1.30x roofline; cuBLAS 24.7 us, bf16 26.1 us
    ("sm90", 1, 5120, 8192): Choice("gemv", GemvConfig(4, 2048, 2, 3)),
    # 14.7 us = 1.49x roofline; cuBLAS 22.0 us, bf16 26.7 us
    ("sm90", 4, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'last', 1, False)),
    # GEMV_WIDE: 62.2 us = 1.01x roofline; cuBLAS 78.9 us, bf16 133.7 us
    ("sm90", 1, 51200, 5120): Choice("gemv", GemvConfig(16, 1024, 4, 1)),
    # 67.5 us = 1.10x roofline; cuBLAS 86.4 us, bf16 134.8 us
    ("sm90", 4, 51200, 5120): Choice("small_m", SmallMConfig(256, 1, 8, 3, 'last', 1, False)),
    # GEMV_WIDE: 34.2 us = 1.12x roofline; cuBLAS 50.3 us, bf16 73.3 us
    ("sm90", 1, 5120, 25600): Choice("gemv", GemvConfig(4, 2048, 2, 3)),
    # 34.2 us = 1.11x roofline; cuBLAS 46.3 us, bf16 68.0 us (DOWN_M1 above)
    ("sm90", 4, 5120, 25600): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 2, False, False)),
    # GEMV_WIDE: 3.7 us = 3.73x roofline; cuBLAS 18.9 us, bf16 7.6 us
    ("sm90", 1, 1024, 4096): Choice("gemv", GemvConfig(2, 2048, 4, 1)),
    # 5.5 us = 5.62x roofline; cuBLAS 15.4 us, bf16 7.9 us
    ("sm90", 4, 1024, 4096): Choice("small_m", SmallMConfig(32, 8, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 14.3 us = 1.21x roofline; cuBLAS 24.3 us, bf16 27.6 us
    ("sm90", 1, 12288, 4096): Choice("gemv", GemvConfig(8, 1024, 2, 3)),
    # 16.8 us = 1.42x roofline; cuBLAS 20.1 us, bf16 28.3 us
    ("sm90", 4, 12288, 4096): Choice("small_m", SmallMConfig(64, 2, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 15.9 us = 1.16x roofline; cuBLAS 25.3 us, bf16 31.7 us
    ("sm90", 1, 14336, 4096): Choice("gemv", GemvConfig(4, 2048, 2, 3)),
    # 18.8 us = 1.36x roofline; cuBLAS 20.6 us, bf16 30.1 us
    ("sm90", 4, 14336, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False)),
    # GEMV_WIDE: 12.6 us = 1.28x roofline; cuBLAS 22.7 us, bf16 22.8 us
    ("sm90", 1, 8192, 5120): Choice("gemv", GemvConfig(4, 1024, 2, 3)),
    # 14.4 us = 1.46x roofline; cuBLAS 19.7 us, bf16 22.6 us
    ("sm90", 4, 8192, 5120): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'last', 1, False)),
    # GEMV_WIDE: 4.7 us = 3.79x roofline; cuBLAS 21.4 us, bf16 8.3 us
    ("sm90", 1, 1024, 5120): Choice("gemv", GemvConfig(2, 2048, 4, 1)),
    # 6.0 us = 4.90x roofline; cuBLAS 18.5 us, bf16 8.2 us
    ("sm90", 4, 1024, 5120): Choice("small_m", SmallMConfig(32, 8, 4, 4, 'last', 1, False)),
    # GEMV_WIDE: 33.2 us = 1.08x roofline; cuBLAS 44.1 us, bf16 68.2 us
    ("sm90", 1, 25600, 5120): Choice("gemv", GemvConfig(4, 1024, 2, 3)),
    # 35.4 us = 1.15x roofline; cuBLAS 42.3 us, bf16 68.5 us
    ("sm90", 4, 25600, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False)),
    # M buckets 16, 32, 64: measured 2026-12-01 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0) by
    # `python benchmarks/gemm.py --ms 16,32,64 --small-only` (the merged engine shapes and the HF form's separate
    # q / k / v / gate / up shapes), with the scales loaded a tile ahead and the TMA families (the config's last
    # field; docs/small_m_tuning.md ideas 12, 13); each comment is the measured time of the chosen config.
    # Idea 15 (the activation rows split over programs, SmallMConfig.block_m; 2026-12-03, same GPU and versions,
    # `python benchmarks/gemm.py --ms 32,64 --small-only` on the tree of this row's commit) took the four rows
    # marked so, where its config beat the committed row re-timed in the same run by more than 3%: Qwen3-8B qkv at
    # M = 64 (14.85 -> 14.19 us), the k|v weights at M = 64 (7.94 -> 6.58, 8.84 -> 7.33) and Qwen3-8B's at M = 32
    # (6.22 -> 6.01). Elsewhere the rows stay (the run's best within 0.97-1.0x of them).
    # 10.4 us = 1.74x roofline; cuBLAS 15.5 us, bf16 15.3 us
    ("sm90", 16, 6144, 4096): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 1, False, True)),
    # 11.5 us = 1.92x roofline; cuBLAS 16.2 us, bf16 16.1 us
    ("sm90", 32, 6144, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 3, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 11.9 us = 1.93x roofline; cuBLAS 16.5 us, bf16 16.2 us; the row before: 14.3 us
    ("sm90", 64, 6144, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True, 0, False)),
    # 8.4 us = 2.11x roofline; cuBLAS 16.5 us, bf16 12.7 us
    ("sm90", 16, 4096, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, False)),
    # 9.2 us = 2.29x roofline; cuBLAS 15.9 us, bf16 13.8 us
    ("sm90", 32, 4096, 4096): Choice("small_m", SmallMConfig(64, 2, 4, 6, 'last', 1, False, False)),
    # idea 20 (NOSWAP): 10.5 us = 2.56x roofline; cuBLAS 16.3 us, bf16 12.3 us; the row before: 11.2 us
    ("sm90", 64, 4096, 4096): Choice("small_m", SmallMConfig(32, 2, 4, 4, 'last', 1, False, True, 0, False)),
    # 27.1 us = 1.14x roofline; cuBLAS 35.7 us, bf16 50.6 us
    ("sm90", 16, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True)),
    # 27.7 us = 1.16x roofline; cuBLAS 38.2 us, bf16 51.2 us
    ("sm90", 32, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 28.9 us = 1.19x roofline; cuBLAS 35.7 us, bf16 52.5 us; the row before: 30.6 us
    ("sm90", 64, 24576, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True, 0, False)),
    # 16.8 us = 1.42x roofline; cuBLAS 23.0 us, bf16 29.0 us
    ("sm90", 16, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'last', 1, False, True)),
    # 18.4 us = 1.54x roofline; cuBLAS 37.6 us, bf16 30.0 us
    ("sm90", 32, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'last', 1, False, True)),
    # 20.9 us = 1.73x roofline; cuBLAS 38.0 us, bf16 31.9 us
    ("sm90", 64, 4096, 12288): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, True)),
    # 31.2 us = 1.13x roofline; cuBLAS 37.7 us, bf16 57.5 us
    ("sm90", 16, 28672, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True)),
    # 32.2 us = 1.15x roofline; cuBLAS 39.6 us, bf16 62.6 us
    ("sm90", 32, 28672, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 3, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 33.5 us = 1.18x roofline; cuBLAS 38.1 us, bf16 62.7 us; the row before: 34.9 us
    ("sm90", 64, 28672, 4096): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False)),
    # 19.0 us = 1.38x roofline; cuBLAS 29.1 us, bf16 32.8 us
    ("sm90", 16, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'last', 1, False, True)),
    # 20.7 us = 1.49x roofline; cuBLAS 43.2 us, bf16 33.7 us
    ("sm90", 32, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 6, 'last', 1, False, True)),
    # 23.4 us = 1.66x roofline; cuBLAS 43.0 us, bf16 35.0 us
    ("sm90", 64, 4096, 14336): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, True)),
    # 16.8 us = 1.36x roofline; cuBLAS 20.5 us, bf16 28.3 us
    ("sm90", 16, 10240, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 2, False, False)),
    # 18.6 us = 1.50x roofline; cuBLAS 20.7 us, bf16 28.8 us
    ("sm90", 32, 10240, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 19.0 us = 1.50x roofline; cuBLAS 20.7 us, bf16 28.2 us; the row before: 20.7 us
    ("sm90", 64, 10240, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True, 0, False)),
    # 15.1 us = 1.53x roofline; cuBLAS 21.2 us, bf16 26.3 us
    ("sm90", 16, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 2, False, False)),
    # 16.4 us = 1.65x roofline; cuBLAS 27.1 us, bf16 26.8 us
    ("sm90", 32, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 18.1 us = 1.79x roofline; cuBLAS 27.3 us, bf16 28.9 us; the row before: 19.0 us
    ("sm90", 64, 5120, 8192): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 1, False, True, 0, False)),
    # 67.5 us = 1.09x roofline; cuBLAS 84.5 us, bf16 135.3 us
    ("sm90", 16, 51200, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 3, 'last', 1, False, True)),
    # 68.9 us = 1.11x roofline; cuBLAS 77.0 us, bf16 136.4 us
    ("sm90", 32, 51200, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 72.0 us = 1.15x roofline; cuBLAS 78.4 us, bf16 135.9 us; the row before: 77.2 us
    ("sm90", 64, 51200, 5120): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False)),
    # 35.8 us = 1.16x roofline; cuBLAS 46.7 us, bf16 68.0 us
    ("sm90", 16, 5120, 25600): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 2, False, False)),
    # 38.2 us = 1.24x roofline; cuBLAS 72.2 us, bf16 69.6 us
    ("sm90", 32, 5120, 25600): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 41.8 us = 1.34x roofline; cuBLAS 73.1 us, bf16 72.2 us; the row before: 44.4 us
    ("sm90", 64, 5120, 25600): Choice("small_m", SmallMConfig(64, 3, 4, 6, 'last', 1, False, True, 0, False)),
    # 5.6 us = 5.63x roofline; cuBLAS 15.8 us, bf16 7.9 us
    ("sm90", 16, 1024, 4096): Choice("small_m", SmallMConfig(64, 8, 4, 6, 'last', 1, False, False)),
    # idea 15 (rows split, 2026-12-03, above): 6.0 us = 5.85x roofline; cuBLAS 15.7 us, bf16 7.9 us
    ("sm90", 32, 1024, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, False, 16)),
    # idea 15 (rows split, 2026-12-03, above): 6.6 us = 6.12x roofline; cuBLAS 15.9 us, bf16 7.4 us
    ("sm90", 64, 1024, 4096): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, False, 32)),
    # 15.4 us = 1.29x roofline; cuBLAS 21.4 us, bf16 28.1 us
    ("sm90", 16, 12288, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # 16.0 us = 1.33x roofline; cuBLAS 21.8 us, bf16 28.7 us
    ("sm90", 32, 12288, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 16.5 us = 1.35x roofline; cuBLAS 19.1 us, bf16 28.5 us; the row before: 19.1 us
    ("sm90", 64, 12288, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True, 0, False)),
    # 17.8 us = 1.29x roofline; cuBLAS 22.8 us, bf16 30.6 us
    ("sm90", 16, 14336, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # 18.4 us = 1.32x roofline; cuBLAS 22.8 us, bf16 31.4 us
    ("sm90", 32, 14336, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 18.3 us = 1.29x roofline; cuBLAS 22.1 us, bf16 33.5 us; the row before: 21.0 us
    ("sm90", 64, 14336, 4096): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True, 0, False)),
    # 14.6 us = 1.48x roofline; cuBLAS 19.7 us, bf16 22.6 us
    ("sm90", 16, 8192, 5120): Choice("small_m", SmallMConfig(64, 3, 4, 4, 'last', 1, False, False)),
    # 15.5 us = 1.55x roofline; cuBLAS 19.7 us, bf16 23.0 us
    ("sm90", 32, 8192, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 15.6 us = 1.54x roofline; cuBLAS 20.0 us, bf16 24.6 us; the row before: 17.7 us
    ("sm90", 64, 8192, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 6, 'last', 1, False, True, 0, False)),
    # 6.2 us = 4.92x roofline; cuBLAS 18.5 us, bf16 8.4 us
    ("sm90", 16, 1024, 5120): Choice("small_m", SmallMConfig(32, 8, 4, 4, 'last', 1, False, False)),
    # 6.6 us = 5.15x roofline; cuBLAS 18.3 us, bf16 8.5 us
    ("sm90", 32, 1024, 5120): Choice("small_m", SmallMConfig(64, 8, 4, 4, 'last', 1, False, False)),
    # idea 15 (rows split, 2026-12-03, above): 7.3 us = 5.49x roofline; cuBLAS 18.7 us, bf16 8.9 us
    ("sm90", 64, 1024, 5120): Choice("small_m", SmallMConfig(64, 4, 4, 4, 'last', 1, False, False, 32)),
    # 34.5 us = 1.12x roofline; cuBLAS 43.9 us, bf16 69.9 us
    ("sm90", 16, 25600, 5120): Choice("small_m", SmallMConfig(64, 1, 4, 4, 'last', 1, False, True)),
    # 36.2 us = 1.16x roofline; cuBLAS 44.0 us, bf16 68.8 us
    ("sm90", 32, 25600, 5120): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'last', 1, False, True)),
    # idea 20 (NOSWAP): 37.7 us = 1.20x roofline; cuBLAS 44.1 us, bf16 70.7 us; the row before: 38.9 us
    ("sm90", 64, 25600, 5120): Choice("small_m", SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False)),
}
# (arch name, M bucket, N, K) -> the fastest small-M config where TABLE names another path (the GEMV): what the
# grouped launch (``blockscale_mm_grouped``, a small-M kernel) runs for that merged shape. From the same
# `benchmarks/gemm.py --ms 1,4 --small-only` run as TABLE's M = 1 rows (the us of that config in the comment).
SMALL_M_BEST: dict[tuple[str, int, int, int], SmallMConfig] = {
    ("sm90", 1, 6144, 4096): SmallMConfig(64, 4, 4, 6, 'last', 1, False),  # 10.45 us
    ("sm90", 1, 4096, 4096): SmallMConfig(128, 4, 8, 4, 'last', 1, False),  # 8.38 us
    ("sm90", 1, 24576, 4096): SmallMConfig(128, 1, 8, 4, 'last', 1, False),  # 28.09 us
    ("sm90", 1, 28672, 4096): SmallMConfig(128, 1, 8, 4, 'last', 1, False),  # 31.25 us
    ("sm90", 1, 10240, 5120): SmallMConfig(128, 3, 8, 4, 'last', 1, False),  # 17.26 us
    ("sm90", 1, 5120, 8192): SmallMConfig(128, 7, 8, 4, 'last', 1, False),  # 15.16 us
    ("sm90", 1, 51200, 5120): SmallMConfig(256, 1, 8, 3, 'last', 1, False),  # 66.92 us
    ("sm90", 1, 1024, 4096): SmallMConfig(64, 8, 4, 6, 'last', 1, False),  # 5.56 us
    ("sm90", 1, 12288, 4096): SmallMConfig(128, 4, 8, 4, 'last', 1, False),  # 16.39 us
    ("sm90", 1, 14336, 4096): SmallMConfig(128, 2, 8, 4, 'last', 1, False),  # 18.40 us
    ("sm90", 1, 8192, 5120): SmallMConfig(128, 4, 4, 4, 'last', 1, False),  # 14.68 us
    ("sm90", 1, 1024, 5120): SmallMConfig(32, 8, 4, 4, 'last', 1, False),  # 6.03 us
    ("sm90", 1, 25600, 5120): SmallMConfig(128, 1, 8, 4, 'last', 1, False),  # 35.32 us
    # the down projections' TMA rows of DOWN_M1 (TABLE's until GEMV_WIDE)
    ("sm90", 1, 4096, 12288): SmallMConfig(64, 4, 4, 6, 'last', 1, False, True),  # 16.1 us
    ("sm90", 1, 4096, 14336): SmallMConfig(64, 4, 4, 6, 'last', 1, False, True),  # 17.9 us
    ("sm90", 1, 5120, 25600): SmallMConfig(64, 3, 4, 6, 'last', 1, False, True),  # 34.5 us
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
    if path == "gemv":
        return _triton_unsupported(a, device_type, group) or _gemv_unsupported(1, k, group)
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
    if choice.path == "gemv" and m > GEMV_MAX_M:
        return f"the gemv path takes M <= {GEMV_MAX_M}"
    return None


def plan(
    a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, n: int, k: int, group: int, out_dtype: torch.dtype
) -> Choice:
    """The path for this GEMM: the table's, else the default, else the first legal fallback. Pure."""
    key = (a.name, m_bucket(m), n, k)
    wanted = TABLE.get(key) or default_choice(a, m, n, k)
    # Where the table's GEMV cannot run (e.g. 1x64 activation groups), the small-M config measured beside it.
    small = Choice("small_m", SMALL_M_BEST.get(key)) if m <= SMALL_M_MAX else Choice("tiled")
    fallbacks = [wanted, small, Choice("tiled"), Choice("dequant")]
    for choice in fallbacks:
        if (
            _config_unsupported(choice, m) is None
            and unsupported(choice.path, a, device_type, fp8, n, k, group, out_dtype) is None
        ):
            return choice
    raise AssertionError("unreachable: dequant is always supported")


def small_m_plan(
    a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, n: int, k: int, group: int, out_dtype: torch.dtype
) -> Choice | None:
    """For kernels built on the small-M GEMM (the grouped launch): ``plan``'s choice when it is small-M; where the
    plan is the GEMV, the small-M config measured best at that shape (``SMALL_M_BEST``, else the default); None
    where the plan is another path (cuBLAS / tiled measured faster) or the small-M kernel cannot run the GEMM."""
    if m > SMALL_M_MAX or unsupported("small_m", a, device_type, fp8, n, k, group, out_dtype) is not None:
        return None
    choice = plan(a, device_type, fp8, m, n, k, group, out_dtype)
    if choice.path == "small_m":
        return choice
    if choice.path == "gemv":
        return Choice("small_m", SMALL_M_BEST.get((a.name, m_bucket(m), n, k)))
    return None


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
    if path == "gemv":  # gemv_mm raises its own ValueError above GEMV_MAX_M rows
        return gemv_mm(q, x_scale, w_q, w_scale, out_dtype, config)
    return _ref.blockscale_mm(q, x_scale, w_q, w_scale, out_dtype)


def slow_path_warning(a: _arch.Arch, device_type: str, fp8: torch.dtype, n: int, k: int, group: int,
                      out_dtype: torch.dtype) -> str | None:
    """Why a GPU runs this GEMM on the ``dequant`` reference (fp32 weights made per call: many times slower than a
    kernel), or None where a kernel path takes it or the device is the CPU (where the reference is the path)."""
    if device_type == "cpu":
        return None
    reasons = {p: unsupported(p, a, device_type, fp8, n, k, group, out_dtype) for p in ("cublas", "small_m")}
    if any(r is None for r in reasons.values()):
        return None
    hint = (" Quantize with group_size=128 (quantize_block_fp8's default) to get the kernels."
            if promotion_block(group) < MIN_BLOCK_K else "")
    return (f"blockscale_mm: no kernel on {a.name} takes N={n} K={k} with activation group {group} (cuBLAS: "
            f"{reasons['cublas']}; Triton: {reasons['small_m']}), so it runs the dequantize-and-matmul reference, "
            f"many times slower.{hint}")


_WARNED_SLOW: set = set()


def blockscale_mm(q, x_scale, w_q, w_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """``y [M, N] = dequant(q, x_scale) @ dequant(w_q, w_scale)^T`` (signature of ``reference_backend``)."""
    checks.blockscale_mm_args("blockscale_mm", q, x_scale, w_q, w_scale, out_dtype)
    choice = plan_for(q, x_scale, w_q, w_scale, out_dtype)
    if choice.path == "dequant":  # a silent 10x+ slowdown otherwise: say so once per kind of GEMM
        m, n, k, group = _shape_facts(q, x_scale, w_q)
        a = _arch.arch_of(q.device)
        message = slow_path_warning(a, q.device.type, q.dtype, n, k, group, out_dtype)
        if message is not None and (a.name, n, k, group) not in _WARNED_SLOW:
            _WARNED_SLOW.add((a.name, n, k, group))
            warnings.warn(message, stacklevel=2)
    return _execute(choice.path, q, x_scale, w_q, w_scale, out_dtype, choice.config)
