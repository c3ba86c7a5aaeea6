"""``blockscale_mm_silu_mul_group_quant`` on the Triton backend: the gate/up GEMM with the down projection's input
quant in its epilogue, where that measured faster than the two launches it replaces; else exactly those two.

Choice per (arch, M bucket, I, K): the config in ``TABLE`` (measured by ``benchmarks/gemm_silu_quant.py`` on the
GPU), else the unfused pair: where the table has None (the pair won or tied), no row (never measured: 2 of the 3
measured shapes showed no gain, so an unmeasured one is not assumed to gain), or M > ``SMALL_M_MAX``. On the H200
the swap-AB fused launch won only where its GEMM tiling is also the better GEMM (Qwen3-32B and Llama-3.1-8B at
M = 16 / 32, with TMA tiles but for Qwen3-32B at 32); at M = 33-64 the launch with the activation rows on the MMA's
M side (``SmallMConfig.swap`` False) won on all three measured shapes: see the table's comment.

The fused launch is ``_small_m_silu_kernels.py`` (a ``SmallMConfig`` row) or, for M <= ``GEMV_MAX_M``, the GEMV
with the same epilogue, ``_gemv_silu_kernels.py`` (a ``GemvConfig`` row); the unfused pair is ``blockscale_mm`` (or
``blockscale_mm_grouped`` for separate gate / up weights) then ``silu_mul_group_quant``, the graph the pass started
from, so a shape the fused kernel cannot take computes the same thing.
"""

from __future__ import annotations

import torch

from ... import arch as _arch
from .. import checks
from . import blockscale_mm as _bm
from ._blockscale_kernels import SCALE_BLOCK
from ._gemv_kernels import GEMV_MAX_M, GemvConfig
from ._gemv_silu_kernels import gemv_silu_quant
from ._gemv_silu_kernels import unsupported as gemv_unsupported
from ._small_m_kernels import SmallMConfig
from ._small_m_silu_kernels import small_m_mm_silu_quant, unsupported
from .blockscale_mm_grouped import blockscale_mm_grouped
from .silu_mul_group_quant import silu_mul_group_quant

OP = "blockscale_mm_silu_mul_group_quant"
SMALL_M_MAX = _bm.SMALL_M_MAX

# (arch name, M bucket, I, K) -> the fused launch's config (a GemvConfig: the GEMV's, M <= GEMV_MAX_M), or None
# where the unfused pair was faster.
# fmt: off
TABLE: dict[tuple[str, int, int, int], SmallMConfig | GemvConfig | None] = {
    # Measured 2026-12-01 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0, copy 4.25 TB/s) by
    # `python benchmarks/gemm_silu_quant.py --ms 4,16,32,64` (the gate_up shapes of Qwen3-8B, Llama-3.1-8B,
    # Qwen3-32B), on the tree of commit c686824 with the TMA pair (`_k_loop_pair`): 14 families, 6 of them TMA,
    # against the unfused pair whose plain GEMM has the TMA rows of `blockscale_mm.TABLE`. A config where the
    # fused launch beat the unfused pair by more than 2%, else None. TMA took the fused launch's best at Llama-3.1-8B
    # M = 4-64 and Qwen3-32B M = 16 / 64; it won over the pair at Llama M = 16 / 32 (0.96x) and Qwen3-32B M = 16
    # (0.98x); Qwen3-32B M = 32 keeps the pointer tile (0.96x). On Qwen3-8B the fused launch ties the pair at M = 4-32
    # and loses at M = 64 (35.0 vs 32.0 us): 192 programs of 128 weight rows, where the pair's GEMM runs 384 of 64.
    # M = 1: from an earlier run (`--ms 1,4`, same day, GPU, commit c4c11cb), the first with the GEMV and the
    # same epilogue (_gemv_silu_kernels.py) in the sweep; the best fused config, swap-AB or GEMV, in the comment.
    # M = 1 again on 2026-12-04 (same GPU and versions, copy 4.28 TB/s), `python benchmarks/gemm_silu_quant.py
    # --ms 1 --gemv-only --gemv-wide` on the tree of 8b1d52a (28 GEMV configs, 2 warps and 2048-value chunks too),
    # after blockscale_mm's wider GEMV rows: the pair got faster, the fused GEMV did not. Its best against the pair:
    # 30.0 / 26.9 us (Qwen3-8B), 32.6 / 31.3 (Llama-3.1-8B), 67.3 / 64.2 (Qwen3-32B), so the rows stay None. The
    # group ticket is most of the gap (docs/benchmarks.md, "The SiLU-quant GEMV at one row, again"). With gate and
    # up as one tile (7b9b18e, same command and day): 28.4 / 26.7, 31.7 / 30.7, 63.5 / 62.8 us: still None.
    # M = 64 again on 2026-12-04 (same GPU and versions, copy 4.28 TB/s), `python benchmarks/gemm_silu_quant.py --ms
    # 16,32,64 --noswap` on the tree of 501bef5: with the activation rows on the MMA's M side (`swap` False, TMA) the
    # fused launch beat the pair at all three shapes (2.0-4.8%), so the M = 64 rows name it; at M = 16 / 32 it did
    # not beat the committed rows. In the decode step at batch 64 (docs/benchmarks.md, fifteenth session) the pass
    # with these rows ran 1.204 / 1.258 / 1.165x against 1.186 / 1.256 / 1.147x without `gemm_silu_quant`.
    # fused 30.1 us (GEMV rows 8) vs unfused 28.2 us (the GEMV, then the silu-quant), roofline 23.5 us
    ('sm90', 1, 12288, 4096): None,
    # fused 27.8 us vs unfused 28.0 us, roofline 23.7 us
    ('sm90', 4, 12288, 4096): None,
    # fused 28.3 us vs unfused 28.5 us, roofline 23.7 us
    ('sm90', 16, 12288, 4096): None,
    # fused 30.1 us vs unfused 30.0 us, roofline 23.8 us
    ('sm90', 32, 12288, 4096): None,
    # fused 30.7 us (TMA, the activation rows on the MMA's M side) vs unfused 31.4 us, roofline 23.8 us (run of
    # 501bef5; 35.0 vs 32.0 us with the swap-AB tile)
    ('sm90', 64, 12288, 4096): SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False),
    # fused 32.7 us (GEMV rows 8) vs unfused 33.5 us, roofline 27.4 us (run of c4c11cb). Not taken: inside the
    # decode step (profile_step.py, 4 layers, batch 1, commit bf8bd40) the fused GEMV took 32.5 us per layer where
    # the GEMV and the silu-quant took 30.6 + 1.4 us.
    ('sm90', 1, 14336, 4096): None,
    # fused 31.6 us (TMA) vs unfused 32.1 us, roofline 27.6 us
    ('sm90', 4, 14336, 4096): None,
    # fused 31.9 us vs unfused 33.1 us, roofline 27.7 us
    ('sm90', 16, 14336, 4096): SmallMConfig(128, 1, 4, 4, 'last', 1, False, True),
    # fused 33.3 us vs unfused 34.6 us, roofline 27.8 us
    ('sm90', 32, 14336, 4096): SmallMConfig(128, 1, 4, 4, 'last', 1, False, True),
    # fused 34.8 us (TMA, the activation rows on the MMA's M side) vs unfused 36.5 us, roofline 27.7 us (run of
    # 501bef5; 37.4 vs 37.4 us with the swap-AB tile)
    ('sm90', 64, 14336, 4096): SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False),
    # fused 67.7 us (swap-AB; the GEMV's best 67.9) vs unfused 66.6 us, roofline 61.2 us (run of c4c11cb)
    ('sm90', 1, 25600, 5120): None,
    # fused 66.7 us vs unfused 67.4 us, roofline 61.7 us (the run of 56c68d2: 67.9 vs 71.2, then taken)
    ('sm90', 4, 25600, 5120): None,
    # fused 66.5 us vs unfused 67.9 us, roofline 61.8 us
    ('sm90', 16, 25600, 5120): SmallMConfig(128, 1, 4, 3, 'last', 1, False, True),
    # fused 68.1 us vs unfused 70.7 us, roofline 61.9 us
    ('sm90', 32, 25600, 5120): SmallMConfig(128, 1, 4, 3, 'last'),
    # fused 75.1 us (TMA, the activation rows on the MMA's M side) vs unfused 76.8 us, roofline 61.7 us (run of
    # 501bef5; 84.0 vs 80.3 us with the swap-AB tile)
    ('sm90', 64, 25600, 5120): SmallMConfig(128, 1, 4, 4, 'last', 1, False, True, 0, False),
}
# fmt: on


def _gate_up(w_qs, w_scales):
    """(gate, gate scales, up, up scales) as views, or None when the halves of a merged weight share a weight
    block row (I not a multiple of 128) or gate and up are laid out differently."""
    if len(w_qs) == 2:
        parts = (w_qs[0], w_scales[0], w_qs[1], w_scales[1])
    else:
        w, s = w_qs[0], w_scales[0]
        i = w.shape[0] // 2
        if i % SCALE_BLOCK:
            return None
        parts = (w[:i], s[: i // SCALE_BLOCK], w[i:], s[i // SCALE_BLOCK:])
    wg, sg, wu, su = parts
    if wg.stride() != wu.stride() or sg.stride() != su.stride() or wg.stride(1) != 1:
        return None
    return parts


def fused_config(a: _arch.Arch, device_type: str, fp8: torch.dtype, m: int, i: int, k: int, group_k: int,
                 group_size: int, out_dtype: torch.dtype) -> SmallMConfig | GemvConfig | None:
    """The fused launch's measured config for this GEMM, or None when the unfused pair runs (no TABLE row, the
    row's None, M above the small-M range, or a shape / device the kernel cannot take). Pure: no tensors."""
    if m > SMALL_M_MAX or _bm.unsupported("small_m", a, device_type, fp8, 2 * i, k, group_k, out_dtype):
        return None
    config = TABLE.get((a.name, _bm.m_bucket(m), i, k))
    if isinstance(config, GemvConfig):
        return config if m <= GEMV_MAX_M and gemv_unsupported(m, k, group_k, i, group_size, config) is None else None
    if config is None or unsupported(i, group_size, config) is not None:
        return None
    return config


def measured(a: _arch.Arch, m: int, i: int, k: int) -> bool:
    """Has ``TABLE`` a row (a config or None) for this GEMM: for the report's wording."""
    return (a.name, _bm.m_bucket(m), i, k) in TABLE


def layout_unsupported(w_qs, w_scales) -> str | None:
    """Why the fused kernel cannot read these gate / up weights in place (None when it can); fake tensors do."""
    if _gate_up(w_qs, w_scales) is not None:
        return None
    if len(w_qs) == 1:
        return (f"the merged weight's halves share a 128-row scale block (I = {w_qs[0].shape[0] // 2} is not a "
                "multiple of 128)")  # fmt: skip
    return "gate and up are laid out differently (strides), or not K-contiguous"


def blockscale_mm_silu_mul_group_quant(q, x_scale, w_qs, w_scales, out_dtype: torch.dtype, group_size: int = 128):
    """``(q_out [M, I] fp8, scale [M, I / group_size] fp32)`` = ``silu_mul_group_quant`` of the gate/up GEMM."""
    i = checks.gate_up_mm_args(OP, q, x_scale, w_qs, w_scales, out_dtype, group_size)
    m, k = q.shape
    config = fused_config(_arch.arch_of(q.device), q.device.type, q.dtype, m, i, k, k // x_scale.shape[1],
                          group_size, out_dtype)  # fmt: skip
    parts = _gate_up(w_qs, w_scales) if config is not None else None
    if parts is not None:
        launch = gemv_silu_quant if isinstance(config, GemvConfig) else small_m_mm_silu_quant
        out = launch(q, x_scale, *parts, out_dtype, group_size, config)
        if out is not None:
            return out
    if len(w_qs) == 1:
        y = _bm.blockscale_mm(q, x_scale, w_qs[0], w_scales[0], out_dtype)
    else:
        y = blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype)
    return silu_mul_group_quant(y, group_size)
