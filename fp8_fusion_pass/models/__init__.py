"""Models the pass works on: HF-form and engine-form Qwen3 / Llama by preset name, random seeded weights.

``build_model(name, form="hf"|"engine", scheme="block"|"per-tensor"|"bf16", layers=None, ...)``,
``example_inputs(model_or_name, batch, seq)``, ``decode_step(model, batch, seq, cache_len)`` (one decode step's
inputs over a static KV cache: ``step.run(compiled_model)``), ``PRESETS`` (name -> published config numbers),
``engine_from_hf(hf_model)`` (merged qkv / gate_up engine model sharing the HF weights).
"""

from __future__ import annotations

from .build import build_model, example_inputs
from .decode_inputs import DecodeStep, decode_step
from .presets import PRESETS, TINY, get_preset

__all__ = ["PRESETS", "TINY", "DecodeStep", "KVCache", "build_model", "decode_step", "engine_from_hf", "example_inputs",
           "get_preset"]


def __getattr__(name: str):
    # engine.py is imported on first use only.
    if name in ("engine_from_hf", "EngineForCausalLM", "KVCache"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
