"""Engine-style Llama / Qwen3 decoder, written the way vLLM and sglang model code is written.

Differences from the Hugging Face modeling code, all of them exact for the same weights:
- norms call the op vocabulary: ``rms_norm`` for the first layer's input norm, then ``add_rms_norm``
  (residual add + norm in one op, which also returns the new residual) for every later norm;
- q/k/v are one merged linear (``qkv_proj``) and gate/up one merged linear (``gate_up_proj``) followed by
  ``silu_and_mul``. Merging block-FP8 weights is exact when each part's N is a multiple of 128: the
  ``weight_scale_inv`` rows then never straddle two parts, so they concatenate along N like the weights;
- RoPE and causal SDPA (GQA) use the same tensor ops in the same dtypes as transformers 5.x.

Shapes: ``input_ids [B, S]``, ``positions [B, S]`` (default ``arange(S)``), logits ``[B, S, vocab]``.
With a ``KVCache`` the new keys/values are written at ``positions`` and attention runs over the whole static
cache with a ``key_pos <= query_pos`` mask, so a decode step (S = 1) has fixed shapes for CUDA graphs. That
attention is ``decode_attention``, by default written out (q @ k^T, fp32 softmax, @ v), the fastest of the
formulations measured at decode; the step without a cache (prefill) uses SDPA as transformers does.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .. import quantize as q

ops = torch.ops.fp8_fusion


class RMSNorm(nn.Module):
    """``forward(x)`` -> ``rms_norm``; ``forward(x, residual)`` -> ``add_rms_norm`` -> ``(y, residual + x)``."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class KVCache:
    """Static per-layer key/value buffers ``[B, n_kv_heads, max_seq, head_dim]``.

    The buffers are marked static (``torch._dynamo.mark_static_address``, as transformers' StaticCache does) so a
    compiled decode step that writes into them can still be captured in one CUDA graph.
    """

    def __init__(self, num_layers: int, batch: int, max_seq: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        shape = (batch, num_kv_heads, max_seq, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.batch, self.max_seq = batch, max_seq
        for t in self.k + self.v:
            torch._dynamo.mark_static_address(t)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, S, D]; cos, sin: [B, S, D] in x.dtype (transformers' apply_rotary_pos_emb, unsqueeze_dim=1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)


class Attention(nn.Module):
    def __init__(self, qkv_proj: nn.Module, o_proj: nn.Module, num_heads: int, num_kv_heads: int, head_dim: int,
                 q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None) -> None:
        super().__init__()
        self.qkv_proj, self.o_proj, self.q_norm, self.k_norm = qkv_proj, o_proj, q_norm, k_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        self.scaling = head_dim**-0.5

    def forward(self, h, cos, sin, positions, cache_kv=None):
        b, s, _ = h.shape
        q, k, v = self.qkv_proj(h).split(self.sizes, dim=-1)
        q = q.view(b, s, self.num_heads, self.head_dim)
        k = k.view(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q = _rope(q.transpose(1, 2), cos, sin)  # [B, H, S, D]
        k = _rope(k.transpose(1, 2), cos, sin)
        v = v.view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if cache_kv is None:
            causal = False  # a plain bool: under dynamic shapes `s > 1` is a SymBool, which SDPA rejects
            if s > 1:
                causal = True
            o = F.scaled_dot_product_attention(q, k, v, scale=self.scaling, is_causal=causal,
                                               enable_gqa=self.num_heads != self.num_kv_heads)
        else:
            o = self._cached(q, k, v, positions, *cache_kv)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim))

    def _cached(self, q, k, v, positions, k_cache, v_cache):
        b = q.shape[0]
        # Token (b, positions[b, i]) of every head, written into the cache tensor itself: an index_put_ on the
        # graph input, which Inductor keeps in place. (Writing through a transposed view of the cache made
        # functionalization copy the whole cache back every step: 35 us per layer and tensor at batch 64 on the
        # H200, benchmarks/profile_step.py.)
        rows = torch.arange(b, device=q.device).view(b, 1, 1)
        heads = torch.arange(self.num_kv_heads, device=q.device).view(1, -1, 1)
        at = positions.unsqueeze(1)  # [B, 1, S]
        k_cache.index_put_((rows, heads, at), k)
        v_cache.index_put_((rows, heads, at), v)
        return decode_attention(q, k_cache, v_cache, positions, self.scaling)


# How a step with a KV cache attends (``decode_attention``'s ``impl``). ``benchmarks/attention_decode.py`` on the
# H200 (2026-12-01, Qwen3-8B heads, 512 of 576 cache slots valid, compiled, CUDA-graph replays): math 8.8 / 11.5 /
# 51.6 us at batch 1 / 8 / 64, SDPA with a mask (cuDNN) 19.7 / 20.6 / 68.8, flex 24.0 / 24.8 / 47.9, SDPA
# mem-efficient 29.4 / 30.4 / 86.8. The fused kernels run one program per (batch, kv head), 8 at batch 1, and
# walk the 576 keys serially; the math form's GEMMs and softmax spread them over the GPU.
DECODE_ATTENTION = "math"
# "fp32": the math form without its two bf16 roundings (scores and probabilities stay fp32, v widened), the exact
# attention the fused op is held to (tests compare a model with the op against this one run eagerly).
DECODE_ATTENTION_IMPLS = ("sdpa_mask", "sdpa_efficient", "math", "flex", "fp32")


@contextlib.contextmanager
def attention_impl(impl: str) -> Iterator[None]:
    """Every engine model attends with ``impl`` (``DECODE_ATTENTION_IMPLS``) inside the block: "fp32" runs a model
    eagerly with the exact attention the fused ``decode_attention`` is held to (``verify``, the fuzz, the GPU tests)."""
    global DECODE_ATTENTION
    if impl not in DECODE_ATTENTION_IMPLS:
        raise ValueError(f"decode attention impl must be one of {DECODE_ATTENTION_IMPLS}, got {impl!r}")
    saved, DECODE_ATTENTION = DECODE_ATTENTION, impl
    try:
        yield
    finally:
        DECODE_ATTENTION = saved


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                     scale: float, impl: str | None = None) -> torch.Tensor:
    """``q [B, H, S, D]`` attends over the whole static cache ``[B, Hkv, T, D]`` where key_pos <= positions
    ``[B, S]``. All formulations compute the same softmax attention (fp32 softmax); they differ in kernels.
    ``impl`` None: ``DECODE_ATTENTION``."""
    impl = impl or DECODE_ATTENTION
    if impl not in DECODE_ATTENTION_IMPLS:
        raise ValueError(f"decode attention impl must be one of {DECODE_ATTENTION_IMPLS}, got {impl!r}")
    b, h, s, d = q.shape
    hkv, t = k_cache.shape[1], k_cache.shape[2]
    rep = h // hkv
    if impl == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        def visible(score, bi, hi, qi, ki):
            return torch.where(ki <= positions[bi, qi], score, float("-inf"))

        return flex_attention(q, k_cache, v_cache, score_mod=visible, scale=scale, enable_gqa=rep > 1)
    mask = torch.arange(t, device=q.device) <= positions.unsqueeze(-1)  # [B, S, T]
    # GQA without repeating the cache: the rep query heads of one kv head become rep * S query rows.
    qg = q.reshape(b, hkv, rep * s, d)
    mask = mask.unsqueeze(1).expand(b, rep, s, t).reshape(b, 1, rep * s, t)
    if impl == "math":
        scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * scale
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
        o = torch.matmul(probs, v_cache)
    elif impl == "fp32":
        scores = torch.matmul(qg.float(), k_cache.float().transpose(-1, -2)) * scale
        o = torch.matmul(scores.masked_fill(~mask, float("-inf")).softmax(-1), v_cache.float()).to(q.dtype)
    elif impl == "sdpa_efficient":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            o = F.scaled_dot_product_attention(qg, k_cache, v_cache, attn_mask=mask, scale=scale)
    else:
        o = F.scaled_dot_product_attention(qg, k_cache, v_cache, attn_mask=mask, scale=scale)
    return o.reshape(b, h, s, d)


class MLP(nn.Module):
    def __init__(self, gate_up_proj: nn.Module, down_proj: nn.Module) -> None:
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj

    def forward(self, x):
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, self_attn: Attention, mlp: MLP, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm

    def forward(self, h, residual, cos, sin, positions, cache_kv=None):
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, cos, sin, positions, cache_kv)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class EngineModel(nn.Module):
    def __init__(self, embed_tokens: nn.Embedding, layers: list[DecoderLayer], norm: RMSNorm) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm = embed_tokens, nn.ModuleList(layers), norm


class EngineForCausalLM(nn.Module):
    """``forward(input_ids, positions=None, kv_cache=None) -> logits``; ``.config`` is the HF config."""

    def __init__(self, config, model: EngineModel, lm_head: nn.Module, inv_freq: torch.Tensor,
                 attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.config, self.model, self.lm_head = config, model, lm_head
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)
        self.attention_scaling = attention_scaling

    def _rope_tables(self, positions, dtype):
        # transformers' RotaryEmbedding.forward: fp32 angles, cos/sin scaled, then rounded to the activation dtype
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        b, s = input_ids.shape
        if positions is None:
            positions = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
        h = self.model.embed_tokens(input_ids)
        cos, sin = self._rope_tables(positions, h.dtype)
        residual = None
        for i, layer in enumerate(self.model.layers):
            cache_kv = None if kv_cache is None else (kv_cache.k[i], kv_cache.v[i])
            h, residual = layer(h, residual, cos, sin, positions, cache_kv)
        h, _ = self.model.norm(h, residual)
        return self.lm_head(h)

    def new_kv_cache(self, batch: int, max_seq: int) -> KVCache:
        c = self.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        dtype = self.model.embed_tokens.weight.dtype
        return KVCache(len(self.model.layers), batch, max_seq, c.num_key_value_heads, head_dim, dtype,
                       self.inv_freq.device)


def merge_linears(parts: list[nn.Module], names: list[str]) -> nn.Module:
    """One linear whose output is the concatenation of ``parts``' outputs (exact; no requantization)."""
    kinds = {type(p) for p in parts}
    if len(kinds) != 1:
        listing = ", ".join(f"{n}: {type(p).__name__}" for n, p in zip(names, parts))
        raise ValueError(f"cannot merge linears of different kinds ({listing}); quantize all of them or none")
    first = parts[0]
    has_bias = first.bias is not None
    bias = torch.cat([p.bias.detach() for p in parts]) if has_bias else None
    n = sum(p.out_features for p in parts)
    if isinstance(first, q.BlockFP8Linear):
        for name, p in zip(names, parts):
            if p.out_features % q.BLOCK[0]:
                raise ValueError(f"cannot merge block-FP8 {name}: N={p.out_features} is not a multiple of "
                                 f"{q.BLOCK[0]}, so its scale rows straddle the next part")
        merged = q.BlockFP8Linear(first.in_features, n, has_bias, group_size=first.group_size,
                                  fp8_dtype=first.weight.dtype, device="meta",
                                  dtype=bias.dtype if has_bias else torch.bfloat16)
        merged.weight = torch.cat([p.weight for p in parts])
        merged.weight_scale_inv = torch.cat([p.weight_scale_inv for p in parts])
    elif isinstance(first, nn.Linear):
        w = first.weight
        merged = nn.Linear(first.in_features, n, has_bias, device="meta", dtype=w.dtype)
        merged.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]), requires_grad=False)
    else:
        raise NotImplementedError(
            f"cannot merge {type(first).__name__} ({', '.join(names)}): per-tensor scales differ per part, so a "
            "merged weight needs requantization; build the engine from the bf16 model and quantize it instead")
    if has_bias:
        merged.bias = nn.Parameter(bias, requires_grad=False)
    return merged


def _norm(hf_norm: nn.Module) -> RMSNorm:
    eps = getattr(hf_norm, "variance_epsilon", getattr(hf_norm, "eps", None))
    return RMSNorm(hf_norm.weight, eps)


def _layer(hf_layer: nn.Module, config, prefix: str) -> DecoderLayer:
    a, m = hf_layer.self_attn, hf_layer.mlp
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    qkv = merge_linears([a.q_proj, a.k_proj, a.v_proj], [f"{prefix}self_attn.{n}_proj" for n in "qkv"])
    qk_norms = (_norm(a.q_norm), _norm(a.k_norm)) if hasattr(a, "q_norm") else (None, None)
    attn = Attention(qkv, a.o_proj, config.num_attention_heads, config.num_key_value_heads, head_dim, *qk_norms)
    gate_up = merge_linears([m.gate_proj, m.up_proj], [f"{prefix}mlp.gate_proj", f"{prefix}mlp.up_proj"])
    return DecoderLayer(attn, MLP(gate_up, m.down_proj), _norm(hf_layer.input_layernorm),
                        _norm(hf_layer.post_attention_layernorm))


def engine_from_hf(hf_model: nn.Module, consume: bool = False) -> EngineForCausalLM:
    """An engine model computing what ``hf_model`` computes, sharing its norms, embeddings, o/down projections
    and lm_head, with q/k/v and gate/up merged (new tensors). ``consume=True`` drops each HF decoder layer once
    converted, so peak memory grows by one layer's merged weights, not the model's."""
    config, base = hf_model.config, hf_model.model
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and any(
        t != "full_attention" for t in (getattr(config, "layer_types", None) or ["full_attention"])
    ):
        raise NotImplementedError("sliding-window attention layers are not supported by the engine model")
    layers = []
    for i in range(len(base.layers)):
        layers.append(_layer(base.layers[i], config, f"model.layers.{i}."))
        if consume:
            base.layers[i] = nn.Identity()
    rotary = base.rotary_emb
    engine = EngineForCausalLM(config, EngineModel(base.embed_tokens, layers, _norm(base.norm)), hf_model.lm_head,
                               rotary.inv_freq.detach().clone(), float(getattr(rotary, "attention_scaling", 1.0)))
    return engine.eval()
