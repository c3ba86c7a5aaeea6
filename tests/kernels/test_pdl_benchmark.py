"""``benchmarks/pdl.py --dry-run`` (CPU, Triton interpreter) runs end to end: every shape's GEMM and chain, each
variant checked bitwise against PDL off and timed, the table printed; and a GEMM config comes from the TABLE."""

from __future__ import annotations

import os
import sys

import pytest

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def test_gemm_config_is_the_tables_small_m_row(monkeypatch):
    import pdl

    # no TABLE row at M <= 64 names cuBLAS any more (the last two took idea 20's rows, 2026-12-04): make one
    monkeypatch.setitem(bm.TABLE, ("sm90", 64, 10240, 5120), bm.Choice("cublas"))
    with arch.simulate_arch("sm90") as a:
        assert pdl.gemm_config(a, 16, 6144, 4096) == bm.TABLE[("sm90", 16, 6144, 4096)].config
        # M = 1: TABLE names the GEMV, so the small-M config measured beside it
        assert bm.TABLE[("sm90", 1, 6144, 4096)].path == "gemv"
        assert pdl.gemm_config(a, 1, 6144, 4096) == bm.SMALL_M_BEST[("sm90", 1, 6144, 4096)]
        assert bm.TABLE[("sm90", 64, 10240, 5120)].path == "cublas"  # no small-M row: the kernel's default
        assert pdl.gemm_config(a, 64, 10240, 5120) == pdl.default_small_m_config(10240, 5120, a=a)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the dry run needs the Triton interpreter")
def test_dry_run(capsys):
    import pdl

    assert pdl.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "DIFF" not in out and "outputs differing from PDL off: 0" in out
    for what in ("GEMM", "norm_quant -> GEMM", "silu_quant -> GEMM"):
        assert f"  {what}  " in out, what
    assert "pdl, no prefetch us" in out and "pdl/roofline" in out
