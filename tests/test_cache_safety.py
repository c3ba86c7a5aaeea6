"""Cache safety: with Inductor's FX graph cache on, a compile under another config (or other pass code) never gets a
graph compiled under the old one, and the same config twice is a cache hit.

Each compile runs in a fresh process (``reliability_worker.py``) sharing only a per-test ``TORCHINDUCTOR_CACHE_DIR``
(tmp_path), so nothing in memory carries over. Cache hits are counted with
``torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"]``; a hit skips the pass (the backend then adds a
report marked ``cache_hit``, with no decisions).
The uuid unit tests at the bottom need no compile.
"""

from __future__ import annotations

import pathlib

import pytest
import reliability_worker

from fp8_fusion_pass import config as config_mod
from fp8_fusion_pass import fusion_pass
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.fusion_pass import FP8FusionPass

run_worker = reliability_worker.spawn


def fused(result: dict) -> dict:
    """Fusion counts of the single report a compile produced."""
    (counts,) = result["reports"]
    return {k: v for k, v in counts.items() if k in ("norm_quant", "add_norm_quant", "silu_quant") and v}


ALL_FUSED = {"norm_quant": 1, "add_norm_quant": 1, "silu_quant": 1}  # engine qwen3-tiny, 1 layer


def test_cache_key_follows_config_env_and_injected_faults(tmp_path):
    """One cache dir, one fresh process per compile (one cold compile in all: each cold one costs ~20 s here)."""
    # A compile made while a failure is injected must not be served to a normal compile. Found by this test: the
    # hook's state was not in uuid(), so the next normal compile got the unfused graph from the cache (fixed in
    # 1ac3f86: uuid() hashes the active faults).
    injected = run_worker(tmp_path, "injected", "--inject", "replacement:silu_quant")
    assert injected["reports"][0]["errors"] == 1 and injected["inductor"].get("fxgraph_cache_miss") == 1
    first = run_worker(tmp_path, "default")
    assert first["uuid"] != injected["uuid"]
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0 and fused(first) == ALL_FUSED, first

    # another config in a fresh process: a miss, and the graph reflects the new config
    no_silu = run_worker(tmp_path, "no-silu", "--disable", "silu_quant")
    assert no_silu["uuid"] != first["uuid"]
    assert no_silu["inductor"].get("fxgraph_cache_hit", 0) == 0, no_silu["inductor"]
    assert fused(no_silu) == {"norm_quant": 1, "add_norm_quant": 1}
    assert no_silu["rejection_reasons"][0].get("disabled_by_config") == 1

    # the same config again: a hit (no pass run: the backend adds a cache_hit report), the same logits bit for bit
    again = run_worker(tmp_path, "no-silu-again", "--disable", "silu_quant")
    assert again["uuid"] == no_silu["uuid"]
    assert again["inductor"].get("fxgraph_cache_hit") == 1 and again["reports"] == [], again
    assert again["cache_hit_reports"] == 1
    assert again["logits_sha256"] == no_silu["logits_sha256"]

    # the environment override is part of the key too
    env_off = run_worker(tmp_path, "env-no-norm", env={"FP8_FUSION_DISABLE": "norm_quant"})
    assert env_off["uuid"] not in (first["uuid"], no_silu["uuid"])
    assert env_off["inductor"].get("fxgraph_cache_hit", 0) == 0, env_off["inductor"]
    assert fused(env_off) == {"silu_quant": 1}
    assert env_off["rejection_reasons"][0].get("disabled_by_env") == 2


# ---------------------------------------------------------------- uuid(): no compile needed


@pytest.mark.parametrize("change", [
    {"norm_quant": False}, {"silu_quant": False}, {"dedup_quant": False}, {"zero_fill": False},
    {"group_sizes": (128,)}, {"use_env": False},
])
def test_uuid_changes_with_every_config_field(change, monkeypatch):
    monkeypatch.setenv(config_mod.ENV_DISABLE, "zero_fill")  # so that use_env=False changes the effective config
    base = FP8FusionPass(FusionConfig()).uuid()
    assert FP8FusionPass(FusionConfig()).uuid() == base  # stable for an equal config
    assert FP8FusionPass(FusionConfig(**change)).uuid() != base


def test_uuid_changes_with_env_and_deterministic_mode(monkeypatch):
    import torch

    monkeypatch.delenv(config_mod.ENV_DISABLE, raising=False)
    base = FP8FusionPass().uuid()
    monkeypatch.setenv(config_mod.ENV_DISABLE, "silu_quant")
    assert FP8FusionPass().uuid() != base
    monkeypatch.setenv(config_mod.ENV_DISABLE, "not_a_fusion")  # malformed: still a key, not an exception
    assert FP8FusionPass().uuid() not in (None, base)
    monkeypatch.delenv(config_mod.ENV_DISABLE)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert FP8FusionPass().uuid() != base
    finally:
        torch.use_deterministic_algorithms(was)
    assert FP8FusionPass().uuid() == base


def test_uuid_changes_with_a_threshold_set_at_run_time(monkeypatch):
    # a benchmark's --set, or a user tuning a bound: the sources are the same, the rewrite decided otherwise
    from fp8_fusion_pass import guards
    from fp8_fusion_pass.patterns import decode_attention

    base = FP8FusionPass().uuid()
    monkeypatch.setattr(guards, "GQA_MIN_BATCH_HEADS", 1)
    pairs = FP8FusionPass().uuid()
    monkeypatch.setattr(decode_attention, "MAX_ROWS", 64)
    assert len({base, pairs, FP8FusionPass().uuid()}) == 3
    monkeypatch.undo()
    assert FP8FusionPass().uuid() == base


def test_uuid_covers_the_pattern_sources(tmp_path, monkeypatch):
    """Editing any hashed source (pass, guards, patterns, op schemas) changes the key: the hash reads file
    contents, not names or mtimes."""
    files = fusion_pass.hashed_files()
    names = {str(p.relative_to(fusion_pass.PACKAGE)) for p in files}
    assert {"fusion_pass.py", "guards.py", "config.py", "kernels/ops.py", "kernels/attention_ops.py",
            "patterns/norm_quant.py", "patterns/silu_quant.py", "patterns/dedup_quant.py"} <= names, names
    base = FP8FusionPass().uuid()
    original = pathlib.Path.read_bytes
    target = fusion_pass.PACKAGE / "patterns" / "silu_quant.py"

    def edited(path):
        data = original(path)
        return data + b"\n# edited\n" if path == target else data

    monkeypatch.setattr(pathlib.Path, "read_bytes", edited)
    assert FP8FusionPass().uuid() != base
