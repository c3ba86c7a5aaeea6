"""Shared by the pattern tests: post-grad graphs captured without running Inductor's codegen, the pass run on
copies of them, and tiny modules written with the op vocabulary and with HF's plain-torch code.

``capture(module, *inputs)`` compiles through Dynamo and AOTAutograd up to Inductor's post-grad passes, copies
the graph there and aborts the compile: a CPU compile costs seconds, mostly in codegen, which the pattern tests
do not need. ``run_pass(gm, config)`` then runs FP8FusionPass on a fresh copy and returns (report, graph).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass import report as report_mod
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass
from fp8_fusion_pass.kernels import reference

ops = torch.ops.fp8_fusion


class _Captured(Exception):
    pass


class _Capture(CustomGraphPass):
    def __init__(self):
        self.graphs = []

    def __call__(self, graph):
        self.graphs.append(copy_gm(graph.owning_module))
        raise _Captured()

    def uuid(self):
        return None  # bypass the FX graph cache: the capture must run


def copy_gm(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return torch.fx.GraphModule(gm, g)


def capture(module, *inputs, dynamic=False, calls=None) -> list[torch.fx.GraphModule]:
    """Post-grad graphs (one per Dynamo frame compiled) of ``module(*inputs)`` (and of ``calls``: more input
    tuples, for dynamic shapes), before any custom post-grad pass."""
    cap = _Capture()

    def backend(gm, example_inputs):
        try:
            # uuid() None: the FX graph cache is bypassed, so the capture always runs
            return compile_fx(gm, example_inputs, config_patches={"post_grad_custom_post_pass": cap})
        except Exception as e:  # noqa: BLE001 - the capture aborts the compile on purpose
            if not _is_capture(e):
                raise
            return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for args in [inputs, *(calls or [])]:
            compiled(*args)
    torch._dynamo.reset()
    return cap.graphs


def _is_capture(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, _Captured):
            return True
        e = e.__cause__ or e.__context__
    return False


# What ``run_pass`` runs when a test names no config: the default rewrites minus the whole-graph ones that run
# after the fusions (norm_rope, qk_rope, inline_norm, group_gemm, gemm_silu_quant, quant_gemm, gqa_attention,
# decode_attention). Those rewrite exactly what a fusion test checks was left alone or made (a rejected norm, the
# GEMMs after a fusion, the silu-quant, the quant no producer took, the attention); test_norm_rope.py,
# test_qk_rope.py, test_inline_norm.py, test_group_gemm.py, test_gemm_silu_quant.py, test_quant_gemm.py,
# test_gqa_attention.py and test_decode_attention.py test them, defaults on. (rope_cache stays on: with no
# norm_rope / qk_rope op it has nothing to take.)
FUSIONS_ONLY = FusionConfig(norm_rope=False, qk_rope=False, inline_norm=False, group_gemm=False,
                            gemm_silu_quant=False, quant_gemm=False, gqa_attention=False, decode_attention=False)


def run_pass(gm: torch.fx.GraphModule, config: FusionConfig | None = None, is_inference: bool = True):
    """Run the pass on a copy of ``gm`` (``config`` default: ``FUSIONS_ONLY``); returns (report, the rewritten
    graph module)."""
    gm = copy_gm(gm)
    FP8FusionPass(FUSIONS_ONLY if config is None else config)(gm.graph, is_inference)
    gm.graph.lint()  # every rewrite leaves a valid, topologically ordered graph
    gm.recompile()
    return report_mod.last_report(), gm


def compile_model(model, inputs, config: FusionConfig) -> tuple[torch.Tensor, dict]:
    """``model(*inputs)`` compiled with the pass under ``config`` (fresh Dynamo state, no FX graph cache, so the pass
    runs): (the logits, the last graph's report counts). HF models' outputs are unwrapped to their logits."""
    torch._dynamo.reset()
    report_mod.clear_reports()
    opts = {"post_grad_custom_post_pass": FP8FusionPass(config), "fx_graph_cache": False}
    with torch.no_grad():
        out = torch.compile(model, options=opts)(*inputs)
    counts = report_mod.last_report().counts()
    torch._dynamo.reset()
    return logits(out), counts


def logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out  # HF models return a CausalLMOutputWithPast


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


@contextlib.contextmanager
def exact_sdpa():
    """Every ``F.scaled_dot_product_attention`` call inside is ``reference.decode_attention``: scores, softmax and
    p @ v in fp32, the output rounded once to q's dtype (the reference the library's attention kernels are held
    to). transformers' SDPA attention looks the function up on each call, so an HF model run eagerly inside this is
    the model with exact attention: what a rewrite that changes the attention kernel is held to, since the o_proj's
    fp8 quant turns any kernel's ~2e-3 from exact into ~0.07 of 2 layers' logits (whichever kernel eager itself
    runs agrees with the copy form's to the bit). Masks: boolean, or additive of 0 / -inf (or the dtype's min)."""
    plain = F.scaled_dot_product_attention

    def exact(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p or is_causal:
            raise NotImplementedError("exact_sdpa: no dropout, no causal flag (a decode step passes its mask)")
        keep = torch.ones((), dtype=torch.bool, device=q.device) if attn_mask is None else attn_mask
        if keep.dtype != torch.bool:  # additive: 0 where seen, -inf (or the dtype's min, as HF once wrote) where not
            hidden = keep <= torch.finfo(keep.dtype).min
            if not (hidden | (keep == 0)).all():
                raise NotImplementedError("exact_sdpa: an additive mask of 0 / -inf only (not a bias)")
            keep = ~hidden
        g = q.shape[-3] // k.shape[-3]  # enable_gqa: each kv head serves g query heads
        k, v = (t.repeat_interleave(g, -3) for t in (k, v))
        return reference.decode_attention(q, k, v, keep, q.shape[-1] ** -0.5 if scale is None else scale)

    torch.nn.functional.scaled_dot_product_attention = exact
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = plain


def ops_in(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def count(gm, op) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is op)


def graph_text(gm) -> str:
    return str(gm.graph)


# ---------------------------------------------------------------- tiny modules


class BlockLinear(nn.Module):
    """``quantize.BlockFP8Linear``'s forward on given shapes (reshape -> group_quant -> blockscale_mm)."""

    def __init__(self, k, n, group_size=128, dtype=torch.bfloat16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(n, k, generator=g) * 0.05
        wq, ws = reference.quantize_weight_blockwise(w, (128, 128), torch.float8_e4m3fn, 448.0) if (
            n % 128 == 0 and k % 128 == 0) else _ceil_blocks(w)
        self.register_buffer("weight", wq)
        self.register_buffer("weight_scale_inv", ws)
        self.k, self.group_size, self.dtype = k, group_size, dtype

    def forward(self, x):
        x2 = x.reshape(-1, self.k)
        q, s = ops.group_quant(x2, self.group_size)
        y = ops.blockscale_mm(q, s, self.weight, self.weight_scale_inv, x.dtype)
        return y.reshape(*x.shape[:-1], -1)


def _ceil_blocks(w):
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    wp = torch.zeros(nb * 128, kb * 128)
    wp[:n, :k] = w
    wq, ws = reference.quantize_weight_blockwise(wp, (128, 128), torch.float8_e4m3fn, 448.0)
    return wq[:n, :k].contiguous(), ws


class HFRMSNorm(nn.Module):
    """transformers' Qwen3RMSNorm / LlamaRMSNorm forward, verbatim."""

    def __init__(self, hidden, eps=1e-6, dtype=torch.bfloat16):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(1)).to(
            dtype), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class NormLinear(nn.Module):
    """norm -> (three) quantized linears; ``form`` "hf" (plain torch) or "op"; ``residual`` adds one first."""

    def __init__(self, hidden=256, n=256, form="hf", residual=False, eps=1e-6, group_size=128, heads=1,
                 dtype=torch.bfloat16):
        super().__init__()
        self.norm = HFRMSNorm(hidden, eps, dtype)
        self.projs = nn.ModuleList(BlockLinear(hidden, n, group_size, dtype, seed=i) for i in range(heads))
        self.form, self.residual, self.eps = form, residual, eps

    def forward(self, x, res=None):
        if self.residual:
            if self.form == "op":
                h, res = ops.add_rms_norm(x, res, self.norm.weight, self.eps)
            else:
                res = res + x
                h = self.norm(res)
        else:
            h = self.norm(x) if self.form == "hf" else ops.rms_norm(x, self.norm.weight, self.eps)
        outs = [p(h) for p in self.projs]
        out = outs[0]
        for o in outs[1:]:
            out = out + o
        return (out, res) if self.residual else out


class SiluLinear(nn.Module):
    """x -> gate/up (bf16 matmuls: static N, like the GEMMs of a model) -> silu * mul -> quantized down_proj.

    ``form``: "op" (``silu_and_mul`` on merged gate_up), "split" (HF: separate gate / up), "slice" or "chunk"
    (plain torch on a merged gate_up), "op-input" (``silu_and_mul`` on the input itself).
    """

    def __init__(self, inter=256, hidden=256, form="split", group_size=128, dtype=torch.bfloat16):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w_gate_up = nn.Parameter((torch.randn(2 * inter, hidden, generator=g) * 0.05).to(dtype),
                                      requires_grad=False)
        self.down = BlockLinear(inter, hidden, group_size)
        self.form, self.inter = form, inter

    def forward(self, x):
        if self.form == "op-input":
            return self.down(ops.silu_and_mul(x))
        if self.form == "split":
            gate = x @ self.w_gate_up[: self.inter].t()
            up = x @ self.w_gate_up[self.inter:].t()
            return self.down(F.silu(gate) * up)
        gate_up = x @ self.w_gate_up.t()
        if self.form == "op":
            h = ops.silu_and_mul(gate_up)
        elif self.form == "slice":
            d = gate_up.shape[-1] // 2
            h = F.silu(gate_up[..., :d]) * gate_up[..., d:]
        else:
            g, u = gate_up.chunk(2, dim=-1)
            h = F.silu(g) * u
        return self.down(h)
