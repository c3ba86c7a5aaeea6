"""Which ops overwrite their scale argument and which accumulate into it: the registry the zero-fill rewrite reads.

A ``torch.zeros(1)`` scale buffer is dead work only when the op it feeds *overwrites* every element without
reading it first. An op that max-reduces into the buffer (``scale = max(scale, amax / FP8_MAX)`` with
``atomicMax``) *accumulates*: it needs the zeros, and dropping them is a silent correctness bug. The registry
maps ``(op, argument)`` to one of the two; ops that are not registered are never touched.

Entries are verified, not trusted:
- ``register_scale_writer`` checks the argument against the op's schema (it must exist, be a Tensor, and for
  ``overwrites`` be declared mutable, ``Tensor(a!)``) as soon as the op is loaded;
- the built-in entries below are registered by NAME and checked against the schema when an op of that name is
  first seen in a graph, so importing this module imports none of aiter / vLLM / sgl-kernel;
- ``probe_scale_semantics`` (``scale_probe.py``) runs the op with its scale pre-filled with +inf, -inf, NaN and
  +/-1e30 and classifies it from the bits it writes; the tests probe every entry whose op is on the machine.

``fingerprint()`` changes whenever the registry does; the pass folds it into ``uuid()`` so Inductor's FX graph
cache never serves a graph compiled under other scale semantics.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import torch

log = logging.getLogger(__name__)

OVERWRITES = "overwrites"
ACCUMULATES = "accumulates"
SEMANTICS = (OVERWRITES, ACCUMULATES)

# Built-in entries: (op name, argument, semantics, evidence). Evidence names the source read and its version.
BUILTIN = (
    ("fp8_fusion::dynamic_per_tensor_quant", "scale", OVERWRITES,
     "ours: every backend computes amax(x) / FP8_MAX and stores it (reference: scale.copy_); "
     "probed on each backend in tests/test_scale_semantics.py"),
    ("aiter::dynamic_per_tensor_quant", "scale", OVERWRITES,
     "ROCm/aiter csrc/kernels/quant_kernels.cu dynamic_per_tensor_quant launches initializeScale(scale, 1, 0.0f) "
     "before data_to_scale_kernel (atomicMaxFloat) in its fp8 and i8 branches; read at v0.1.3 (9085c21f), "
     "v0.1.7 (de14bec0), v0.1.7.post5, v0.1.20, v0.1.20.post1 (de07f388) and HEAD e4048607 (2026-08-22). "
     "torch.ops.aiter.dynamic_per_tensor_quant is defined by aiter/jit/utils/torch_guard.py (v0.1.7+) with "
     "infer_schema(mutates_args='unknown'): (Tensor(a0!) out, Tensor(a1!) input, Tensor(a2!) scale) -> ()"),
    ("_C::dynamic_scaled_fp8_quant", "scale", ACCUMULATES,
     "vllm-project/vllm csrc/quantization/fp8/common.cu @006ccf0e: segmented_max_reduction atomicMaxFloat-s into "
     "the caller's scale with no init (callers pass torch.zeros(1)); one stored version zeroes it only for strided "
     "rows; csrc/quantization/w8a8/fp8/common.cu @cda1b348 and 8bit/fp8/common.cu @619f1cf6 cudaMemsetAsync it "
     "themselves. Accumulating is the reading that is safe at every version; probe the installed build and "
     "re-register as overwrites if it says so"),
    ("sgl_kernel::sgl_per_tensor_quant_fp8", "output_s", ACCUMULATES,
     "sgl-project/sglang sgl-kernel/csrc/gemm/per_tensor_quant_fp8.cu @28f9412d: per_tensor_absmax_kernel "
     "atomicMaxFloat-s into output_s with no init. Schema (common_extension.cc @40ef116f) declares output_s "
     "without (a!), so graphs show it as a plain read and the fill stays either way"),
)


@dataclasses.dataclass(frozen=True)
class ScaleWriter:
    op: str  # "ns::name" (every overload) or "ns::name.overload"
    arg: str
    semantics: str
    evidence: str = ""
    builtin: bool = False


@dataclasses.dataclass(frozen=True)
class Lookup:
    """What the registry says about one argument of one concrete overload seen in a graph."""

    entry: ScaleWriter | None
    error: str = ""  # the entry does not fit the schema: the fill stays

    @property
    def semantics(self) -> str | None:
        return None if self.entry is None or self.error else self.entry.semantics


_lock = threading.RLock()
_entries: dict[tuple[str, str], ScaleWriter] = {}
_builtins_loaded = False
_checked: dict[tuple[str, str, str], str] = {}  # (overload key, arg, semantics) -> schema error ("" if fine)


# ---------------------------------------------------------------- op names


def op_key(op) -> str:
    """``"ns::name"`` for a packet or a bare name, ``"ns::name.overload"`` for an overload."""
    if isinstance(op, torch._ops.OpOverload):
        return f"{op._schema.name}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, str):
        ns, name, overload = split_name(op)
        return f"{ns}::{name}" + (f".{overload}" if overload else "")
    raise TypeError(f"op must be an OpOverload, OpOverloadPacket or 'ns::name' string, got {type(op).__name__}")


def split_name(name: str) -> tuple[str, str, str]:
    """``"ns::op[.overload]"``, ``"ns.op[.overload]"`` or ``"torch.ops.ns.op[.overload]"`` -> (ns, op, overload)."""
    text = name.strip().removeprefix("torch.ops.")
    if "::" in text:
        ns, rest = text.split("::", 1)
        op, _, overload = rest.partition(".")
    else:
        ns, _, rest = text.partition(".")
        op, _, overload = rest.partition(".")
    if not ns or not op:
        raise ValueError(f"cannot parse op name {name!r}; expected 'namespace::op' or 'namespace::op.overload'")
    return ns, op, overload


def loaded_overloads(op) -> list[torch._ops.OpOverload]:
    """The overloads of ``op`` already registered with torch (never imports a package to find them)."""
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    if isinstance(op, str):
        ns, name, overload = split_name(op)
        try:
            op = getattr(getattr(torch.ops, ns), name)
            if overload:
                return [getattr(op, overload)]
        except (AttributeError, RuntimeError):
            return []
    return [getattr(op, o) for o in op.overloads()]


# ---------------------------------------------------------------- schema check


def schema_error(overload: torch._ops.OpOverload, arg: str, semantics: str) -> str:
    """Why ``arg`` of ``overload`` cannot carry ``semantics`` ("" if it can)."""
    schema = overload._schema
    found = next((a for a in schema.arguments if a.name == arg), None)
    if found is None:
        names = ", ".join(a.name for a in schema.arguments)
        return f"{op_key(overload)} has no argument {arg!r} (arguments: {names})"
    if not str(found.type).startswith("Tensor"):
        return f"{op_key(overload)} argument {arg!r} is {found.type}, not a Tensor"
    writes = found.alias_info is not None and found.alias_info.is_write
    if semantics == OVERWRITES and not writes:
        # An op that writes an argument its schema calls read-only is invisible to functionalization.
        return f"{op_key(overload)} argument {arg!r} is not declared mutable (Tensor(a!)) in {schema}"
    return ""


def _check(overload: torch._ops.OpOverload, entry: ScaleWriter) -> str:
    key = (op_key(overload), entry.arg, entry.semantics)
    if key not in _checked:
        _checked[key] = schema_error(overload, entry.arg, entry.semantics)
        if _checked[key]:
            log.warning("scale-semantics entry %s(%s)=%s ignored: %s", entry.op, entry.arg, entry.semantics,
                        _checked[key])
    return _checked[key]


# ---------------------------------------------------------------- registry


def _ensure_builtins() -> None:
    global _builtins_loaded
    with _lock:
        if _builtins_loaded:
            return
        _builtins_loaded = True
        for name, arg, semantics, evidence in BUILTIN:
            _entries.setdefault((op_key(name), arg), ScaleWriter(op_key(name), arg, semantics, evidence, True))


def register_scale_writer(op, arg: str = "scale", semantics: str = OVERWRITES, *, evidence: str = "") -> ScaleWriter:
    """Declare that ``op`` overwrites (never reads) or accumulates into its ``arg`` scale buffer.

    ``op``: an OpOverload, an OpOverloadPacket (every overload that has ``arg``) or an ``"ns::name"`` string.
    If the op is loaded, the schema is checked now (ValueError if ``arg`` is missing, not a Tensor, or not
    mutable for ``overwrites``); an op not loaded yet is checked when it is first seen in a graph.
    Run ``probe_scale_semantics(op)`` on the target device before registering an op ``overwrites``.
    """
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    if not isinstance(arg, str) or not arg:
        raise ValueError(f"arg must be an argument name, got {arg!r}")
    key = op_key(op)
    overloads = loaded_overloads(op)
    if overloads:
        errors = [schema_error(o, arg, semantics) for o in overloads]
        having = [e for e in errors if "has no argument" not in e]
        if not having:
            raise ValueError(errors[0])
        if any(having):
            raise ValueError(next(e for e in having if e))
    entry = ScaleWriter(key, arg, semantics, evidence)
    _ensure_builtins()
    with _lock:
        old = _entries.get((key, arg))
        if old is not None and old.semantics != semantics:
            log.warning("scale-semantics of %s(%s) changed: %s -> %s", key, arg, old.semantics, semantics)
        _entries[(key, arg)] = entry
        _checked.clear()
    return entry


def unregister_scale_writer(op, arg: str = "scale") -> ScaleWriter | None:
    """Remove an entry (built-in ones too); returns what was removed."""
    _ensure_builtins()
    with _lock:
        _checked.clear()
        return _entries.pop((op_key(op), arg), None)


def registered_scale_writers() -> list[ScaleWriter]:
    _ensure_builtins()
    with _lock:
        return sorted(_entries.values(), key=lambda e: (e.op, e.arg))


def lookup(overload: torch._ops.OpOverload, arg: str) -> Lookup:
    """The entry for ``arg`` of a concrete overload (overload-specific entry first), schema-checked."""
    _ensure_builtins()
    with _lock:
        qualified = op_key(overload)
        entry = _entries.get((qualified, arg)) or _entries.get((qualified.rsplit(".", 1)[0], arg))
        if entry is None:
            return Lookup(None)
        return Lookup(entry, _check(overload, entry))


def scale_semantics_of(op, arg: str = "scale") -> str | None:
    """``"overwrites"``, ``"accumulates"`` or None (not registered, or the entry does not fit the schema)."""
    overloads = loaded_overloads(op)
    if overloads:
        found = {lookup(o, arg).semantics for o in overloads} - {None}
        return found.pop() if len(found) == 1 else None
    _ensure_builtins()
    key = op_key(op)
    with _lock:
        entry = _entries.get((key, arg)) or _entries.get((key.rsplit(".", 1)[0], arg))
    return entry.semantics if entry else None


def fingerprint() -> str:
    """Stable text that changes whenever an entry does (feeds the pass's ``uuid()``)."""
    return ";".join(f"{e.op}({e.arg})={e.semantics}" for e in registered_scale_writers())


def __getattr__(name: str):
    # The probe lives in its own module (it needs tabulate and runs kernels); re-exported here for the public API.
    if name in ("probe_scale_semantics", "ProbeResult", "resolve_op", "default_make_args"):
        from . import scale_probe

        return getattr(scale_probe, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
