"""Model shapes by name: tiny CPU-fast ones for tests, and the real published configs (random weights).

Real-shape numbers are copied from the published ``config.json`` of each checkpoint (sources below); only the
fields that change the graph or the GEMM shapes are kept. Keys are ``transformers`` config kwargs; the legacy
``rope_theta`` / ``rope_scaling`` spelling is used because transformers 4.57 and 5.x both accept it.

Tiny presets keep every quantizable N and K a multiple of 128 (so every decoder linear converts) and head_dim
64 or 128 like the real models, with GQA (2 query heads per kv head) so the kv-head mapping is exercised.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_LLAMA3_ROPE = {  # Llama-3.1 config.json "rope_scaling"
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _config(**kwargs: Any) -> dict[str, Any]:
    return kwargs


@dataclasses.dataclass(frozen=True)
class Preset:
    family: str  # "qwen3" | "llama" | "qwen2" | "mistral": picks the transformers classes
    config: dict[str, Any]
    source: str

    @property
    def layers(self) -> int:
        return self.config["num_hidden_layers"]


PRESETS: dict[str, Preset] = {
    # -------- tiny (tests, examples): 2 layers, hidden 256, vocab 512
    "qwen3-tiny": Preset("qwen3", _config(
        vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
        tie_word_embeddings=False,
    ), "Qwen3 architecture at toy size (qkv N = 512 + 256 + 256, gate_up N = 1536, down K = 768)"),
    "llama-tiny": Preset("llama", _config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072, tie_word_embeddings=False,
    ), "Llama-3.1 architecture (llama3 RoPE scaling) at toy size; k/v N = 128"),
    "qwen2-tiny": Preset("qwen2", _config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
        tie_word_embeddings=False,
    ), "Qwen2 architecture at toy size: q/k/v carry a bias (merged with the weights)"),
    "mistral-tiny": Preset("mistral", _config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096,
        sliding_window=None, tie_word_embeddings=False,
    ), "Mistral-7B-v0.3 architecture at toy size"),
    # -------- real shapes (random weights)
    "qwen3-0.6b": Preset("qwen3", _config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        tie_word_embeddings=True,
    ), "https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json"),
    "qwen3-8b": Preset("qwen3", _config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        tie_word_embeddings=False,
    ), "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json"),
    "qwen3-32b": Preset("qwen3", _config(
        vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        tie_word_embeddings=False,
    ), "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json"),
    "llama3.1-8b": Preset("llama", _config(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072, tie_word_embeddings=False,
    ), "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"),
    "llama3.1-70b": Preset("llama", _config(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072, tie_word_embeddings=False,
    ), "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"),
}

TINY = tuple(n for n in PRESETS if n.endswith("-tiny"))


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
