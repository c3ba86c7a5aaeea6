"""Load a block-FP8 checkpoint in the published Qwen3-FP8 layout, compile it with the pass, run it.

    python examples/load_fp8_checkpoint.py [CHECKPOINT_DIR]

Without an argument, writes a tiny checkpoint (qwen3-tiny, random weights) into a temporary directory first:
``config.json`` with ``quantization_config = {quant_method: "fp8", weight_block_size: [128, 128], ...}`` and a
``model.safetensors`` with F8_E4M3 ``<linear>.weight`` and bf16 ``<linear>.weight_scale_inv`` tensors, as in
Qwen/Qwen3-8B-FP8. With a directory (e.g. a downloaded Qwen3-*-FP8 snapshot) it loads that instead; nothing is
ever fetched from the hub.
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch._inductor.config
from safetensors import safe_open

import fp8_fusion_pass

device = "cuda" if torch.cuda.is_available() else "cpu"
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False

with tempfile.TemporaryDirectory() as tmp:
    if len(sys.argv) > 1:
        path, written = Path(sys.argv[1]), None
    else:
        path = Path(tmp)
        written = fp8_fusion_pass.write_tiny_fp8_checkpoint(path, preset="qwen3-tiny")  # the model it wrote
    print("quantization_config:", json.loads((path / "config.json").read_text())["quantization_config"])
    for shard in sorted(path.glob("*.safetensors")):  # one file here, several in a published checkpoint
        with safe_open(str(shard), "pt") as f:
            for key in [k for k in f.keys() if k.startswith("model.layers.0.mlp.gate_proj.")]:  # noqa: SIM118
                t = f.get_slice(key)  # (safe_open is not a dict: keys() is its API)
                print(f"  {shard.name}: {key}: {t.get_dtype()} {t.get_shape()}")

    model = fp8_fusion_pass.load_fp8_checkpoint(path, device=device)  # HF Qwen3ForCausalLM with BlockFP8Linears
    print(model.quantize_summary)

compiled = torch.compile(model, backend="fp8_fusion")
(input_ids,) = fp8_fusion_pass.example_inputs(model, batch=2, seq=8)
with torch.no_grad():
    logits = compiled(input_ids).logits
    eager = model(input_ids).logits
    err = ((logits.float() - eager.float()).norm() / eager.float().norm()).item()
    print(f"logits {tuple(logits.shape)}; compiled vs eager relative L2 error {err:.4f}")
    if written is not None:  # the loaded model holds exactly the values that were written
        same = torch.equal(model(input_ids).logits, written.to(device)(input_ids).logits)
        print(f"loaded model == written model (eager logits bit-identical): {same}")

report = fp8_fusion_pass.last_report()
print(report.summary_line())
print("fused counts:", report.counts())
