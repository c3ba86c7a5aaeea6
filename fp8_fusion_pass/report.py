"""FusionReport: what the pass did to one graph, and why it left anything alone.

One report per pass invocation (per compiled graph). Every rewrite is an ``applied`` entry, every candidate
left alone a ``rejected`` entry with a reason code (``docs/guards.md`` explains each code and what to change),
every zero-fill stripped or kept an entry in ``fills_stripped`` / ``fills_kept``, and every replacement that
raised an ``errors`` entry (the match is left unrewritten). A candidate one rewrite declined and a later rewrite
then took into its own op (Qwen3's q / k norms: ``norm_quant`` declines them, ``norm_rope`` takes them) leaves
``rejected`` for ``superseded``, so ``rejected`` lists only what the graph still runs unfused. Imports nothing of
ours.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from collections import Counter

SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Decision:
    pattern: str  # "norm_quant", "add_norm_quant", "silu_quant", "dedup_quant", "inline_norm", "group_gemm", ...
    node: str  # the graph node the decision is about (anchor of the match)
    shapes: str = ""  # e.g. "x[s0, 4096] w[4096]"
    dtype: str = ""  # activation dtype, e.g. "bfloat16"
    reason: str = ""  # reason code for rejections / kept fills (empty when applied)
    detail: str = ""  # human sentence: what exactly failed, with numbers

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Superseded:
    """A rejection made moot: the rewrite ``taken_by`` later took ``rejection.node`` into its fused op."""

    rejection: Decision
    taken_by: str  # the later rewrite's pattern name, e.g. "norm_rope"

    def to_dict(self) -> dict:
        return {**self.rejection.to_dict(), "taken_by": self.taken_by}


@dataclasses.dataclass
class FusionReport:
    graph: int  # sequence number of the compiled graph in this process
    inference: bool = True
    config: str = ""
    cache_hit: bool = False  # served from Inductor's FX graph cache: the pass did not run, nothing below is known
    applied: list[Decision] = dataclasses.field(default_factory=list)
    rejected: list[Decision] = dataclasses.field(default_factory=list)
    fills_stripped: list[Decision] = dataclasses.field(default_factory=list)
    fills_kept: list[Decision] = dataclasses.field(default_factory=list)
    errors: list[Decision] = dataclasses.field(default_factory=list)
    superseded: list[Superseded] = dataclasses.field(default_factory=list)  # rejections a later rewrite made moot
    notes: list[str] = dataclasses.field(default_factory=list)

    # ------------------------------------------------------------ recording
    def apply(self, pattern: str, node: str, shapes: str = "", dtype: str = "", detail: str = "") -> None:
        self.applied.append(Decision(pattern, node, shapes, dtype, "", detail))

    def reject(self, pattern: str, node: str, reason: str, detail: str = "", shapes: str = "", dtype: str = "") -> None:
        self.rejected.append(Decision(pattern, node, shapes, dtype, reason, detail))

    def strip_fill(self, node: str, consumer: str, shapes: str = "") -> None:
        self.fills_stripped.append(Decision("zero_fill", node, shapes, "", "", f"consumer {consumer} overwrites it"))

    def keep_fill(self, node: str, reason: str, detail: str = "", shapes: str = "") -> None:
        self.fills_kept.append(Decision("zero_fill", node, shapes, "", reason, detail))

    def error(self, pattern: str, node: str, detail: str) -> None:
        self.errors.append(Decision(pattern, node, "", "", "replacement_failed", detail))

    def supersede(self, nodes: set[str], by: str) -> None:
        """The rewrite ``by`` took ``nodes`` into its fused op: their rejections (by any earlier rewrite) move from
        ``rejected`` to ``superseded``, so that ``rejected`` keeps only what the graph still runs unfused."""
        moved = [d for d in self.rejected if d.node in nodes]
        if not moved:
            return
        self.rejected = [d for d in self.rejected if d.node not in nodes]
        self.superseded += [Superseded(d, by) for d in moved]

    def settle(self, pattern: str, node: str, shapes: str, dtype: str, verdict, stays: str, rewrite, *args) -> None:
        """One candidate of a rewrite that walks the graph: a ``rejected`` entry when ``verdict`` (a guards.Verdict:
        ok, reason, detail) says no (``stays``: what is left as it was, after the detail), else ``rewrite(*args)`` and
        an ``applied`` entry with the detail it returns. A rewrite that raises is an ``errors`` entry: the rewrites edit
        all or nothing (``patterns._graph.Edit``), so the graph is as it was and the other sites go on."""
        if not verdict.ok:
            detail = f"{verdict.detail}: {stays}" if stays else verdict.detail
            self.reject(pattern, node, verdict.reason, detail, shapes, dtype)
            return
        try:
            detail = rewrite(*args)
        except Exception as e:  # noqa: BLE001 - failure isolation, as the pass does per match
            self.error(pattern, node, f"replacement raised {type(e).__name__}: {e}")
            return
        self.apply(pattern, node, shapes, dtype, detail)

    # ------------------------------------------------------------ reading
    def counts(self) -> dict:
        """Applied rewrites per pattern, plus the fills stripped and kept."""
        c = Counter(d.pattern for d in self.applied)
        out = dict(sorted(c.items()))
        out["fills_stripped"] = len(self.fills_stripped)
        out["fills_kept"] = len(self.fills_kept)
        out["rejected"] = len(self.rejected)
        out["errors"] = len(self.errors)
        return out

    def superseded_line(self) -> str:
        """One line for a terminal: how many declined candidates each later rewrite took in, e.g.
        "declined, then taken by a later rewrite: 4 norm_quant -> norm_rope, 2 group_quant -> quant_gemm"."""
        taken = Counter((s.rejection.pattern, s.taken_by) for s in self.superseded)
        return "declined, then taken by a later rewrite: " + ", ".join(
            f"{n} {pattern} -> {by}" for (pattern, by), n in sorted(taken.items()))

    def rejection_reasons(self) -> dict:
        return dict(sorted(Counter(d.reason for d in self.rejected).items()))

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "graph": self.graph,
            "inference": self.inference,
            "config": self.config,
            "cache_hit": self.cache_hit,
            "counts": self.counts(),
            "applied": [d.to_dict() for d in self.applied],
            "rejected": [d.to_dict() for d in self.rejected],
            "fills_stripped": [d.to_dict() for d in self.fills_stripped],
            "fills_kept": [d.to_dict() for d in self.fills_kept],
            "errors": [d.to_dict() for d in self.errors],
            "superseded": [d.to_dict() for d in self.superseded],
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary_line(self) -> str:
        if self.cache_hit:
            return (f"fp8_fusion_pass graph {self.graph}: served from Inductor's FX graph cache (the pass did not run; "
                    "the cached graph was compiled under this config)")
        c = self.counts()
        tallies = ("fills_stripped", "fills_kept", "rejected", "errors")
        fused = ", ".join(f"{k}={v}" for k, v in c.items() if k not in tallies)
        rejected = f"rejected {c['rejected']}" + (f" {self.rejection_reasons()}" if c["rejected"] else "")
        parts = [f"fp8_fusion_pass graph {self.graph}: fused [{fused or 'none'}]", rejected,
                 f"fills stripped {c['fills_stripped']}, kept {c['fills_kept']}"]
        if c["errors"]:
            parts.append(f"ERRORS {c['errors']}")
        if not self.inference:
            parts.append("not an inference graph: left alone")
        return "; ".join(parts)

    def render(self) -> str:
        """Tables for a terminal: applied per pattern, then every rejection, fill and error with its reason."""
        from tabulate import tabulate

        parts = [self.summary_line()]
        if self.applied:
            rows = sorted(Counter((d.pattern, d.dtype) for d in self.applied).items())
            parts.append(tabulate([(p, dt, n) for (p, dt), n in rows], headers=["fused", "dtype", "count"]))
        for title, items in (
            ("rejected", self.rejected),
            ("fills kept", self.fills_kept),
            ("errors", self.errors),
        ):
            if items:
                parts.append(
                    tabulate(
                        [(d.pattern, d.node, d.reason, d.detail, d.shapes) for d in items],
                        headers=[title, "node", "reason", "detail", "shapes"],
                    )
                )
        if self.fills_stripped:
            parts.append(tabulate([(d.node, d.detail) for d in self.fills_stripped], headers=["fill stripped", "why"]))
        if self.superseded:
            parts.append(self.superseded_line())
        if self.notes:
            parts.append("\n".join(f"note: {n}" for n in self.notes))
        return "\n\n".join(parts)


# ---------------------------------------------------------------- the per-process log of reports

_lock = threading.Lock()
_reports: list[FusionReport] = []
_counter = itertools.count(1)
MAX_KEPT = 256  # reports kept in memory; a long-running server compiles a bounded number of graphs anyway


def new_report(config: str = "", inference: bool = True) -> FusionReport:
    with _lock:
        report = FusionReport(graph=next(_counter), inference=inference, config=config)
        _reports.append(report)
        del _reports[:-MAX_KEPT]
    return report


def last_report() -> FusionReport | None:
    """The report of the most recently compiled graph (None before any compile ran the pass).

    A graph served from Inductor's FX graph cache does not run the pass, so it adds no report.
    """
    with _lock:
        return _reports[-1] if _reports else None


def all_reports() -> list[FusionReport]:
    with _lock:
        return list(_reports)


def clear_reports() -> None:
    with _lock:
        _reports.clear()


def merged(reports: list[FusionReport]) -> FusionReport:
    """One report over several graphs (a model compiled in pieces, or forward + graph breaks)."""
    out = FusionReport(graph=0, inference=all(r.inference for r in reports) if reports else True)
    for r in reports:
        out.config = out.config or r.config
        for name in ("applied", "rejected", "fills_stripped", "fills_kept", "errors", "superseded", "notes"):
            getattr(out, name).extend(getattr(r, name))
    return out
