"""FP8FusionPass: the Inductor ``post_grad_custom_post_pass`` that runs the table in ``patterns/__init__.py``.

Per call (one compiled graph): a fresh report; training graphs are left alone (with a note); duplicate quants
collapse; the norm / silu fusions run as ``PatternMatcherPass`` entries anchored at ``group_quant``, each match
judged by the guards and recorded (applied or rejected, with a reason); every norm / silu / quant still in the
graph then gets its "why not"; the whole-graph rewrites follow (leftover norms inlined, GEMMs of one activation
grouped, gate/up GEMMs taking their silu-quant into their epilogue); the zero-fill rewrite runs last. One INFO
line per compile on the ``fp8_fusion_pass`` logger. A guard or replacement that raises leaves its match unrewritten,
warns once per kind of failure, and is recorded as an error: the compile itself never fails because of the pass.

Patterns are traced once per process, lazily (the first compile that runs the pass), under a lock; only the
cheap ``PatternMatcherPass`` wiring is rebuilt per call, bound to that call's report and config.

``uuid()`` hashes this package's pass / pattern / guard sources, ``config.fingerprint()`` (environment override
included), the deterministic-mode flag, an explicit kernel backend choice and the torch version, so Inductor's
FX graph cache never serves a graph compiled under other code or another config. A cache hit skips the pass,
so it adds no report.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import pathlib
import pkgutil
import sys
import threading
import warnings
from typing import Callable, Iterator

import torch
from torch._inductor import custom_graph_pass
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, register_graph_pattern
from torch.fx import Graph, Node

from . import guards, report
from .config import FusionConfig
from .patterns import BY_NAME, FUSIONS, Fusion, _candidates, _graph, _site, dedup_quant

log = logging.getLogger("fp8_fusion_pass")

PACKAGE = pathlib.Path(__file__).resolve().parent
# Sources whose change must change uuid(): the pass, its guards, the patterns, the op schemas and the small-M table.
HASHED = ("fusion_pass.py", "guards.py", "config.py", "scale_semantics.py", "patterns/*.py", "kernels/ops.py",
          "kernels/attention_ops.py", "kernels/small_m.py")

# CustomInferenceAwareGraphPass (torch 2.12+) is told whether the graph is an inference graph; on 2.11 we ask
# the caller's frame (see _is_inference).
_Base = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", custom_graph_pass.CustomGraphPass)

_LOCK = threading.Lock()
_TRACED: list | None = None  # [(fusion, module, form, producer pattern)], built once per process
_WARNED: set = set()
_FAULTS: dict = {}  # test hook: {(stage, fusion name): exception factory}


def hashed_files() -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for pattern in HASHED:
        files.extend(sorted(PACKAGE.glob(pattern)))
    return files


def thresholds() -> tuple:
    """The guards' and the patterns' module-level numbers as they are now (``GQA_MIN_BATCH_HEADS``, ``MAX_ROWS``,
    ...): the sources are hashed, but a caller may set one at run time (a benchmark's ``--set``, a user tuning a
    bound), and a graph compiled under one value must not be served to a compile under another."""
    return tuple((m.__name__, name, value) for m in _threshold_modules() for name, value in sorted(vars(m).items())
                 if name.isupper() and _plain(value))


@functools.cache
def _threshold_modules() -> tuple:
    """guards and every pattern module, imported now: the key must not depend on which ones a compile has loaded."""
    from . import patterns

    names = sorted(info.name for info in pkgutil.iter_modules(patterns.__path__))
    return (guards, *(importlib.import_module(f"{patterns.__name__}.{name}") for name in names))


def _plain(value) -> bool:
    """A number, string or flag, or a tuple of them: what a threshold is (not an op handle or a table of them)."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int, float, str))


def checked_config(config: FusionConfig | None) -> FusionConfig:
    """``config``, or the default for None; anything else is a TypeError now rather than an error inside
    Inductor's compile at the model's first call."""
    if config is None:
        return FusionConfig()
    if not isinstance(config, FusionConfig):
        raise TypeError(f"config must be a fp8_fusion_pass.FusionConfig or None, got {type(config).__name__}")
    return config


class FP8FusionPass(_Base):
    """``torch.compile(model, options={"post_grad_custom_post_pass": FP8FusionPass()})``, or through
    ``fp8_fusion_pass.backend()``. ``config`` picks the rewrites (default: all, honouring FP8_FUSION_DISABLE)."""

    def __init__(self, config: FusionConfig | None = None) -> None:
        self.config = checked_config(config)

    def __call__(self, graph: Graph, is_inference: bool | None = None) -> None:
        _Run(graph, self.config, _is_inference(graph) if is_inference is None else is_inference).run()

    def uuid(self) -> str:
        h = hashlib.sha256()
        for path in hashed_files():
            h.update(_rel(path).encode())
            h.update(path.read_bytes())
        from . import scale_semantics
        from .kernels import backends

        # The scale-semantics registry is user-extensible at run time: an op registered after a compile must not
        # be served the cached graph compiled before it (its fill would stay).
        extra = (_fingerprint(self.config), torch.__version__, torch.are_deterministic_algorithms_enabled(),
                 backends.explicit_choice(), scale_semantics.fingerprint(), thresholds(),
                 # the failure-injection test hook changes what the pass does, so it is part of the key: a graph
                 # compiled with a fault injected must never be served to a normal compile
                 tuple(sorted(map(repr, _FAULTS))))
        h.update(repr(extra).encode())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"FP8FusionPass({self.config})"


def _rel(path: pathlib.Path) -> str:
    try:
        return str(path.relative_to(PACKAGE))
    except ValueError:  # a file outside the package (tests add one)
        return str(path)


def _fingerprint(config: FusionConfig) -> str:
    try:
        return config.fingerprint()
    except ValueError as e:  # a malformed FP8_FUSION_DISABLE: _Run turns everything off and says so
        return f"{config!r}|bad-env={e}"


def _is_inference(graph: Graph) -> bool:
    """torch 2.11 does not pass ``is_inference``: read it from ``post_grad_passes(gm, is_inference)``, our caller
    in every torch since 2.1; failing that, a graph with tangent inputs is a backward graph."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "post_grad_passes" and "is_inference" in frame.f_locals:
            return bool(frame.f_locals["is_inference"])
        frame = frame.f_back
    return not any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)


def _traced() -> list:
    """Trace every form's producer once per process (thread-safe)."""
    global _TRACED
    with _LOCK:
        if _TRACED is None:
            traced = []
            for fusion in FUSIONS:
                module = importlib.import_module(f"{__package__}.patterns.{fusion.module}")
                for form in getattr(module, "FORMS", {}).get(fusion.name, ()):
                    traced.extend((fusion, module, form, p) for p in form.patterns())
            _TRACED = traced
    return _TRACED


@contextlib.contextmanager
def inject_failure(stage: str, fusion: str, exc: type[Exception] = RuntimeError) -> Iterator[None]:
    """Test hook: make the ``stage`` ("guard" or "replacement") of ``fusion`` raise ``exc`` while active."""
    if stage not in ("guard", "replacement"):
        raise ValueError(f"stage must be 'guard' or 'replacement', got {stage!r}")
    _FAULTS[(stage, fusion)] = exc
    try:
        yield
    finally:
        _FAULTS.pop((stage, fusion), None)


def _maybe_fail(stage: str, fusion: str) -> None:
    exc = _FAULTS.get((stage, fusion))
    if exc is not None:
        raise exc(f"injected {stage} failure in {fusion}")


class _Run:
    """One invocation of the pass on one graph."""

    def __init__(self, graph: Graph, config: FusionConfig, inference: bool) -> None:
        self.graph, self.config = graph, config
        self.report = report.new_report(_fingerprint(config), inference)
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.decided: set = set()  # anchors (quants) a guard already ruled on
        self.explained: set = set()  # nodes whose candidates have a decision
        try:
            self.env_disabled = config.env_disabled()
        except ValueError as e:
            self.env_disabled = frozenset(f.switch for f in FUSIONS)
            self.report.notes.append(f"{e}: every fusion is off until the variable is fixed")

    def run(self) -> None:
        if not self.report.inference:
            self.report.notes.append("not an inference graph (it needs gradients): left alone")
        else:
            for name, stage in self.stages():
                # a graph rewrite that swaps in a fused op and erases a declined node took it in (_declined_in_graph)
                takes_in = name in BY_NAME and BY_NAME[name].stage == "graph" and BY_NAME[name].fused_op is not None
                declined = self._declined_in_graph() if takes_in else set()
                try:
                    stage()
                except Exception as e:  # noqa: BLE001 - e.g. a pattern that fails to trace on this torch
                    self._fail(name, None, "stage", e)
                if declined:
                    self.report.supersede(declined - {n.name for n in self.graph.nodes}, by=name)
        log.info(self.report.summary_line())

    # ------------------------------------------------------------ stages
    def stages(self) -> list[tuple[str, Callable[[], None]]]:
        """(name, stage) in the order of ``patterns.FUSIONS`` (its docstring says why that order): one table
        sets it. The matched rows share one pattern pass and the why-not scan after it, where the first stands."""
        stages: list = []
        for fusion in FUSIONS:
            if fusion.stage == "graph":
                stages.append((fusion.name, functools.partial(self._whole_graph_rewrite, fusion.name)))
            elif fusion.stage == "matched":
                if not any(name == "fusions" for name, _ in stages):
                    stages += [("fusions", self._fuse), ("why-not scan", self._explain)]
            else:
                stages.append((fusion.name, {"dedup": self._dedup, "zero_fill": self._zero_fill}[fusion.stage]))
        return stages

    def _dedup(self) -> None:
        fusion = BY_NAME["dedup_quant"]
        gate = guards.can_run_fusion(fusion.switch, fusion.bit_exact, self.config, self.env_disabled,
                                     self.deterministic)
        if not gate.ok:
            return  # the norms then report multiple_quants
        pm = PatternMatcherPass(pass_name="fp8_fusion_dedup")
        for pattern in dedup_quant.anchors():
            register_graph_pattern(pattern, pass_dict=pm)(functools.partial(self._dedup_one, fusion))
        pm.apply(self.graph)

    def _dedup_one(self, fusion: Fusion, match: Match, *args, **kwargs) -> None:
        quant = match.output_node()
        try:
            keep = dedup_quant.twin(quant)
            if keep is None:
                return
            detail = dedup_quant.describe(match, keep)
            shapes, dtype = _graph.shape_str(x=quant.args[0]), _graph.dtype_str(quant.args[0])
            _maybe_fail("replacement", fusion.name)
            dedup_quant.rewrite(self.graph, quant, keep)
        except Exception as e:  # noqa: BLE001 - failure isolation: leave the quant, record, go on
            self._fail(fusion, quant, "replacement", e)
            return
        self.report.apply(fusion.name, quant.name, shapes, dtype, detail)

    def _fuse(self) -> None:
        pm = PatternMatcherPass(pass_name="fp8_fusion")
        for fusion, module, form, producer in _traced():
            for anchor in _site.anchors(producer):
                register_graph_pattern(
                    anchor, extra_check=functools.partial(self._accepts, fusion, module, form), pass_dict=pm
                )(functools.partial(self._fuse_one, fusion, module, form))
        pm.apply(self.graph)

    def _explain(self) -> None:
        _candidates.explain(self.graph, self.explained, self._record)

    def _may_run(self, name: str) -> bool:
        """The switch, the environment and deterministic mode allow this rewrite in this graph."""
        f = BY_NAME[name]
        return guards.can_run_fusion(f.switch, f.bit_exact, self.config, self.env_disabled, self.deterministic).ok

    def _whole_graph_rewrite(self, name: str) -> None:
        """A rewrite that walks the graph itself (``patterns.<module>.run(graph, report)``; the "graph" rows of
        FUSIONS). Each rewrites one site whole or not at all, so a failure leaves a valid graph."""
        fusion = BY_NAME[name]
        if not self._may_run(name):
            return
        try:
            _maybe_fail("replacement", fusion.name)
            module = importlib.import_module(f"{__package__}.patterns.{fusion.module}")
            if name in ("norm_rope", "qk_rope"):  # their combo-kernels guard asks whether the cache writes join
                module.run(self.graph, self.report, self._may_run("rope_cache"))
            else:
                module.run(self.graph, self.report)
        except Exception as e:  # noqa: BLE001 - failure isolation
            self._fail(fusion, None, "replacement", e)

    def _zero_fill(self) -> None:
        fusion = BY_NAME["zero_fill"]
        if not self.config.zero_fill or fusion.switch in self.env_disabled:
            return
        try:
            try:
                from .patterns import zero_fill
            except ImportError as e:
                raise ImportError("fp8_fusion_pass.patterns.zero_fill (the zero-fill rewrite) is missing from "
                                  "this install; reinstall fp8-fusion-pass or use FusionConfig(zero_fill=False)"
                                  ) from e
            zero_fill.run(self.graph, self.report, self.config)
        except Exception as e:  # noqa: BLE001 - failure isolation
            self._fail(fusion, None, "replacement", e)

    # ------------------------------------------------------------ one match
    def _accepts(self, fusion: Fusion, module, form, match: Match) -> bool:
        quant = match.output_node()
        if quant in self.decided:
            return False
        try:
            return bool(module.accepts(match, fusion.name, form.name))
        except Exception:  # noqa: BLE001 - a structural check that cannot decide says no
            return False

    def _fuse_one(self, fusion: Fusion, module, form, match: Match, *args, **kwargs) -> None:
        quant = match.output_node()
        self.decided.add(quant)
        try:
            site = module.site(match, fusion.name, form.name)
            _maybe_fail("guard", fusion.name)
            verdict = _site.check(site, self.config, self.env_disabled, self.deterministic)
        except Exception as e:  # noqa: BLE001
            self._fail(fusion, quant, "guard", e, match)
            return
        if not verdict.ok:
            first = site.producer not in self.explained  # sibling quants of one producer: one decision
            self.explained.update(match.nodes)
            self.explained.add(site.producer)
            if first:
                self.report.reject(fusion.name, site.producer.name, verdict.reason, verdict.detail,
                                   site.shapes(), _graph.dtype_str(site.activation()))
            return
        shapes, dtype = site.shapes(), _graph.dtype_str(site.activation())
        gemms = len(_graph.gemm_shapes(site.quant))
        try:
            _maybe_fail("replacement", fusion.name)
            fused = _site.rewrite(self.graph, site)
        except Exception as e:  # noqa: BLE001
            self._fail(fusion, quant, "replacement", e, match)
            return
        self.report.apply(fusion.name, fused.name, shapes, dtype,
                          f"{site.form} form, group {site.group_size}, feeds {gemms} GEMM(s)")

    # ------------------------------------------------------------ recording
    def _declined_in_graph(self) -> set[str]:
        """Names of the rejected nodes still in the graph. One that a later graph rewrite with a fused op erases was
        taken into that op (Qwen3's q / k norms by ``norm_rope``, the o_proj's input quant by ``quant_gemm`` or the
        attention's launch); node names are never reused within a graph. ``inline_norm`` and ``gqa_attention``
        swap in no fused op (the norm becomes aten ops, the KV copies go), so their erasures leave a rejection."""
        if not self.report.rejected:
            return set()
        names = {n.name for n in self.graph.nodes}
        return {d.node for d in self.report.rejected if d.node in names}

    def _record(self, reason: str, node: Node, pattern: str, detail: str, x: Node) -> None:
        self.report.reject(pattern, node.name, reason, detail, _graph.shape_str(x=x), _graph.dtype_str(x))

    def _fail(self, fusion: Fusion | str, node: Node | None, stage: str, e: Exception, match: Match | None = None
              ) -> None:
        fusion = fusion if isinstance(fusion, str) else fusion.name
        name = node.name if node is not None else "(graph)"
        self.report.error(fusion, name, f"{stage} raised {type(e).__name__}: {e}")
        if match is not None:
            self.explained.update(match.nodes)
        if node is not None:
            self.explained.add(node)
        key = (fusion, stage, type(e).__name__)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"fp8_fusion_pass: {fusion} {stage} raised {type(e).__name__}: {e}; that match is "
                          "left unfused (further failures of this kind are only in the report)", stacklevel=2)
