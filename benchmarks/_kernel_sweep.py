"""``benchmarks/fused_kernels.py --sweep``: time tile candidates of our Triton kernels, print the winners for
``_tiles.py``.

For each (op, K, M) the kernel runs with the tile its launcher picks (``default``) and with every candidate of
``candidates``; per (op, K, M bucket) the tile with the smallest summed time relative to the best at each M of the
bucket wins (buckets: ``_tiles.BUCKETS``). The run ends with a ``MEASURED = {...}`` block to paste into
``fp8_fusion_pass/kernels/triton/_tiles.py``: entries there take precedence over the launchers' defaults.

Candidates (what the defaults were reasoned from, and around them):
- norms (one-pass rows): block shapes of 8, 16 or 32 values per thread (``_tiles.VALUES_PER_THREAD``: 32 predicted,
  fewer instructions per value; 16 gives more warps per row), each persistent at up to 32 (= as many as fit) and
  at 2 programs per SM, with ``prefetch``; the default shape without prefetch; and one program per row block
  (the first GPU round's structure). Rows that are not 2^a + 2^b groups: two-pass chunks of 4, 8, 16 groups.
  At M <= ``_tiles.SPLIT_MAX_M`` also one row over several programs (``split_candidates``), whose winners go to
  their own table, ``SPLIT_ROWS``, where one beats every unsplit tile by more than 3%.
- per-group kernels (silu + quant, group quant): [rows, groups] tiles of 2048 - 8192 values at 16 or 32 values
  per thread, plus the small tiles the launcher shrinks to at small M.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch
import triton
from _timing import time_graph

from fp8_fusion_pass.kernels.triton import _tiles

G = 128
TABLE_OP = {  # benchmark op -> the _tiles.MEASURED key (one row tile serves the fused and the unquantized norm)
    "rms_norm_group_quant": "rms_norm",
    "add_rms_norm_group_quant": "add_rms_norm",
    "silu_mul_group_quant": "silu_mul",
    "group_quant": "group_quant",
}


def log(msg: str) -> None:
    print(f"[sweep {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def row_candidates(k: int) -> list[_tiles.Tile]:
    Tile = _tiles.Tile
    n_groups = k // G
    one_pass = _tiles.one_pass_groups(k, G)
    if one_pass is None:
        return [Tile(bm, gpc, w, one_pass=False) for bm in (1, 2, 4) for gpc in (4, 8, 16) for w in (4, 8)
                if n_groups % gpc == 0 and 8 <= bm * gpc * G // (32 * w) <= 32]  # fmt: skip
    main, tail = one_pass
    out = []
    for bm in (1, 2, 4, 8):
        for w in (1, 2, 4, 8, 16):
            if bm * main * G // (32 * w) not in (8, 16, 32):  # 8: more warps on one row (latency at M = 1)
                continue
            out += [Tile(bm, main, w, True, tail, per_sm=p, prefetch=True) for p in (_tiles.MAX_PER_SM, 2)]
            if bm == 1:  # one row block (M = 1): nothing to prefetch, no loop to persist over
                out.append(Tile(1, main, w, True, tail, per_sm=0, prefetch=False))
    default = _tiles.row_tile(8192, k, G)
    out += [dataclasses.replace(default, prefetch=False), dataclasses.replace(default, per_sm=0, prefetch=False)]
    return list(dict.fromkeys(out))


def split_candidates(k: int) -> list[_tiles.Tile]:
    """One row over several programs (``_tiles.SPLIT_ROWS``, M <= ``SPLIT_MAX_M``): every split into power-of-two
    slices of 1-16 groups, at 2, 4 and 8 warps."""
    one_pass = _tiles.one_pass_groups(k, G)
    if one_pass is None:
        return []
    main, tail = one_pass
    n_groups = main + tail
    splits = [n_groups // gps for gps in (1, 2, 4, 8, 16) if n_groups % gps == 0 and n_groups // gps > 1]
    return [_tiles.Tile(1, main, w, True, tail, split=s) for s in splits for w in (2, 4, 8)]


def elementwise_candidates(n_groups: int, m: int) -> list[_tiles.Tile]:
    Tile = _tiles.Tile
    out = []
    for elements in (2048, 4096, 8192):
        for gpc in (8, 16, 32, 64):
            bm = elements // (gpc * G)
            if bm < 1 or gpc > triton.next_power_of_2(n_groups):
                continue
            if n_groups / (triton.cdiv(n_groups, gpc) * gpc) < _tiles.MIN_EFFICIENCY:
                continue
            out += [Tile(bm, gpc, elements // (32 * vpt)) for vpt in (16, 32)]
    if m <= 1024:  # what the launcher shrinks to when the grid would not cover the GPU
        out += [Tile(1, gpc, w) for gpc in (1, 2, 4, 8) for w in (1, 2, 4) if 8 <= gpc * G // (32 * w) <= 32]
    return list(dict.fromkeys(out))


def default_tile(op: str, k: int, m: int) -> _tiles.Tile:
    if op in ("silu_mul_group_quant", "group_quant"):
        return _tiles.elementwise_tile(m, k // G, G, TABLE_OP[op])
    return _tiles.row_tile(m, k, G, op.startswith("add_"))


def sweep_point(case, bw: float, dry: bool) -> dict:
    """Our kernel for ``case`` with its default tile and with every candidate."""
    op, k, m = case.op, case.k, case.m
    default = default_tile(op, k, m)
    tiles = row_candidates(k) if "norm" in op else elementwise_candidates(k // G, m)
    splits = split_candidates(k) if "norm" in op and m <= _tiles.SPLIT_MAX_M else []
    if dry:
        tiles, splits = tiles[:2], splits[:1]
    tiles += splits
    timed = {}
    for tile in dict.fromkeys([default, *tiles]):
        try:
            timed[tile] = time_graph(lambda i, t=tile: case.fused(i, t), case.copies, dry)
        except Exception as e:  # noqa: BLE001 - a tile the compiler rejects (registers, shared memory)
            log(f"  {tile}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    best = min(timed, key=timed.get)
    roof = case.min_bytes / bw * 1e6
    return {
        "op": op, "K": k, "M": m, "roofline_us": roof, "default_tile": default, "default_us": timed[default],
        "best_tile": best, "best_us": timed[best], "default_over_best": timed[default] / timed[best],
        "best_over_roofline": timed[best] / roof, "all": timed,
    }  # fmt: skip


def winners(rows: list[dict]) -> dict[tuple[str, int, str], tuple[_tiles.Tile, list[dict]]]:
    """Per (table op, K, bucket): the tile minimising the sum over the bucket's M of time / best time at that M."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((TABLE_OP[r["op"]], r["K"], _tiles.bucket_of(r["M"])), []).append(r)
    out = {}
    for key, rs in groups.items():  # split tiles serve M <= SPLIT_MAX_M only: their own table (split_winners)
        common = {t for t in set.intersection(*(set(r["all"]) for r in rs)) if t.split == 1}
        score = {t: sum(r["all"][t] / r["best_us"] for r in rs) for t in common}
        out[key] = (min(score, key=score.get), rs)
    return out


def split_winners(rows: list[dict], margin: float = 0.97) -> dict[tuple[str, int], tuple[_tiles.Tile, list[dict]]]:
    """Per (table op, K): the split tile with the smallest summed time over the points at M <= SPLIT_MAX_M, where
    it beats the best unsplit tile at every one of them by more than 3%."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["M"] <= _tiles.SPLIT_MAX_M and "norm" in r["op"]:
            groups.setdefault((TABLE_OP[r["op"]], r["K"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        common = {t for t in set.intersection(*(set(r["all"]) for r in rs)) if t.split > 1}
        if not common:
            continue
        best = min(common, key=lambda t: sum(r["all"][t] for r in rs))
        unsplit = [min(v for t, v in r["all"].items() if t.split == 1) for r in rs]
        if all(r["all"][best] < margin * u for r, u in zip(rs, unsplit)):
            out[key] = (best, rs)
    return out


def print_table(rows: list[dict], header: str) -> None:
    print(f"\n# {header}")
    print("# op, K, M: default tile -> best tile (best / default time, best / roofline)")
    for r in rows:
        print(f"# {r['op']} K={r['K']} M={r['M']}: {r['default_us']:.1f} us -> {r['best_us']:.1f} us "
              f"({r['best_us'] / r['default_us']:.2f}x, {r['best_over_roofline']:.2f}x roofline); "
              f"best {r['best_tile']}")  # fmt: skip
        split = {t: v for t, v in r["all"].items() if t.split > 1}
        if split:
            t = min(split, key=split.get)
            print(f"#   best split row: {split[t]:.1f} us ({split[t] / r['default_us']:.2f}x the default tile) {t}")
    print("\n# Paste into fp8_fusion_pass/kernels/triton/_tiles.py (replaces MEASURED):")
    print("MEASURED: dict[tuple[str, int, str], Tile] = {")
    for (op, k, bucket), (tile, rs) in sorted(winners(rows).items()):
        for r in rs:
            t, roof = r["all"][tile], r["roofline_us"]
            print(f"    # M={r['M']}: {t:.1f} us, {t / roof:.2f}x roofline (default tile {r['default_us']:.1f} us)")
        print(f'    ("{op}", {k}, "{bucket}"):\n        {tile!r},')
    print("}")
    split_rows = split_winners(rows)
    if any(r["M"] <= _tiles.SPLIT_MAX_M and "norm" in r["op"] for r in rows):
        print("\n# Paste into fp8_fusion_pass/kernels/triton/_tiles.py (replaces SPLIT_ROWS; a row over several "
              f"programs at M <= {_tiles.SPLIT_MAX_M}, where it beat every unsplit tile by > 3%):")
        print("SPLIT_ROWS: dict[tuple[str, int], Tile] = {")
        for (op, k), (tile, rs) in sorted(split_rows.items()):
            for r in rs:
                unsplit = min(v for t, v in r["all"].items() if t.split == 1)
                print(f"    # M={r['M']}: {r['all'][tile]:.2f} us against {unsplit:.2f} us for the best unsplit tile")
            print(f'    ("{op}", {k}):\n        {tile!r},')
        print("}")


def run(make_case, ops, sizes_of, sizes_filter, ms, bw: float, dry: bool, budget_s: float) -> list[dict]:
    """``make_case(op, k, m, w)`` builds a benchmarks/fused_kernels.py Case. Stops starting new points past budget_s."""
    rows, t0 = [], time.time()
    for op in ops:
        for k in sizes_of(op):
            if sizes_filter and k not in sizes_filter:
                continue
            w = torch.randn(k, device="cpu" if dry else "cuda", dtype=torch.bfloat16) * 0.5 + 1
            for m in ms:
                if time.time() - t0 > budget_s:
                    log(f"budget of {budget_s:.0f} s spent: skipping {op} K={k} M={m} and the rest")
                    return rows
                case = make_case(op, k, m, w)
                row = sweep_point(case, bw, dry)
                rows.append(row)
                log(f"{op} K={k} M={m}: default {row['default_us']:.1f} us, best {row['best_us']:.1f} us "
                    f"({row['best_over_roofline']:.2f}x roofline) {row['best_tile']}")  # fmt: skip
                del case
            if not dry:
                torch.cuda.empty_cache()
    return rows
