"""The small-M "worth it" table (kernels/small_m.py): where a bf16 GEMM input beats a pre-quantized one."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config

from fp8_fusion_pass.kernels.small_m import BF16_INPUT_PREFERRED, prefers_bf16_input

# Published Qwen3 configs (huggingface.co/Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B config.json), attention fields only.
QWEN3_0_6B = Qwen3Config(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         intermediate_size=3072)
QWEN3_1_7B = Qwen3Config(hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         intermediate_size=6144)


def _qkv(cfg) -> tuple[int, int]:
    # merged q/k/v weight at TP1: N = (heads + 2 * kv_heads) * head_dim, K = hidden
    return (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim, cfg.hidden_size


def test_gfx950_entries_are_the_seed_prs_qwen3_qkv_proj_shapes():
    assert _qkv(QWEN3_0_6B) == (4096, 1024) and _qkv(QWEN3_1_7B) == (4096, 2048)
    assert BF16_INPUT_PREFERRED["gfx950"] == {_qkv(QWEN3_0_6B): 16, _qkv(QWEN3_1_7B): 16}


@pytest.mark.parametrize("cfg", [QWEN3_0_6B, QWEN3_1_7B], ids=["0.6B", "1.7B"])
def test_qkv_proj_prefers_bf16_up_to_16_rows_on_gfx950(cfg):
    n, k = _qkv(cfg)
    assert [prefers_bf16_input("gfx950", m, n, k) for m in (1, 8, 16, 17, 32, 4096)] == [True] * 3 + [False] * 3


@pytest.mark.parametrize("arch_name", ["gfx942", "sm90", "sm89", "cpu", "gfx1250"])
def test_other_archs_never_prefer_bf16(arch_name):
    assert not any(prefers_bf16_input(arch_name, m, 4096, 1024) for m in (1, 16))


@pytest.mark.parametrize(
    "n,k",
    [
        (2 * 3072, 1024),  # Qwen3-0.6B gate_up
        (1024, 3072),  # Qwen3-0.6B down
        (1024, 2048),  # Qwen3-0.6B o_proj (16 heads * 128 -> 1024)
        (6144, 4096),  # Qwen3-8B qkv
        (1024, 4096),  # transposed 0.6B qkv: the key is (N, K), not a set of sizes
    ],
)
def test_other_shapes_never_prefer_bf16(n, k):
    assert not any(prefers_bf16_input("gfx950", m, n, k) for m in (1, 16))


def test_symbolic_or_empty_rows_do_not_prefer_bf16():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    m = ShapeEnv().create_unbacked_symint()
    assert not prefers_bf16_input("gfx950", m, 4096, 1024)
    assert not prefers_bf16_input("gfx950", 0, 4096, 1024)
    assert not prefers_bf16_input("gfx950", True, 4096, 1024)  # a bool is not a row count
