"""Run a benchmark with the tile tables a sweep printed, before they are pasted into ``_tiles.py``.

    python benchmarks/with_tiles.py [--tables SPLIT_ROWS] SWEEP_LOG benchmarks/decode.py --presets qwen3-32b ...

``SWEEP_LOG`` is the output of ``benchmarks/fused_kernels.py --sweep``: its ``MEASURED = {...}`` and
``SPLIT_ROWS = {...}`` blocks (either may be absent; ``--tables`` picks, default both) are read, without running
them, and put into ``fp8_fusion_pass.kernels.triton._tiles`` over the committed entries; then the script runs with
the arguments that follow, in this process. The launchers choose their tiles when they launch (also while a CUDA
graph is captured), so the script's kernels use the sweep's tiles: the same script run plainly on the same
machine is the comparison (``benchmarks/issue7.sh split`` runs both for Qwen3-32B at batch 1).
"""

from __future__ import annotations

import argparse
import ast
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fp8_fusion_pass.kernels.triton import _tiles

TABLES = ("MEASURED", "SPLIT_ROWS")


def _tile(node: ast.expr) -> _tiles.Tile:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Tile"):
        raise ValueError(f"not a Tile(...) call: {ast.unparse(node)}")
    return _tiles.Tile(*map(ast.literal_eval, node.args), **{k.arg: ast.literal_eval(k.value) for k in node.keywords})


def read_tables(text: str) -> dict[str, dict]:
    """{table name: {key: Tile}} of every ``NAME: dict[...] = {...}`` block of ``TABLES`` in a sweep's output; the
    keys are literals and the values ``Tile(...)`` calls with literal arguments (nothing else is evaluated)."""
    tables: dict[str, dict] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        name = line.split(":", 1)[0]
        if name not in TABLES or not line.rstrip().endswith("{"):
            continue
        end = next((j for j in range(i, len(lines)) if lines[j] == "}"), None)
        if end is None:
            raise ValueError(f"{name}: the block has no closing brace")
        block = ast.parse("\n".join(lines[i:end + 1])).body[0]
        if not isinstance(block, ast.AnnAssign) or not isinstance(block.value, ast.Dict):
            raise ValueError(f"{name}: not a dict assignment")
        tables[name] = {ast.literal_eval(k): _tile(v) for k, v in zip(block.value.keys, block.value.values)}
    return tables


def apply(tables: dict[str, dict]) -> None:
    for name, entries in tables.items():
        getattr(_tiles, name).update(entries)  # in place: the launchers read the module's dicts at each launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", default=",".join(TABLES), help=f"which of {', '.join(TABLES)} to apply")
    p.add_argument("log", metavar="SWEEP_LOG")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    names = [n for n in args.tables.split(",") if n]
    if not names or set(names) - set(TABLES):
        p.error(f"--tables takes {', '.join(TABLES)}; got {args.tables!r}")
    with open(args.log) as f:
        tables = {name: entries for name, entries in read_tables(f.read()).items() if name in names}
    for name in names:
        entries = tables.get(name, {})
        print(f"[with_tiles] {name}: {len(entries)} entries from {args.log}"
              + "".join(f"\n    {k}: {t}" for k, t in entries.items()), file=sys.stderr, flush=True)
    if not any(tables.values()):
        print(f"[with_tiles] {args.log} has no {' / '.join(names)} entries: nothing to try", file=sys.stderr)
        return 3
    apply(tables)
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
