"""Entry points: a ``torch.compile`` backend factory, the registered backend name ``"fp8_fusion"``, and ``fuse``.

    model = torch.compile(model, backend=fp8_fusion_pass.backend())                 # Inductor + the pass
    model = torch.compile(model, backend=fp8_fusion_pass.backend(), mode="reduce-overhead")   # + CUDA graphs
    model = torch.compile(model, backend=fp8_fusion_pass.backend(**{"triton.cudagraphs": True}))  # the same
    model = torch.compile(model, backend="fp8_fusion")                             # registered name
    model = fp8_fusion_pass.fuse(model, dynamic=True)                              # an instance
    @fp8_fusion_pass.fuse                                                          # a class: every instance
    class MyModel(nn.Module): ...

The backend calls ``compile_fx(gm, example_inputs, config_patches={...})``: the pass and the Inductor options
are scoped to this compile and reach its recompiles and lazily compiled backward (``inductor_api.md`` §2); no
global Inductor config is ever assigned. ``mode=`` (``"reduce-overhead"``, ``"max-autotune"``, ...) and
``options=`` given to ``torch.compile`` arrive here as keyword arguments and are merged in.

``dynamic=True`` and Hugging Face models: Dynamo turns Python floats such as the RMSNorm eps into runtime graph
inputs, which a fused op cannot take (it needs eps when the graph is compiled), so those norms stay unfused
with reason ``eps_graph_input``. ``fuse(..., dynamic=True)`` compiles with
``torch._dynamo.config.specialize_float=True`` in force during its calls, which keeps eps a constant (a float
argument whose value changes then recompiles instead of becoming an input).
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable

import torch
from torch import nn

from . import report
from .config import FusionConfig
from .fusion_pass import FP8FusionPass, checked_config

NAME = "fp8_fusion"
ENTRY_POINT_GROUP = "torch_dynamo_backends"


def _check_inductor_options(options: dict) -> None:
    """Unknown Inductor config keys fail here, at ``backend(...)``, not as a BackendCompilerFailed at the first call."""
    import torch._inductor.config as inductor_config

    unknown = [k for k in options if not hasattr(inductor_config, k)]
    if not unknown:
        return
    hint = ""
    if any(k in ("mode", "options", "dynamic", "fullgraph") for k in unknown):
        hint = "; mode= / options= / dynamic= / fullgraph= belong to torch.compile(...), not to backend(...)"
    raise ValueError(f"backend(): {', '.join(map(repr, unknown))} is not an Inductor config key (torch._inductor."
                     f"config, e.g. max_autotune=True or **{{'triton.cudagraphs': True}}){hint}")


def _patches(pass_: FP8FusionPass, mode: str | None, options: dict | None, dynamic, inductor_options: dict) -> dict:
    from torch._inductor import list_mode_options

    patches = dict(list_mode_options(mode, dynamic)) if mode and mode != "default" else {}
    patches.update(inductor_options)
    patches.update(options or {})
    if patches.get("use_post_grad_passes", True) is False or mode == "lite":
        raise ValueError("this configuration turns Inductor's post-grad passes off (mode='lite' or "
                         "use_post_grad_passes=False), so the fp8 fusion pass would never run")
    patches["post_grad_custom_post_pass"] = pass_
    return patches


def backend(config: FusionConfig | None = None, **inductor_options: Any) -> Callable:
    """A ``torch.compile`` backend: Inductor with ``FP8FusionPass(config)`` as its post-grad custom pass.

    ``inductor_options`` are Inductor config keys (``{"triton.cudagraphs": True}``, ``max_autotune=True``,
    ``force_disable_caches=True``); ``torch.compile``'s own ``mode=`` / ``options=`` are honoured as well.
    """
    pass_ = FP8FusionPass(config)
    _check_inductor_options(inductor_options)
    _register()

    def fp8_fusion_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                           options: dict | None = None):
        from torch._inductor.compile_fx import compile_fx

        patches = _patches(pass_, mode, options, None, inductor_options)
        before = report.last_report()
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
        if report.last_report() is before:
            _note_cache_hit(pass_)
        return compiled

    fp8_fusion_backend.fusion_pass = pass_  # for introspection (tests, the CLI)
    return fp8_fusion_backend


def _note_cache_hit(pass_: FP8FusionPass) -> None:
    # Inductor served this graph from its FX graph cache, so the pass did not run and made no report. Say so,
    # rather than leave last_report() pointing at another graph: the cache key includes the pass's uuid (sources,
    # config, registry), so the cached graph holds the rewrites this config made when it was first compiled.
    r = report.new_report(config=pass_.config.fingerprint())
    r.cache_hit = True
    r.notes.append("served from Inductor's FX graph cache: the pass did not run on this compile; the cached graph "
                   "was compiled under the same pass sources and config. Set TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 "
                   "(or fx_graph_cache=False) to see this graph's decisions.")


def registered_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                       options: dict | None = None):
    """``torch.compile(model, backend="fp8_fusion")``: the default config (the ``torch_dynamo_backends`` entry
    point, and ``torch._dynamo.register_backend`` for source checkouts)."""
    return _default_backend()(gm, example_inputs, mode=mode, options=options)


@functools.lru_cache(maxsize=1)
def _default_backend() -> Callable:
    return backend()


def _register() -> None:
    """Make ``backend="fp8_fusion"`` work in a source checkout: register the name with Dynamo, unless an installed
    package declares it as a ``torch_dynamo_backends`` entry point. Then Dynamo loads it from there (registering
    it here too would make that load fail with "duplicate name", since loading the entry point imports us)."""
    if getattr(_register, "done", False):
        return
    _register.done = True
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry

    if NAME in entry_points(group=ENTRY_POINT_GROUP).names:
        return
    try:
        registry.register_backend(registered_backend, name=NAME)
    except AssertionError:  # "duplicate name": already registered
        pass


def fuse(obj: Any = None, config: FusionConfig | None = None, **compile_kwargs: Any):
    """Compile with the fp8 fusion backend.

    - ``fuse(module, config=None, **compile_kwargs)`` on an instance: returns ``torch.compile(module, backend=...,
      **compile_kwargs)`` (``dynamic=``, ``fullgraph=``, ``mode=`` pass through);
    - ``@fuse`` / ``@fuse(config=..., **compile_kwargs)`` on an ``nn.Module`` subclass: every instance compiles its
      forward with the backend on its first call (``nn.Module.compile``).
    """
    checked_config(config)  # a bad config fails at the decorator, not at the first instance's first call
    if obj is None:
        return functools.partial(fuse, config=config, **compile_kwargs)
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return _fuse_class(obj, config, compile_kwargs)
    if isinstance(obj, nn.Module):
        compiled = torch.compile(obj, backend=backend(config), **compile_kwargs)
        if compile_kwargs.get("dynamic"):
            compiled.forward = _specialized_floats(compiled.forward)
        return compiled
    raise TypeError(f"fuse() takes an nn.Module instance or subclass, got {type(obj).__name__}")


def _fuse_class(cls: type, config: FusionConfig | None, compile_kwargs: dict) -> type:
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not getattr(self, "_fp8_fusion_compiled", False):  # a decorated subclass: compile once
            self.compile(backend=backend(config), **compile_kwargs)
            if compile_kwargs.get("dynamic"):
                self._compiled_call_impl = _specialized_floats(self._compiled_call_impl)
            self._fp8_fusion_compiled = True

    cls.__init__ = __init__
    return cls


def _specialized_floats(fn: Callable) -> Callable:
    """Run ``fn`` with Dynamo keeping Python floats (RMSNorm eps) constants, so norms can fuse under dynamic=True."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_float=True):
            return fn(*args, **kwargs)

    return call


class _CallableModule(types.ModuleType):
    """``fp8_fusion_pass.backend`` is both this module and the function ``backend`` the package exports: once
    anything imports the submodule, Python's import system sets the package attribute ``backend`` to the module,
    shadowing the function. Calling the module calls the function, so ``fp8_fusion_pass.backend(...)`` works
    whichever of the two the attribute holds."""

    def __call__(self, config: FusionConfig | None = None, **inductor_options: Any) -> Callable:
        return backend(config, **inductor_options)


sys.modules[__name__].__class__ = _CallableModule
_register()
