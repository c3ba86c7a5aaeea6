"""``benchmarks/attention_regs.py``: the decode-attention kernel compiled offline for sm_90 (no GPU), its registers
and spills read back. It runs in a process of its own: the tests' Triton kernels are the interpreter's."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_an_offline_compile_reports_its_registers():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["--rows", "64", "--ropes", "qwen3,none", "--configs", "8:2"]
    done = subprocess.run([sys.executable, "benchmarks/attention_regs.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "sm_90, Triton" in lines[0], done.stdout
    rows = [line.split() for line in lines[3:]]
    assert [r[:4] for r in rows] == [["64", "qwen3", "8", "2"], ["64", "none", "8", "2"]], done.stdout
    assert all(0 < int(r[4]) <= 255 and int(r[5]) >= 0 for r in rows), done.stdout


def test_it_says_it_cannot_compile_under_the_interpreter(monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import attention_regs

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match="without TRITON_INTERPRET=1"):
        attention_regs.main([])


def test_the_compile_is_specialized_as_the_jit_would_specialize_the_engines_launch():
    """The unit strides of the cache and the query become constants and the pointers are marked 16-byte aligned:
    without that (the script before 2026-12-07) the key loop compiled to one-bf16 loads."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import attention_regs

    named, _ = attention_regs.recorded_launch(4, "llama", 128, 3)
    assert named["SPLITS"] == 3 and named["ROPE"] and named["BLOCK_T"] == 128
    sig, consts, attrs = attention_regs.specialized(named, attention_regs.sm90_constexprs(named))
    index = {name: (i,) for i, name in enumerate(named)}
    for unit in ("skd", "svd", "sqd", "sod"):
        assert sig[unit] == "constexpr" and consts[index[unit]] == 1, unit
    assert sig["k_ptr"] == "*bf16" and attrs[index["k_ptr"]] == [["tt.divisibility", 16]]
    assert sig["skt"] == "i32" and attrs[index["skt"]] == [["tt.divisibility", 16]]  # 128 elements a slot
    assert sig["HKV"] == "i32" and index["HKV"] not in attrs  # 8 kv heads: not a multiple of 16
    assert consts[index["SPLITS"]] == 3 and consts[index["PTX"]] and not consts[index["EMULATE_CAST"]]


def test_the_rope_launch_compiles_sm90s_path_not_the_registers_one():
    """On CPU tensors the op launches the RoPE's ROCm path (the new k / v from registers); sm_90 stores and reads
    them back. The constexprs handed to the compile must be sm_90's (until the thirty-eighth session they were not,
    and every RoPE row of the tool's tables was the other path's)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import attention_regs

    named, _ = attention_regs.recorded_launch(4, "qwen3", 128, 3)
    assert named["ROPE"]
    named["NEW_FROM_REGISTERS"] = True  # as the script's own process (no interpreter) records it
    sm90 = attention_regs.sm90_constexprs(named)
    assert sm90["PTX"] and not sm90["NEW_FROM_REGISTERS"]
    plain, _ = attention_regs.recorded_launch(4, "none", 128, 3)
    assert not attention_regs.sm90_constexprs(plain)["NEW_FROM_REGISTERS"]
