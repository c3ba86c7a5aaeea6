"""What the ``fp8-fusion`` verbs share: the MODEL argument, devices, dtypes, progress lines, one-line errors.

MODEL is a preset name (``fp8_fusion_pass.models.PRESETS``) or ``package.module:factory``, where ``factory()``
returns an ``nn.Module`` or ``(module, example_inputs)``; example inputs are a tuple of positional arguments, a
dict of keyword arguments, or one tensor.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the verbs, not here: `fp8-fusion --help` stays instant
    import torch

DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
          "float32": "float32", "fp32": "float32"}


class CliError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2, no traceback (unless --debug)."""


class Progress:
    """Stage lines on stderr (``[fp8-fusion] compile 1/2 ...``); real-shape compiles take minutes on a CPU."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self._t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[fp8-fusion {time.perf_counter() - self._t0:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class LoadedModel:
    model: torch.nn.Module
    inputs: Any
    description: str  # one line for headers: "qwen3-tiny (hf form, block scheme, 2 layers, bf16, cpu)"
    preset: str | None = None


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device cuda: no CUDA GPU is visible to this torch ({torch.__version__}); use --device cpu")
    if name not in ("cpu", "cuda"):
        raise CliError(f"--device {name}: expected cpu or cuda")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    import torch

    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise CliError(f"--dtype {name}: expected one of {', '.join(DTYPES)}") from None


def known_presets() -> list[str]:
    from .models import PRESETS

    return list(PRESETS)


def at_least(flag: str, value, low) -> None:
    """A numeric flag below ``low`` (or NaN, which compares false with everything) is a CliError."""
    if not value >= low:
        raise CliError(f"{flag} {value}: must be >= {low}")


def load_model(spec: str, args, progress: Progress) -> LoadedModel:
    """Build MODEL from a preset name or ``module:factory`` on ``args.device`` with the verb's options."""
    for flag in ("batch", "seq"):  # checked before the model is built; 0 would fail deep inside the compile
        at_least(f"--{flag}", getattr(args, flag), 1)
    cache = getattr(args, "cache", None)
    if cache is not None:
        at_least("--cache", cache, args.seq)  # the step's tokens are written into it
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype)
    if ":" in spec:
        if cache is not None:
            raise CliError("--cache builds a decode step for a preset; a factory returns its own example inputs")
        return _from_factory(spec, args, device, progress)
    presets = known_presets()
    if spec not in presets:
        raise CliError(
            f"unknown model {spec!r}: known presets are {', '.join(presets)} (or give package.module:factory)"
        )
    if args.layers is not None:
        at_least("--layers", args.layers, 1)
    from .models import build_model, example_inputs

    layers = _layers_text(spec, args.layers)
    what = f"{spec} ({args.form} form, {args.scheme} scheme, {layers}, {_short(dtype)}, {device})"
    progress(f"building {what} with random weights ...")
    try:
        model = build_model(spec, form=args.form, scheme=args.scheme, layers=args.layers, dtype=dtype, device=device)
    except ModuleNotFoundError as exc:
        if exc.name != "transformers":
            raise
        raise CliError("presets are built with transformers, which is not installed: "
                       "pip install 'fp8-fusion-pass[hf]'") from exc
    dynamic = ", dynamic shapes" if getattr(args, "dynamic", False) else ""
    if cache is None:
        inputs = example_inputs(model, batch=args.batch, seq=args.seq, device=device)
        return LoadedModel(model, inputs, f"{what}, batch {args.batch} x seq {args.seq}{dynamic}", preset=spec)
    from .models.decode_inputs import decode_step

    inputs = decode_step(model, batch=args.batch, seq=args.seq, cache_len=cache)
    step = f"a decode step of batch {args.batch} x {args.seq} new tokens over a {cache}-slot KV cache"
    return LoadedModel(model, inputs, f"{what}, {step}{dynamic}", preset=spec)


def _layers_text(spec: str, layers: int | None) -> str:
    from .models import PRESETS

    n = layers if layers is not None else PRESETS[spec].layers
    return f"{n} layer{'s' if n != 1 else ''}"


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "").replace("bfloat16", "bf16")


def _from_factory(spec: str, args, device: torch.device, progress: Progress) -> LoadedModel:
    import torch

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"model {spec!r}: expected package.module:factory")
    progress(f"importing {module_name} and calling {attr}() ...")
    module = import_user_module(module_name, f"model {spec!r}")
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise CliError(f"model {spec!r}: {module_name} has no callable {attr!r}")
    try:
        made = factory()
    except Exception as exc:
        raise CliError(f"model {spec!r}: {attr}() raised {type(exc).__name__}: {exc}") from exc
    inputs = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made, inputs = made
    if not isinstance(made, torch.nn.Module):
        raise CliError(
            f"model {spec!r}: {attr}() returned {type(made).__name__}, not a torch.nn.Module"
            " (return a module or (module, example_inputs))"
        )
    model = made.to(device).eval()
    if inputs is None:
        inputs = _default_inputs(model, spec, args, device)
    inputs = _to_device(inputs, device)
    dynamic = ", dynamic shapes" if getattr(args, "dynamic", False) else ""
    return LoadedModel(model, inputs, f"{spec} ({type(model).__name__}, {device}){dynamic}")


def import_user_module(name: str, what: str):
    """Import the user's module from the working directory or sys.path; any failure is one CliError line."""
    if os.getcwd() not in sys.path:  # a console script does not put the working directory on sys.path
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or anything the user's module raises at import time
        raise CliError(f"{what}: cannot import {name}: {type(exc).__name__}: {exc}") from exc


def _default_inputs(model: torch.nn.Module, spec: str, args, device: torch.device):
    if getattr(getattr(model, "config", None), "vocab_size", None):
        from .models import example_inputs

        return example_inputs(model, batch=args.batch, seq=args.seq, device=device)
    raise CliError(
        f"model {spec!r}: the factory returned a module without example inputs and it has no config.vocab_size"
        " to make token ids from; return (module, example_inputs)"
    )


def _to_device(inputs, device: torch.device):
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    if isinstance(inputs, dict):
        return {k: _to_device(v, device) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_to_device(v, device) for v in inputs)
    return inputs


def fusion_config(only: str | None):
    """FusionConfig for ``--only a,b`` (None: the default config, every fusion on)."""
    if not only:
        return None
    from .config import FusionConfig

    try:
        return FusionConfig.only(only)
    except ValueError as exc:
        raise CliError(f"--only {only}: {exc}") from None


def make_fusion_pass(config):
    from .fusion_pass import FP8FusionPass

    return FP8FusionPass(config)
