"""The GEMV that quantizes its own input (``_gemv_kernels.gemv_mm_bf16``) and the op that runs it,
``group_quant_blockscale_mm``.

CPU (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): bit for bit ``gemv_mm`` on the group-quant kernel's
``(q, scale)`` at the same config, on random rows and on the adversarial ones (zeros, +-inf, NaN, 1e30,
denormals), K in and not in whole chunks; the op's dispatch (a TABLE row and the GEMV plan, else the pair) and its
input errors; the reference backend's composition.
"""

from __future__ import annotations

import pytest
import torch
from elementwise_checks import _adversarial
from gemm_helpers import make_inputs

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, ops  # noqa: F401  (ops registers torch.ops.fp8_fusion)
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton import group_quant_blockscale_mm as gqm
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, gemv_mm, gemv_mm_bf16
from fp8_fusion_pass.kernels.triton.group_quant import group_quant

BF16 = torch.bfloat16
OP = torch.ops.fp8_fusion.group_quant_blockscale_mm


def _bits(y):
    return y.view(torch.int16) if y.dtype == BF16 else y.view(torch.int32)


def _pair(x, w, s, config, out_dtype=BF16):
    return gemv_mm(*group_quant(x, 128), w, s, out_dtype, config)


@pytest.mark.parametrize(
    "m, n, k, config",
    [
        (1, 256, 512, GemvConfig(4, 256, 4, 1)),
        (3, 130, 384, GemvConfig(8, 256, 4, 1)),  # K = 384 in chunks of 256: a zero-filled tail chunk; N partial
        (4, 256, 1024, GemvConfig(8, 1024, 4, 1)),  # K in whole 1024-value chunks
    ],
)
@pytest.mark.parametrize("out_dtype", [BF16, torch.float32])
def test_quantizing_gemv_is_quant_then_gemv_bit_for_bit(m, n, k, config, out_dtype):
    _, _, w, s = make_inputs(m, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16) * 3
    got = gemv_mm_bf16(x, w, s, out_dtype, config)
    assert torch.equal(_bits(got), _bits(_pair(x, w, s, config, out_dtype))), f"M={m} N={n} K={k} {config}"


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32])
def test_fp16_and_fp32_inputs_too(x_dtype):
    _, _, w, s = make_inputs(2, 256, 512)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(3)).to(x_dtype)
    config = GemvConfig(16, 256, 4, 1)  # 16 programs: each quantizes the whole row again, ~0.2 s of Python here
    assert torch.equal(_bits(gemv_mm_bf16(x, w, s, BF16, config)), _bits(_pair(x, w, s, config)))


@pytest.mark.parametrize("rows", [slice(0, 4), slice(4, 8), slice(8, 9)])
def test_adversarial_rows_match_the_pair_bit_for_bit(rows):
    x = _adversarial(9, 256)[rows]  # zeros, +-inf, NaN, 1e30, denormals, fp8-max edges, a zero row
    _, _, w, s = make_inputs(1, 256, 256)
    config = GemvConfig(16, 256, 4, 1)
    got, want = gemv_mm_bf16(x, w, s, BF16, config), _pair(x, w, s, config)
    assert torch.equal(_bits(got), _bits(want))  # NaN where the pair has NaN, bit for bit


def _pin(monkeypatch, m, n, k, config):
    monkeypatch.setitem(gqm.TABLE, (arch.arch_of("cpu").name, bm.m_bucket(m), n, k), config)


def test_the_op_runs_the_gemv_where_the_table_says(monkeypatch):
    _, _, w, s = make_inputs(1, 256, 512)
    x = torch.randn(1, 512, dtype=torch.float32).to(BF16)
    config = GemvConfig(8, 256, 4, 1)
    _pin(monkeypatch, 1, 256, 512, config)
    a = arch.arch_of("cpu")
    assert gqm.fused_config(a, "cpu", w.dtype, 1, 256, 512, 128, BF16) == config
    calls = []
    monkeypatch.setattr(gqm, "gemv_mm_bf16", lambda *args: calls.append(args) or gemv_mm_bf16(*args))
    with backends.use_backend("triton"):
        got = OP(x, w, s, BF16, 128)
    assert len(calls) == 1 and torch.equal(_bits(got), _bits(_pair(x, w, s, config)))
    with backends.use_backend("reference"):
        assert torch.equal(_bits(OP(x, w, s, BF16, 128)),
                           _bits(ref.blockscale_mm(*ref.group_quant(x, 128, arch.fp8_dtype("cpu"),
                                                                    arch.fp8_max("cpu")), w, s, BF16)))  # fmt: skip


@pytest.mark.parametrize(
    "m, config, group, why",
    [
        (1, None, 128, "measured slower"),
        (1, "no row", 128, "never measured"),
        (5, GemvConfig(8, 256, 4, 1), 128, "M above the GEMV's 4 rows"),
        (1, GemvConfig(8, 256, 4, 1), 64, "groups of 64: the GEMV takes 128"),
    ],
)
def test_the_op_runs_the_pair_elsewhere(monkeypatch, m, config, group, why):
    _, _, w, s = make_inputs(m, 256, 512)
    x = torch.randn(m, 512).to(BF16)
    if config != "no row":
        _pin(monkeypatch, m, 256, 512, config)
    monkeypatch.setattr(gqm, "gemv_mm_bf16", lambda *args: pytest.fail(f"the fused GEMV ran: {why}"))
    with backends.use_backend("triton"):
        got = OP(x, w, s, BF16, group)
    want = bm.blockscale_mm(*group_quant(x, group), w, s, BF16)
    assert torch.equal(_bits(got), _bits(want)), why


def test_every_table_row_is_a_config_the_gemv_takes():
    assert gqm.TABLE, "measured rows expected"
    for (arch_name, bucket, n, k), config in gqm.TABLE.items():
        assert arch_name == "sm90" and bucket in (1, 4) and k % 128 == 0, (n, k)
        assert config is None or isinstance(config, GemvConfig), config


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda x, w, s: (x.to(torch.float8_e4m3fn), w, s), TypeError, "x must be bf16"),
        (lambda x, w, s: (x.reshape(1, 1, 512), w, s), ValueError, "2-D"),
        (lambda x, w, s: (x[:, :384], w, s), ValueError, "K=384"),
        (lambda x, w, s: (x, w.float(), s), TypeError, "w_q must be fp8"),
        (lambda x, w, s: (x, w, s[:1]), ValueError, "w_scale must be"),
        (lambda x, w, s: (x[:, :320], w[:, :320], s), ValueError, "multiple of group_size"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, error, match):
    _, _, w, s = make_inputs(1, 256, 512)
    x = torch.randn(1, 512).to(BF16)
    with pytest.raises(error, match=match):
        OP(*change(x, w, s), BF16, 128)


def test_benchmark_dry_run_prints_pasteable_rows(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_json = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "quant_gemm.py"), "--dry-run", "--json",
                           str(out_json)], env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WRONG" not in proc.stderr
    rows = proc.stdout.split("by `python benchmarks/quant_gemm.py`):\n")[1]
    table = eval("{\n" + rows + "\n}", {"GemvConfig": GemvConfig})
    assert set(table) == {("cpu", 1, 256, 512)} and all(v is None or isinstance(v, GemvConfig) for v in table.values())
    with open(out_json) as f:
        (row,) = json.load(f)["rows"]
    assert row["path"] == "gemv" and isinstance(row["fused_us"], float)  # its own config ran, bit for bit the pair
