"""The small-M block-scale GEMM with two K tiles' MMAs in flight (Hopper, Gluon): a probe of tuning idea 18.

Same contract as ``_small_m_kernels.small_m_mm`` with TMA tiles (swap-AB: a program owns ``BLOCK_N`` weight rows
and every activation row, ``acc [BLOCK_N, BLOCK_M] += (w_tile @ x_tile^T) * w_scale * x_scale`` per 128-wide K
tile), written in Gluon, where the MMA's wait is explicit. ``tl.dot`` waits for each block-scaled product before
its promotion (docs/small_m_tuning.md, idea 17: ``wgmma.wait_group 0`` after every tile in Triton 3.6's PTX), so a
program's K loop is a chain of MMA latencies. Here tile i's MMA is issued before tile i - 1's product is waited
for (``warpgroup_mma_wait(num_outstanding=1)``) and promoted: one MMA always runs beside the promotion and the
next TMA copy. The promotion is the Triton kernel's, in the same order (``acc + (part * w_s) * x_s`` per tile).

Split-K: ``MODE`` 0 writes the output (one split), 1 writes fp32 partials that ``_splitk_reduce_kernel`` sums.
Hopper only (``warpgroup_mma``); Gluon has no CPU interpreter, so the CPU tests compile it for sm_90 and check
the wait in its PTX; the GPU test and ``benchmarks/gemm_gluon.py`` check it against the fp32 oracle.
"""

from __future__ import annotations

import torch
import triton

from ... import arch as _arch
from ._small_m_kernels import SCALE_BLOCK, _splitk_reduce_kernel, split_plan

try:  # Gluon (Triton >= 3.5): absent from older Triton, and its API moves between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

BLOCK_K = 128  # one promotion per K tile: the 128-wide scale block


def available() -> bool:
    """Gluon and its Hopper MMA are importable here (the kernel still needs an sm_90 GPU to run)."""
    return gluon is not None


if gluon is not None:
    _BK = gl.constexpr(BLOCK_K)

    @gluon.jit
    def _load_stage(w_desc, x_desc, w_smem, x_smem, bars, i, kt0, n0, STAGES: gl.constexpr):
        """Start the copies of the split's tile ``i`` (K tile ``kt0 + i``) into stage ``i % STAGES``, signalled on
        that stage's barrier."""
        s = i % STAGES
        bar = bars.index(s)
        mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, (kt0 + i) * _BK], bar, w_smem.index(s))
        tma.async_copy_global_to_shared(x_desc, [0, (kt0 + i) * _BK], bar, x_smem.index(s))

    @gluon.jit
    def _mma_of(w_smem, x_smem, bars, zero, i, STAGES: gl.constexpr):
        """Wait for tile ``i``'s stage (the barrier's phase flips once per use), then start its MMA, not waited."""
        s = i % STAGES
        mbarrier.wait(bars.index(s), phase=(i // STAGES) & 1)
        return warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)

    @gluon.jit
    def _scales(ws_ptr, xs_ptr, kt, w_row, offs_m, M, stride_wsn, stride_wsk, stride_xsm, stride_xsk):
        """Tile ``kt``'s weight scale (one per program: BLOCK_N divides the 128-row scale block) and activation
        scales ``[BLOCK_M]``."""
        w_s = gl.load(ws_ptr + w_row * stride_wsn + kt * stride_wsk)
        x_s = gl.load(xs_ptr + offs_m * stride_xsm + kt * stride_xsk, mask=offs_m < M, other=0.0)
        return w_s, x_s

    @gluon.jit
    def _small_m_gluon_kernel(
        w_desc, x_desc,  # TMA descriptors: weight [N, K] fp8 (blocks [BLOCK_N, 128]), activation [M, K] fp8
        c_ptr,  # MODE 0: out [M, N], row stride stride_cm; MODE 1: fp32 partials [SPLIT, M, N] contiguous
        ws_ptr, xs_ptr,  # weight scales (n // 128, k // 128); activation scales (m, k // 128)
        M, N, stride_cm, stride_wsn, stride_wsk, stride_xsm, stride_xsk,
        k_tiles, k_tiles_per_split,
        MODE: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
        pid_n = gl.program_id(0)
        pid_s = gl.program_id(1)
        n0 = pid_n * BLOCK_N
        kt0 = pid_s * k_tiles_per_split
        n_tiles = gl.minimum(k_tiles - kt0, k_tiles_per_split)

        # wgmma: 16 weight rows per instruction step, the activation rows as its N, 32 fp8 values of K
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_M, 32])
        offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        w_row = n0 // 128

        w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, _BK], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, _BK], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        for s in gl.static_range(STAGES - 1):  # the first STAGES - 1 tiles in flight
            if s < n_tiles:
                _load_stage(w_desc, x_desc, w_smem, x_smem, bars, s, kt0, n0, STAGES)

        zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        # Tile 0's MMA, then the last free stage's copy (tile STAGES - 1).
        tok = _mma_of(w_smem, x_smem, bars, zero, 0, STAGES)
        w_s, x_s = _scales(ws_ptr, xs_ptr, kt0, w_row, offs_m, M, stride_wsn, stride_wsk, stride_xsm, stride_xsk)
        if STAGES - 1 < n_tiles:
            _load_stage(w_desc, x_desc, w_smem, x_smem, bars, STAGES - 1, kt0, n0, STAGES)
        for i in range(1, n_tiles):
            nxt = _mma_of(w_smem, x_smem, bars, zero, i, STAGES)
            w_n, x_n = _scales(ws_ptr, xs_ptr, kt0 + i, w_row, offs_m, M, stride_wsn, stride_wsk, stride_xsm,
                               stride_xsk)  # fmt: skip
            part = warpgroup_mma_wait(num_outstanding=1, deps=(tok,))  # tile i - 1's product; tile i's runs on
            acc += part * w_s * x_s[None, :]
            # tile i - 1's stage is free now that its MMA is done: refill it with tile i - 1 + STAGES
            if i - 1 + STAGES < n_tiles:
                _load_stage(w_desc, x_desc, w_smem, x_smem, bars, i - 1 + STAGES, kt0, n0, STAGES)
            tok = nxt
            w_s, x_s = w_n, x_n
        part = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        acc += part * w_s * x_s[None, :]
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))

        # acc [BLOCK_N, BLOCK_M] is out^T: rows are output columns. Stored through a layout whose threads run
        # along the output columns (the contiguous axis).
        out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, num_warps], [0, 1])
        res = gl.convert_layout(acc, out_layout)
        cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
        mask = (cols < N)[:, None] & (rows < M)[None, :]
        if MODE == 0:
            gl.store(c_ptr + rows[None, :].to(gl.int64) * stride_cm + cols[:, None], res.to(c_ptr.dtype.element_ty),
                     mask=mask)  # fmt: skip
        else:
            base = c_ptr + pid_s.to(gl.int64) * M * N
            gl.store(base + rows[None, :].to(gl.int64) * N + cols[:, None], res, mask=mask)


def small_m_gluon_mm(q, x_scale, w_q, w_scale, out_dtype, block_n: int = 64, split_k: int = 1, stages: int = 4,
                     warps: int = 4, maxnreg: int | None = None) -> torch.Tensor:  # fmt: skip
    """``small_m_mm(q, x_scale, w_q, w_scale)`` by the Gluon kernel: q [M <= 64, K] fp8, w_q [N, K] fp8, scales of
    1 x 128 / 128 x 128 blocks, K a multiple of 128. Raises where it cannot run (no Gluon, not sm_90, a layout TMA
    cannot address)."""
    if gluon is None:
        raise RuntimeError("small_m_gluon_mm needs Triton's Gluon (triton >= 3.5)")
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        raise RuntimeError("small_m_gluon_mm runs on Hopper (sm_90) only: warpgroup_mma")
    m, k = q.shape
    n = w_q.shape[0]
    if m > 64 or k % BLOCK_K or 128 % block_n or x_scale.shape[1] * BLOCK_K != k:
        raise ValueError(f"small_m_gluon_mm: M <= 64, K % 128 == 0, block_n | 128, group 128; got M={m}, K={k}, "
                         f"block_n={block_n}, scale {tuple(x_scale.shape)}")  # fmt: skip
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    fp8 = gl.float8e4nv if q.dtype == torch.float8_e4m3fn else None
    if fp8 is None or w_q.dtype != q.dtype:
        raise ValueError(f"small_m_gluon_mm takes float8_e4m3fn operands, got {q.dtype} / {w_q.dtype}")
    w_desc = GluonDescriptor.from_tensor(w_q, [block_n, BLOCK_K], gl.NVMMASharedLayout.get_default_for(
        [block_n, BLOCK_K], fp8))  # fmt: skip
    x_desc = GluonDescriptor.from_tensor(q, [block_m, BLOCK_K], gl.NVMMASharedLayout.get_default_for(
        [block_m, BLOCK_K], fp8))  # fmt: skip
    split, per_split, _ = split_plan(k // BLOCK_K, split_k, 1)
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=q.device)
    _small_m_gluon_kernel[(triton.cdiv(n, block_n), split)](
        w_desc, x_desc, target, w_scale, x_scale, m, n, out.stride(0), *w_scale.stride(), *x_scale.stride(),
        k // BLOCK_K, per_split, MODE=0 if split == 1 else 1, STAGES=stages, num_warps=warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](target, out, m * n, split, BLOCK=block,
                                                            EMULATE_CAST=_arch.triton_interpreting(), PDL=False,
                                                            num_warps=4)  # fmt: skip
    return out


assert SCALE_BLOCK == 128  # the weight-scale block the kernel's w_row assumes
