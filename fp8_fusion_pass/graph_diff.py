"""Capture the post-grad graph exactly before and after FP8FusionPass, and diff the two readably.

How the capture works: a capturing ``CustomGraphPass`` is installed as Inductor's ``post_grad_custom_post_pass``
(through ``compile_fx(config_patches=...)``, so it reaches every graph of the compile). It snapshots the graph,
runs the fusion pass (when given one) on that same graph, and snapshots it again. Its ``uuid()`` is None, which
makes Inductor bypass the FX graph cache: a cache hit would skip every custom pass and capture nothing
(``shared/research/inductor_api.md`` §1.2).

Why the diff is readable: FX names nodes by target plus a creation counter (``convert_element_type_37``,
``rms_norm_default_2``). Nodes the pass leaves alone keep their FX names (the pass edits the graph in place),
so both snapshots are renamed with one shared map: op name plus an ordinal in order of first appearance, new
nodes numbered after the old ones. An early rewrite then changes only the lines it touches and their direct
readers, not the name of every later node.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import re
import time
from collections import Counter, defaultdict
from typing import Any, Callable

import torch
import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass

try:  # torch >= 2.0 keeps the short dtype names FX prints (bf16, f8e4m3fn) here
    from torch.fx.graph import dtype_abbrs as _DTYPE_ABBRS
except ImportError:  # pragma: no cover - defensive, present in 2.11..2.13
    _DTYPE_ABBRS = {}

# Ops that never launch a kernel: tuple indexing, views / reshapes (metadata only), allocations without a fill,
# and size arithmetic on SymInts. Everything else counts as a kernel op; Inductor may still fuse several
# pointwise aten ops into one kernel, so the count is an upper bound, while every fp8_fusion custom op is an
# opaque call that is exactly one launch (or more) on every backend.
_NOT_KERNEL_OPS = frozenset(
    "getitem view reshape _unsafe_view expand squeeze unsqueeze permute t transpose alias as_strided slice select "
    "unbind split split_with_sizes detach lift_fresh_copy empty empty_strided empty_like sym_size sym_stride "
    "sym_numel sym_storage_offset".split()
)
_FILE_COMMENT = re.compile(r"^\s*# File: .*$\n?", re.MULTILINE)
_REF = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")


# ---------------------------------------------------------------- snapshots of one graph


@dataclasses.dataclass(frozen=True)
class NodeLine:
    """One graph node as plain data, taken at snapshot time (the graph is edited in place afterwards)."""

    name: str  # the FX name, used only to match nodes between the two snapshots
    kind: str  # placeholder / call_function / get_attr / output
    op: str  # short op name: "aten.mm", "aten.mul.Tensor", "fp8_fusion.rms_norm", "getitem", "input"
    base: str  # the op alone, for naming and counting: "mm", "mul", "rms_norm", "getitem"
    args: str  # rendered arguments; references to other nodes are written %fx_name
    meta: str  # dtype and shape, e.g. "bf16[2, 8, 256]"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    lines: tuple[NodeLine, ...]
    raw: str  # print_readable() text without "# File:" comments, for --dump-dir

    def kernel_ops(self) -> int:
        return sum(1 for n in self.lines if n.kind == "call_function" and n.base not in _NOT_KERNEL_OPS)

    def custom_ops(self) -> int:
        return sum(1 for n in self.lines if n.kind == "call_function" and n.op.startswith("fp8_fusion."))

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.lines if n.kind == "call_function")


@dataclasses.dataclass(frozen=True)
class GraphCapture:
    before: Snapshot
    after: Snapshot  # == before when no fusion pass ran


def _base(target: Any, op: str) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return re.sub(r"\W", "_", op.rsplit(".", 1)[-1])


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        overload = target._overloadname
        name = f"{target.namespace}.{target._opname}"
        return name if overload == "default" else f"{name}.{overload}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target).replace("::", ".")
    if getattr(target, "__module__", None) in (operator.__name__, "_operator"):
        return target.__name__
    return getattr(target, "__name__", None) or str(target)


def _meta(node: torch.fx.Node) -> str:
    val = node.meta.get("val")

    def one(v) -> str:
        if isinstance(v, torch.Tensor):
            dtype = _DTYPE_ABBRS.get(v.dtype, str(v.dtype).replace("torch.", ""))
            return f"{dtype}[{', '.join(str(s) for s in v.shape)}]"
        if isinstance(v, (torch.SymInt, torch.SymFloat, int, float)):
            return f"sym {v}" if isinstance(v, (torch.SymInt, torch.SymFloat)) else ""
        return ""

    if isinstance(val, (tuple, list)):
        parts = [one(v) for v in val]
        return "(" + ", ".join(p or "-" for p in parts) + ")" if any(parts) else ""
    return one(val)


def _render(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_render(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _op_name(value)
    if isinstance(value, torch.dtype):
        return _DTYPE_ABBRS.get(value, str(value))
    return repr(value)


def snapshot(graph: torch.fx.Graph) -> Snapshot:
    lines = []
    for node in graph.nodes:
        args = ", ".join([_render(a) for a in node.args] + [f"{k}={_render(v)}" for k, v in node.kwargs.items()])
        if node.op == "call_function":
            op = _op_name(node.target)
        elif node.op == "placeholder":
            op = "input"
        else:
            op = node.op if node.op == "output" else f"{node.op}:{node.target}"
        base = "in" if node.op == "placeholder" else _base(node.target, op)
        lines.append(NodeLine(node.name, node.op, op, base, args, _meta(node)))
    gm = graph.owning_module
    raw = gm.print_readable(print_output=False) if gm is not None else str(graph)
    return Snapshot(tuple(lines), _FILE_COMMENT.sub("", raw))


# ---------------------------------------------------------------- normalised text and the diff


def _name_map(*snapshots: Snapshot) -> dict[str, str]:
    """FX name -> op name + ordinal, numbered in order of first appearance across the snapshots."""
    names: dict[str, str] = {}
    ordinal: defaultdict[str, int] = defaultdict(int)
    for snap in snapshots:
        for n in snap.lines:
            if n.name in names:
                continue
            names[n.name] = f"{n.base}_{ordinal[n.base]}"
            ordinal[n.base] += 1
    return names


def normalised_text(snap: Snapshot, names: dict[str, str]) -> list[str]:
    out = []
    for n in snap.lines:
        args = _REF.sub(lambda m: names.get(m.group(1), m.group(1)), n.args)
        meta = f"  # {n.meta}" if n.meta else ""
        if n.kind == "placeholder":
            out.append(f"{names[n.name]} = input{meta}")
        elif n.kind == "output":
            out.append(f"return {args}")
        elif n.base == "getitem":  # tuple outputs of multi-output ops: x[i] reads better than getitem(x, i)
            src, _, idx = args.partition(", ")
            out.append(f"{names[n.name]} = {src}[{idx}]{meta}")
        else:
            out.append(f"{names[n.name]} = {n.op}({args}){meta}")
    return out


def name_map(capture: GraphCapture) -> dict[str, str]:
    """FX name -> normalised name for both snapshots of one graph (the names the diff and the report show)."""
    return _name_map(capture.before, capture.after)


def normalised_pair(capture: GraphCapture) -> tuple[list[str], list[str]]:
    names = name_map(capture)
    return normalised_text(capture.before, names), normalised_text(capture.after, names)


def unified_diff(captures: list[GraphCapture], context: int = 3) -> list[str]:
    """One unified diff per captured graph, headed ``--- before (graph i)`` / ``+++ after (graph i)``."""
    out: list[str] = []
    for i, cap in enumerate(captures, 1):
        before, after = normalised_pair(cap)
        label = f" (graph {i} of {len(captures)})" if len(captures) > 1 else ""
        diff = list(
            difflib.unified_diff(before, after, f"before{label}", f"after{label}", n=context, lineterm="")
        )
        out.extend(diff or [f"# graph {i}: the pass changed nothing"])
    return out


_COLOURS = {"+": "\033[32m", "-": "\033[31m", "@": "\033[36m"}


def colourise(lines: list[str]) -> list[str]:
    def one(line: str) -> str:
        if line.startswith(("+++", "---")):
            return f"\033[1m{line}\033[0m"
        colour = _COLOURS.get(line[:1])
        return f"{colour}{line}\033[0m" if colour else line

    return [one(line) for line in lines]


# ---------------------------------------------------------------- compiling with the capture installed


class _StopAfterCapture(Exception):
    """Raised by the capture pass when only the graphs are wanted: skips Inductor's lowering and codegen."""


class CapturePass(CustomGraphPass):
    """Snapshot the post-grad graph, run ``inner`` (the fusion pass) on it, snapshot again."""

    def __init__(self, inner: Callable[[torch.fx.Graph], None] | None = None, stop: bool = False,
                 progress: Callable[[str], None] | None = None):
        self.inner = inner
        self.stop = stop
        self.progress = progress
        self.captures: list[GraphCapture] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        t0 = time.perf_counter()
        before = snapshot(graph)
        if self.inner is not None:
            self.inner(graph)
            after = snapshot(graph)
        else:
            after = before
        self.captures.append(GraphCapture(before, after))
        if self.progress is not None:
            what = f"{len(after.lines)} after the pass, " if self.inner is not None else ""
            self.progress(f"graph {len(self.captures)} reached the post-grad passes: {len(before.lines)} nodes, "
                          f"{what}{time.perf_counter() - t0:.1f}s")
        if self.stop:
            raise _StopAfterCapture

    def uuid(self) -> None:
        return None  # never cacheable: a cache hit would skip the capture (and the pass)


def _is_stop(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _StopAfterCapture):
            return True
        seen.add(id(exc))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return False


def capture_backend(capture: CapturePass) -> Callable:
    """A torch.compile backend: Inductor with ``capture`` as its post-grad custom post pass.

    With ``capture.stop`` the compile ends right after the snapshots and the graph runs eagerly, which is all
    the diff needs and saves the C++/Triton codegen (most of the compile time on a CPU).
    """
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs):
        try:
            return compile_fx(gm, example_inputs, config_patches={"post_grad_custom_post_pass": capture})
        except Exception as exc:
            if capture.stop and _is_stop(exc):
                return gm.forward
            raise

    return backend


def call_model(model: Callable, inputs: Any):
    from .models.decode_inputs import DecodeStep

    if isinstance(inputs, DecodeStep):  # a decode step over a static KV cache (--cache): it knows its call
        return inputs.run(model)
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def compile_and_capture(
    model: torch.nn.Module, inputs: Any, fusion_pass=None, *, dynamic: bool = False, stop: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[GraphCapture], Callable]:
    """Compile ``model`` with the capture (and ``fusion_pass`` inside it), run it once; return the captures.

    ``dynamic=True`` compiles as ``fp8_fusion_pass.fuse(model, dynamic=True)`` does: Python floats (the RMSNorm
    eps) stay constants (``specialize_float``), else they become graph inputs and no norm can fuse. The
    returned callable keeps that setting for later calls (a recompile must see the same graph).
    """
    capture = CapturePass(fusion_pass, stop=stop, progress=progress)
    torch._dynamo.reset()  # a compiled frame from an earlier compile would be reused without running our pass
    compiled = torch.compile(model, backend=capture_backend(capture), dynamic=dynamic or None)
    if dynamic:
        plain = compiled

        def compiled(*args, **kwargs):
            with torch._dynamo.config.patch(specialize_float=True):
                return plain(*args, **kwargs)

    with torch.no_grad():
        call_model(compiled, inputs)
    return capture.captures, compiled


def launches_per_forward(compiled: Callable, inputs: Any) -> int:
    """Device-side kernel, memset and memcpy events of one warm forward, from torch.profiler (CUDA only).

    A stripped zero-fill shows up here as one memset or fill kernel less per quantized linear.
    """
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        call_model(compiled, inputs)  # warm: the compile and autotuning are not part of a forward
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call_model(compiled, inputs)
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
