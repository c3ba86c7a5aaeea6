"""Triton tiled GEMM behind ``blockscale_mm`` and ``per_tensor_mm``, and the helpers both Triton GEMMs share.

Numerics (``reference.blockscale_mm``, ``kernels.md`` §0.1): fp32 accumulation with *per-K-tile promotion*,
``acc += dot(a_tile, b_tile) * a_scale[:, None] * b_scale[None, :]``, where one K tile lies inside one
activation group and one 128x128 weight block. That is the DeepGEMM / sglang recipe; on Hopper it also
bounds the error of the FP8 tensor-core accumulator (about 14 mantissa bits; Triton's sm90 default is
``max_num_imprecise_acc = 2**30``, i.e. no promotion inside a ``tl.dot``) to one 128-long sum.

Scale layouts are passed as strides, so any layout works without a copy:
- ``x_scale [M, K/group]`` (row-major from ``group_quant``, or outer-dim-major as cuBLAS wants);
- ``w_scale [ceil(N/128), ceil(K/128)]``: N and K need not be multiples of 128 (ceil blocks);
- per-tensor scales: strides 0, so every tile reads the one value.

``_blockscale_mm_kernel``: classic output tiles with a grouped-M launch order (compute-bound, M >= 128). The
small-M GEMM (swap-AB split-K, for decode-sized M) is in ``_small_m_kernels.py``. ``PDL`` (``_pdl.py``, off by
default): ``wait_then_launch`` first in every program.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ... import arch as _arch
from ._pdl import pdl_kwargs, wait_then_launch

SCALE_BLOCK = 128  # weight scales are per 128x128 block (DeepSeek-V3 / Qwen3-FP8 ``weight_scale_inv``)
MIN_BLOCK_K = 32  # an 8-bit MMA has k=32: a smaller promotion step cannot use tensor cores


@dataclasses.dataclass(frozen=True)
class TiledConfig:
    block_m: int
    block_n: int
    group_m: int = 8
    warps: int = 4
    stages: int = 3


# M varies per call: specializing on its divisibility by 16 would compile one variant per value class for no gain.
@triton.jit(do_not_specialize=["M"])
def _blockscale_mm_kernel(
    a_ptr,  # q [M, K] fp8, K contiguous
    b_ptr,  # w_q [N, K] fp8, K contiguous
    c_ptr,  # out [M, N]
    as_ptr,  # activation scales, element (m, k // GROUP_K) at m * stride_asm + (k // GROUP_K) * stride_ask
    bs_ptr,  # weight scales, element (n // 128, k // 128)
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    GROUP_K: tl.constexpr,  # activation-scale group along K (a multiple of BLOCK_K)
    SCALE_BLOCK: tl.constexpr,  # weight-scale block (128, a multiple of BLOCK_K)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # the promotion step: one K tile, one scale pair
    GROUP_M: tl.constexpr,  # launch order: GROUP_M row tiles share each weight tile while it is in L2
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask (always true for block scales)
    PDL: tl.constexpr,  # programmatic dependent launch (_pdl.py): wait_then_launch before any load or store
):
    wait_then_launch(PDL)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_in_group = GROUP_M * num_pid_n
    first_m = (pid // pids_in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_in_group) % group_rows
    pid_n = (pid % pids_in_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows / columns wrap onto valid ones, so loads need no mask; the store masks them.
    rm = offs_m % M
    rn = offs_n % N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = b_ptr + rn.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]  # [BLOCK_K, BLOCK_N], K-major
    as_ptrs = as_ptr + rm * stride_asm
    bs_ptrs = bs_ptr + (rn // SCALE_BLOCK) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(tl.cdiv(K, BLOCK_K)):
        k0 = kt * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0.0)
        a_s = tl.load(as_ptrs + (k0 // GROUP_K) * stride_ask)
        b_s = tl.load(bs_ptrs + (k0 // SCALE_BLOCK) * stride_bsk)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# ---------------------------------------------------------------- launch helpers


def triton_unsupported(a: _arch.Arch, device_type: str) -> str | None:
    """Why Triton cannot run an fp8 GEMM here (None: CUDA sm89+ / ROCm gfx942+, or the CPU interpreter)."""
    if device_type == "cpu":
        return None if _arch.triton_interpreting() else "Triton runs on the CPU only under TRITON_INTERPRET=1"
    if device_type != "cuda" or not a.triton_fp8:
        return f"Triton has no fp8 on {a.name}"
    return None


def promotion_block(group_k: int) -> int:
    """The K tile: the largest power of two dividing both the activation group and the 128 weight block, so
    one tile never straddles two scales (group 128 -> 128, group 64 -> 64, group 384 -> 128)."""
    return math.gcd(group_k, SCALE_BLOCK)


def _sm_major(a: _arch.Arch) -> int:
    return int(a.name[2:-1]) if a.platform == "cuda" and a.name.startswith("sm") else 0


def default_tiled_config(m: int, a: _arch.Arch) -> TiledConfig:
    """Chosen by reasoning until measured (``benchmarks/gemm.py``): a 128x128 fp8 tile pair is 32 KB of shared
    memory per stage; Hopper (and sm100) has 227 KB (3 stages), Ada about 100 KB and ROCm Triton pipelines 2."""
    hopper = _sm_major(a) >= 9
    stages = 3 if hopper else 2
    if m <= 16:
        return TiledConfig(16, 64, warps=4, stages=4 if hopper else 2)  # 10 KB per stage
    if m <= 32:
        return TiledConfig(32, 64, warps=4, stages=stages)
    if m <= 64:
        return TiledConfig(64, 64, warps=4, stages=stages)
    if m <= 256:
        return TiledConfig(64, 128, warps=4, stages=stages)
    return TiledConfig(128, 128, warps=8, stages=stages)


def _scale_strides(x_scale: torch.Tensor, w_scale: torch.Tensor, per_tensor: bool):
    if per_tensor:
        return 0, 0, 0, 0
    return x_scale.stride(0), x_scale.stride(1), w_scale.stride(0), w_scale.stride(1)


def tiled_mm(q, x_scale, w_q, w_scale, out_dtype, config: TiledConfig | None = None, per_tensor: bool = False):
    """Tiled GEMM. Block scales (``x_scale [M, K/g]``, ``w_scale [ceil(N/128), ceil(K/128)]``) or, with
    ``per_tensor``, one scale each. Inputs are assumed validated (``checks.py``)."""
    m, k = q.shape
    n = w_q.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if per_tensor:
        group_k = block_k = 128  # scales have stride 0: the group only has to be a multiple of the tile
    else:
        group_k = k // x_scale.shape[1]
        block_k = promotion_block(group_k)
    cfg = config or default_tiled_config(m, _arch.arch_of(q.device))
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _blockscale_mm_kernel[grid](
        q, w_q, out, x_scale, w_scale,
        m, n, k,
        q.stride(0), w_q.stride(0), out.stride(0),
        *_scale_strides(x_scale, w_scale, per_tensor),
        GROUP_K=group_k, SCALE_BLOCK=SCALE_BLOCK,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
        EVEN_K=k % block_k == 0,
        num_warps=cfg.warps, num_stages=cfg.stages, **pdl_kwargs(q.device),
    )  # fmt: skip
    return out
