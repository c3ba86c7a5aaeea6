"""Pure-torch semantics of every op: the numerical oracle, runnable on any device.

This file *is* the numerics contract of ``DESIGN.md``; kernels are tested against it, and the pattern
search functions are written from it, so the matched graph and the oracle are the same code.

Layouts (DeepSeek-V3 / Qwen3-FP8 checkpoints):
- activations ``x [..., K]``, quantized per row in groups of ``group_size`` contiguous values:
  ``q [..., K]`` fp8 and ``scale [..., K // group_size]`` fp32, row-major;
- weights ``w_q [N, K]`` fp8 with ``w_scale [ceil(N/128), ceil(K/128)]`` fp32, the *dequant multiplier*
  (checkpoints call it ``weight_scale_inv``).
"""

from __future__ import annotations

import torch

AMAX_FLOOR = 1e-10  # scale = max(amax, 1e-10) / FP8_MAX: an all-zero group gives zeros, never NaN


def _over_fp8_max(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    # Divide by a tensor, not a Python float: torch CUDA computes ``t / 448.0`` as ``t * float32(1 / 448)``, one
    # ulp off the correctly rounded scale in 59% of groups (BinaryDivTrueKernel.cu); the contract is the division.
    return amax / torch.full((), fp8_max, dtype=amax.dtype, device=amax.device)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF ``Qwen3RMSNorm`` / ``LlamaRMSNorm``: normalise in fp32, round to x.dtype, multiply by w (rounds again)."""
    # x: [..., K], w: [K]
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    return w * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float):
    """HF decoder layer: ``residual = residual + x`` (rounded to x.dtype), then RMSNorm of that sum."""
    residual_out = residual + x
    return rms_norm(residual_out, w, eps), residual_out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF ``apply_rotary_pos_emb`` (rotate-half): ``x [B, H, S, D]``, ``cos`` / ``sin [B, S, D]`` in x.dtype; each
    op rounds to x.dtype as eager does."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    d = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., d:], x[..., :d]), dim=-1) * sin)


def rms_norm_rope(q, wq, k, wk, eps: float, cos, sin):
    """Qwen3 attention's per-head q / k norms then RoPE: ``q [B, S, Hq, D]``, ``k [B, S, Hk, D]`` ->
    ``(rope(rms_norm(q).transpose(1, 2)), rope(rms_norm(k).transpose(1, 2)))``, each ``[B, H, S, D]`` contiguous."""
    return tuple(rope(rms_norm(x, w, eps).transpose(1, 2), cos, sin).contiguous() for x, w in ((q, wq), (k, wk)))


def write_cache(cache: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> None:
    """``cache[b, h, positions[b, s]] = x[b, h, s]``: ``x [B, H, S, D]`` into a static ``cache [B, H, T, D]``;
    ``positions [B, S]`` per batch row (the engine's ``index_put_``) or ``[S]`` shared by all (HF's
    ``index_copy_(2, cache_position, x)``). A negative position counts from the end, as indexing does; one out of
    range raises."""
    b, h, s, _ = x.shape
    rows = torch.arange(b, device=cache.device)[:, None, None]
    heads = torch.arange(h, device=cache.device)[None, :, None]
    cache.index_put_((rows, heads, positions.expand(b, s)[:, None, :]), x)


def rms_norm_rope_cache(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache) -> torch.Tensor:
    """``rms_norm_rope``, then its k and ``v [B, Hk, S, D]`` written into their static caches (``write_cache``);
    returns q ``[B, Hq, S, D]``. k_cache / v_cache are updated in place."""
    q_out, k_out = rms_norm_rope(q, wq, k, wk, eps, cos, sin)
    write_cache(k_cache, k_out, positions)
    write_cache(v_cache, v, positions)
    return q_out


def qk_rope(q, k, cos, sin):
    """Llama attention's RoPE on q and k (no norms): ``q [B, S, Hq, D]``, ``k [B, S, Hk, D]`` ->
    ``(rope(q.transpose(1, 2)), rope(k.transpose(1, 2)))``, each ``[B, H, S, D]`` contiguous."""
    return tuple(rope(x.transpose(1, 2), cos, sin).contiguous() for x in (q, k))


def qk_rope_cache(q, k, cos, sin, v, positions, k_cache, v_cache) -> torch.Tensor:
    """``qk_rope``, then its k and ``v`` written into their static caches (``write_cache``); returns q."""
    q_out, k_out = qk_rope(q, k, cos, sin)
    write_cache(k_cache, k_out, positions)
    write_cache(v_cache, v, positions)
    return q_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with gate the first half of the last dim; each step rounds to x.dtype as HF does."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def group_quant(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype, fp8_max: float):
    """1 x group_size dynamic quant. Returns ``(q [..., K] fp8, scale [..., K/group_size] fp32)``.

    scale = max(amax, 1e-10) / FP8_MAX; q = clamp(x / scale, -FP8_MAX, FP8_MAX) cast round-to-nearest-even.
    The clamp makes every path agree: eager casts gave NaN out of range on torch 2.11/2.12, Triton saturates.
    A NaN in a group makes that group's scale NaN (and its values NaN), nothing else.
    """
    k = x.shape[-1]
    xg = x.to(torch.float32).reshape(*x.shape[:-1], k // group_size, group_size)
    amax = xg.abs().amax(-1, keepdim=True)
    scale = _over_fp8_max(amax.clamp(min=AMAX_FLOOR), fp8_max)
    q = (xg / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q.reshape(x.shape), scale.squeeze(-1)


def rms_norm_group_quant(x, w, eps, group_size, fp8_dtype, fp8_max):
    return group_quant(rms_norm(x, w, eps), group_size, fp8_dtype, fp8_max)


def add_rms_norm_group_quant(x, residual, w, eps, group_size, fp8_dtype, fp8_max):
    y, residual_out = add_rms_norm(x, residual, w, eps)
    q, scale = group_quant(y, group_size, fp8_dtype, fp8_max)
    return q, scale, residual_out


def silu_mul_group_quant(x, group_size, fp8_dtype, fp8_max):
    return group_quant(silu_and_mul(x), group_size, fp8_dtype, fp8_max)


def dequant_activation(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of a group-quantized activation (group size inferred from the shapes)."""
    group = q.shape[-1] // scale.shape[-1]
    return q.to(torch.float32) * scale.repeat_interleave(group, dim=-1)


WEIGHT_BLOCK = 128  # checkpoint weight blocks are 128 x 128; w_scale is [ceil(N/128), ceil(K/128)]


def dequant_weight(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of a 128x128 block-quantized weight; the last block row/column may be partial (N, K need
    not be multiples of 128). The block is fixed, not inferred from the shapes: ceil(N / rows) is wrong for N=200."""
    n, k = w_q.shape
    full = w_scale.repeat_interleave(WEIGHT_BLOCK, dim=0).repeat_interleave(WEIGHT_BLOCK, dim=1)[:n, :k]
    return w_q.to(torch.float32) * full


def blockscale_mm(q, x_scale, w_q, w_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """y[M, N] = dequant(q, x_scale) @ dequant(w_q, w_scale).T in fp32, cast to out_dtype."""
    return (dequant_activation(q, x_scale) @ dequant_weight(w_q, w_scale).t()).to(out_dtype)


def blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype: torch.dtype) -> torch.Tensor:
    """The GEMMs of one activation with several weights, outputs concatenated along N."""
    return torch.cat([blockscale_mm(q, x_scale, w, ws, out_dtype) for w, ws in zip(w_qs, w_scales)], dim=-1)


def blockscale_mm_silu_mul_group_quant(q, x_scale, w_qs, w_scales, out_dtype, group_size, fp8_dtype, fp8_max):
    """The gate/up GEMM (one merged ``[2I, K]`` weight or gate and up ``[I, K]``) in out_dtype, then
    ``silu_mul_group_quant``: the unfused pair the fused op stands for."""
    return silu_mul_group_quant(blockscale_mm_grouped(q, x_scale, w_qs, w_scales, out_dtype), group_size, fp8_dtype,
                                fp8_max)


def group_quant_blockscale_mm(x, w_q, w_scale, out_dtype, group_size, fp8_dtype, fp8_max):
    """``group_quant`` then ``blockscale_mm``: the unfused pair ``group_quant_blockscale_mm`` stands for."""
    q, x_scale = group_quant(x, group_size, fp8_dtype, fp8_max)
    return blockscale_mm(q, x_scale, w_q, w_scale, out_dtype)


def per_tensor_quant(x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float):
    """Dynamic per-tensor quant: one scale for the whole tensor. Returns ``(q, scale[1])``."""
    xf = x.to(torch.float32)
    scale = _over_fp8_max(xf.abs().amax().clamp(min=AMAX_FLOOR), fp8_max).reshape(1)
    return (xf / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype), scale


def per_tensor_mm(q, x_scale, w_q, w_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """y = (q * x_scale) @ (w_q * w_scale).T with one scale per tensor."""
    a = q.to(torch.float32) * x_scale.to(torch.float32)
    w = w_q.to(torch.float32) * w_scale.to(torch.float32)
    return (a @ w.t()).to(out_dtype)


def quantize_weight_blockwise(w: torch.Tensor, block: tuple[int, int], fp8_dtype: torch.dtype, fp8_max: float):
    """128x128 block recipe: scale = amax(block) / FP8_MAX. Returns ``(w_q [N, K], w_scale [N/bn, K/bk] fp32)``."""
    n, k = w.shape
    bn, bk = block
    if n % bn or k % bk:
        raise ValueError(f"weight [{n}, {k}] is not a multiple of the block {block}")
    wb = w.to(torch.float32).reshape(n // bn, bn, k // bk, bk)
    amax = wb.abs().amax(dim=(1, 3), keepdim=True)
    scale = _over_fp8_max(amax.clamp(min=AMAX_FLOOR), fp8_max)
    w_q = (wb / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype).reshape(n, k)
    return w_q, scale.reshape(n // bn, k // bk)


def decode_attention(q, k_cache, v_cache, keep, scale: float) -> torch.Tensor:
    """Softmax attention of ``q [B, Hkv, R, D]`` (the R query rows that share a kv head) over the cache slots
    ``t`` of ``k_cache / v_cache [B, Hkv, T, D]`` where ``keep [B|1, Hkv|1, R|1, T]`` is True: scores, softmax and
    the sum over values in fp32, the output rounded to q's dtype once. A row that keeps no slot is NaN, as
    softmax over nothing is."""
    s = torch.matmul(q.float(), k_cache.float().transpose(-1, -2)) * scale
    s = s.masked_fill(~keep, float("-inf"))
    return torch.matmul(s.softmax(-1), v_cache.float()).to(q.dtype)


def decode_attention_upto(q, k_cache, v_cache, last, scale: float) -> torch.Tensor:
    """``decode_attention`` with batch row b seeing the slots ``0..last[b]``."""
    keep = torch.arange(k_cache.shape[2], device=q.device) <= last.view(-1, 1, 1, 1)
    return decode_attention(q, k_cache, v_cache, keep, scale)


def decode_attention_tokens(q, k_cache, v_cache, last, scale: float) -> torch.Tensor:
    """A step of S tokens in the engine's layouts: ``q [B, Hq, S, D]``, query head h reading kv head
    ``h // (Hq / Hkv)``, token s of batch row b seeing the slots ``0..last[b, s]`` (``last [B, S]``); the output
    ``[B, S, Hq, D]`` as the o_proj reads it. ``decode_attention`` on the G heads x S tokens of each kv head."""
    b, hq, s, d = q.shape
    hkv, t = k_cache.shape[1], k_cache.shape[2]
    keep = torch.arange(t, device=q.device) <= last.unsqueeze(-1)  # [B, S, T]
    keep = keep.unsqueeze(1).expand(b, hq // hkv, s, t).reshape(b, 1, hq // hkv * s, t)
    o = decode_attention(q.reshape(b, hkv, hq // hkv * s, d), k_cache, v_cache, keep, scale)
    return o.reshape(b, hq, s, d).transpose(1, 2).contiguous()


def rope_decode_attention(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache, last, scale: float):
    """One decode token's RoPE, cache writes and attention: ``rms_norm_rope_cache`` (``wq`` None:
    ``qk_rope_cache``), its q ``[B, Hq, 1, D]`` grouped as ``[B, Hkv, Hq / Hkv, D]``, then ``decode_attention_upto``
    over the caches it wrote. Returns the attention output (the caches are written in place)."""
    if wq is None:
        q_out = qk_rope_cache(q, k, cos, sin, v, positions, k_cache, v_cache)
    else:
        q_out = rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)
    b, hq, _, d = q_out.shape
    hkv = k_cache.shape[1]
    return decode_attention_upto(q_out.reshape(b, hkv, hq // hkv, d), k_cache, v_cache, last, scale)


def rope_decode_attention_tokens(q, wq, k, wk, eps: float, cos, sin, v, positions, k_cache, v_cache, last,
                                 scale: float):
    """A step of S tokens' RoPE, cache writes and attention: ``rms_norm_rope_cache`` (``wq`` None:
    ``qk_rope_cache``), then ``decode_attention_tokens`` on its q ``[B, Hq, S, D]`` over the caches it wrote.
    Returns the attention output ``[B, S, Hq, D]`` (the caches are written in place)."""
    if wq is None:
        q_out = qk_rope_cache(q, k, cos, sin, v, positions, k_cache, v_cache)
    else:
        q_out = rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)
    return decode_attention_tokens(q_out, k_cache, v_cache, last, scale)
