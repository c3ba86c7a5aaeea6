"""Per-tensor FP8 and zero-fill stripping: the ``torch.zeros(1)`` scale buffers that the quant op overwrites.

    python examples/per_tensor_zero_fill.py

Engine code quantizes a GEMM input per tensor like this (``PerTensorFP8Linear.forward``)::

    scale = torch.zeros(1, device=x.device, dtype=torch.float32)      # a fill kernel on every call
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    torch.ops.fp8_fusion.dynamic_per_tensor_quant(out, x, scale)      # writes scale, never reads it

The zeros are dead work only if the op overwrites its scale; an op that max-reduces into it needs them. The pass
turns such a fill into ``empty`` only for (op, argument) pairs registered as overwriting
(``fp8_fusion_pass.register_scale_writer``), and lists every fill it stripped or kept in the report.
See docs/zero_fill.md.
"""

import torch
import torch._inductor.config

import fp8_fusion_pass

device = "cuda" if torch.cuda.is_available() else "cpu"
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False

# The engine form has 4 quantized GEMMs per layer (qkv, o, gate_up, down). scheme="per-tensor" converts them
# with quantize_fp8_per_tensor, which a model of your own can call directly.
model = fp8_fusion_pass.build_model("qwen3-tiny", form="engine", scheme="per-tensor", layers=1, device=device)
print(model.quantize_summary)
inputs = fp8_fusion_pass.example_inputs(model, batch=2, seq=8)
OP = "fp8_fusion::dynamic_per_tensor_quant"


def compile_and_run(title: str):
    torch._dynamo.reset()  # forget the previous compile: the registry is read when a graph is compiled
    print(f"--- {title}: {OP}(scale) is registered {fp8_fusion_pass.scale_semantics_of(OP, 'scale')!r}")
    compiled = torch.compile(model, backend="fp8_fusion")
    with torch.no_grad():
        logits, eager = compiled(*inputs), model(*inputs)
    err = ((logits.float() - eager.float()).norm() / eager.float().norm()).item()
    report = fp8_fusion_pass.last_report()
    # The norm / silu fusions stay off: a per-tensor quant is not a group quant (their reason: no_quant_consumer).
    print(report.summary_line())
    print(f"compiled vs eager relative L2 error {err:.4f}")
    for fill in report.fills_stripped:
        print(f"  stripped {fill.node}: {fill.detail}")
    for fill in report.fills_kept:
        print(f"  kept {fill.node}: {fill.reason} ({fill.detail})")
    print("fill counts:", {k: report.counts()[k] for k in ("fills_stripped", "fills_kept")})


# 1. As shipped: our op overwrites its scale, so every zeros(1) before it is dead work.
compile_and_run("built-in registry")

# 2. Pretend the op max-reduced into its scale (as vLLM's dynamic_scaled_fp8_quant does at most versions): the
#    zeros are then load-bearing and the pass must keep every one. Register your own ops the same way.
shipped = fp8_fusion_pass.unregister_scale_writer(OP, "scale")
fp8_fusion_pass.register_scale_writer(OP, "scale", "accumulates", evidence="what-if in examples/")
try:
    compile_and_run("re-registered as accumulating")
finally:  # put the shipped entry back
    fp8_fusion_pass.unregister_scale_writer(OP, "scale")
    fp8_fusion_pass.register_scale_writer(OP, "scale", shipped.semantics, evidence=shipped.evidence)
