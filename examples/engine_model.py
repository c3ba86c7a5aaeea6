"""The engine-style model (vLLM / sglang model code shape) compiled with ``fp8_fusion_pass.backend()``.

    python examples/engine_model.py

Engine model code differs from Hugging Face's: q/k/v are one merged ``qkv_proj`` and gate/up one merged
``gate_up_proj`` (so each norm output feeds a single quant and there is nothing to dedup), norms are the
``fp8_fusion.rms_norm`` / ``add_rms_norm`` ops (residual add + norm in one op), and the MLP calls
``silu_and_mul`` on the merged [M, 2I] output. The same pass fuses both spellings.
"""

import torch
import torch._inductor.config

import fp8_fusion_pass

device = "cuda" if torch.cuda.is_available() else "cpu"
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False

model = fp8_fusion_pass.build_model("qwen3-tiny", form="engine", scheme="block", device=device)  # 2 layers
layer = model.model.layers[0]
print(f"merged projections: qkv_proj {layer.self_attn.qkv_proj}, gate_up_proj {layer.mlp.gate_up_proj}")

# backend() is the factory behind the registered name "fp8_fusion": it takes a FusionConfig and Inductor options
# ({"triton.cudagraphs": True}, max_autotune=True, ...); torch.compile's own mode= passes through too.
compiled = torch.compile(model, backend=fp8_fusion_pass.backend())

input_ids, positions = fp8_fusion_pass.example_inputs(model, batch=2, seq=8)
with torch.no_grad():
    logits = compiled(input_ids, positions)
    eager = model(input_ids, positions)
err = ((logits.float() - eager.float()).norm() / eager.float().norm()).item()
print(f"logits {tuple(logits.shape)}; compiled vs eager relative L2 error {err:.4f}")

report = fp8_fusion_pass.last_report()
print(report.render())
counts, layers = report.counts(), len(model.model.layers)
norms = counts.get("norm_quant", 0) + counts.get("add_norm_quant", 0)
print(f"{layers} layers: {norms} norm sites fused (expected {2 * layers}: layer 0's input norm plain, the others "
      f"residual add + norm), {counts.get('silu_quant', 0)} silu sites (expected {layers}); the final norm feeds "
      "the bf16 lm_head and stays unfused")
print("fused counts:", counts)
