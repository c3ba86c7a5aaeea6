"""The attention side's ops, namespace ``fp8_fusion`` (registered by importing ``ops.py``, which imports this):
Qwen3's q / k norms and RoPE, the static KV-cache writes, and decode attention over the caches, alone or with the
step's RoPE and the o_proj's input quant in its launch. Each real implementation validates its inputs and dispatches
to the device's backend; each fake validates the same way and describes the outputs (``ops.py``'s conventions).

Outputs (``g = group_size``):
  rms_norm_rope(q [B,S,Hq,D], wq, k [B,S,Hk,D], wk, eps, cos [B,S,D], sin)  -> (q [B,Hq,S,D], k [B,Hk,S,D])
  qk_rope(q [B,S,Hq,D], k [B,S,Hk,D], cos, sin)     -> (q [B,Hq,S,D], k [B,Hk,S,D])   (rms_norm_rope without norms)
  rms_norm_rope_cache(q, wq, k, wk, eps, cos, sin, v [B,Hk,S,D], positions [B|1,S] or [S], k_cache!, v_cache!)
                                                     -> q [B,Hq,S,D]; k, v written at positions into caches [B,Hk,T,D]
  qk_rope_cache(q, k, cos, sin, v, positions, k_cache!, v_cache!) -> q     (the same, without norms)
  decode_attention(q [B,Hkv,R,D], k_cache [B,Hkv,T,D], v_cache, keep [B|1,Hkv|1,R|1,T] bool, scale) -> o [B,Hkv,R,D]
  decode_attention_upto(q, k_cache, v_cache, last [B] int, scale) -> o: keep = slot <= last[b], every row
  decode_attention_upto_quant(q, k_cache, v_cache, last, scale, g) -> (o_q [B,Hkv,R,D] fp8, scale [B,Hkv,R,D/g])
                                                     (group_quant of decode_attention_upto's output, one launch)
  decode_attention_tokens(q [B,Hq,S,D], k_cache, v_cache, last [B,S] int, scale) -> o [B,S,Hq,D]
                                                     (token s sees slots 0..last[b, s]; the engine's layouts)
  decode_attention_tokens_quant(q [B,Hq,S,D], k_cache, v_cache, last [B,S] int, scale, g)
                        -> (o_q [B,S,Hq,D] fp8, scale [B,S,Hq,D/g])   (token s sees slots 0..last[b, s]; quantized)
  rope_decode_attention(q [B,1,Hq,D], wq?, k [B,1,Hk,D], wk?, eps, cos, sin, v [B,Hk,1,D], positions, k_cache!,
                        v_cache!, last [B], scale, g) -> (o [B,Hk,Hq/Hk,D], scale [B,Hk,Hq/Hk,D/g or 0])
                                                     (rms_norm_rope_cache / qk_rope_cache, then decode_attention_upto
                                                      and with g > 0 its quant: one launch)
  rope_decode_attention_tokens(q [B,S,Hq,D], wq?, k [B,S,Hk,D], wk?, eps, cos, sin, v [B,Hk,S,D], positions,
                        k_cache!, v_cache!, last [B,S], scale) -> o [B,S,Hq,D]   (the same, then
                                                      decode_attention_tokens: one launch)
  rope_decode_attention_tokens_quant(q [B,S,Hq,D], wq?, k [B,S,Hk,D], wk?, eps, cos, sin, v [B,Hk,S,D], positions,
                        k_cache!, v_cache!, last [B,S], scale, g) -> (o_q [B,S,Hq,D] fp8, scale [B,S,Hq,D/g])
                                                     (rms_norm_rope_cache / qk_rope_cache, then
                                                      decode_attention_tokens_quant: one launch)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

from . import checks
from .ops import NS, _kernel, _quant_outputs


def _check_norm_rope(op, q, wq, k, wk, cos, sin):
    for name, x in (("q", q), ("k", k)):  # any strides: the kernel takes them all (and so the fake's check
        checks.activation(op, name, x, any_strides=True)  # cannot fail at lowering over a layout Inductor chose)
        if x.dim() != 4:
            raise ValueError(f"{op}: {name} must be [B, S, H, D], got shape {tuple(x.shape)}")
    b, s, _, d = q.shape
    if k.dtype != q.dtype or k.shape[0] != b or k.shape[1] != s or k.shape[3] != d:
        raise ValueError(f"{op}: k must be [B, S, Hk, D] = [{b}, {s}, Hk, {d}] of q's dtype {q.dtype}, got "
                         f"{tuple(k.shape)} {k.dtype}")  # fmt: skip
    if d % 2:
        raise ValueError(f"{op}: the head dim must be even (rotate-half RoPE), got {d}")
    if wq is not None:  # qk_rope: no norms
        checks.norm_weight(op, q, wq)
        checks.norm_weight(op, k, wk)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, b) or tuple(t.shape[1:]) != (s, d) or t.dtype != q.dtype:
            raise ValueError(f"{op}: {name} must be [{b} or 1, {s}, {d}] of q's dtype {q.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")  # fmt: skip
    checks.same_device(op, q=q, k=k, wq=wq, wk=wk, cos=cos, sin=sin)


@custom_op(f"{NS}::rms_norm_rope", mutates_args=())
def rms_norm_rope(q: Tensor, wq: Tensor, k: Tensor, wk: Tensor, eps: float, cos: Tensor, sin: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """Qwen3 attention's per-head q / k norms and the RoPE after them (``reference.rms_norm_rope``), both
    tensors in one launch on the Triton backend (``kernels/triton/rms_norm_rope.py``). Outputs ``[B, H, S, D]``
    contiguous: the layout after ``transpose(1, 2)``."""
    _check_norm_rope("rms_norm_rope", q, wq, k, wk, cos, sin)
    return _kernel("rms_norm_rope", q)(q, wq, k, wk, eps, cos, sin)


@rms_norm_rope.register_fake
def _(q, wq, k, wk, eps, cos, sin):
    _check_norm_rope("rms_norm_rope", q, wq, k, wk, cos, sin)
    b, s, hq, d = q.shape
    return q.new_empty((b, hq, s, d)), k.new_empty((b, k.shape[2], s, d))


def _check_norm_rope_cache(op, q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache):
    _check_norm_rope(op, q, wq, k, wk, cos, sin)
    b, s, hk, d = k.shape
    checks.activation(op, "v", v, any_strides=True)
    if tuple(v.shape) != (b, hk, s, d) or v.dtype != q.dtype:
        raise ValueError(f"{op}: v must be [B, Hk, S, D] = [{b}, {hk}, {s}, {d}] of q's dtype {q.dtype}, got "
                         f"{tuple(v.shape)} {v.dtype}")  # fmt: skip
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or (c.shape[0], c.shape[1], c.shape[3]) != (b, hk, d) or c.dtype != q.dtype:
            raise ValueError(f"{op}: {name} must be [B, Hk, T, D] = [{b}, {hk}, T, {d}] of q's dtype {q.dtype}, "
                             f"got {tuple(c.shape)} {c.dtype}")  # fmt: skip
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{op}: k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")  # fmt: skip
    # The rank first: a tuple == compares items before lengths, so ``(B, S) == (S,)`` would compare a symbolic
    # B with S, and under a marked-dynamic batch that guard specializes it (Dynamo's ConstraintViolationError).
    pos_ok = positions.dtype in (torch.int32, torch.int64) and (
        (positions.dim() == 1 and positions.shape[0] == s) or (positions.dim() == 2 and positions.shape[0] in (1, b)
                                                               and positions.shape[1] == s))  # fmt: skip
    if not pos_ok:
        raise ValueError(f"{op}: positions must be int32 / int64 [B or 1, S] or [S] = [{s}], got "
                         f"{tuple(positions.shape)} {positions.dtype}")  # fmt: skip
    checks.same_device(op, q=q, v=v, positions=positions, k_cache=k_cache, v_cache=v_cache)


@custom_op(f"{NS}::rms_norm_rope_cache", mutates_args=("k_cache", "v_cache"))
def rms_norm_rope_cache(q: Tensor, wq: Tensor, k: Tensor, wk: Tensor, eps: float, cos: Tensor, sin: Tensor,
                        v: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
    """``rms_norm_rope`` with the static KV-cache writes after it (``reference.rms_norm_rope_cache``): k and
    ``v [B, Hk, S, D]`` go into ``k_cache`` / ``v_cache [B, Hk, T, D]`` at ``positions``, in place, in the same
    launch on the Triton backend; returns q ``[B, Hq, S, D]`` contiguous."""
    _check_norm_rope_cache("rms_norm_rope_cache", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache)
    return _kernel("rms_norm_rope_cache", q)(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache)


@rms_norm_rope_cache.register_fake
def _(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache):
    _check_norm_rope_cache("rms_norm_rope_cache", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache)
    b, s, hq, d = q.shape
    return q.new_empty((b, hq, s, d))


@custom_op(f"{NS}::qk_rope", mutates_args=())
def qk_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Llama attention's RoPE on q and k (``reference.qk_rope``: ``rms_norm_rope`` without the norms), both
    tensors in one launch on the Triton backend. Outputs ``[B, H, S, D]`` contiguous."""
    _check_norm_rope("qk_rope", q, None, k, None, cos, sin)
    return _kernel("qk_rope", q)(q, k, cos, sin)


@qk_rope.register_fake
def _(q, k, cos, sin):
    _check_norm_rope("qk_rope", q, None, k, None, cos, sin)
    b, s, hq, d = q.shape
    return q.new_empty((b, hq, s, d)), k.new_empty((b, k.shape[2], s, d))


@custom_op(f"{NS}::qk_rope_cache", mutates_args=("k_cache", "v_cache"))
def qk_rope_cache(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, v: Tensor, positions: Tensor, k_cache: Tensor,
                  v_cache: Tensor) -> Tensor:
    """``qk_rope`` with the static KV-cache writes after it, as ``rms_norm_rope_cache``; returns q."""
    _check_norm_rope_cache("qk_rope_cache", q, None, k, None, cos, sin, v, positions, k_cache, v_cache)
    return _kernel("qk_rope_cache", q)(q, k, cos, sin, v, positions, k_cache, v_cache)


@qk_rope_cache.register_fake
def _(q, k, cos, sin, v, positions, k_cache, v_cache):
    _check_norm_rope_cache("qk_rope_cache", q, None, k, None, cos, sin, v, positions, k_cache, v_cache)
    b, s, hq, d = q.shape
    return q.new_empty((b, hq, s, d))


ATTENTION_DTYPES = (torch.bfloat16, torch.float16)
ATTENTION_MAX_ROWS = 64  # query rows per kv head (the Triton kernel keeps them in registers)
ATTENTION_MAX_HEAD_DIM = 256


def _check_decode_attention(op, q, k_cache, v_cache, scale, keep=None, last=None, tokens=False):
    """The shared checks; ``keep`` (decode_attention) or ``last`` (decode_attention_upto) says what is seen;
    ``tokens``: q is ``[B, Hq, S, D]`` and last ``[B, S]`` (decode_attention_tokens_quant)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)) + ((("keep", keep),) if last is None else ()):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{op}: {name} must be a 4-D tensor, got {got}")
    if q.dtype not in ATTENTION_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"{op}: q, k_cache and v_cache must share one dtype, bf16 or fp16; got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    b, hkv, r, d = q.shape
    if tokens:  # q [B, Hq, S, D]: each kv head's rows are its G query heads x the S tokens
        b, hq, s, d = q.shape
        hkv = k_cache.shape[1]
        if hkv == 0 or hq % hkv:
            raise ValueError(f"{op}: the query heads ({hq}) must be a multiple of the kv heads ({hkv})")
        r = hq // hkv * s
    if tuple(k_cache.shape) != tuple(v_cache.shape) or tuple(k_cache.shape[:2]) != (b, hkv) or k_cache.shape[3] != d:
        raise ValueError(f"{op}: k_cache and v_cache must both be [B, Hkv, T, D] = [{b}, {hkv}, T, {d}] (q's B, Hkv, "
                         f"D), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    t = k_cache.shape[2]
    if last is not None:
        want, each = ((b, s), "batch row and token") if tokens else ((b,), "batch row")
        if not isinstance(last, Tensor) or last.dim() != len(want) or last.dtype not in (torch.int32, torch.int64):
            got = f"{tuple(last.shape)} {last.dtype}" if isinstance(last, Tensor) else type(last).__name__
            raise TypeError(f"{op}: last must be a {len(want)}-D int32 / int64 tensor, the last slot each {each} "
                            f"sees; got {got}")  # fmt: skip
        if tuple(last.shape) != want:
            raise ValueError(f"{op}: last must be {list(want)} (one entry per {each}), got {list(last.shape)}")
    elif keep.dtype != torch.bool:
        raise TypeError(f"{op}: keep must be a bool mask (True: the slot is seen), got {keep.dtype}")
    elif any(m not in (1, n) for m, n in zip(keep.shape[:3], (b, hkv, r))) or keep.shape[3] != t:
        raise ValueError(f"{op}: keep must broadcast to [B, Hkv, R, T] = [{b}, {hkv}, {r}, {t}], got "
                         f"{tuple(keep.shape)}")
    if r > ATTENTION_MAX_ROWS or d > ATTENTION_MAX_HEAD_DIM:
        raise ValueError(f"{op}: at most {ATTENTION_MAX_ROWS} query rows per kv head and head dim "
                         f"{ATTENTION_MAX_HEAD_DIM}, got {r} rows of {d}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a number, got {type(scale).__name__}")
    checks.same_device(op, q=q, k_cache=k_cache, v_cache=v_cache, **({"keep": keep} if last is None else
                                                                       {"last": last}))


@custom_op(f"{NS}::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, keep: Tensor, scale: float) -> Tensor:
    """Softmax attention of the R query rows per kv head over a static cache (``reference.decode_attention``),
    one launch on the Triton backend (split-KV, GQA rows grouped). Output ``[B, Hkv, R, D]`` contiguous."""
    _check_decode_attention("decode_attention", q, k_cache, v_cache, scale, keep=keep)
    return _kernel("decode_attention", q)(q, k_cache, v_cache, keep, scale)


@decode_attention.register_fake
def _(q, k_cache, v_cache, keep, scale):
    _check_decode_attention("decode_attention", q, k_cache, v_cache, scale, keep=keep)
    return q.new_empty(q.shape)  # contiguous, whatever q's strides


@custom_op(f"{NS}::decode_attention_upto", mutates_args=())
def decode_attention_upto(q: Tensor, k_cache: Tensor, v_cache: Tensor, last: Tensor, scale: float) -> Tensor:
    """``decode_attention`` where batch row b sees the cache slots 0..last[b] (every query row alike: a decode
    step's causal mask over a static cache). The kernel reads no mask and no slot after ``last[b]``; a negative
    ``last[b]`` sees nothing (NaN rows, as softmax over nothing)."""
    _check_decode_attention("decode_attention_upto", q, k_cache, v_cache, scale, last=last)
    return _kernel("decode_attention_upto", q)(q, k_cache, v_cache, last, scale)


@decode_attention_upto.register_fake
def _(q, k_cache, v_cache, last, scale):
    _check_decode_attention("decode_attention_upto", q, k_cache, v_cache, scale, last=last)
    return q.new_empty(q.shape)


def _check_attention_quant(op, q, k_cache, v_cache, last, scale, group_size, tokens=False):
    _check_decode_attention(op, q, k_cache, v_cache, scale, last=last, tokens=tokens)
    d = q.shape[-1]
    if not isinstance(group_size, int) or group_size <= 0 or d % group_size or d & (d - 1):
        raise ValueError(f"{op}: the head dim must be a power of two and a multiple of the group size; got head dim "
                         f"{d}, group size {group_size}")


@custom_op(f"{NS}::decode_attention_upto_quant", mutates_args=())
def decode_attention_upto_quant(q: Tensor, k_cache: Tensor, v_cache: Tensor, last: Tensor, scale: float,
                                group_size: int) -> tuple[Tensor, Tensor]:
    """``group_quant(decode_attention_upto(...), group_size)`` in one launch: the output rounded to q's dtype, then
    quantized per 1 x group_size group of each row, as the o_proj's input quant would (bit for bit that pair)."""
    _check_attention_quant("decode_attention_upto_quant", q, k_cache, v_cache, last, scale, group_size)
    return _kernel("decode_attention_upto_quant", q)(q, k_cache, v_cache, last, scale, group_size)


@decode_attention_upto_quant.register_fake
def _(q, k_cache, v_cache, last, scale, group_size):
    _check_attention_quant("decode_attention_upto_quant", q, k_cache, v_cache, last, scale, group_size)
    return _quant_outputs(q, group_size)


@custom_op(f"{NS}::decode_attention_tokens", mutates_args=())
def decode_attention_tokens(q: Tensor, k_cache: Tensor, v_cache: Tensor, last: Tensor, scale: float) -> Tensor:
    """``decode_attention_tokens_quant`` without the quant, for an o_proj that reads q's dtype (bf16, or a per-tensor
    quant of its own): ``o [B, S, Hq, D]`` in q's dtype (``reference.decode_attention_tokens``), one launch on the
    Triton backend."""
    _check_decode_attention("decode_attention_tokens", q, k_cache, v_cache, scale, last=last, tokens=True)
    return _kernel("decode_attention_tokens", q)(q, k_cache, v_cache, last, scale)


@decode_attention_tokens.register_fake
def _(q, k_cache, v_cache, last, scale):
    _check_decode_attention("decode_attention_tokens", q, k_cache, v_cache, scale, last=last, tokens=True)
    return torch.empty_like(q.transpose(1, 2), memory_format=torch.contiguous_format)  # [B, S, Hq, D]


@custom_op(f"{NS}::decode_attention_tokens_quant", mutates_args=())
def decode_attention_tokens_quant(q: Tensor, k_cache: Tensor, v_cache: Tensor, last: Tensor, scale: float,
                                  group_size: int) -> tuple[Tensor, Tensor]:
    """A step of S tokens per row (verifying draft tokens) in the engine's layouts, then the o_proj's input quant,
    one launch on the Triton backend: ``q [B, Hq, S, D]`` (any strides), token s of row b seeing the slots
    ``0..last[b, s]`` (``reference.decode_attention_tokens``); returns ``(o_q [B, S, Hq, D], scales [B, S, Hq,
    D / group_size])``, bit for bit ``group_quant`` of that attention's output."""
    _check_attention_quant("decode_attention_tokens_quant", q, k_cache, v_cache, last, scale, group_size, True)
    return _kernel("decode_attention_tokens_quant", q)(q, k_cache, v_cache, last, scale, group_size)


@decode_attention_tokens_quant.register_fake
def _(q, k_cache, v_cache, last, scale, group_size):
    _check_attention_quant("decode_attention_tokens_quant", q, k_cache, v_cache, last, scale, group_size, True)
    return _quant_outputs(q.transpose(1, 2), group_size)  # contiguous [B, S, Hq, D] and its scales


def _check_rope_attention(op, q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache, last, scale, group_size,
                          tokens=False):
    """``rms_norm_rope_cache``'s checks (``wq`` None: ``qk_rope_cache``'s), whole query heads per kv head, then the
    attention's on the q it RoPEs: one token, ``decode_attention_upto``'s (with its quant's when ``group_size`` is not
    0) on the grouped q; ``tokens``, ``decode_attention_tokens_quant``'s on q as [B, Hq, S, D] (``group_size`` None:
    ``decode_attention_tokens``'s, no quant). Returns that q (a view)."""
    if (wq is None) != (wk is None):
        raise ValueError(f"{op}: wq and wk must both be given (Qwen3's q / k norms) or both be None (RoPE alone)")
    _check_norm_rope_cache(op, q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache)
    _, s, hq, d = q.shape
    hkv = k_cache.shape[1]
    if s != 1 and not tokens:
        raise ValueError(f"{op}: one token per step (a decode step), got {s}")
    if hq == 0 or hq % hkv:
        raise ValueError(f"{op}: the query heads ({hq}) must be a positive multiple of the kv heads ({hkv})")
    if d & (d - 1) or d < 16:
        raise ValueError(f"{op}: the head dim must be a power of two of at least 16 (one tile per head), got {d}")
    plain_tokens = tokens and group_size is None
    if not plain_tokens and (not isinstance(group_size, int) or isinstance(group_size, bool)
                             or group_size < (1 if tokens else 0)):  # fmt: skip
        raise ValueError(f"{op}: group_size must be {'a' if tokens else '0 (no quant) or a'} group size, got "
                         f"{group_size!r}")  # fmt: skip
    if tokens:
        heads_first = q.transpose(1, 2)  # a view: the attention's [B, Hq, S, D] q
        if plain_tokens:
            _check_decode_attention(op, heads_first, k_cache, v_cache, scale, last=last, tokens=True)
        else:
            _check_attention_quant(op, heads_first, k_cache, v_cache, last, scale, group_size, tokens=True)
        return heads_first
    grouped = q.squeeze(1).unflatten(1, (hkv, hq // hkv))  # a view: the attention's [B, Hkv, R, D] q, no copy
    if group_size:
        _check_attention_quant(op, grouped, k_cache, v_cache, last, scale, group_size)
    else:
        _check_decode_attention(op, grouped, k_cache, v_cache, scale, last=last)
    return grouped


@custom_op(f"{NS}::rope_decode_attention", mutates_args=("k_cache", "v_cache"))
def rope_decode_attention(q: Tensor, wq: Tensor | None, k: Tensor, wk: Tensor | None, eps: float, cos: Tensor,
                          sin: Tensor, v: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor, last: Tensor,
                          scale: float, group_size: int) -> tuple[Tensor, Tensor]:
    """One decode token's RoPE (with Qwen3's q / k norms when ``wq`` / ``wk`` are given), its k / v cache writes and
    the attention over the caches (``reference.rope_decode_attention``), one launch on the Triton backend; with
    ``group_size`` the output's group quant too. Returns ``(o [B, Hkv, Hq / Hkv, D], scales)``: o in q's dtype and
    scales ``[B, Hkv, R, 0]`` when ``group_size`` is 0, else fp8 and ``[B, Hkv, R, D / group_size]``."""
    _check_rope_attention("rope_decode_attention", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache, last,
                          scale, group_size)  # fmt: skip
    return _kernel("rope_decode_attention", q)(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last,
                                               scale, group_size)  # fmt: skip


@rope_decode_attention.register_fake
def _(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale, group_size):
    grouped = _check_rope_attention("rope_decode_attention", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache,
                                    last, scale, group_size)  # fmt: skip
    if group_size:
        return _quant_outputs(grouped, group_size)
    return torch.empty_like(grouped, memory_format=torch.contiguous_format), grouped.new_empty(
        (*grouped.shape[:3], 0), dtype=torch.float32)


@custom_op(f"{NS}::rope_decode_attention_tokens", mutates_args=("k_cache", "v_cache"))
def rope_decode_attention_tokens(q: Tensor, wq: Tensor | None, k: Tensor, wk: Tensor | None, eps: float, cos: Tensor,
                                 sin: Tensor, v: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor,
                                 last: Tensor, scale: float) -> Tensor:
    """``rope_decode_attention_tokens_quant`` without the quant, for an o_proj that reads q's dtype (bf16, or a
    per-tensor quant of its own): the step's S tokens RoPE'd (Qwen3: normed), their k / v written at ``positions``,
    and ``o [B, S, Hq, D]`` in q's dtype (``reference.rope_decode_attention_tokens``), one launch on the Triton
    backend."""
    _check_rope_attention("rope_decode_attention_tokens", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache,
                          last, scale, None, tokens=True)  # fmt: skip
    return _kernel("rope_decode_attention_tokens", q)(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache,
                                                      last, scale)  # fmt: skip


@rope_decode_attention_tokens.register_fake
def _(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale):
    _check_rope_attention("rope_decode_attention_tokens", q, wq, k, wk, cos, sin, v, positions, k_cache, v_cache,
                          last, scale, None, tokens=True)  # fmt: skip
    return torch.empty_like(q, memory_format=torch.contiguous_format)  # [B, S, Hq, D]


@custom_op(f"{NS}::rope_decode_attention_tokens_quant", mutates_args=("k_cache", "v_cache"))
def rope_decode_attention_tokens_quant(q: Tensor, wq: Tensor | None, k: Tensor, wk: Tensor | None, eps: float,
                                       cos: Tensor, sin: Tensor, v: Tensor, positions: Tensor, k_cache: Tensor,
                                       v_cache: Tensor, last: Tensor, scale: float, group_size: int
                                       ) -> tuple[Tensor, Tensor]:
    """A step of S tokens (verifying draft tokens): their RoPE (with Qwen3's q / k norms when ``wq`` / ``wk`` are
    given), their k / v cache writes at ``positions``, the attention of token s over the slots ``0..last[b, s]`` and
    the o_proj's input quant (``reference.rope_decode_attention_tokens``, then ``group_quant``), one launch on the
    Triton backend. Returns ``(o_q [B, S, Hq, D] fp8, scales [B, S, Hq, D / group_size])``."""
    _check_rope_attention("rope_decode_attention_tokens_quant", q, wq, k, wk, cos, sin, v, positions, k_cache,
                          v_cache, last, scale, group_size, tokens=True)  # fmt: skip
    return _kernel("rope_decode_attention_tokens_quant", q)(q, wq, k, wk, eps, cos, sin, v, positions, k_cache,
                                                            v_cache, last, scale, group_size)  # fmt: skip


@rope_decode_attention_tokens_quant.register_fake
def _(q, wq, k, wk, eps, cos, sin, v, positions, k_cache, v_cache, last, scale, group_size):
    _check_rope_attention("rope_decode_attention_tokens_quant", q, wq, k, wk, cos, sin, v, positions, k_cache,
                          v_cache, last, scale, group_size, tokens=True)  # fmt: skip
    return _quant_outputs(q, group_size)  # contiguous [B, S, Hq, D] and its scales
