"""Random decoder models for the fuzz tests: a ``DecoderSpec`` strategy, the model it builds, and the fusion
counts the pass must produce on it (an oracle written from the guards' rules, independent of the pass's code).

Models are built directly from transformers configs (Qwen3 / Llama / Qwen2 classes, random seeded weights, no
hub): HF form is block-FP8 quantized layer by layer (``models.build.materialize_hf``); engine form is converted
from the bf16 HF model (``engine_from_hf``: merged qkv / gate_up) and then quantized, so a merged weight whose
N is a multiple of 128 is quantized even when its parts are not. ``quantize.convert_linears`` leaves every linear
with N or K not a multiple of 128 in the activation dtype: those sites have no group_quant to fuse. A spec may ask
for the per-tensor scheme instead (``scheme``; the decode fuzz draws it): linears with N and K multiples of 16, each
quantizing its input with one dynamic scale, so nothing for the group-quant fusions, a zero fill per linear.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from fp8_fusion_pass import quantize
from fp8_fusion_pass.models import engine_from_hf
from fp8_fusion_pass.models.build import FAMILIES, _transformers_class, hf_on_meta, materialize_hf

BLOCK = quantize.BLOCK[0]  # 128: a linear is quantized iff N and K are multiples of it
VOCAB = 96  # lm_head stays bf16 (skipped), so the vocab only costs time
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    family: str  # "qwen3" | "llama" | "qwen2"
    form: str  # "hf" (split q/k/v, gate/up) | "engine" (merged)
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    attn_bias: bool  # q/k/v (+ o for llama) bias; Qwen2 always has q/k/v bias
    mlp_bias: bool  # llama only
    dtype: str
    dynamic: bool
    specialize_float: bool  # dynamic only: fuse(..., dynamic=True) keeps eps a constant
    shapes: tuple[tuple[int, int], ...]  # (batch, seq) per call
    seed: int = 0
    scheme: str = "block"  # quantize.SCHEMES: "block" (1x128 / 128x128 scales) | "per-tensor" (one scale each)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def short(self) -> str:
        return (f"{self.family}/{self.form} H={self.hidden} I={self.inter} h={self.heads}x{self.head_dim} "
                f"kv={self.kv_heads} L={self.layers} eps={self.eps:g} bias={int(self.attn_bias)}{int(self.mlp_bias)} "
                f"{self.dtype} {'dyn' + ('-spec' if self.specialize_float else '') if self.dynamic else 'static'} "
                f"shapes={list(self.shapes)}{'' if self.scheme == 'block' else ' ' + self.scheme}")


def _shape():
    return st.tuples(st.integers(1, 3), st.integers(1, 7))  # odd M = batch * seq is common


@st.composite
def decoder_specs(draw, forms=("hf", "engine"), dtypes=("bf16", "bf16", "bf16", "fp16", "fp32"),
                  max_layers: int = 3) -> DecoderSpec:
    """Small decoders: sizes mixing multiples and non-multiples of 128, any eps, 1..max_layers layers."""
    family = draw(st.sampled_from(sorted(FAMILIES.keys() - {"mistral"})))
    # Weighted towards sizes that quantize (multiples of 128), so most graphs have something to fuse.
    head_dim = draw(st.sampled_from((32, 64, 64, 128, 128, 128)))
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.sampled_from((1, 2)))
    if family == "qwen2":  # Qwen2 derives head_dim from hidden / heads
        hidden = heads * head_dim
    else:
        hidden = draw(st.sampled_from((96, 128, 128, 160, 192, 256, 256, 256, 320, 384, 384)))
    dynamic = draw(st.booleans())
    eps = draw(st.one_of(st.sampled_from((1e-6, 1e-5)), st.floats(1e-9, 0.5, allow_nan=False)))
    n_calls = draw(st.integers(1, 2)) if dynamic else 1
    return DecoderSpec(
        family=family,
        form=draw(st.sampled_from(forms)),
        hidden=hidden,
        inter=draw(st.sampled_from((128, 192, 256, 256, 320, 384, 512, 512))),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        layers=draw(st.integers(1, max_layers)),
        eps=eps,
        attn_bias=family == "qwen2" or draw(st.booleans()),
        mlp_bias=family == "llama" and draw(st.booleans()),
        dtype=draw(st.sampled_from(dtypes)),
        dynamic=dynamic,
        specialize_float=dynamic and draw(st.booleans()),
        shapes=tuple(draw(st.lists(_shape(), min_size=n_calls, max_size=n_calls))),
        seed=draw(st.integers(0, 2**16)),
    )


def hf_config(spec: DecoderSpec):
    kwargs = {
        "vocab_size": VOCAB, "hidden_size": spec.hidden, "intermediate_size": spec.inter,
        "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim, "rms_norm_eps": spec.eps, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "rope_theta": 10000.0,
    }
    if spec.family in ("qwen3", "llama"):
        kwargs["attention_bias"] = spec.attn_bias
    if spec.family == "llama":
        kwargs["mlp_bias"] = spec.mlp_bias
    config = _transformers_class(spec.family, 0)(**kwargs)
    config.use_cache = False
    return config


def build(spec: DecoderSpec) -> torch.nn.Module:
    """The model of ``spec`` on the CPU, eval mode, no grads, seeded weights."""
    model = hf_on_meta(hf_config(spec), spec.torch_dtype)
    materialize_hf(model, "cpu", spec.scheme if spec.form == "hf" else "bf16", seed=spec.seed)
    if spec.form == "engine":
        model = engine_from_hf(model, consume=True)
        quantize.convert_linears(model, spec.scheme, skip=("lm_head",))
    return model.eval().requires_grad_(False)


def inputs(spec: DecoderSpec, batch: int, seq: int, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    if spec.form == "hf":
        return (ids,)
    return ids, torch.arange(seq).unsqueeze(0).expand(batch, seq)


# ---------------------------------------------------------------- the oracle


def _quantized(n: int, k: int) -> bool:
    return n % BLOCK == 0 and k % BLOCK == 0


def linear_shapes(spec: DecoderSpec) -> list[tuple[int, int]]:
    """(N, K) of one decoder layer's linears: HF q / k / v, o, gate / up, down; engine qkv, o, gate_up, down."""
    hd, h, kv, hidden, inter = spec.head_dim, spec.heads, spec.kv_heads, spec.hidden, spec.inter
    if spec.form == "hf":
        return [(h * hd, hidden), (kv * hd, hidden), (kv * hd, hidden), (hidden, h * hd), (inter, hidden),
                (inter, hidden), (hidden, inter)]
    return [((h + 2 * kv) * hd, hidden), (hidden, h * hd), (2 * inter, hidden), (hidden, inter)]


def expected_fills(spec: DecoderSpec) -> int:
    """Zero fills the pass must strip: one per per-tensor linear (``PerTensorFP8Linear`` allocates its activation
    scale as ``torch.zeros(1)``, and ``dynamic_per_tensor_quant`` overwrites it); block linears allocate none.
    ``quantize`` converts a linear per tensor where N and K are multiples of ``PER_TENSOR_ALIGN`` (lm_head skipped)."""
    if spec.scheme != "per-tensor":
        return 0
    align = quantize.PER_TENSOR_ALIGN
    return spec.layers * sum(n % align == 0 and k % align == 0 for n, k in linear_shapes(spec))


def expected_counts(spec: DecoderSpec) -> dict[str, int]:
    """Rewrites the pass must apply to the graph of ``spec`` (DESIGN.md guards, issue 4's counts):

    - a norm fuses when every consumer is a quantized linear (HF q/k/v collapse into one quant first); the first
      layer's input norm is a plain norm, every later norm follows a residual add; the final norm feeds the bf16
      lm_head and stays;
    - silu fuses when down_proj is quantized;
    - bf16 only; a dynamic HF compile without specialized floats lifts eps into a graph input: no norm fuses;
    - dedup (bf16, HF form): n quantized linears reading one normed tensor leave n - 1 duplicates (fp16 / fp32
      graphs are left exactly as they are, dedup included);
    - per-tensor models have no group quant: none of these (their zero fills: ``expected_fills``).
    """
    if spec.scheme == "per-tensor":  # its quant is no group quant: nothing for these fusions (nor for dedup)
        return {}
    hd, h, kv, hidden, inter, L = spec.head_dim, spec.heads, spec.kv_heads, spec.hidden, spec.inter, spec.layers
    if spec.form == "hf":
        qkv = [_quantized(n, hidden) for n in (h * hd, kv * hd, kv * hd)]
        gu = [_quantized(inter, hidden)] * 2
        dedup = L * (max(0, sum(qkv) - 1) + max(0, sum(gu) - 1))
    else:
        qkv = [_quantized((h + 2 * kv) * hd, hidden)]
        gu = [_quantized(2 * inter, hidden)]
        dedup = 0
    bf16 = spec.dtype == "bf16"
    eps_ok = not (spec.dynamic and not spec.specialize_float and spec.form == "hf")
    in_norm = bf16 and eps_ok and all(qkv)
    post_norm = bf16 and eps_ok and all(gu)
    silu = bf16 and _quantized(hidden, inter)
    out = {
        "norm_quant": int(in_norm),
        "add_norm_quant": (L - 1) * int(in_norm) + L * int(post_norm),
        "silu_quant": L * int(silu),
        "dedup_quant": dedup if bf16 else 0,
    }
    return {k: v for k, v in out.items() if v}
