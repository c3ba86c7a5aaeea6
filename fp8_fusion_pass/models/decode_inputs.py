"""One decode step over a static KV cache, as the inputs of ``fp8-fusion diff / verify --cache N``.

Without a cache a model's forward is a prefill: its attention is SDPA, and the decode-time rewrites
(``decode_attention``, ``rope_cache``, ``rope_attention``, ``gqa_attention``) have no candidate, so neither the diff
nor the report could show them. ``decode_step(model, batch, seq, cache_len)`` builds the cache a serving step sees:
``cache_len`` slots of random keys and values (as after a prefill) and ``seq`` new tokens per row written after them,
the engine form's rows each at its own position (``index_put_``), the HF form's one ``cache_position`` for every
row (``StaticCache``'s ``index_copy_``).

A step writes its tokens' keys and values into the cache in place; every call writes the same slots before reading
them, so calls repeat (with and without the pass, each input case). transformers 5.x's ``StaticCache`` writes where
its ``cumulative_length`` says and counts on: ``DecodeStep.run`` sets it back to the step's position first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class DecodeStep:
    ids: torch.Tensor  # [B, S]
    positions: torch.Tensor  # [B, S]: engine, each row's own; HF, one row for all (its cache_position)
    cache: Any  # engine KVCache or transformers StaticCache
    engine: bool

    def run(self, fn: Callable, ids: torch.Tensor | None = None, mark: Callable | None = None):
        """``fn`` (the model, compiled or not) on this step, with ``ids`` in place of the step's own if given.
        ``mark(ids, positions)``, if given, sees the two tensors ``fn`` gets, right before the call (to mark dims
        dynamic): the engine's positions [B, S], HF's cache_position [S]."""
        ids = self.ids if ids is None else ids
        positions = self.positions
        if not self.engine:
            for layer in getattr(self.cache, "layers", ()):
                if hasattr(layer, "cumulative_length"):  # transformers 5.x writes at the tokens it counted
                    layer.cumulative_length.fill_(int(self.positions[0, 0]))
            positions = self.positions[0].clone()
        if mark is not None:
            mark(ids, positions)
        if self.engine:
            return fn(ids, positions, self.cache)
        return fn(input_ids=ids, past_key_values=self.cache, cache_position=positions, use_cache=True)


def decode_step(model: torch.nn.Module, batch: int, seq: int, cache_len: int, seed: int = 0) -> DecodeStep:
    """``seq`` new tokens per row over a ``cache_len``-slot cache of random contents, on the model's device."""
    if not 1 <= seq <= cache_len:
        raise ValueError(f"a step of {seq} tokens does not fit a {cache_len}-slot cache (1 <= seq <= cache_len)")
    param = next(model.parameters())
    device, gen = param.device, torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(device)
    engine = not hasattr(model, "generate")
    free = cache_len - seq  # slots before the step's tokens
    if engine:  # row 0's tokens end at the cache's last slot, row i's 3i slots earlier (wrapping): positions differ
        first = free - torch.arange(batch) * 3 % (free + 1)
        cache = model.new_kv_cache(batch, cache_len)
        tensors = cache.k + cache.v
    else:
        first = torch.full((batch,), free)
        cache, tensors = static_cache(model, batch, cache_len)
    positions = (first.view(batch, 1) + torch.arange(seq)).to(device)
    for i, t in enumerate(tensors):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(seed + i)))
    return DecodeStep(ids, positions, cache, engine)


def static_cache(model, batch: int, cache_len: int):
    """A transformers ``StaticCache`` of ``cache_len`` slots for ``model`` at ``batch`` rows, its buffers allocated
    (lazily, at a first write: one eager token written at slot 0, for the caller to overwrite), and its tensors
    (keys then values, per layer)."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    with torch.no_grad():
        model(input_ids=torch.zeros(batch, 1, dtype=torch.long, device=device), past_key_values=cache,
              cache_position=torch.tensor([0], device=device), use_cache=True)  # fmt: skip
    return cache, [t for layer in cache.layers for t in (layer.keys, layer.values)]
