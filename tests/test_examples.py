"""Every script in examples/ runs as a user would run it (``python examples/<name>.py``, a fresh process) and prints
what it claims: exact fused counts, the reasons for what stayed unfused, outputs close to eager.

One subprocess per example: a fresh interpreter is what users get (no Dynamo cache, no backend registered,
nothing imported by other tests). That is not a nicety: in one process that had imported
``fp8_fusion_pass.backend`` first, ``backend="fp8_fusion"`` worked, while a fresh ``import fp8_fusion_pass``
with the package installed failed with Dynamo's "duplicate name: fp8_fusion" (fixed in e1879b3).
Together 105 - 160 s on the loaded 2-core box (75 s of CPU), each example 9 - 35 s, mostly Inductor's CPU compile
of the tiny models.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# This module's tolerance table.
# Compiled (with the pass) vs eager logits, relative L2: the bound of tests/models/test_compile.py
# (COMPILED_VS_EAGER_REL_ERR, Inductor's own bf16-intermediate noise on these block-FP8 models; measured 0.045
# on HF qwen3-tiny). The examples printed 0.000 - 0.039 on the CPU; a wrong weight or graph gives ~1.
COMPILED_VS_EAGER_REL_ERR = 0.10
TIMEOUT_S = 300  # one example; 52 s the slowest measured on the loaded box

# A tiny 2-layer Qwen3 (HF form): 2L norm sites (layer 0's input norm plain, 2L-1 after a residual add), L silu
# sites, q/k/v and gate/up each collapse to one quant (2 + 1 dropped quants per layer), and each attention reads
# k / v without transformers' copy (gqa_attention: the example re-runs its fixed-length buffer of 14 tokens per step,
# within guards.GQA_MAX_QUERY_TOKENS); rejected: the final norm feeds no quant (1), the attention output feeding
# o_proj (2, by group_quant and by quant_gemm: 2 + 2). Each layer's q_norm / k_norm, which norm_quant declines,
# norm_rope takes: superseded, not rejected.
HF_QWEN3_2L = {"norm_quant": 1, "add_norm_quant": 3, "silu_quant": 2, "dedup_quant": 6, "group_gemm": 4,
               "gemm_silu_quant": 2, "norm_rope": 2, "gqa_attention": 2, "fills_stripped": 0, "fills_kept": 0,
               "rejected": 5, "errors": 0}


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "fp8_fusion_pass:" not in proc.stderr, f"the pass warned (a guard or replacement raised):\n{proc.stderr}"
    print(proc.stdout)
    return proc.stdout


def dicts_after(label: str, out: str) -> list[dict]:
    """Every ``{...}`` printed after ``label`` on a line, parsed."""
    found = [ast.literal_eval(m) for m in re.findall(rf"^{re.escape(label)} (\{{.*\}})$", out, flags=re.MULTILINE)]
    assert found, f"no line starting with {label!r} in:\n{out}"
    return found


def check_errors_small(out: str, expected_lines: int) -> None:
    errs = [float(e) for e in re.findall(r"relative L2 error (\d+\.\d+)", out)]
    assert len(errs) == expected_lines, out
    assert max(errs) < COMPILED_VS_EAGER_REL_ERR, errs


def test_every_example_has_a_test():
    tested = {n[len("test_"):] for n in globals() if n.startswith("test_")}
    scripts = {p.stem for p in EXAMPLES.glob("*.py")}
    assert scripts and scripts <= tested, f"examples without a test: {sorted(scripts - tested)}"


def test_compile_hf_qwen3():
    out = run_example("compile_hf_qwen3.py")
    assert dicts_after("fused counts:", out) == [HF_QWEN3_2L]
    assert "14 linear(s) converted, 1 skipped" in out and "skipped lm_head" in out
    check_errors_small(out, 1)
    generated = re.search(r"-> generated (\[.*\])", out)
    assert generated and len(ast.literal_eval(generated.group(1))) == 6, out
    assert "graphs compiled: 1 " in out  # the fixed-length decoding buffer: no recompile per token
    for reason in ("no_quant_consumer", "producer_not_fusable"):  # the rendered table shows each rejection
        assert reason in out
    assert "declined, then taken by a later rewrite: 4 norm_quant -> norm_rope" in out


def test_decorator():
    out = run_example("decorator.py")
    assert dicts_after("decorated class fused counts:", out) == [
        {"add_norm_quant": 1, "dedup_quant": 1, "gemm_silu_quant": 1, "group_gemm": 1, "norm_quant": 1,
         "silu_quant": 1, "fills_stripped": 0, "fills_kept": 0, "rejected": 0, "errors": 0}]
    assert dicts_after("instance fused counts:", out) == [
        {"norm_quant": 1, "fills_stripped": 0, "fills_kept": 0, "rejected": 0, "errors": 0}]
    check_errors_small(out, 2)


def test_pass_only():
    out = run_example("pass_only.py")
    # silu_quant is off in the FusionConfig: no silu fusion, and the report names the switch
    assert dicts_after("fused counts:", out) == [{"add_norm_quant": 1, "dedup_quant": 3, "norm_quant": 1,
                                                  "fills_stripped": 0, "fills_kept": 0, "rejected": 3,
                                                  "errors": 0}]
    assert dicts_after("rejection reasons:", out) == [
        {"disabled_by_config": 1, "no_quant_consumer": 1, "producer_not_fusable": 1}]
    assert "FusionConfig.silu_quant is False" in out and '"schema_version": 1' in out
    check_errors_small(out, 1)


def test_engine_model():
    out = run_example("engine_model.py")
    # merged qkv / gate_up: one quant per norm output already, so nothing to dedup or group; the q / k norms of
    # each layer have no quant consumer and go with their RoPE into one rms_norm_rope (superseded, not rejected);
    # the final norm is inlined (still rejected: it runs unfused); the o_proj's input quant is rejected twice per
    # layer (producer_not_fusable, m_above_gemv)
    assert dicts_after("fused counts:", out) == [{"add_norm_quant": 3, "gemm_silu_quant": 2, "inline_norm": 1,
                                                  "norm_quant": 1, "norm_rope": 2, "silu_quant": 2, "fills_stripped": 0,
                                                  "fills_kept": 0, "rejected": 5, "errors": 0}]
    assert "declined, then taken by a later rewrite: 4 norm_quant -> norm_rope" in out
    assert "qkv_proj BlockFP8Linear(in_features=256, out_features=1024" in out
    check_errors_small(out, 1)


def test_per_tensor_zero_fill():
    out = run_example("per_tensor_zero_fill.py")
    # 1 layer, 4 per-tensor GEMMs (qkv, o, gate_up, down), one zeros(1) scale each
    assert dicts_after("fill counts:", out) == [{"fills_stripped": 4, "fills_kept": 0},  # op overwrites
                                                {"fills_stripped": 0, "fills_kept": 4}]  # re-registered accumulating
    assert len(re.findall(r"^  stripped full_default\S*: consumer fp8_fusion::dynamic_per_tensor_quant\(scale\) "
                          r"overwrites it$", out, flags=re.MULTILINE)) == 4
    assert len(re.findall(r"^  kept full_default\S*: fill_accumulating_op ", out, flags=re.MULTILINE)) == 4
    # a per-tensor quant is no group quant: nothing for the norm / silu fusions; the q / k norms go with their RoPE
    # into one rms_norm_rope, and the other norms are inlined
    assert "fused [inline_norm=3, norm_rope=1]" in out
    check_errors_small(out, 2)


def test_load_fp8_checkpoint():
    out = run_example("load_fp8_checkpoint.py")
    assert "'quant_method': 'fp8'" in out and "'weight_block_size': [128, 128]" in out
    assert re.search(r"gate_proj\.weight: F8_E4M3 \[768, 256\]", out)
    assert re.search(r"gate_proj\.weight_scale_inv: BF16 \[6, 2\]", out)  # ceil(768/128) x ceil(256/128), bf16
    assert "14 linear(s) converted" in out
    assert "bit-identical): True" in out
    assert dicts_after("fused counts:", out) == [HF_QWEN3_2L]
    check_errors_small(out, 1)
