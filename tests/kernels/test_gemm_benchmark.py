"""``benchmarks/gemm.py``: the TABLE rows it prints are valid Python that ``blockscale_mm`` accepts, and (slow) the
``--dry-run`` (CPU, Triton interpreter) runs end to end, checking every candidate against the oracle."""

from __future__ import annotations

import os
import re
import sys

import pytest

from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._blockscale_kernels import SmallMConfig, TiledConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
NAMES = {"Choice": bm.Choice, "SmallMConfig": SmallMConfig, "TiledConfig": TiledConfig}


def _parse(rows: list[str]) -> dict:
    return eval("{\n" + "\n".join(rows) + "\n}", dict(NAMES))


def test_table_rows_are_pasteable():
    import gemm

    rows = [
        gemm.table_row("sm90", 3, 4096, 4096, "small_m", SmallMConfig(64, 4, 4, 4), "4.1 us"),
        gemm.table_row("sm90", 2049, 4096, 4096, "tiled", TiledConfig(128, 128, 8, 8, 3), "x"),
        gemm.table_row("sm90", 2048, 4096, 12288, "cublas", None, "y"),
    ]
    assert _parse(rows) == {
        ("sm90", 4, 4096, 4096): bm.Choice("small_m", SmallMConfig(64, 4, 4, 4)),  # M=3 -> bucket 4
        ("sm90", 8192, 4096, 4096): bm.Choice("tiled", TiledConfig(128, 128, 8, 8, 3)),
        ("sm90", 2048, 4096, 12288): bm.Choice("cublas"),
    }


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the dry run needs the Triton interpreter")
def test_dry_run(capsys):
    import gemm

    assert gemm.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r'\s+\("cpu", \d+, \d+, \d+\): Choice\(', line)]
    table = _parse(rows)
    assert set(table) == {("cpu", 1, 128, 256), ("cpu", 128, 128, 256)}  # M=1 and M=65 (bucket 128)
    assert all(c.path in ("tiled", "small_m") and c.config is not None for c in table.values())
    assert "WRONG" not in out
