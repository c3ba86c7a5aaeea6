"""The table of rewrites the pass makes, in the order it makes them. One row per rewrite; the module named in a
row implements it (one fusion per file, each with its before -> after docstring and its guards).

Order matters: duplicate quants collapse first (so q/k/v share one quant before the norm fusion looks for
"exactly one quant"), the residual-add norm fusion is tried before the plain one (the plain pattern is a subset
of it: it would match the same norm with the add's sum as its input), the attention rewrites fold the o_proj's
input quant into their launch before ``quant_gemm`` may move it into the GEMV (measured faster: the fold adds
~0.5 us to the attention, the quantizing GEMV ~0.9 us to the GEMV), and zero fills go last.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Fusion:
    name: str  # the report's pattern name
    switch: str  # the FusionConfig field / FP8_FUSION_DISABLE name that turns it off
    module: str  # fp8_fusion_pass.patterns.<module> implements it
    fused_op: str | None  # the torch.ops.fp8_fusion op it swaps in (None: no op swapped)
    bit_exact: bool  # output identical to the unfused graph (deterministic mode keeps only these)
    # how the pass applies it: "dedup" (its own pattern pass), "matched" (the matched rows share one pattern pass,
    # then the why-not scan, where the first of them stands), "graph" (``patterns.<module>.run(graph, report)``
    # walks the graph itself), "zero_fill" (needs the final consumers). fusion_pass builds its stages from this
    # table, in this order.
    stage: str

    def __post_init__(self):  # a misspelt stage would otherwise fail every compile, in fusion_pass.stages()
        if self.stage not in STAGES:
            raise ValueError(f"Fusion {self.name!r}: stage {self.stage!r} is not one of {STAGES}")


STAGES = ("dedup", "matched", "graph", "zero_fill")

FUSIONS: tuple[Fusion, ...] = (
    # group_quant(reshape(x)) x N, same x / shape / group  ->  one group_quant(reshape(x)), its outputs shared
    Fusion("dedup_quant", "dedup_quant", "dedup_quant", None, True, "dedup"),
    # (x + residual) -> rms_norm -> [reshape] -> group_quant -> blockscale_mm  ->  add_rms_norm_group_quant
    Fusion("add_norm_quant", "norm_quant", "norm_quant", "add_rms_norm_group_quant", False, "matched"),
    # rms_norm -> [reshape] -> group_quant -> blockscale_mm  ->  rms_norm_group_quant
    Fusion("norm_quant", "norm_quant", "norm_quant", "rms_norm_group_quant", False, "matched"),
    # silu(gate) * up -> [reshape] -> group_quant -> blockscale_mm  ->  silu_mul_group_quant
    Fusion("silu_quant", "silu_quant", "silu_quant", "silu_mul_group_quant", True, "matched"),
    # rms_norm -> permute -> rotate-half RoPE, for q and for k on one cos / sin  ->  one rms_norm_rope
    Fusion("norm_rope", "norm_rope", "norm_rope", "rms_norm_rope", False, "graph"),
    # reshape -> permute -> rotate-half RoPE (no norm: Llama), for q and for k on one cos / sin  ->  one qk_rope
    Fusion("qk_rope", "qk_rope", "qk_rope", "qk_rope", False, "graph"),
    # rms_norm_rope / qk_rope -> k into a static cache by index, v beside it  ->  *_cache (both writes, in place)
    Fusion("rope_cache", "rope_cache", "rope_cache", "rms_norm_rope_cache", True, "graph"),
    # rms_norm / add_rms_norm with no quant consumer (left after the fusions)  ->  its aten ops
    Fusion("inline_norm", "inline_norm", "inline_norm", None, False, "graph"),
    # blockscale_mm x 2-3 of one (q, scale)  ->  blockscale_mm_grouped + slices
    Fusion("group_gemm", "group_gemm", "group_gemm", "blockscale_mm_grouped", False, "graph"),
    # blockscale_mm (or grouped gate / up) -> silu_mul_group_quant  ->  blockscale_mm_silu_mul_group_quant
    Fusion("gemm_silu_quant", "gemm_silu_quant", "gemm_silu_quant", "blockscale_mm_silu_mul_group_quant", False,
           "graph"),
    # repeat_kv copies of the KV cache -> SDPA, one query token  ->  SDPA on the cache, query heads as rows
    Fusion("gqa_attention", "gqa_attention", "gqa_attention", None, False, "graph"),
    # bmm(softmax(where(~keep, -inf, scale * bmm(q, k^T).float())).to(bf16), v), few rows  ->  decode_attention
    Fusion("decode_attention", "decode_attention", "decode_attention", "decode_attention", False, "graph"),
    # *_rope_cache -> decode_attention_upto(_quant) on its q and caches, one token  ->  rope_decode_attention
    Fusion("rope_attention", "rope_attention", "rope_attention", "rope_decode_attention", False, "graph"),
    # group_quant -> blockscale_mm (no producer took the quant in, the attention's launch neither), M <= 4
    #   ->  group_quant_blockscale_mm
    Fusion("quant_gemm", "quant_gemm", "quant_gemm", "group_quant_blockscale_mm", False, "graph"),
    # full(0) scale buffer -> op that overwrites it  ->  empty -> same op
    Fusion("zero_fill", "zero_fill", "zero_fill", None, True, "zero_fill"),
)

BY_NAME = {f.name: f for f in FUSIONS}
