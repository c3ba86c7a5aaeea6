"""``benchmarks/rope_attention.py`` on the CPU: its table (the two launches against the fused op, the caches and
outputs compared; the ops' CPU backend is the reference) and its ``--sweep`` (the Triton kernel itself, in the
interpreter) run end to end; ``benchmarks/attention_decode.py``'s table at several tokens per row."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from benchmark_script import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import attention_decode  # noqa: E402
import decode  # noqa: E402
import rope_attention  # noqa: E402


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(decode, "DEVICE", "cpu")  # capture / time_replays: plain calls, wall clock
    monkeypatch.setattr(attention_decode, "SWEEP", attention_decode.SWEEP[:2])
    grad = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(grad)  # main() turns autograd off for the process, as a script may; later tests need it


def test_table_compares_the_pair_and_the_fused_op(on_cpu, capsys):
    assert rope_attention.main(["--batches", "1", "--max-seq", "24", "--context", "20"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1 ")]
    assert len(rows) == 4  # llama / qwen3, without / with the quant
    assert all(r[-2] == "True" for r in rows), rows  # the caches equal the pair's, bit for bit
    assert all(float(r[-1]) < 1e-2 for r in rows), rows


def test_table_at_several_tokens_compares_the_pair_and_the_token_op(on_cpu, capsys):
    assert rope_attention.main(["--batches", "2", "--max-seq", "24", "--context", "18", "--tokens", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("2 ")]
    # rope_decode_attention_tokens (a bf16 / per-tensor o_proj) and rope_decode_attention_tokens_quant
    want = [("llama", "-"), ("llama", "quant"), ("qwen3", "-"), ("qwen3", "quant")]
    assert [(r[1], r[2]) for r in rows] == want, rows
    assert all(r[-2] == "True" for r in rows) and all(float(r[-1]) < 1e-2 for r in rows), rows


def test_table_takes_the_heads_and_models_asked_for(on_cpu, capsys, monkeypatch):
    # Qwen3-32B's 8 query rows per kv head, scaled down: 16 query heads on 2 kv heads, the qwen3 rows alone
    seen, real = [], rope_attention.inputs

    def inputs(*a, **kw):
        out = real(*a, **kw)
        seen.append((out[0].shape[2], out[9].shape[1]))  # (query heads, kv heads) of the inputs made
        return out

    monkeypatch.setattr(rope_attention, "inputs", inputs)
    args = ["--batches", "1", "--heads", "16,2", "--models", "qwen3", "--max-seq", "24", "--context", "20"]
    assert rope_attention.main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1 ")]
    assert [r[1] for r in rows] == ["qwen3", "qwen3"] and all(r[-2] == "True" for r in rows), rows
    assert set(seen) == {(16, 2)}


def test_attention_decode_times_a_step_of_several_tokens_against_fp32(on_cpu, capsys):
    # a step verifying 3 draft tokens, 2 query heads per kv head: 8 rows per kv head, each token its own mask row;
    # the one-token form (fused_upto) is left out, every other output held to fp32 attention
    args = ["--batches", "1,2", "--tokens", "4", "--heads", "16", "--impls", "math,fused,fused_upto",
            "--context", "20", "--max-seq", "32"]  # fmt: skip
    assert attention_decode.main(args) == 0
    out = capsys.readouterr().out
    assert "16 query heads, 8 kv heads, 4 token(s) per row: 8 query rows per kv head" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert sorted((r[0], r[1]) for r in rows) == [("1", "fused"), ("1", "math"), ("2", "fused"), ("2", "math")]
    assert all(float(r[-1]) < 1e-2 for r in rows), rows  # measured: math 3.6e-3 (its bf16 scores), fused 5e-5


def test_attention_decode_times_the_token_form_against_the_masked_one(on_cpu, capsys):
    # several tokens, q as the RoPE op leaves it, the o_proj's quantized input: the masked op with its copies and
    # quant against decode_attention_tokens_quant, each dequantized and held to fp32 attention; one token: left out
    args = ["--batches", "2", "--tokens", "3", "--heads", "16", "--impls", "masked+quant,math+quant,tokens_quant",
            "--context", "20", "--max-seq", "32"]  # fmt: skip
    assert attention_decode.main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("2 ")]
    assert sorted(r[1] for r in rows) == ["masked+quant", "math+quant", "tokens_quant"], rows
    assert all(float(r[-1]) < 6e-2 for r in rows), rows  # the fp8 steps: 2.6e-2 both, on the CPU reference
    assert attention_decode.main(["--batches", "1", "--impls", "math,tokens_quant", "--context", "20",
                                  "--max-seq", "32"]) == 0  # fmt: skip
    assert "tokens_quant" not in capsys.readouterr().out


def test_attention_decode_times_the_plain_token_form_against_the_masked_one(on_cpu, capsys):
    # no quant to fold (a per-tensor o_proj): the masked op and the math form between their copies against
    # decode_attention_tokens, each output [B, S, H, D] held to fp32 attention in its own layout
    args = ["--batches", "2", "--tokens", "3", "--heads", "16", "--impls", "masked+copy,math+copy,tokens",
            "--context", "20", "--max-seq", "32"]  # fmt: skip
    assert attention_decode.main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("2 ")]
    assert sorted(r[1] for r in rows) == ["masked+copy", "math+copy", "tokens"], rows
    errs = {r[1]: float(r[-1]) for r in rows}
    assert errs["tokens"] < 1e-3 and errs["masked+copy"] < 1e-3, errs  # bf16 outputs of fp32 sums (a layout slip: ~1.4)
    assert errs["math+copy"] < 1e-2, errs  # its bf16 scores


def test_attention_decode_sweeps_the_rows_of_a_step_of_several_tokens(on_cpu, capsys):
    # the kernel alone (the interpreter) at 2 query heads per kv head x 4 tokens, each token its own mask row; the
    # upto form reads one position a row, so several tokens take the mask form only
    args = ["--sweep", "--sweep-mask", "--batches", "1", "--tokens", "4", "--heads", "16", "--context", "20",
            "--max-seq", "32"]  # fmt: skip
    assert attention_decode.main(args) == 0
    out = capsys.readouterr().out
    assert "8 query rows per kv head (16 query heads, 8 kv heads, 4 token(s)), mask form" in out
    assert "AttentionConfig(" in out
    with pytest.raises(SystemExit, match="the mask form"):
        attention_decode.main(["--sweep", "--batches", "1", "--tokens", "4"])


def test_attention_decode_sweep_ranks_no_config_off_fp32(on_cpu, monkeypatch):
    # each config's output is checked against fp32 attention first: a kernel that dropped the last key of every
    # row is reported WRONG and never ranked (here every config, so the sweep has nothing to rank and says so)
    real = attention_decode.kernel.decode_attention

    def last_key_lost(q, k_cache, v_cache, keep, scale, cfg):
        return real(q, k_cache, v_cache, keep & (torch.arange(keep.shape[-1]) < 20), scale, cfg)

    monkeypatch.setattr(attention_decode.kernel, "decode_attention", last_key_lost)
    args = ["--sweep", "--sweep-mask", "--batches", "1", "--heads", "16", "--context", "20", "--max-seq", "32"]
    with pytest.raises(SystemExit, match="every config WRONG"):
        attention_decode.main(args)


@pytest.mark.parametrize("args", [["--models", "qwen"], ["--heads", "64"], ["--heads", "64,x"]])
def test_unknown_models_and_bad_heads_are_refused(on_cpu, args):
    with pytest.raises(SystemExit):
        rope_attention.main(["--batches", "1", *args])


@pytest.mark.parametrize("tokens", [1, 3])
def test_sweep_times_each_config(on_cpu, capsys, tokens):
    # one token: rope_decode_attention; 3: the token form's RoPE launch (rope_decode_attention_tokens_quant)
    args = ["--sweep", "--heads", "8,2", "--batches", "1", "--models", "qwen3", "--max-seq", "24", "--context", "20",
            "--tokens", str(tokens)]  # fmt: skip
    assert rope_attention.main(args) == 0
    captured = capsys.readouterr()
    out = captured.out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("1 "))
    assert row[:4] == ["1", "qwen3", "8/2", str(tokens)] and "AttentionConfig(" in out, out
    # the log line carries TABLE's figure too, the table's column (a call cut short never prints the table)
    assert f"x {tokens}: TABLE's {row[-2]}; " in captured.err, captured.err


def test_cache_copies_are_past_three_l2s(monkeypatch):
    import _timing

    kc, vc = torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16)
    each = 2 * kc.numel() * kc.element_size()
    monkeypatch.setattr(_timing, "ROTATE_BYTES", 20 * each)  # "3x L2": twenty of these caches
    copies = _timing.cache_copies(kc, vc)
    assert len(copies) == 20 and all(torch.equal(k, kc) and torch.equal(v, vc) for k, v in copies)
    ptrs = {t.data_ptr() for pair in copies for t in pair} | {kc.data_ptr(), vc.data_ptr()}
    assert len(ptrs) == 2 * 20 + 2  # every copy its own memory
    assert len(_timing.cache_copies(kc, vc, dry_run=True)) == 2  # a dry run rotates through two


def test_attention_decode_cold_sweep_reads_copies_and_holds_them_to_fp32(on_cpu, monkeypatch, capsys):
    read, real = [], attention_decode.kernel.decode_attention_upto

    def upto(q, kc, *a, **kw):
        read.append(kc.data_ptr())
        return real(q, kc, *a, **kw)

    made, randn_like = [], torch.randn_like

    def like(t, *a, **kw):  # the sweep makes v_cache "like" its k_cache: that is the k cache it made
        made.append(t.data_ptr())
        return randn_like(t, *a, **kw)

    monkeypatch.setattr(attention_decode.kernel, "decode_attention_upto", upto)
    monkeypatch.setattr(torch, "randn_like", like)
    args = ["--sweep", "--cold", "--batches", "1", "--heads", "16", "--context", "20", "--max-seq", "32"]
    assert attention_decode.main(args) == 0
    err = capsys.readouterr().err
    assert "sweep batch 1 (cold caches): " in err and "WRONG" not in err, err
    assert len(set(read)) == 1 and read and made and made[0] not in read, (read, made)  # every call on a copy
    with pytest.raises(SystemExit):
        attention_decode.main(["--cold", "--batches", "1"])


def test_cold_sweep_reads_a_copy_of_the_caches(on_cpu, monkeypatch, capsys):
    read, real = [], attention_decode.kernel.rope_decode_attention

    def op(*a, **kw):
        read.append(a[9].data_ptr())  # the k cache this call reads
        return real(*a, **kw)

    monkeypatch.setattr(attention_decode.kernel, "rope_decode_attention", op)
    args = ["--sweep", "--cold", "--heads", "8,2", "--batches", "1", "--models", "llama", "--max-seq", "24",
            "--context", "20"]  # fmt: skip
    assert rope_attention.main(args) == 0
    assert "(cold caches): TABLE's" in capsys.readouterr().err
    # per config: the eager call on the inputs' cache, then the capture's and the replay's on the copy (on the CPU,
    # with one call a replay, one copy of the two is read)
    original, copies = read[0], [p for p in read if p != read[0]]
    assert read.count(original) == len(attention_decode.SWEEP) and len(set(copies)) == 1 and copies, read


def test_sweep_of_some_programs_keeps_those_configs_and_tables(on_cpu, monkeypatch, capsys):
    # --programs 0: the one-split configs and TABLE's (programs 1 at these pairs), not the other programs-1 config
    table = attention_decode.kernel.config_for(2)
    one_split, other = attention_decode.SWEEP[0], attention_decode.SWEEP[1]
    assert (one_split.programs, other.programs, table.programs) == (0, 1, 1) and other != table
    monkeypatch.setattr(attention_decode, "SWEEP", [one_split, other, table])
    args = ["--sweep", "--programs", "0", "--heads", "8,2", "--batches", "1", "--models", "llama", "--max-seq", "24",
            "--context", "20"]  # fmt: skip
    assert rope_attention.main(args) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "sweep batch 1" in x)
    assert line.count("AttentionConfig(") == 2 and str(one_split) in line and str(table) in line, line
    assert "TABLE's nan" not in line, line


def test_sweep_of_a_split_count_keeps_those_configs(monkeypatch, capsys):
    # --programs s2: the configs that ask for 2 splits (and TABLE's), not the one-split ones nor programs-1's
    table = attention_decode.kernel.config_for(2)
    two = next(c for c in attention_decode.SWEEP if c.splits == 2)
    monkeypatch.setattr(decode, "DEVICE", "cpu")  # as on_cpu, whose SWEEP has no 2-split config
    monkeypatch.setattr(attention_decode, "SWEEP", [attention_decode.SWEEP[0], attention_decode.SWEEP[1], two, table])
    args = ["--sweep", "--programs", "s2", "--heads", "8,2", "--batches", "1", "--models", "llama", "--max-seq", "24",
            "--context", "20"]  # fmt: skip
    grad = torch.is_grad_enabled()
    try:
        assert rope_attention.main(args) == 0
    finally:
        torch.set_grad_enabled(grad)
    line = next(x for x in capsys.readouterr().err.splitlines() if "sweep batch 1" in x)
    assert line.count("AttentionConfig(") == 2 and str(two) in line and str(table) in line, line


@pytest.mark.parametrize("args", [["--sweep", "--programs", "3"], ["--sweep", "--programs", "0,x"],
                                  ["--sweep", "--programs", "s9"],
                                  ["--sweep", "--programs", "0,,1"], ["--programs", "0"], ["--cold"]])
def test_sweep_refuses_programs_no_config_has_and_programs_without_a_sweep(on_cpu, args):
    with pytest.raises(SystemExit):
        rope_attention.main([*args, "--batches", "1"])


def test_once_launches_the_fused_op_and_times_nothing(on_cpu, monkeypatch, capsys):
    # what a profiler attaches to (attention_ncu.sh): N eager calls of the fused op with the quant per batch and model
    calls, real = [], rope_attention.fused

    def fused(args, group):
        calls.append((args[0].shape[0], args[1] is not None, group))  # (batch, q / k norms, quant group)
        return real(args, group)

    monkeypatch.setattr(rope_attention, "fused", fused)
    monkeypatch.setattr(rope_attention, "capture", lambda *a, **kw: pytest.fail("--once captures nothing"))
    args = ["--once", "3", "--batches", "1,2", "--heads", "8,2", "--max-seq", "24", "--context", "20"]
    assert rope_attention.main(args) == 0
    want = [(b, norm, 128) for b in (1, 2) for norm in (False, True) for _ in range(3)]
    assert calls == want
    assert "batch" not in capsys.readouterr().out  # no table
    with pytest.raises(SystemExit):
        rope_attention.main(["--once", "1", "--sweep", "--batches", "1"])


def test_attention_ncu_profiles_the_third_launch_of_each_batch_and_model(tmp_path):
    # the wrapper's plumbing, with an ncu stand-in that records its arguments and prints a report's headline lines
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").write_text('#!/usr/bin/env bash\necho "$@" >> "$OUT/ncu_args"\n'
                                 'echo "    Duration                         us         12.80"\n'
                                 'echo "    Waves Per SM                                 1.45"\n')  # fmt: skip
    (bin_dir / "ncu").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "benchmarks/attention_ncu.sh", "8,32", "llama"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = (out / "ncu_args").read_text().splitlines()
    assert len(runs) == 2
    for run, batch in zip(runs, ("8", "32")):
        assert "-k regex:_decode_attention_kernel --launch-skip 2 --launch-count 1" in run
        assert run.endswith(f"rope_attention.py --once 3 --batches {batch} --models llama --heads 32,8")
        assert (out / f"ncu_b{batch}_llama.txt").exists()
    assert done.stdout.count("Duration") == 2 and "== batch 32, llama, heads 32,8" in done.stdout


def test_attention_ncu_says_when_ncu_is_missing(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", "benchmarks/attention_ncu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and "ncu (Nsight Compute) is not on PATH" in done.stderr


def test_attention_decode_times_the_visible_splits_beside_the_slot_splits(on_cpu, capsys, monkeypatch):
    # fused_upto_visible: the upto op launched with decode_attention.SPLIT_VISIBLE on, for its capture alone (the
    # Triton kernel in the interpreter: the CPU's backend is the reference, which has no splits)
    from fp8_fusion_pass.kernels import backends
    from fp8_fusion_pass.kernels.triton import decode_attention as kernel

    flags, real, default = [], kernel._launch, kernel.SPLIT_VISIBLE
    monkeypatch.setattr(kernel, "_launch", lambda *a, **kw: flags.append(kernel.SPLIT_VISIBLE) or real(*a, **kw))
    args = ["--batches", "1", "--impls", "fused_upto,fused_upto_visible", "--context", "20", "--max-seq", "200"]
    with backends.use_backend("triton"):
        assert attention_decode.main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1 ")]
    assert [r[1] for r in rows] == ["fused_upto", "fused_upto_visible"] and all(float(r[-1]) < 1e-2 for r in rows)
    assert False in flags and True in flags and flags.index(True) > flags.index(False)
    assert kernel.SPLIT_VISIBLE is default  # put back
