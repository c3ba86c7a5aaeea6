"""The small-M GEMM sweep of ``benchmarks/gemm.py``: which configs it times per (N, K, M), and what each tuning
idea of ``docs/small_m_tuning.md`` gave (the ratio of the best time with the idea to the best time without it).

Compile-time families (block_n, warps, stages, k_unroll, fma, tma) x split-K (a runtime argument, so free to sweep):
each family gets the splits that give about 132, 264, 396 and 528 programs (1 to 4 per SM of an H200; a
persistent grid would be the same thing), every split summed in the same launch ("last"). The two-launch sum
("kernel") is timed at the default config and at the best config, so idea 1 is measured at both.
Compiles: 16 MMA families (7 of them TMA) x 3 row classes (16, 32, 64) and 3 GEMV families x 2 (1, 4), two modes
each at most.
"""

from __future__ import annotations

import dataclasses
import math

from fp8_fusion_pass.kernels.triton._small_m_kernels import FMA_MAX_M, SmallMConfig, small_m_block_m, split_plan

# (block_n, warps, stages, k_unroll, fma, tma)
FAMILIES = [
    (32, 4, 4, 1, False, False),  # round 1's shapes: 32 / 64 / 128 wide at 4 stages
    (64, 4, 4, 1, False, False),
    (128, 4, 4, 1, False, False),
    (64, 4, 4, 2, False, False),  # idea 2: two scale groups (256 K) per iteration
    (128, 4, 4, 2, False, False),
    (64, 4, 6, 1, False, False),  # idea 3: deeper pipeline
    (128, 8, 4, 1, False, False),  # idea 3: 8 warps
    (256, 8, 3, 1, False, False),  # idea 4: a quarter of the activation re-reads
    (256, 4, 4, 1, False, False),  # idea 11: the 256-row tile at any M (the silu-quant epilogue's best gate_up tile)
    (16, 4, 3, 1, True, False),  # idea 5: GEMV (M <= 4)
    (32, 4, 3, 1, True, False),
    (64, 4, 3, 1, True, False),
    (32, 4, 4, 1, False, True),  # idea 13: the operand tiles by TMA
    (64, 4, 3, 1, False, True),
    (64, 4, 4, 1, False, True),
    (64, 4, 6, 1, False, True),
    (128, 4, 4, 1, False, True),
    (128, 8, 4, 1, False, True),
    (256, 8, 3, 1, False, True),
]
QUICK_FAMILIES = [FAMILIES[1], FAMILIES[2], FAMILIES[3], FAMILIES[9], FAMILIES[14]]
# Idea 15: the activation rows split over programs (block_m 16 / 32 where M has more), each program reading the
# same weight tile (an L2 hit for all but the first): more programs without split-K partials. Measured on the
# families that won most M = 32 / 64 rows.
ROW_SPLIT_FAMILIES = [FAMILIES[1], FAMILIES[14], FAMILIES[15], FAMILIES[16]]
ROW_SPLITS = (16, 32)
# Idea 20: the activation rows on the MMA's M side (swap False; 64 rows, padded below M = 64, and below 64 rows also
# M's own row tile, compiled to mma.sync, not wgmma, offline by Triton 3.9), the weight tile its N side, one weight
# scale per tile: (block_n, warps, stages, k_unroll, fma, tma, swap). ``gemm.py --noswap``.
NOSWAP_FAMILIES = [
    (32, 4, 4, 1, False, True, False),
    (64, 4, 4, 1, False, True, False),
    (64, 4, 6, 1, False, True, False),
    (128, 4, 3, 1, False, True, False),
    (128, 4, 4, 1, False, True, False),
    (128, 8, 4, 1, False, True, False),
    (64, 4, 4, 1, False, False, False),
]
DRY_FAMILIES = [(32, 4, 2, 2, False, False), (32, 4, 2, 1, True, False), (32, 4, 2, 1, False, True),
                (32, 4, 2, 1, False, True, False)]
PROGRAM_TARGETS = (132, 264, 396, 528)


def candidates(n: int, k: int, m: int, families=FAMILIES, block_k: int = 128, row_split=()) -> list[SmallMConfig]:
    """Distinct small-M configs (effective split-K, as ``split_plan`` runs it) for one GEMM; ``row_split``: families
    also timed with the rows split over programs (``ROW_SPLITS`` rows each, where M has more)."""
    k_tiles = k // block_k
    out: list[SmallMConfig] = []
    for block_n, warps, stages, unroll, fma, tma, *swap in families:  # swap: NOSWAP_FAMILIES' seventh field
        if fma and m > FMA_MAX_M:
            continue
        n_tiles = math.ceil(n / block_n)
        splits = {split_plan(k_tiles, max(1, round(t / n_tiles)), unroll)[0] for t in PROGRAM_TARGETS}
        out += [SmallMConfig(block_n, s, warps, stages, "last", unroll, fma, tma, swap=all(swap))
                for s in sorted(splits)]  # fmt: skip
        if not all(swap) and small_m_block_m(m) < 64:  # M's own row tile: Ampere-style MMAs (offline sm_90 PTX)
            out += [SmallMConfig(block_n, s, warps, stages, "last", unroll, fma, tma, small_m_block_m(m), False)
                    for s in sorted(splits)]  # fmt: skip
    for block_n, warps, stages, unroll, fma, tma in row_split:
        for block_m in (b for b in ROW_SPLITS if b < small_m_block_m(m)):
            tiles = math.ceil(n / block_n) * math.ceil(m / block_m)
            splits = {split_plan(k_tiles, max(1, round(t / tiles)), unroll)[0] for t in PROGRAM_TARGETS}
            out += [SmallMConfig(block_n, s, warps, stages, "last", unroll, fma, tma, block_m) for s in sorted(splits)]
    return list(dict.fromkeys(out))


def with_kernel_reduce(cfg: SmallMConfig) -> SmallMConfig:
    return dataclasses.replace(cfg, reduce="kernel")


# Idea -> (the configs that have it, the configs it is compared with). Ratios < 1: the idea helps.
IDEAS = {
    "k_unroll 2": (lambda c: c.k_unroll == 2, lambda c: c.k_unroll == 1 and not c.fma and c.block_n in (64, 128)
                   and c.warps == 4 and c.stages == 4),
    "stages 6": (lambda c: c.stages == 6, lambda c: c.block_n == 64 and c.stages == 4 and c.k_unroll == 1),
    "warps 8 (bn 128)": (lambda c: c.block_n == 128 and c.warps == 8,
                         lambda c: c.block_n == 128 and c.warps == 4 and c.k_unroll == 1),
    "bn 256": (lambda c: c.block_n == 256, lambda c: not c.fma and c.block_n <= 128),
    "bn 128 vs 64": (lambda c: c.block_n == 128 and c.warps == 4 and c.k_unroll == 1,
                     lambda c: c.block_n == 64 and c.stages == 4 and c.k_unroll == 1),
    "fma GEMV": (lambda c: c.fma, lambda c: not c.fma),
    "split 1": (lambda c: c.split_k == 1 and not c.block_m, lambda c: c.split_k > 1 and not c.block_m),
    "rows split": (lambda c: c.block_m > 0, lambda c: c.block_m == 0),
    "tma": (lambda c: c.tma, lambda c: not c.tma and not c.fma and c.k_unroll == 1),
    "no swap": (lambda c: not c.swap, lambda c: c.swap and not c.fma),
}  # fmt: skip


def idea_ratios(timed: dict[SmallMConfig, float]) -> dict[str, float | None]:
    """Best time among the configs with each idea over the best among those it is compared with."""
    out: dict[str, float | None] = {}
    for name, (has, base) in IDEAS.items():
        # every other idea compares pointer-loaded configs, as it did before the TMA families existed
        # (the rows split is measured mostly on TMA families: against every config without it, TMA or not)
        pool = {c: t for c, t in timed.items()
                if c.reduce == "last" and (name in ("tma", "rows split", "no swap") or not c.tma)}  # fmt: skip
        a = [t for c, t in pool.items() if has(c)]
        b = [t for c, t in pool.items() if base(c)]
        out[name] = min(a) / min(b) if a and b else None
    return out
