"""Tensor-parallel engine models: column-parallel qkv / gate_up, row-parallel o / down, all-reduce in the graph.

Megatron layout, built by composition from an unsharded ``EngineForCausalLM`` (``models.engine``), so the same
preset, seed and scheme give the same weights and a sharded run can be compared with the unsharded one:

    rank r of tp:
      h ─► qkv_proj[q_r | k_r | v_r] ─► attention (heads/tp, kv heads/tp) ─► o_proj[:, K_r] ─► all_reduce(sum)
        ─► wait_tensor ─► add_rms_norm(x, residual) ─► group_quant ─► gate_up_proj[gate_r | up_r]
        ─► silu_and_mul ─► group_quant ─► down_proj[:, I_r] ─► all_reduce(sum) ─► wait_tensor ─► next layer

- Column-parallel (qkv, gate_up): N is split, and a merged weight is split per sub-projection, so rank r holds
  its q heads, its k and v heads, its gate half and its matching up half. Block-FP8 ``weight_scale_inv`` rows
  are split with the weights: a shard must start and end on a 128-row block or a scale would cover two ranks.
- Row-parallel (o, down): K is split (scale columns with it: K/tp must be a multiple of 128, which also keeps
  the activation's 1x128 quant groups whole), each rank computes a partial product, and the functional
  collective ``_c10d_functional.all_reduce`` + ``wait_tensor`` sums it. Functional collectives are traced by
  dynamo, so the all-reduce is a node of the compiled graph, and the pass sees the
  ``wait_tensor -> add_rms_norm -> group_quant -> blockscale_mm`` chain it fuses after the collective.
- lm_head is vocab-parallel (rows split, logits all-gathered, as vLLM's ParallelLMHead): at TP 2 a replicated
  Qwen3-8B lm_head (151936 x 4096 bf16, 1.24 GB) would be read whole by both GPUs every decode step, 26% of a
  rank's weight bytes (its decoder shard is 3.47 GB of fp8). ``shard_lm_head=False`` keeps it replicated.
- Embeddings, norms (also Qwen3's per-head q_norm / k_norm) and RoPE are replicated.
- kv heads are split, never replicated: ``num_key_value_heads % tp == 0`` or the model is refused.

Shapes a shard cannot take are refused with ``TPShardError`` naming the layer and the sizes, before anything
is changed. ``tp_shapes(config, tp)`` runs the same checks from a config alone (real presets at TP 1-8 are
checked without building their weights).
"""

from __future__ import annotations

import dataclasses
import types

import torch
import torch.distributed as dist
from torch import nn

from .. import quantize as q
from .engine import MLP, Attention, EngineForCausalLM, KVCache

BLOCK = q.BLOCK[0]  # 128: block-FP8 weight block (rows and columns) and activation quant group


class TPShardError(ValueError):
    """A model cannot be sharded at the requested tensor-parallel size (the message names layer and sizes)."""


@dataclasses.dataclass(frozen=True)
class ShardShape:
    """One projection of every decoder layer: how it is split and what each rank holds."""

    name: str  # "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"
    style: str  # "column" (split N per part) or "row" (split K, all-reduce the output)
    n: int  # full output features
    k: int  # full input features
    parts: tuple[int, ...]  # column: output sizes of the merged sub-projections (q, k, v) / (gate, up)
    part_names: tuple[str, ...] = ()

    def local(self, tp: int) -> tuple[int, int]:
        """(N, K) of one rank's shard."""
        return (self.n // tp, self.k) if self.style == "column" else (self.n, self.k // tp)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def tp_shapes(config, tp: int, block: int | None = BLOCK) -> list[ShardShape]:
    """The four per-layer projections of ``config`` (an HF config or a preset's config dict) split ``tp`` ways.

    ``block``: the block-FP8 block (128); every shard boundary must fall on it. ``None`` (bf16 weights) only
    asks for even splits. Raises ``TPShardError`` naming the projection and sizes when a split is impossible.
    """
    if isinstance(config, dict):
        config = types.SimpleNamespace(**{"head_dim": None, **config})
    if not isinstance(tp, int) or tp < 1:
        raise TPShardError(f"tensor-parallel size must be a positive int, got {tp!r}")
    heads, kv_heads, hd = config.num_attention_heads, config.num_key_value_heads, _head_dim(config)
    hidden, inter = config.hidden_size, config.intermediate_size
    for what, count, why in (("num_attention_heads", heads, ""),
                             ("num_key_value_heads", kv_heads, " (kv heads are split, never replicated)")):
        if count % tp:
            raise TPShardError(f"self_attn: {what}={count} is not divisible by tp={tp}{why}")
    shapes = [
        ShardShape("self_attn.qkv_proj", "column", (heads + 2 * kv_heads) * hd, hidden,
                   (heads * hd, kv_heads * hd, kv_heads * hd), ("q", "k", "v")),
        ShardShape("self_attn.o_proj", "row", hidden, heads * hd, ()),
        ShardShape("mlp.gate_up_proj", "column", 2 * inter, hidden, (inter, inter), ("gate", "up")),
        ShardShape("mlp.down_proj", "row", hidden, inter, ()),
    ]
    for s in shapes:
        _check_split(s, tp, block)
    return shapes


def _check_split(s: ShardShape, tp: int, block: int | None) -> None:
    names = s.part_names or tuple(f"part {i}" for i in range(len(s.parts)))
    sizes = [(f"{n} part N", p) for n, p in zip(names, s.parts)] if s.style == "column" else [("K", s.k)]
    for label, size in sizes:
        if size % tp:
            raise TPShardError(f"{s.name}: {label}={size} is not divisible by tp={tp}")
        if block and (size // tp) % block:
            what = "a weight-scale block" + (" and an activation quant group" if s.style == "row" else "")
            raise TPShardError(
                f"{s.name}: {label}={size} / tp={tp} = {size // tp} is not a multiple of the {block}-wide FP8 block "
                f"(a shard would split {what} between ranks); use a smaller tp or the bf16 scheme")


# ---------------------------------------------------------------- sharding one linear


def _block_of(lin: nn.Module) -> int | None:
    return BLOCK if isinstance(lin, q.BlockFP8Linear) else None


def _rows(t: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([t[a:b] for a, b in spans]).contiguous()


def _cols(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
    return t[:, a:b].contiguous()


def _new_like(lin: nn.Module, n: int, k: int, bias: bool) -> nn.Module:
    w = lin.weight
    if isinstance(lin, q.BlockFP8Linear):
        return q.BlockFP8Linear(k, n, bias, group_size=lin.group_size, fp8_dtype=w.dtype, device="meta",
                                dtype=lin.bias.dtype if bias else torch.bfloat16)
    if isinstance(lin, q.PerTensorFP8Linear):
        return q.PerTensorFP8Linear(k, n, bias, fp8_dtype=w.dtype, device="meta",
                                    dtype=lin.bias.dtype if bias else torch.bfloat16)
    return nn.Linear(k, n, bias, device="meta", dtype=w.dtype)


def _set(mod: nn.Module, name: str, t: torch.Tensor) -> None:
    if name in mod._buffers:
        mod._buffers[name] = t
    else:
        mod._parameters[name] = nn.Parameter(t, requires_grad=False)


def _check_kind(lin: nn.Module, name: str) -> None:
    if not isinstance(lin, (q.BlockFP8Linear, q.PerTensorFP8Linear, nn.Linear)):
        raise TPShardError(f"{name}: cannot shard a {type(lin).__name__} (BlockFP8Linear, PerTensorFP8Linear or "
                           "nn.Linear only)")


def shard_column(lin: nn.Module, parts: tuple[int, ...], tp: int, rank: int, name: str = "linear") -> nn.Module:
    """Rank ``rank``'s output rows of ``lin``: the r-th 1/tp of each merged sub-projection, concatenated."""
    _check_kind(lin, name)
    if sum(parts) != lin.out_features:
        raise TPShardError(f"{name}: parts {parts} do not add up to N={lin.out_features}")
    block = _block_of(lin)
    _check_split(ShardShape(name, "column", lin.out_features, lin.in_features, parts), tp, block)
    spans, off = [], 0
    for p in parts:
        a = off + rank * (p // tp)
        spans.append((a, a + p // tp))
        off += p
    out = _new_like(lin, lin.out_features // tp, lin.in_features, lin.bias is not None)
    _set(out, "weight", _rows(lin.weight.detach(), spans))
    if isinstance(lin, q.BlockFP8Linear):  # every span starts and ends on a block: scale rows = spans / 128
        _set(out, "weight_scale_inv", _rows(lin.weight_scale_inv, [(a // block, b // block) for a, b in spans]))
    elif isinstance(lin, q.PerTensorFP8Linear):  # one scale for the whole weight: every rank keeps it
        _set(out, "weight_scale", lin.weight_scale.clone())
    if lin.bias is not None:
        _set(out, "bias", _rows(lin.bias.detach(), spans))
    return out


class RowParallel(nn.Module):
    """``all_reduce(inner(x_shard)) + bias``: a K-sharded linear whose partial products are summed across ranks.

    The bias (if any) is added once, after the sum, not once per rank.
    """

    def __init__(self, inner: nn.Module, group_name: str, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.inner, self.group_name = inner, group_name
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = inner.in_features, inner.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(self.inner(x), self.group_name)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"group={self.group_name!r}"


def shard_row(lin: nn.Module, tp: int, rank: int, group_name: str, name: str = "linear") -> RowParallel:
    """Rank ``rank``'s input columns of ``lin``, wrapped in the all-reduce that completes the product."""
    _check_kind(lin, name)
    block = _block_of(lin)
    _check_split(ShardShape(name, "row", lin.out_features, lin.in_features, ()), tp, block)
    kl = lin.in_features // tp
    a, b = rank * kl, (rank + 1) * kl
    inner = _new_like(lin, lin.out_features, kl, False)
    _set(inner, "weight", _cols(lin.weight.detach(), a, b))
    if isinstance(lin, q.BlockFP8Linear):
        _set(inner, "weight_scale_inv", _cols(lin.weight_scale_inv, a // block, b // block))
    elif isinstance(lin, q.PerTensorFP8Linear):
        _set(inner, "weight_scale", lin.weight_scale.clone())
    bias = None if lin.bias is None else lin.bias.detach().clone()
    return RowParallel(inner, group_name, bias)


class VocabParallelHead(nn.Module):
    """``all_gather(inner(x))`` along the vocabulary: each rank computes the logits of its vocab rows."""

    def __init__(self, inner: nn.Module, tp: int, group_name: str) -> None:
        super().__init__()
        self.inner, self.tp, self.group_name = inner, tp, group_name
        self.in_features, self.out_features = inner.in_features, inner.out_features * tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        v = y.shape[-1]
        g = torch.ops._c10d_functional.all_gather_into_tensor(y.reshape(-1, v).contiguous(), self.tp, self.group_name)
        g = torch.ops._c10d_functional.wait_tensor(g)  # [tp * M, V/tp], rank-major
        return g.view(self.tp, -1, v).permute(1, 0, 2).reshape(*y.shape[:-1], v * self.tp)

    def extra_repr(self) -> str:
        return f"tp={self.tp}, group={self.group_name!r}"


def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum ``x`` over the group, as graph nodes: ``_c10d_functional.all_reduce`` then ``wait_tensor``.

    The ops (not ``dist.all_reduce``, which mutates and breaks the graph) are what dynamo and Inductor keep as
    collective nodes; in eager they run at once and ``wait_tensor`` returns the summed tensor. Checked on torch
    2.13 with gloo on the CPU (eager and compiled) and written for NCCL on torch 2.11.
    """
    y = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
    return torch.ops._c10d_functional.wait_tensor(y)


# ---------------------------------------------------------------- the whole model


class TPEngineForCausalLM(EngineForCausalLM):
    """An engine model whose decoder projections are this rank's shards; ``new_kv_cache`` holds local kv heads."""

    tp: int
    rank: int
    group_name: str

    def new_kv_cache(self, batch: int, max_seq: int) -> KVCache:
        c = self.config
        dtype = self.model.embed_tokens.weight.dtype
        return KVCache(len(self.model.layers), batch, max_seq, c.num_key_value_heads // self.tp, _head_dim(c), dtype,
                       self.inv_freq.device)

    def extra_repr(self) -> str:
        return f"tp={self.tp}, rank={self.rank}, group={self.group_name!r}"


def _group_info(group, tp: int | None, rank: int | None) -> tuple[int, int, str]:
    if group is None and dist.is_available() and dist.is_initialized():
        group = dist.group.WORLD
    if group is not None:
        g_tp, g_rank = dist.get_world_size(group), dist.get_rank(group)
        if (tp is not None and tp != g_tp) or (rank is not None and rank != g_rank):
            raise TPShardError(f"tp={tp}, rank={rank} disagree with the process group (size {g_tp}, rank {g_rank})")
        return g_tp, g_rank, group.group_name
    if tp is None or rank is None:
        raise TPShardError("no process group is initialized: pass tp and rank (and a group before running it)")
    if not 0 <= rank < tp:
        raise TPShardError(f"rank={rank} is outside tp={tp}")
    return tp, rank, ""


def tensor_parallel(model: EngineForCausalLM, group: dist.ProcessGroup | None = None, *, tp: int | None = None,
                    rank: int | None = None, shard_lm_head: bool = True) -> TPEngineForCausalLM:
    """This rank's shard of ``model`` (an unsharded engine model), over ``group`` (default: the world).

    Consumes ``model``: its decoder projections are replaced by shards, and the returned model shares every
    other module with it. The whole model is checked before anything is changed, so a refused model is intact.
    At tp=1 the projections are re-wrapped (row-parallel o / down with an all-reduce over one rank) only when a
    group is given; without a process group, ``tp=1, rank=0`` returns the model's layers unchanged.
    """
    if not isinstance(model, EngineForCausalLM):
        raise TypeError(f"tensor_parallel needs an engine-form model (build_model(..., form='engine')), "
                        f"got {type(model).__name__}")
    tp, rank, group_name = _group_info(group, tp, rank)
    layers = model.model.layers
    for i, layer in enumerate(layers):  # check every layer first: refuse before changing anything
        _check_layer(layer, model.config, tp, f"model.layers.{i}.")
    head = model.lm_head
    shard_lm_head = shard_lm_head and tp > 1
    if shard_lm_head:
        _check_kind(head, "lm_head")
        _check_split(ShardShape("lm_head", "column", head.out_features, head.in_features, (head.out_features,),
                                ("vocab",)), tp, _block_of(head))
    if tp > 1 and not group_name:
        raise TPShardError(f"tp={tp} needs a process group (torch.distributed.init_process_group or group=)")
    if group_name:
        for i, layer in enumerate(layers):
            _shard_layer(layer, model.config, tp, rank, group_name, f"model.layers.{i}.")
        if shard_lm_head:
            head = VocabParallelHead(shard_column(head, (head.out_features,), tp, rank, "lm_head"), tp, group_name)
    out = TPEngineForCausalLM(model.config, model.model, head, model.inv_freq, model.attention_scaling)
    out.tp, out.rank, out.group_name = tp, rank, group_name
    out.quantize_summary = getattr(model, "quantize_summary", None)
    return out.eval()


def _projections(layer) -> dict[str, nn.Module]:
    a, m = layer.self_attn, layer.mlp
    if not isinstance(a, Attention) or not isinstance(m, MLP):
        raise TPShardError(f"expected engine Attention / MLP modules, got {type(a).__name__} / {type(m).__name__}")
    return {"self_attn.qkv_proj": a.qkv_proj, "self_attn.o_proj": a.o_proj,
            "mlp.gate_up_proj": m.gate_up_proj, "mlp.down_proj": m.down_proj}


def _check_layer(layer, config, tp: int, prefix: str) -> None:
    projs = _projections(layer)
    blocks = {_block_of(p) for p in projs.values()}
    for s in _shapes_named(config, tp, BLOCK if BLOCK in blocks else None, prefix):
        lin = projs[s.name.removeprefix(prefix)]
        _check_kind(lin, s.name)
        if isinstance(lin, RowParallel):
            raise TPShardError(f"{s.name}: already sharded")
        if (lin.out_features, lin.in_features) != (s.n, s.k):
            raise TPShardError(f"{s.name}: weight is N={lin.out_features}, K={lin.in_features}; the config says "
                               f"N={s.n}, K={s.k}")
        if s.style == "row" or _block_of(lin) is None:
            continue
        # Merged weights: each sub-projection must start on a block too (engine.merge_linears guarantees it).
        offsets = [sum(s.parts[:i]) for i in range(len(s.parts))]
        if any(o % BLOCK for o in offsets):
            raise TPShardError(f"{s.name}: sub-projection offsets {offsets} are not on {BLOCK}-row blocks")


def _shapes_named(config, tp: int, block: int | None, prefix: str) -> list[ShardShape]:
    try:
        shapes = tp_shapes(config, tp, block)
    except TPShardError as e:
        raise TPShardError(f"{prefix}{e}") from None
    return [dataclasses.replace(s, name=prefix + s.name) for s in shapes]


def _shard_layer(layer, config, tp: int, rank: int, group_name: str, prefix: str) -> None:
    a, m = layer.self_attn, layer.mlp
    shapes = {s.name.removeprefix(prefix): s for s in _shapes_named(config, tp, None, prefix)}
    a.qkv_proj = shard_column(a.qkv_proj, shapes["self_attn.qkv_proj"].parts, tp, rank, prefix + "self_attn.qkv_proj")
    a.o_proj = shard_row(a.o_proj, tp, rank, group_name, prefix + "self_attn.o_proj")
    m.gate_up_proj = shard_column(m.gate_up_proj, shapes["mlp.gate_up_proj"].parts, tp, rank,
                                  prefix + "mlp.gate_up_proj")
    m.down_proj = shard_row(m.down_proj, tp, rank, group_name, prefix + "mlp.down_proj")
    a.num_heads //= tp
    a.num_kv_heads //= tp
    a.sizes = [s // tp for s in a.sizes]
