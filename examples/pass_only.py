"""The pass object on its own, handed to stock Inductor: ``options={"post_grad_custom_post_pass": FP8FusionPass()}``.

    python examples/pass_only.py

For code that already calls ``torch.compile`` with Inductor options (a serving engine, a training harness) and
wants to add the pass without switching backends. ``FusionConfig`` picks the rewrites: here only the norm
fusions and the quant dedup, so the silu * up -> quant site is left alone and the report says why.
"""

import torch
import torch._inductor.config

from fp8_fusion_pass import FP8FusionPass, FusionConfig, build_model, example_inputs, last_report

device = "cuda" if torch.cuda.is_available() else "cpu"
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False

# A 1-layer Llama-3.1-architecture HF model at toy size, block-FP8 linears, random seeded weights.
model = build_model("llama-tiny", form="hf", scheme="block", layers=1, device=device)

config = FusionConfig.only("norm_quant,dedup_quant")  # FusionConfig() = every rewrite on
compiled = torch.compile(model, options={"post_grad_custom_post_pass": FP8FusionPass(config)})
# Only one custom post-grad pass fits in that option before torch 2.13: to run yours as well, call both from one
# CustomGraphPass whose uuid() combines theirs.

(input_ids,) = example_inputs(model, batch=2, seq=8)
with torch.no_grad():
    logits = compiled(input_ids).logits
    eager = model(input_ids).logits
err = ((logits.float() - eager.float()).norm() / eager.float().norm()).item()
print(f"logits {tuple(logits.shape)}; compiled vs eager relative L2 error {err:.4f}")

report = last_report()
print(report.render())
print("fused counts:", report.counts())
print("rejection reasons:", report.rejection_reasons())
print("report as JSON (first lines):")
print("\n".join(report.to_json().splitlines()[:8]))
