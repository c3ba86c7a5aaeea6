"""``fp8_fusion_pass.fuse`` on your own modules: as a class decorator, and on an instance.

    python examples/decorator.py

The modules are plain PyTorch written the way Hugging Face modeling code is (an RMSNorm in fp32 arithmetic, a
SwiGLU MLP); ``quantize_block_fp8`` turns their ``nn.Linear`` s into ``BlockFP8Linear`` s, and the pass finds
the norm -> quant and silu * up -> quant subgraphs in the compiled graph without any change to the module code.
"""

import torch
import torch._inductor.config
import torch.nn.functional as F
from torch import nn

import fp8_fusion_pass

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
# A graph served from Inductor's FX graph cache skips the pass and adds no report: off, so every run prints one.
torch._inductor.config.fx_graph_cache = False


class RMSNorm(nn.Module):
    """As transformers' LlamaRMSNorm / Qwen3RMSNorm: fp32 statistics, result cast back, then the weight."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@fp8_fusion_pass.fuse  # every instance compiles its forward with the fp8 fusion backend on its first call
class DecoderMLP(nn.Module):
    """Pre-norm projection with a residual, then a pre-norm SwiGLU MLP with a residual (a decoder layer minus
    attention): the second norm reads ``x + proj(...)``, so it fuses as residual add + norm."""

    def __init__(self, hidden: int = 256, intermediate: int = 512) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(self.norm1(x))
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


x = torch.randn(2, 8, 256, device=device, dtype=torch.bfloat16)

# 1. The decorated class. Compilation is lazy, so converting the linears after construction is fine.
block = DecoderMLP().to(device=device, dtype=torch.bfloat16).eval()
print(fp8_fusion_pass.quantize_block_fp8(block))
with torch.no_grad():
    y = block(x)  # compiled
    err = rel_err(y, block.forward(x))  # .forward() is the module's own (eager) code: compile wraps __call__ only
report = fp8_fusion_pass.last_report()
print(report.render())
print(f"decorated class: output {tuple(y.shape)}, compiled vs eager relative L2 error {err:.4f}")
print("decorated class fused counts:", report.counts())

# 2. fuse() on an instance of any module, here an nn.Sequential: returns the compiled module.
head = nn.Sequential(RMSNorm(256), nn.Linear(256, 384, bias=False)).to(device=device, dtype=torch.bfloat16).eval()
fp8_fusion_pass.quantize_block_fp8(head)
fused_head = fp8_fusion_pass.fuse(head)  # also takes config=FusionConfig(...) and torch.compile's keywords
with torch.no_grad():
    err = rel_err(fused_head(x), head(x))
print(f"instance: compiled vs eager relative L2 error {err:.4f}")
print("instance fused counts:", fp8_fusion_pass.last_report().counts())
