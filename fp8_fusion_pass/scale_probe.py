"""The zero-fill seed's adversarial check as a tool: does an op read the scale buffer it is handed?

Run the op with its scale pre-filled with zeros (the baseline), then again with zeros and with +inf, -inf,
NaN, 1e30 and -1e30, on several shapes, and compare every tensor it touched bit for bit with the baseline.
A kernel that reads the incoming value cannot pass: ``max(+inf, amax / FP8_MAX)`` stays +inf and NaN
survives a max-reduction, so the scale (and the quantized output) change. One that overwrites gives identical
bits for every poison. The verdict is ``overwrites`` only if every run on every shape is bit-identical;
anything else, including a baseline that does not repeat, is ``accumulates`` (keeping a fill is always safe).

    fp8-fusion scale-probe fp8_fusion::dynamic_per_tensor_quant
    probe_scale_semantics("_C::dynamic_scaled_fp8_quant", device="cuda").render()
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import arch
from .scale_semantics import ACCUMULATES, OVERWRITES, loaded_overloads, lookup, op_key, split_name

# Shapes of the seed PR: a square 8B-class hidden, a Qwen3-32B-class hidden, and an odd decode-ish M.
DEFAULT_SHAPES = ((4096, 4096), (1024, 5120), (17, 4096))
# (label, value): the seed PR's poisons. Zeros first: it re-runs the baseline, so nondeterminism shows up.
POISONS = (("zeros", 0.0), ("+inf", math.inf), ("-inf", -math.inf), ("NaN", math.nan),
           ("1e30", 1e30), ("-1e30", -1e30))

# Packages that define an op namespace when imported; imported only when asked to resolve a name in it.
NAMESPACE_MODULES = {
    "fp8_fusion": "fp8_fusion_pass.kernels.ops",
    "aiter": "aiter",
    "_C": "vllm._C",
    "sgl_kernel": "sgl_kernel",
}
INPUT_NAMES = ("x", "input", "inp", "a")  # the activation to quantize, by schema argument name
OUT_NAMES = ("out", "output", "output_q", "result", "q", "y")  # the fp8 output (sgl-kernel's is not marked (a!))


@dataclasses.dataclass(frozen=True)
class ProbeOutcome:
    shape: tuple[int, ...]
    poison: str
    outputs_identical: bool  # every tensor the op was handed except the scale, and every tensor it returned
    scale_identical: bool
    scale: float  # first element of the scale after the call

    @property
    def identical(self) -> bool:
        return self.outputs_identical and self.scale_identical


@dataclasses.dataclass
class ProbeResult:
    op: str
    arg: str
    device: str
    baseline: dict[tuple[int, ...], float]  # shape -> scale after the zero-filled baseline run
    outcomes: list[ProbeOutcome]
    registered: str | None  # what the registry says, for comparison

    @property
    def deterministic(self) -> bool:
        return all(o.identical for o in self.outcomes if o.poison == "zeros")

    @property
    def semantics(self) -> str:
        return OVERWRITES if self.outcomes and all(o.identical for o in self.outcomes) else ACCUMULATES

    @property
    def agrees_with_registry(self) -> bool | None:
        return None if self.registered is None else self.registered == self.semantics

    def render(self) -> str:
        from tabulate import tabulate

        rows = [("x".join(map(str, o.shape)), f"{self.baseline[o.shape]:.6e}", o.poison,
                 "identical" if o.outputs_identical else "DIFFERS", "identical" if o.scale_identical else "DIFFERS",
                 f"{o.scale:.6e}") for o in self.outcomes]
        table = tabulate(rows, headers=["shape", "baseline scale", "pre-fill", "outputs", "scale", "scale after"])
        verdict = {None: "not registered", True: "agrees", False: "DISAGREES"}[self.agrees_with_registry]
        head = (f"{self.op} ({self.arg}) on {self.device}: {self.semantics.upper()}"
                f"  [registry: {self.registered or '-'}, {verdict}]")
        notes = [] if self.deterministic else ["note: the zero-filled baseline does not repeat bit for bit "
                                               "(nondeterministic op), so the verdict is accumulates"]
        return "\n".join([head, table, *notes])


# ---------------------------------------------------------------- op resolution and default arguments


def resolve_op(op) -> torch._ops.OpOverload:
    """An OpOverload from an overload, a packet (its only / default overload) or a name such as
    ``"aiter::dynamic_per_tensor_quant"``; imports the namespace's package (NAMESPACE_MODULES) if needed."""
    if isinstance(op, str) and not loaded_overloads(op):
        module = NAMESPACE_MODULES.get(split_name(op)[0])
        if module is not None:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ValueError(f"{op}: its package {module!r} is not importable here ({e})") from None
    overloads = loaded_overloads(op)
    if not overloads:
        raise ValueError(f"no op {op_key(op)!r} is registered with torch (known namespaces: "
                         f"{', '.join(NAMESPACE_MODULES)})")
    if len(overloads) > 1:
        default = [o for o in overloads if o._overloadname == "default"]
        if not default:
            names = ", ".join(o._overloadname for o in overloads)
            raise ValueError(f"{op_key(op)} has several overloads ({names}); name one, e.g. {op_key(overloads[0])}")
        return default[0]
    return overloads[0]


def default_make_args(op: torch._ops.OpOverload, arg: str = "scale") -> Callable[[tuple, torch.device], dict]:
    """Arguments for a dynamic per-tensor quant op with an ``(out!, x, scale!)``-like schema, by argument name:
    ``arg`` -> fp32 [1]; x / input -> bf16 ``shape`` (seeded normal); out / output_q / result or any other mutable
    Tensor -> fp8 ``shape``;
    bool without a default -> False (``is_static=False`` = dynamic). Anything else: pass ``make_args``."""
    plan: list[tuple[str, str]] = []
    for a in op._schema.arguments:
        writes = a.alias_info is not None and a.alias_info.is_write
        is_tensor = str(a.type).startswith("Tensor")
        if a.name == arg:
            plan.append((a.name, "scale"))
        elif is_tensor and a.name in INPUT_NAMES:
            plan.append((a.name, "input"))
        elif is_tensor and (writes or a.name in OUT_NAMES):
            plan.append((a.name, "out"))
        elif a.has_default_value():
            continue
        elif str(a.type) == "bool":
            plan.append((a.name, "false"))
        else:
            raise ValueError(f"cannot build default arguments for {op_key(op)}: argument {a.name!r} ({a.type}); "
                             "pass make_args=lambda shape, device: {...}")
    if ("scale" not in {k for _, k in plan}) or ("input" not in {k for _, k in plan}):
        raise ValueError(f"{op_key(op)} has no argument {arg!r} and an input named one of {INPUT_NAMES}; "
                         f"pass make_args (schema: {op._schema})")

    def make(shape: tuple, device: torch.device) -> dict:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=gen) * 3).to(torch.bfloat16)  # amax ~ 15: scale ~ 3e-2 for e4m3fn
        fp8 = arch.fp8_dtype(device)
        make_one = {"scale": lambda: torch.zeros(1, dtype=torch.float32), "input": lambda: x,
                    "out": lambda: torch.zeros(shape, dtype=fp8), "false": lambda: False}
        return {name: _to(make_one[kind](), device) for name, kind in plan}

    return make


def _to(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


# ---------------------------------------------------------------- the probe


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)  # bytes: NaN == NaN, -0.0 != 0.0


def _run(op, args: dict, arg: str, value: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    args = _clone(args)
    args[arg].fill_(value)
    ret = op(**args)
    rets = [r for r in (ret if isinstance(ret, (tuple, list)) else [ret]) if isinstance(r, torch.Tensor)]
    others = [v for k, v in args.items() if isinstance(v, torch.Tensor) and k != arg]
    return [_bits(t) for t in others + rets], args[arg]


def probe_scale_semantics(
    op,
    *,
    arg: str = "scale",
    shapes: Sequence[tuple[int, ...]] = DEFAULT_SHAPES,
    device: torch.device | str | None = None,
    make_args: Callable[[tuple, torch.device], dict[str, Any]] | None = None,
) -> ProbeResult:
    """Classify ``op`` as overwriting or accumulating into ``arg`` from what it writes (see module doc).

    ``make_args(shape, device)`` returns the op's keyword arguments (schema names) for one shape; the default
    suits ``(out!, x, scale!)``-like quant ops (``default_make_args``). ``device`` defaults to CUDA if present.
    """
    overload = resolve_op(op)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                          else "cpu")
    make = make_args or default_make_args(overload, arg)
    baseline: dict[tuple[int, ...], float] = {}
    outcomes: list[ProbeOutcome] = []
    for shape in shapes:
        shape = tuple(shape)
        args = make(shape, device)
        if not isinstance(args.get(arg), torch.Tensor):
            raise ValueError(f"make_args must return a tensor for {arg!r}, got {type(args.get(arg)).__name__}")
        ref_out, ref_scale = _run(overload, args, arg, 0.0)
        baseline[shape] = float(ref_scale.reshape(-1)[0])
        for label, value in POISONS:
            out, scale = _run(overload, args, arg, value)
            same_out = len(out) == len(ref_out) and all(torch.equal(a, b) for a, b in zip(out, ref_out))
            outcomes.append(ProbeOutcome(shape, label, same_out, torch.equal(_bits(scale), _bits(ref_scale)),
                                         float(scale.reshape(-1)[0])))
    return ProbeResult(op_key(overload), arg, str(device), baseline, outcomes, lookup(overload, arg).semantics)
