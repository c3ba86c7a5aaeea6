"""Tile shapes for the memory-bound kernels, and the small helpers every launcher shares.

Every kernel here works on 3-D tiles ``[BLOCK_M rows, GPC groups, G columns]``: G contiguous columns are one
quant group (or, for the unquantized ops, one column block), so each group's amax is a reduction over the last
axis and no reshape is needed. G >= 64 bf16 values gives each thread 16-byte vector loads (8 x bf16).

Why these numbers (H200: 132 SMs, 64 warps / SM, 64K registers / SM, 50 MB L2, ~4.8 TB/s HBM3e):
- Little's law: ~4.8 TB/s x ~0.7 us loaded DRAM latency ~ 3.4 MB in flight, ~26 KB per SM. A program that loads
  a 4096-element bf16 tile (8 KB, 16 values / thread at 8 warps) with >= 4 programs resident per SM keeps
  >= 32 KB in flight. ``TILE`` = 4096 is that budget; the 1-row-per-program kernel measured in issue 7 (K=4096,
  4 KB tile per program) reached 191 us against a 37 us roofline.
- ``TARGET_PROGRAMS`` = 264 (2 per SM): at small M the tile shrinks (rows first, then groups) until the grid
  covers the GPU twice; below that the kernel is launch-bound (~3 us) whatever the tile.
- Row kernels (norms) need the whole row in one program, and every program re-reads the norm weight w from L2.
  At one row per program that doubles the L2 -> SM traffic (2 B of x + 2 B of w per value): ~6.4 TB/s at the
  HBM roofline of the norm (1.6e12 values/s), at or above what an H100-class L2 serves. So rows pack to
  ``ROW_TILE`` = 8192 values per program and never fewer than 2 rows at large M (w traffic <= x / 2).
- A row stays in registers between the sum of squares and the normalisation (``one_pass``) when its group count
  is a power of two or the sum of two (K = 5120: 32 + 8 groups, a main tile and a ``tail`` tile). Padding 40
  groups to 64 (what aiter does) would spend 60% more ALU on dead lanes, and the kernel is near its ALU budget
  (counted from the code, not measured: ~20 fp32 ops per value; 132 SMs x 128 lanes x 1.98 GHz / 1.6e12
  values/s ~ 21 available at the roofline rate). Other rows loop over exact 1024-column
  chunks twice (``one_pass=False``): the second pass re-reads the row from L2, not HBM.
Under the CPU interpreter (``TRITON_INTERPRET=1``) every program costs ~25 ms of Python whatever its size
(K=5120, M=17: 680 one-group programs took 17 s), so there the tiles grow to ``INTERPRETER_TILE`` and the grid
shrinks to a few programs; the GPU tiles are exercised there through the ``tile=`` override in the tests.
These are first choices from that reasoning; ``benchmarks/kernels.py --sweep`` measures the alternatives on the
GPU and the table here is to be updated with its numbers.
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from ... import arch

TILE = 4096  # elements per program per step at large M (see module docstring)
ROW_TILE = 8192  # elements per program of the norm kernels: w re-read from L2 once per program
MIN_ROWS = 2  # rows per norm program at large M: the w traffic stays <= half the x traffic
TARGET_PROGRAMS = 264  # 2 programs per SM on a 132-SM H200
MAX_ONE_PASS_K = 8192  # longest row kept in registers: 16 warps x 32 threads x 16 values
CHUNK = 1024  # columns per step of the two-pass row loop: divides 5120, 25600, 12288, 14336, 28672
INTERPRETER_TILE = 1 << 15  # elements per program under TRITON_INTERPRET=1 (numpy: size is cheap, count is not)
MIN_EFFICIENCY = 0.875  # accept a group chunk if at most 1/8 of its lanes are masked past the row end


@dataclasses.dataclass(frozen=True)
class Tile:
    block_m: int  # rows per program
    gpc: int  # groups (column blocks of G) per program step
    num_warps: int
    one_pass: bool = True  # row kernels: the whole row is one step, kept in registers
    tail: int = 0  # row kernels, one_pass: a second tile of this many groups after the first GPC (K = 5120)

    def as_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "GPC": self.gpc, "num_warps": self.num_warps}


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _warps(elements: int, per_thread: int = 16) -> int:
    # 16 values per thread: two 16-byte bf16 loads in flight per thread and ~40 live fp32 registers.
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


def row_tile(m: int, k: int, g: int) -> Tile:
    """Tile of the norm kernels (one program owns whole rows). Independent of the quant flag, so the fused and
    the unfused norm reduce in the same order (fused vs unfused is then bit-exact)."""
    n_groups = triton.cdiv(k, g)
    main = _pow2_floor(n_groups)
    tail = n_groups - main
    tile, target = _budget()
    if k <= MAX_ONE_PASS_K and (tail == 0 or tail == _pow2_floor(tail)):
        row = n_groups * g
        block_m = max(1, tile // TILE * ROW_TILE // row, MIN_ROWS if row >= TILE else 1)
        block_m = min(_pow2_floor(block_m), triton.next_power_of_2(m))
        while block_m > 1 and triton.cdiv(m, block_m) < target:
            block_m //= 2
        return Tile(block_m, main, max(4, _warps(block_m * row)), one_pass=True, tail=tail)
    gpc = _group_chunk(n_groups, max(1, CHUNK // g))
    block_m = max(1, min(tile // TILE * 4, triton.next_power_of_2(m)))
    while block_m > 1 and triton.cdiv(m, block_m) < target:
        block_m //= 2
    return Tile(block_m, gpc, _warps(block_m * gpc * g), one_pass=False)


def elementwise_tile(m: int, n_groups: int, g: int) -> Tile:
    """Tile of the per-group kernels (group quant, silu-mul): grid (row blocks, group chunks)."""
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
