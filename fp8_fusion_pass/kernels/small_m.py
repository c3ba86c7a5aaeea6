"""The small-M "worth it" table: GEMM shapes where a bf16 input beats a pre-quantized one at tiny M.

Some block-FP8 GEMM backends have a small-M kernel that quantizes its bf16 input itself (one launch, the quant
fused into the GEMM's load). Handing such a GEMM a pre-quantized ``(q, scale)`` from a fused norm skips that
kernel, and for a few narrow shapes the skipped kernel was faster than the whole fused norm + regular GEMM.
There the pass leaves the norm unfused (``guards.py`` asks ``prefers_bf16_input``): it is a "should", never a
"can" - the fused graph would be correct, only slower.

Table: ``BF16_INPUT_PREFERRED[arch_name][(N, K)] = max_rows``: at M <= max_rows a bf16 input is preferred.

gfx950 (MI350X / MI355X): from the seed pull request (sglang #48043,
``../shared/seeds/fused-norm-silu-quant-pr.txt``), whose MI355X measurements (CUDA graph, per call, norm plus
GEMM) found the gfx950 small-M block-FP8 GEMM on a bf16 input faster than the bpreshuffle GEMM on a
pre-quantized input for ``qkv_proj`` of Qwen3-0.6B and Qwen3-1.7B at TP1, "up to 16 rows"; end to end on
Qwen3-1.7B-FP8 TP1 the rule made the median decode step 0.973 / 0.980 / 0.981 / 0.981x at batch 1 / 4 / 8 / 16
and 1.001x at batch 24 / 32 (i.e. no longer worth it above 16 rows). Nothing here was re-measured: no AMD
hardware was available to this project.

(N, K) of those ``qkv_proj`` GEMMs at TP1 (merged q/k/v weight, N = (heads + 2 * kv_heads) * head_dim,
K = hidden_size), from the published configs (huggingface.co/Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B config.json):
- Qwen3-0.6B: hidden_size 1024, num_attention_heads 16, num_key_value_heads 8, head_dim 128
  -> N = (16 + 2 * 8) * 128 = 4096, K = 1024.
- Qwen3-1.7B: hidden_size 2048, num_attention_heads 16, num_key_value_heads 8, head_dim 128
  -> N = (16 + 2 * 8) * 128 = 4096, K = 2048.
Other Qwen3 shapes (gate_up, down, o_proj, and every larger model) never preferred bf16 in that PR.

NVIDIA entries stay empty until a benchmark on our own GEMM says otherwise (the GEMM engineer may add some).
"""

from __future__ import annotations

# arch name -> {(N, K): max rows (inclusive) at which a bf16 GEMM input beats a pre-quantized one}
BF16_INPUT_PREFERRED: dict[str, dict[tuple[int, int], int]] = {
    "gfx950": {
        (4096, 1024): 16,  # Qwen3-0.6B qkv_proj, TP1 (seed PR, MI355X)
        (4096, 2048): 16,  # Qwen3-1.7B qkv_proj, TP1 (seed PR, MI355X)
    },
}


def prefers_bf16_input(arch_name: str, m: int, n: int, k: int) -> bool:
    """True when the GEMM ``[m, k] x [n, k]^T`` on ``arch_name`` is faster fed bf16 than pre-quantized FP8.

    ``m``, ``n``, ``k`` must be concrete ints: with a symbolic M (dynamic shapes) the answer is False - the fused
    graph is always correct, and deciding on a symbol would need a shape guard (a recompile per side of 16).
    """
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (m, n, k)) or m <= 0:
        return False
    max_rows = BF16_INPUT_PREFERRED.get(arch_name, {}).get((n, k))
    return max_rows is not None and m <= max_rows
