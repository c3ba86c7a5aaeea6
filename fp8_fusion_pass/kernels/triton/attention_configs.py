"""The decode attention's launch configs (``decode_attention.py``): the measured tables and the rule that picks one
for a launch. Apart from the kernel so that a table row or the rule can change without touching the kernel's
module, and so that tests and benchmarks ask the same function the launch asks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionConfig:
    block_t: int = 64  # keys per loop step
    num_warps: int = 4
    num_stages: int = 2
    programs: int = 2  # split the keys until there are about this many programs per SM (never below BLOCK_T each)
    splits: int = 0  # > 0: this many splits instead (at most one a tile): counts ``programs`` cannot name, e.g. 2


DEFAULT = AttentionConfig()
# (largest batch x kv heads, config), by measurement: ``benchmarks/attention_decode.py --sweep`` (H200, 2026-12-03,
# Qwen3-8B / Llama-3.1-8B heads, 4 rows per kv head, 512 of 576 slots; docs/benchmarks.md, "Decode attention in one
# launch"): to 64 pairs (batch 8) 128-key tiles on 8 warps, a split per 128 keys while the kv heads leave SMs idle;
# at 256 / 512 pairs 64- / 32-key tiles on 4 warps, 3 stages, one program per kv head; sizes between take the next
# row. At 8 pairs (batch 1), since the merge loads its splits together, 64-key tiles: 9 splits, not 5 (H100 RoPE
# launch, ``issue7.sh fewer``: Llama / Qwen3 / Qwen3-32B 5.58 / 6.29 / 6.41 us against 6.01 / 6.81 / 6.74 us with
# the caches hot in L2; the engine's batch-1 steps 0.03-0.1% faster). Every row was swept hot; swept cold (``--cold``,
# H100, fortieth session) the batch-1 row holds, and at 64 pairs 32-key tiles on 4 warps were 3-4% faster alone but
# moved no engine step (Llama-3.1-8B / Qwen3-32B batch 8, docs/benchmarks.md "Each launch of a step in order").
_TILES_128 = AttentionConfig(block_t=128, num_warps=8, num_stages=2, programs=1)
TABLE: tuple[tuple[int, AttentionConfig], ...] = (
    (8, AttentionConfig(block_t=64, num_warps=8, num_stages=2, programs=1)),
    (64, _TILES_128),
    (256, AttentionConfig(block_t=64, num_warps=4, num_stages=3, programs=1)),
    (1 << 62, AttentionConfig(block_t=32, num_warps=4, num_stages=3, programs=1)),
)


# Above 16 query rows per kv head (G heads x S tokens), by the same sweep in the mask form at 32 rows (4 heads x 8
# tokens, 8 x 4) and 64 (8 x 8) (H100, 2026-12-06, thirty-third session; docs/benchmarks.md, "64 rows per kv
# head"): each program's tile is rows x keys, so 4 warps beat 8 from batch 2 to 8 (32 rows at batch 8: 13.15 /
# 12.62 against TABLE's 14.39 / 13.74 us), and at 64 rows the splits' [64, D] fp32 partials cost more than the SMs
# they fill (batch 8: a split per kv head 14.29 against 21.85 us; batch 32: 32-key tiles 32.71 against 37.04).
WIDE: tuple[tuple[int, tuple[tuple[int, AttentionConfig], ...]], ...] = (
    (16, TABLE),
    (32, ((8, _TILES_128), (64, AttentionConfig(block_t=128, num_warps=4, num_stages=2, programs=1)), *TABLE[2:])),
    (64, ((8, AttentionConfig(block_t=128, num_warps=4, num_stages=2, programs=4)),
          (64, AttentionConfig(block_t=128, num_warps=4, num_stages=3, programs=0)),
          (1 << 62, AttentionConfig(block_t=32, num_warps=4, num_stages=3, programs=1)))),
)


# RoPE launches above 16 query rows per kv head (a step of several tokens, above ``ROPE_WIDE_ROWS``) keep the 8-warp
# rows their timings ran on (WIDE's 4-warp rows spilled under the RoPE prologue), and at 8 pairs and fewer the
# 128-key row: TABLE's 64-key batch-1 row was timed at the MMA's 16 rows only.
ROPE_TOKENS: tuple[tuple[int, AttentionConfig], ...] = ((64, _TILES_128), *TABLE[2:])


def _row(table: tuple[tuple[int, AttentionConfig], ...], pairs: int) -> AttentionConfig:
    return next(cfg for most, cfg in table if pairs <= most)


def config_for(pairs: int, rows: int = 1) -> AttentionConfig:
    """The measured config for ``pairs`` (batch rows x kv heads) of ``rows`` query rows each."""
    return _row(next((t for most, t in WIDE if rows <= most), WIDE[-1][1]), pairs)


def launch_config(pairs: int, rows: int, rope: bool, rope_wide_rows: int) -> AttentionConfig:
    """The config a launch of ``pairs`` x ``rows`` query rows takes: ``config_for``'s, but a RoPE launch above
    ``rope_wide_rows`` rows (``decode_attention.ROPE_WIDE_ROWS``) takes TABLE's, or ROPE_TOKENS' above 16 rows."""
    if not rope or rows <= rope_wide_rows:
        return config_for(pairs, rows)
    return _row(TABLE if rows <= 16 else ROPE_TOKENS, pairs)
