"""What ``fp8-fusion diff`` prints and writes: the report table, the summary, the dump files.

Node names in the report are translated to the diff's normalised names (``graph_diff.name_map``), so a rejected
``mul_3`` in the table is the ``mul_3`` line of the diff and of ``after.txt``.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from . import graph_diff as gd
from .report import FusionReport, merged


def renamed_report(reports: list[FusionReport], captures) -> FusionReport:
    """One report over all graphs, with node names translated to the diff's normalised names.

    The pass makes one report per graph it runs on, in compile order, like the captures; if the two lists do not
    line up (a pass that skipped a graph), the names stay FX names.
    """
    if len(reports) != len(captures):
        return merged(reports)
    renamed = []
    for i, (rep, cap) in enumerate(zip(reports, captures), 1):
        names = gd.name_map(cap)
        ops = {n.op for n in cap.before.lines + cap.after.lines if "." not in n.op}  # "getitem", HOP names
        prefix = f"g{i}:" if len(captures) > 1 else ""

        def fix(items):
            return [dataclasses.replace(d, node=prefix + names.get(d.node, d.node),
                                        detail=_rename_words(d.detail, names, ops)) for d in items]

        renamed.append(dataclasses.replace(rep, applied=fix(rep.applied), rejected=fix(rep.rejected),
                                           fills_stripped=fix(rep.fills_stripped), fills_kept=fix(rep.fills_kept),
                                           errors=fix(rep.errors)))
    return merged(renamed)


# A node name in the pass's prose: an identifier not glued to a dot (so the "permute" of "aten.permute" stays).
_NAME_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?![\w.(])")


def _rename_words(text: str, names: dict[str, str], ops: set[str]) -> str:
    """FX node names in a report sentence -> the diff's names. A word that is also an op name (the first
    ``auto_functionalized_v2`` node is named like its op) is renamed only in the "(node)" spelling."""

    def one(m: re.Match) -> str:
        word = m.group(0)
        if word in ops and text[m.start() - 1 : m.start()] + text[m.end() : m.end() + 1] != "()":
            return word
        return names.get(word, word)

    return _NAME_WORD.sub(one, text)


def summary(captures, launches: dict | None) -> dict:
    before = sum((c.before.op_counts() for c in captures), Counter())
    after = sum((c.after.op_counts() for c in captures), Counter())
    return {
        "graphs": len(captures),
        "kernel_ops": {"before": sum(c.before.kernel_ops() for c in captures),
                       "after": sum(c.after.kernel_ops() for c in captures)},
        "fp8_fusion_ops": {"before": sum(c.before.custom_ops() for c in captures),
                           "after": sum(c.after.custom_ops() for c in captures)},
        "ops_removed": dict(sorted((before - after).items())),
        "ops_added": dict(sorted((after - before).items())),
        "launches_per_forward": launches,
    }


def render_summary(s: dict) -> str:
    def arrow(d):
        return f"{d['before']} -> {d['after']} ({d['after'] - d['before']:+d})"

    lines = [
        f"graphs compiled:          {s['graphs']}"
        + ("   (graph breaks split the model; no fusion spans two graphs)" if s["graphs"] > 1 else ""),
        f"kernel ops in the graph:  {arrow(s['kernel_ops'])}   (call_function nodes except getitem / views / sizes)",
        f"fp8_fusion op calls:      {arrow(s['fp8_fusion_ops'])}",
        "ops removed:              " + (", ".join(f"{k} x{v}" for k, v in s["ops_removed"].items()) or "none"),
        "ops added:                " + (", ".join(f"{k} x{v}" for k, v in s["ops_added"].items()) or "none"),
    ]
    if s["launches_per_forward"]:
        lines.append(f"kernel launches/forward:  {arrow(s['launches_per_forward'])}   (torch.profiler, CUDA)")
    else:
        lines.append("kernel launches/forward:  measured on --device cuda only (torch.profiler)")
    return "\n".join(lines)


MAX_DETAIL_ROWS = 20  # rejections / kept fills listed one by one; the rest are in report.json (--dump-dir)


def render_report(report: FusionReport) -> str:
    """Per-pattern counts (fused, rejected with reasons), then fills and errors, then the first rejections."""
    from tabulate import tabulate

    applied = Counter(d.pattern for d in report.applied)
    rejected: dict[str, Counter] = {}
    for d in report.rejected:
        rejected.setdefault(d.pattern, Counter())[d.reason] += 1
    patterns = sorted(set(applied) | set(rejected))
    rows = [(p, applied.get(p, 0), sum(rejected.get(p, Counter()).values()),
             ", ".join(f"{r} x{n}" for r, n in sorted(rejected.get(p, Counter()).items())))
            for p in patterns]
    parts = [tabulate(rows, headers=["pattern", "fused", "rejected", "rejection reasons"]) if rows
             else "no fusion candidates found"]
    parts.append(f"zero fills stripped: {len(report.fills_stripped)}   kept: {len(report.fills_kept)}"
                 f"   replacement errors: {len(report.errors)}")
    if report.superseded:
        parts[-1] += "\n" + report.superseded_line()
    for title, items in (("rejected", report.rejected), ("fill kept", report.fills_kept), ("error", report.errors)):
        if items:
            shown = [(d.pattern, d.node, d.reason, d.detail) for d in items[:MAX_DETAIL_ROWS]]
            table = tabulate(shown, headers=[title, "node", "reason", "detail"])
            more = len(items) - MAX_DETAIL_ROWS
            parts.append(table + (f"\n... {more} more (all in report.json with --dump-dir)" if more > 0 else ""))
    return "\n\n".join(parts)


def dump(directory: Path, captures, report: FusionReport) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    texts = {"before.txt": [], "after.txt": [], "before_raw.txt": [], "after_raw.txt": []}
    for i, cap in enumerate(captures, 1):
        before, after = gd.normalised_pair(cap)
        for key, body in (("before.txt", before), ("after.txt", after)):
            texts[key] += [f"# graph {i}", *body]
        texts["before_raw.txt"] += [f"# graph {i}", cap.before.raw]
        texts["after_raw.txt"] += [f"# graph {i}", cap.after.raw]
    for name, lines in texts.items():
        (directory / name).write_text("\n".join(lines) + "\n")
    (directory / "report.json").write_text(report.to_json() + "\n")
