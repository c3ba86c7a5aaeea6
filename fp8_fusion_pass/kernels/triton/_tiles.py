"""Tile shapes for the memory-bound kernels, and the small helpers every launcher shares.

Every kernel here works on 3-D tiles ``[BLOCK_M rows, GPC groups, G columns]``: G contiguous columns are one
quant group (or, for the unquantized ops, one column block), so each group's amax is a reduction over the last
axis and no reshape is needed. G >= 64 bf16 values gives each thread 16-byte vector loads (8 x bf16).

Why these numbers (H200: 132 SMs, 64 warps / SM, 64K registers / SM, 50 MB L2, 4.28 TB/s measured copy rate):
- Issue budget. At the roofline a norm + quant moves 3 bytes per value (2 in, 1 out): 1.43e12 values/s, against
  132 SMs x 128 lanes x 1.98 GHz = 33.4e12 lane-instructions/s: ~23 SASS instructions per value (~29 at the
  1.25x target); group_quant the same, silu + quant (5 bytes per value) ~39. The first GPU round's kernels sat
  at or past that limit, counted in their sm_90 SASS (offline: Triton 3.6 + ptxas + nvdisasm, no GPU):
  ``REFERENCE_COUNTS``. The fixes: an exact scale from a constant reciprocal, no select and (NVIDIA) no software
  clamp in the quant step (``_fp8.py``); negations Triton emitted as ``0 - x`` (3 FADD per value) written as
  ``x * -1``; w loaded in the x tile's layout and per-row scalars for one-row blocks (no shared-memory layout
  conversions of the row); ex2 / rcp.approx.ftz in silu; and ``VALUES_PER_THREAD`` = 32, which spreads the
  per-row (sum reduction, two ``div.rn`` and a ``sqrt.rn``: ~90 instructions) and per-group (~20) work over
  twice the values: 16.8 instead of 19.6 per value at K=4096, for ~96 registers.
- Latency. Little's law: ~4.8 TB/s x ~0.7 us loaded DRAM latency ~ 3.4 MB in flight, ~26 KB per SM. The norm's
  one-pass programs are persistent (as many per SM as fit: ``resident_programs`` reads the compiled kernel's
  registers; a grid larger than that would run its last programs as a second, serial wave) and ``prefetch`` the
  next row block while normalising the current one: 5 resident 4-warp programs at K=4096 keep 5 x 8 KB in
  flight. w is loaded once per program (it was re-read from L2 for every 2 rows). The per-group kernels hold
  4096 values per program (16 KB of silu input), ~9 programs resident per SM at ~56 registers.
- ``TARGET_PROGRAMS`` = 264 (2 per SM): for the per-group kernels at small M the tile shrinks (rows first, then
  groups) until the grid covers the GPU twice; below that the kernel is launch-bound (~3 us) whatever the tile.
- A row stays in registers (``one_pass``) when its group count is a power of two or the sum of two (K = 5120:
  32 + 8 groups, a main and a ``tail`` tile; padding 40 groups to 64, aiter's way, spends 60% more ALU on dead
  lanes). Other rows loop over exact 1024-column chunks twice (``one_pass=False``): the second pass re-reads the
  row from L2, not HBM.
Under the CPU interpreter (``TRITON_INTERPRET=1``) every program or loop step costs ~25 ms of Python whatever its
size (K=5120, M=17: 680 one-group programs took 17 s), so there the tiles grow to ``INTERPRETER_TILE`` and a
program takes one block; the GPU tiles are exercised there through the ``tile=`` override in the tests.
These defaults are predictions from the counts above; ``benchmarks/fused_kernels.py --sweep`` times the alternatives on
the GPU and prints the winners as ``MEASURED`` entries to paste below (they take precedence at group size 128).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton

from ... import arch

TILE = 4096  # elements per program of the per-group kernels at large M (see module docstring)
VALUES_PER_THREAD = 32
MIN_WARPS = 4  # norm blocks take more rows (K < 4096) until they fill 4 warps
MAX_PER_SM = 32  # persistent norm programs per SM: an upper bound, capped by what fits (resident_programs)
FIRST_GUESS_PER_SM = 2  # before the first launch of a kernel variant tells its registers
TARGET_PROGRAMS = 264  # 2 programs per SM on a 132-SM H200
MAX_ONE_PASS_K = 8192  # longest row kept in registers: 16 warps x 32 threads x 16 values
CHUNK = 1024  # columns per step of the two-pass row loop: divides 5120, 25600, 12288, 14336, 28672
INTERPRETER_TILE = 1 << 15  # elements per program under TRITON_INTERPRET=1 (numpy: size is cheap, count is not)
MIN_EFFICIENCY = 0.875  # accept a group chunk if at most 1/8 of its lanes are masked past the row end
BUCKETS = ((64, "small"), (1024, "mid"))  # M <= 64: decode; <= 1024: mid; else "large" (prefill)

# SASS instructions per value, sm_90, Triton 3.6, counted offline (ptxas + nvdisasm of the compiled kernels, no
# GPU): round 1 = the first GPU round's kernels and tiles (whole kernel / values per thread; norm: 1 row x 8 warps
# and 2 rows x 16 warps), now = the default tiles (norm: the steady-state loop body, K=4096 and K=5120; the
# per-group kernels: whole kernel, 4096 values at 4 warps). Budget at the roofline: 23 / 23.6 / 39.
REFERENCE_COUNTS = {
    "rms_norm_group_quant K=4096": {"round 1": (34.9, 40.5), "now": 16.8},
    "rms_norm_group_quant K=5120": {"round 1": (39.2, 48.5), "now": 17.6},
    "group_quant": {"round 1": 23.4, "now": 13.9},
    "silu_mul_group_quant": {"round 1": 39.1, "now": 22.4},
}


@dataclasses.dataclass(frozen=True)
class Tile:
    block_m: int  # rows per block
    gpc: int  # groups (column blocks of G) per program step
    num_warps: int
    one_pass: bool = True  # row kernels: the whole row is one step, kept in registers
    tail: int = 0  # row kernels, one_pass: a second tile of this many groups after the first GPC (K = 5120)
    per_sm: int = 0  # row kernels, one_pass: at most this many persistent programs per SM (0: one per row block)
    prefetch: bool = False  # row kernels, one_pass: load the next row block before normalising the current one
    split: int = 1  # row kernels, one_pass, block_m 1: programs per row (``SPLIT_ROWS``), each normalising a slice

    def as_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "GPC": self.gpc, "num_warps": self.num_warps}


# Measured winners, pasted from ``benchmarks/fused_kernels.py --sweep`` (H200): (op, K, M bucket) -> Tile,
# group size 128.
# op: "rms_norm" (also serves rms_norm_group_quant and the unquantized norm: one reduction order),
# "add_rms_norm", "silu_mul", "group_quant". Empty until the first sweep: the defaults below apply.
# Measured 2026-12-01 on one NVIDIA H200 (torch 2.11.0+cu130, Triton 3.6.0, copy 4.28 TB/s) by
# `python benchmarks/fused_kernels.py --sweep --sizes 1024,2048,4096,5120,8192,3072,6144,12288,14336,25600,28672`
# (M 8192, 2048, 256, 16; the fused ops only: group_quant keeps its defaults). One row tile serves the fused
# and the unquantized norm, so both reduce in the same order.
MEASURED: dict[tuple[str, int, str], Tile] = {
    # M=8192: 14.9 us, 1.08x roofline (default tile 14.9 us)
    # M=2048: 5.2 us, 1.52x roofline (default tile 5.8 us)
    ("add_rms_norm", 1024, "large"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=256: 2.4 us, 5.51x roofline (default tile 2.6 us)
    ("add_rms_norm", 1024, "mid"):
        Tile(block_m=1, gpc=8, num_warps=2, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=16: 1.8 us, 64.95x roofline (default tile 2.1 us)
    ("add_rms_norm", 1024, "small"):
        Tile(block_m=1, gpc=8, num_warps=2, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=8192: 32.1 us, 1.16x roofline (default tile 34.4 us)
    # M=2048: 8.3 us, 1.21x roofline (default tile 8.5 us)
    ("add_rms_norm", 2048, "large"):
        Tile(block_m=1, gpc=16, num_warps=2, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=256: 2.8 us, 3.23x roofline (default tile 3.0 us)
    ("add_rms_norm", 2048, "mid"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=16: 1.9 us, 34.12x roofline (default tile 2.2 us)
    ("add_rms_norm", 2048, "small"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=8192: 62.7 us, 1.14x roofline (default tile 65.6 us)
    # M=2048: 15.0 us, 1.09x roofline (default tile 15.4 us)
    ("add_rms_norm", 4096, "large"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 3.7 us, 2.14x roofline (default tile 3.8 us)
    ("add_rms_norm", 4096, "mid"):
        Tile(block_m=1, gpc=32, num_warps=8, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=16: 2.2 us, 19.95x roofline (default tile 2.2 us)
    ("add_rms_norm", 4096, "small"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=8192: 78.4 us, 1.14x roofline (default tile 79.2 us)
    # M=2048: 19.5 us, 1.13x roofline (default tile 19.8 us)
    ("add_rms_norm", 5120, "large"):
        Tile(block_m=1, gpc=32, num_warps=8, one_pass=True, tail=8, per_sm=2, prefetch=True),
    # M=256: 4.5 us, 2.10x roofline (default tile 4.5 us)
    ("add_rms_norm", 5120, "mid"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=8, per_sm=2, prefetch=True),
    # M=16: 2.5 us, 18.54x roofline (default tile 2.5 us)
    ("add_rms_norm", 5120, "small"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=8, per_sm=32, prefetch=True),
    # M=8192: 120.8 us, 1.09x roofline (default tile 128.6 us)
    # M=2048: 33.3 us, 1.21x roofline (default tile 34.3 us)
    ("add_rms_norm", 8192, "large"):
        Tile(block_m=1, gpc=64, num_warps=8, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 5.4 us, 1.58x roofline (default tile 5.7 us)
    ("add_rms_norm", 8192, "mid"):
        Tile(block_m=1, gpc=64, num_warps=8, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 2.9 us, 13.23x roofline (default tile 3.0 us)
    ("add_rms_norm", 8192, "small"):
        Tile(block_m=1, gpc=64, num_warps=8, one_pass=True, tail=0, per_sm=32, prefetch=False),
    # M=8192: 8.4 us, 1.41x roofline (default tile 8.5 us)
    # M=2048: 3.8 us, 2.58x roofline (default tile 4.0 us)
    ("rms_norm", 1024, "large"):
        Tile(block_m=1, gpc=8, num_warps=2, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=256: 2.0 us, 10.98x roofline (default tile 2.3 us)
    ("rms_norm", 1024, "mid"):
        Tile(block_m=1, gpc=8, num_warps=2, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=16: 1.7 us, 142.94x roofline (default tile 1.9 us)
    ("rms_norm", 1024, "small"):
        Tile(block_m=1, gpc=8, num_warps=2, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=8192: 14.5 us, 1.22x roofline (default tile 14.1 us)
    # M=2048: 5.6 us, 1.90x roofline (default tile 5.9 us)
    ("rms_norm", 2048, "large"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=256: 2.4 us, 6.47x roofline (default tile 2.6 us)
    ("rms_norm", 2048, "mid"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=16: 1.8 us, 73.62x roofline (default tile 2.0 us)
    ("rms_norm", 2048, "small"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=8192: 28.2 us, 1.19x roofline (default tile 28.2 us)
    # M=2048: 8.3 us, 1.40x roofline (default tile 8.3 us)
    ("rms_norm", 4096, "large"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=256: 2.9 us, 3.92x roofline (default tile 3.0 us)
    ("rms_norm", 4096, "mid"):
        Tile(block_m=1, gpc=32, num_warps=8, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=16: 2.0 us, 41.45x roofline (default tile 2.0 us)
    ("rms_norm", 4096, "small"):
        Tile(block_m=1, gpc=32, num_warps=8, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=8192: 35.2 us, 1.18x roofline (default tile 35.2 us)
    # M=2048: 10.4 us, 1.40x roofline (default tile 10.4 us)
    ("rms_norm", 5120, "large"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=8, per_sm=32, prefetch=True),
    # M=256: 3.5 us, 3.76x roofline (default tile 3.5 us)
    ("rms_norm", 5120, "mid"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=8, per_sm=2, prefetch=True),
    # M=16: 2.3 us, 38.43x roofline (default tile 2.3 us)
    ("rms_norm", 5120, "small"):
        Tile(block_m=1, gpc=32, num_warps=4, one_pass=True, tail=8, per_sm=32, prefetch=True),
    # M=8192: 56.4 us, 1.19x roofline (default tile 56.5 us)
    # M=2048: 14.9 us, 1.25x roofline (default tile 14.9 us)
    ("rms_norm", 8192, "large"):
        Tile(block_m=1, gpc=64, num_warps=8, one_pass=True, tail=0, per_sm=2, prefetch=True),
    # M=256: 4.0 us, 2.67x roofline (default tile 4.0 us)
    ("rms_norm", 8192, "mid"):
        Tile(block_m=1, gpc=64, num_warps=16, one_pass=True, tail=0, per_sm=32, prefetch=True),
    # M=16: 2.4 us, 24.74x roofline (default tile 2.5 us)
    ("rms_norm", 8192, "small"):
        Tile(block_m=1, gpc=64, num_warps=8, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 30.1 us, 1.02x roofline (default tile 31.2 us)
    # M=2048: 9.2 us, 1.25x roofline (default tile 9.3 us)
    ("silu_mul", 3072, "large"):
        Tile(block_m=4, gpc=8, num_warps=8, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 2.8 us, 2.98x roofline (default tile 3.2 us)
    ("silu_mul", 3072, "mid"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 1.5 us, 25.69x roofline (default tile 1.6 us)
    ("silu_mul", 3072, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 64.7 us, 1.09x roofline (default tile 69.3 us)
    # M=2048: 15.4 us, 1.04x roofline (default tile 15.6 us)
    ("silu_mul", 6144, "large"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 3.8 us, 2.04x roofline (default tile 3.9 us)
    ("silu_mul", 6144, "mid"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 1.6 us, 13.54x roofline (default tile 1.7 us)
    ("silu_mul", 6144, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 129.3 us, 1.09x roofline (default tile 129.3 us)
    # M=2048: 29.8 us, 1.01x roofline (default tile 29.8 us)
    ("silu_mul", 12288, "large"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 5.2 us, 1.42x roofline (default tile 5.7 us)
    ("silu_mul", 12288, "mid"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 2.0 us, 8.53x roofline (default tile 2.0 us)
    ("silu_mul", 12288, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 147.6 us, 1.07x roofline (default tile 149.9 us)
    # M=2048: 36.0 us, 1.04x roofline (default tile 35.7 us)
    ("silu_mul", 14336, "large"):
        Tile(block_m=1, gpc=64, num_warps=16, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 5.8 us, 1.34x roofline (default tile 6.7 us)
    ("silu_mul", 14336, "mid"):
        Tile(block_m=2, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 2.0 us, 7.51x roofline (default tile 2.1 us)
    ("silu_mul", 14336, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 268.5 us, 1.09x roofline (default tile 268.5 us)
    # M=2048: 67.9 us, 1.10x roofline (default tile 67.9 us)
    ("silu_mul", 25600, "large"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 9.0 us, 1.17x roofline (default tile 10.4 us)
    ("silu_mul", 25600, "mid"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 2.3 us, 4.74x roofline (default tile 2.4 us)
    ("silu_mul", 25600, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=8192: 300.0 us, 1.09x roofline (default tile 300.0 us)
    # M=2048: 75.2 us, 1.09x roofline (default tile 75.2 us)
    ("silu_mul", 28672, "large"):
        Tile(block_m=1, gpc=16, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=256: 9.8 us, 1.13x roofline (default tile 10.9 us)
    ("silu_mul", 28672, "mid"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
    # M=16: 2.3 us, 4.30x roofline (default tile 2.5 us)
    ("silu_mul", 28672, "small"):
        Tile(block_m=1, gpc=8, num_warps=4, one_pass=True, tail=0, per_sm=0, prefetch=False),
}

# A row over several programs at decode sizes (``_rms_norm_kernel``'s SPLIT): each program sums the squares of the
# whole row (the one-pass tiles, so the same order and the same rstd) and normalises and quantizes (GPC + TAIL) /
# split groups of it. At one row the one-pass program does all of a row's per-value work on one SM: 17.6 SASS
# instructions per value at K = 5120 (``REFERENCE_COUNTS``), ~0.35 us of issue there, and the fused norm ran
# 1.29-1.76x a plain read of its bytes at K = 4096-8192 on the H200 (2.3 us against 1.4 at K = 5120 with the
# residual add; the silu-quant, whose grid spreads a row over many programs, 1.0x). Split, the repeated sum costs
# a few instructions per value and the rest divides by ``split``: sm_90 PTX per thread (Triton 3.9, offline, 4
# warps, K = 5120 with the residual) 912 instructions for the one-pass program, 487 / 424 split 5 / 10 ways.
# Predicted 0.2-0.3 us less per launch at K = 4096-8192, two launches per decoder layer (Qwen3-32B at batch 1:
# ~30 us a step, where 1.10x lacked 7 us on 2026-12-05). Built 2026-12-05 and checked on the CPU (bit for bit
# the one-pass program) and offline for sm_90. Timed on the H200 (2026-12-05, docs/benchmarks.md, "A decode row
# over several programs"): 3-22% off the fused norm launch at 8 of 12 points, but Qwen3-32B's decode step at batch 1
# was 9.242 ms with the sweep's 4 rows against 9.234 ms without (1.101x / 1.102x): the per-launch gain does not
# reach the step, so the table stays empty. ``benchmarks/fused_kernels.py --sweep --ms 1,4`` times the split tiles
# and prints the rows to paste for another GPU. (op, K) -> Tile, for M <= SPLIT_MAX_M.
SPLIT_MAX_M = 4
SPLIT_ROWS: dict[tuple[str, int], Tile] = {}


def check_split(tile: Tile, k: int, g: int) -> None:
    """A split tile must be a one-pass, one-row tile whose groups divide into power-of-two slices."""
    groups = tile.gpc + tile.tail
    gps = groups // tile.split if tile.split > 0 else 0
    if not (tile.one_pass and tile.block_m == 1 and tile.split > 1 and groups > 0
            and groups % tile.split == 0 and gps & (gps - 1) == 0 and groups * g >= k):
        raise ValueError(f"{tile}: a row split over programs needs a one-pass tile of one row whose "
                         f"{groups} groups divide into {tile.split} power-of-two slices (K={k}, G={g})")


def bucket_of(m: int) -> str:
    return next((name for limit, name in BUCKETS if m <= limit), "large")


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def one_pass_groups(k: int, g: int) -> tuple[int, int] | None:
    """(main, tail) group counts when the one-pass norm keeps a row of K in registers: a power-of-two main part and
    a tail that is 0 or a power of two (each a ``tl.arange``); None when the row takes the two-pass kernel."""
    n_groups = triton.cdiv(k, g)
    main = _pow2_floor(n_groups)
    tail = n_groups - main
    if k > MAX_ONE_PASS_K or (tail and tail & (tail - 1)):
        return None
    return main, tail


def _warps(elements: int, per_thread: int = VALUES_PER_THREAD) -> int:
    return max(1, min(16, _pow2_floor(elements // (32 * per_thread))))  # Triton wants a power of two


def _group_chunk(n_groups: int, max_groups: int) -> int:
    """Largest power-of-two group count <= max_groups whose chunks waste at most 1/8 of their lanes."""
    gpc = _pow2_floor(max_groups)
    while gpc > 1 and n_groups / (triton.cdiv(n_groups, gpc) * gpc) < MIN_EFFICIENCY:
        gpc //= 2
    return gpc


def _budget() -> tuple[int, int]:
    """(elements per program, programs wanted) for the device this process launches on."""
    return (INTERPRETER_TILE, 1) if arch.triton_interpreting() else (TILE, TARGET_PROGRAMS)


def _measured(op: str, m: int, k: int, g: int) -> Tile | None:
    if g != 128 or arch.triton_interpreting():
        return None
    return MEASURED.get((op, k, bucket_of(m)))


@functools.cache
def _device(index: int):
    return torch.cuda.get_device_properties(index)


# launch key -> persistent programs per SM that fit, from the first launch's compiled kernel (registers, shared
# memory): the programs of a persistent grid must all be resident, else the last ones run as a second wave.
_RESIDENT: dict[tuple, int] = {}


def resident_programs(compiled, num_warps: int, device: torch.device) -> int | None:
    """Programs of ``compiled`` (a Triton CompiledKernel) that fit on one SM at once; None if unknown."""
    regs = getattr(compiled, "n_regs", None)
    if not regs or device.type != "cuda" or torch.version.hip is not None:  # NVIDIA register files only
        return None
    props = _device(device.index if device.index is not None else 0)
    warps_per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // 32
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    warp_regs = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
    shared = getattr(getattr(compiled, "metadata", None), "shared", 0) or 0
    fits = [regs_per_sm // warp_regs // num_warps, warps_per_sm // num_warps, 32]
    if shared:
        fits.append(smem_per_sm // (shared + 1024))  # 1 KB reserved per block
    return max(1, min(fits))


def note_resident(key: tuple, compiled, tile: Tile, device: torch.device) -> None:
    if tile.per_sm > 0 and key not in _RESIDENT:
        fit = resident_programs(compiled, tile.num_warps, device)
        if fit is not None:
            _RESIDENT[key] = fit


def programs(tile: Tile, m: int, device: torch.device, key: tuple = ()) -> int:
    """Grid of a row kernel: one program per row block, or per_sm (capped by what fits) x SMs persistent ones."""
    blocks = triton.cdiv(m, tile.block_m)
    if tile.per_sm <= 0 or device.type != "cuda" or arch.triton_interpreting():
        return blocks
    per_sm = min(tile.per_sm, _RESIDENT.get(key, FIRST_GUESS_PER_SM))
    return min(blocks, per_sm * _device(device.index if device.index is not None else 0).multi_processor_count)


def row_tile(m: int, k: int, g: int, residual: bool = False, quant: bool = True) -> Tile:
    """Tile of the norm kernels (one program owns whole rows). Independent of the quant flag, so the fused and
    the unfused norm reduce in the same order (fused vs unfused is then bit-exact), but for ``SPLIT_ROWS``: a split
    keeps that order, and its rows are measured on the fused norms only, so the unquantized norm (what a compile
    without the pass runs) keeps its one-program row until a sweep times it."""
    op = "add_rms_norm" if residual else "rms_norm"
    if quant and m <= SPLIT_MAX_M and g == 128 and not arch.triton_interpreting() and (op, k) in SPLIT_ROWS:
        return SPLIT_ROWS[(op, k)]
    measured = _measured(op, m, k, g)
    if measured is not None:
        return measured
    tile, target = _budget()
    one_pass = one_pass_groups(k, g)
    if one_pass is not None:
        main, tail = one_pass
        row = (main + tail) * g
        if tile != TILE:  # interpreter: as many rows per block as fit, one block per program
            block_m = min(_pow2_floor(max(1, tile // row)), triton.next_power_of_2(m))
            return Tile(block_m, main, 4, one_pass=True, tail=tail)
        block_m = max(1, _pow2_floor(VALUES_PER_THREAD * 32 * MIN_WARPS // row))
        block_m = min(block_m, triton.next_power_of_2(m))
        warps = max(1, min(16, _pow2_floor(block_m * main * g // (32 * VALUES_PER_THREAD))))
        return Tile(block_m, main, warps, one_pass=True, tail=tail, per_sm=MAX_PER_SM, prefetch=True)
    n_groups = triton.cdiv(k, g)
    gpc = _group_chunk(n_groups, max(1, CHUNK // g))
    block_m = max(1, min(tile // TILE * 4, triton.next_power_of_2(m)))
    while block_m > 1 and triton.cdiv(m, block_m) < target:
        block_m //= 2
    return Tile(block_m, gpc, _warps(block_m * gpc * g), one_pass=False)


def elementwise_tile(m: int, n_groups: int, g: int, op: str = "group_quant") -> Tile:
    """Tile of the per-group kernels (group quant, silu-mul): grid (row blocks, group chunks)."""
    measured = _measured(op, m, n_groups * g, g)
    if measured is not None:
        return measured
    tile, target = _budget()
    budget = max(1, tile // g)
    gpc = _group_chunk(n_groups, min(budget, triton.next_power_of_2(n_groups)))
    block_m = min(max(1, budget // gpc), triton.next_power_of_2(m))
    while block_m > 1 and triton.cdiv(m, block_m) * triton.cdiv(n_groups, gpc) < target:
        block_m //= 2
    while gpc > 1 and triton.cdiv(m, block_m) * triton.cdiv(n_groups, gpc) < target:
        gpc //= 2
    return Tile(block_m, gpc, _warps(block_m * gpc * g), one_pass=True)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as [M, K] with unit column stride (a view when the leading dims allow it, else a copy)."""
    return x.reshape(-1, x.shape[-1])
