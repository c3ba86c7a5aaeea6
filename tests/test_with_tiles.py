"""``benchmarks/with_tiles.py``: the tables a sweep prints are read back exactly, nothing but literals and
``Tile(...)`` is evaluated, and the script it runs launches with them."""

from __future__ import annotations

import contextlib
import io
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _kernel_sweep as ks  # noqa: E402
import with_tiles  # noqa: E402

from fp8_fusion_pass.kernels.triton import _tiles  # noqa: E402

Tile = _tiles.Tile
ONE = Tile(1, 32, 4, True, 8, per_sm=0, prefetch=False)
S5, S10 = Tile(1, 32, 4, True, 8, split=5), Tile(1, 32, 2, True, 8, split=10)
WIDE = Tile(4, 32, 16, True, 8, per_sm=2, prefetch=True)


def _row(op, k, m, times):
    best = min(times, key=times.get)
    return {"op": op, "K": k, "M": m, "all": times, "best_us": times[best], "best_tile": best,
            "default_us": times[ONE], "roofline_us": 1.0, "best_over_roofline": times[best]}  # fmt: skip


def _sweep_output(rows) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ks.print_table(rows, "test")
    return out.getvalue()


@pytest.fixture
def restore_tables():
    saved = {name: dict(getattr(_tiles, name)) for name in with_tiles.TABLES}
    yield
    for name, entries in saved.items():
        table = getattr(_tiles, name)
        table.clear()
        table.update(entries)


def test_the_printed_tables_read_back_as_the_sweep_chose_them():
    op = "add_rms_norm_group_quant"
    rows = [_row(op, 5120, 1, {ONE: 2.0, S5: 1.5, S10: 1.6}), _row(op, 5120, 4, {ONE: 2.2, S5: 1.9, S10: 2.1}),
            _row(op, 5120, 2048, {ONE: 9.0, WIDE: 7.0})]  # fmt: skip
    tables = with_tiles.read_tables(_sweep_output(rows))
    assert tables["SPLIT_ROWS"] == {("add_rms_norm", 5120): S5}
    assert tables["MEASURED"] == {key: tile for key, (tile, _) in ks.winners(rows).items()}
    assert tables["MEASURED"][("add_rms_norm", 5120, "large")] == WIDE


def test_an_empty_split_table_reads_as_empty():
    rows = [_row("rms_norm_group_quant", 4096, 1, {ONE: 2.0, S5: 1.99})]  # within 3%: no split row
    assert with_tiles.read_tables(_sweep_output(rows))["SPLIT_ROWS"] == {}


@pytest.mark.parametrize("value", ["__import__('os').system('true')", "Tile(block_m=len('x'))", "dict(a=1)"])
def test_anything_but_literal_tiles_is_refused_unevaluated(value):
    text = f'SPLIT_ROWS: dict[tuple[str, int], Tile] = {{\n    ("rms_norm", 4096):\n        {value},\n}}\n'
    with pytest.raises(ValueError):
        with_tiles.read_tables(text)


def test_a_block_without_its_closing_brace_is_refused():
    with pytest.raises(ValueError, match="closing brace"):
        with_tiles.read_tables('MEASURED: dict[tuple[str, int, str], Tile] = {\n    ("rms_norm", 4096, "mid"):\n')


def test_the_script_runs_with_the_tables_applied(tmp_path, restore_tables):
    rows = [_row("rms_norm_group_quant", 5120, 1, {ONE: 2.0, S10: 1.0})]
    log = tmp_path / "sweep.txt"
    log.write_text(_sweep_output(rows))
    seen = tmp_path / "seen.txt"
    script = tmp_path / "script.py"
    script.write_text("import sys\nfrom fp8_fusion_pass.kernels.triton import _tiles\n"
                      "open(sys.argv[1], 'w').write(repr(_tiles.SPLIT_ROWS[('rms_norm', 5120)]))\n")  # fmt: skip
    assert with_tiles.main([str(log), str(script), str(seen)]) == 0
    assert seen.read_text() == repr(S10)


def test_tables_picks_which_blocks_apply(tmp_path, restore_tables):
    op = "add_rms_norm_group_quant"
    rows = [_row(op, 5120, 1, {ONE: 2.0, S5: 1.5}), _row(op, 5120, 2048, {ONE: 9.0, WIDE: 7.0})]
    log = tmp_path / "sweep.txt"
    log.write_text(_sweep_output(rows))
    seen, script = tmp_path / "seen.txt", tmp_path / "script.py"
    script.write_text("import sys\nfrom fp8_fusion_pass.kernels.triton import _tiles\n"
                      "open(sys.argv[1], 'w').write(repr(_tiles.MEASURED.get(('add_rms_norm', 5120, 'large'))))\n")
    assert with_tiles.main(["--tables", "SPLIT_ROWS", str(log), str(script), str(seen)]) == 0
    assert seen.read_text() != repr(WIDE)  # the sweep's MEASURED block left out
    assert _tiles.SPLIT_ROWS[("add_rms_norm", 5120)] == S5
    with pytest.raises(SystemExit):
        with_tiles.main(["--tables", "MEASURD", str(log), str(script)])


def test_a_log_without_entries_runs_nothing(tmp_path, restore_tables):
    log = tmp_path / "sweep.txt"
    log.write_text("no tables here\n")
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('ran')\n")
    assert with_tiles.main([str(log), str(script)]) == 3
