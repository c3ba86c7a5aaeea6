"""The benchmarks' PNG: one panel per (op, M), time over the roofline per implementation, the read floor dotted.

Shared by ``fused_kernels.py`` (x: the hidden / intermediate size) and ``rope_kernels.py`` (x: the per-GPU head counts).
matplotlib is optional: without it there is no PNG, and the script says so.
"""

from __future__ import annotations

import csv

ROOFLINE_TARGET = 1.25  # issue 7, the grey line


def grid(rows: list[dict], ops, series, x_key, x_label, title, path: str) -> None:
    """``rows``: dicts with ``op``, ``M``, ``roofline_us``, ``read_floor_us`` (CSVs from before it may lack it) and,
    per ``(key, label)`` of ``series``, ``{key}_over_roofline``. Panels ordered by ``ops`` and M; within a panel the
    points are sorted by ``x_key(row)`` and labelled ``x_label(row)``; ``title(op, m)`` names a panel."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no PNG (pip install matplotlib)")
        return
    ops = [op for op in ops if any(r["op"] == op for r in rows)]
    ms = sorted({r["M"] for r in rows})
    fig, axes = plt.subplots(len(ops), len(ms), figsize=(3.2 * len(ms), 3.0 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, m in enumerate(ms):
            ax = axes[i][j]
            pts = sorted((r for r in rows if r["op"] == op and r["M"] == m), key=x_key)
            xs = range(len(pts))
            for key, label in series:
                ax.plot(xs, [r[f"{key}_over_roofline"] for r in pts], marker="o", label=label)
            if all("read_floor_us" in r for r in pts):
                ax.plot(xs, [r["read_floor_us"] / r["roofline_us"] for r in pts], color="black", linestyle=":",
                        label="plain read of the bytes")  # fmt: skip
            ax.axhline(ROOFLINE_TARGET, color="grey", linestyle="--", linewidth=0.8)
            ax.set_xticks(list(xs), [x_label(r) for r in pts], rotation=90, fontsize=6)
            ax.set_yscale("log")
            ax.set_title(title(op, m), fontsize=8)
            if j == 0:
                ax.set_ylabel("time / roofline")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def read_csv(path: str, ints, strings=("op", "models")) -> list[dict]:
    """The rows of a benchmark's CSV, numbers parsed: the ``ints`` columns as int, all but ``strings`` as float."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in strings:
                r[k] = int(v) if k in ints else float(v)
    return rows
