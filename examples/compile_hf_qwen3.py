"""Compile a Hugging Face Qwen3ForCausalLM with the fp8 fusion backend: a forward, greedy decoding, the report.

    python examples/compile_hf_qwen3.py

Builds a 2-layer Qwen3 from a config (random weights, nothing downloaded), converts its linears to block FP8
(1x128 activation groups, 128x128 weight blocks, as in the published Qwen3-*-FP8 checkpoints), compiles it with
``backend="fp8_fusion"`` and prints what the pass fused and why it left the rest alone. Runs on the CPU (about
20 s of CPU time, mostly Inductor compiling); uses the GPU when there is one.
"""

import torch
import torch._inductor.config
from transformers import Qwen3Config, Qwen3ForCausalLM

import fp8_fusion_pass
from fp8_fusion_pass.report import all_reports

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False

# Toy sizes, real architecture. Hidden, intermediate and head sizes are multiples of 128, so every decoder linear
# holds whole 128x128 weight blocks (quantize_block_fp8 leaves a linear in bf16, and says so, when they are not).
config = Qwen3Config(
    vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=128, max_position_embeddings=256, tie_word_embeddings=False, use_cache=False,
)
model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
print(fp8_fusion_pass.quantize_block_fp8(model))  # every eligible nn.Linear -> BlockFP8Linear; lm_head stays bf16

compiled = torch.compile(model, backend="fp8_fusion")  # or backend=fp8_fusion_pass.backend(config=...)

prompt_len, new_tokens = 8, 6
# One fixed-length buffer, prompt on the left, zeros on the right: the causal mask keeps the padding from reaching
# earlier positions, so every step reuses the one compiled graph (a growing sequence would compile a second
# graph, with dynamic shapes, at the second length).
ids = torch.zeros(1, prompt_len + new_tokens, dtype=torch.long, device=device)
ids[:, :prompt_len] = torch.randint(0, config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))

with torch.no_grad():
    logits = compiled(ids).logits  # compiles: the pass runs here
    eager = model(ids).logits
    err = ((logits.float() - eager.float()).norm() / eager.float().norm()).item()
    print(f"forward: logits {tuple(logits.shape)} {logits.dtype}; compiled vs eager relative L2 error {err:.4f}")

    for pos in range(prompt_len, prompt_len + new_tokens):  # greedy decoding with the compiled forward
        ids[:, pos] = compiled(ids).logits[:, pos - 1].argmax(-1)
print(f"greedy: prompt {ids[0, :prompt_len].tolist()} -> generated {ids[0, prompt_len:].tolist()}")
print(f"graphs compiled: {len(all_reports())} (one report per graph the pass ran on; no recompile per token)")

# Expected rejections: the final norm feeds the bf16 lm_head (no_quant_consumer); the attention output feeding
# o_proj has no norm or silu to fuse with (producer_not_fusable). Qwen3's per-head q_norm / k_norm feed no quant
# either, but norm_rope takes them into its RoPE launch: the report lists them as superseded, not rejected.
report = fp8_fusion_pass.last_report()
print(report.render())
print("fused counts:", report.counts())
