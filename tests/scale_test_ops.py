"""Test-only mutating quant ops with the ``(out!, x, scale!)`` signature of ``fp8_fusion::dynamic_per_tensor_quant``.

- ``acc_quant`` accumulates like vLLM's ``dynamic_scaled_fp8_quant`` (``atomicMax`` into the caller's scale):
  ``scale = max(scale, amax / FP8_MAX)``, then quantizes with that scale. Registered ``accumulates`` by
  ``register_test_ops``. Under the probe, +inf / NaN / 1e30 pre-fills change its scale; -inf / -1e30 do not.
- ``unreg_quant`` overwrites exactly like our op but is never registered: the rewrite must leave its fill alone.

Imported by tests/test_scale_semantics.py and tests/patterns/test_zero_fill.py (tests/ is on sys.path through
the rootdir conftest).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

import fp8_fusion_pass.kernels.ops  # noqa: F401  (registers torch.ops.fp8_fusion)
from fp8_fusion_pass import arch
from fp8_fusion_pass.scale_semantics import ACCUMULATES, register_scale_writer, unregister_scale_writer

NS = "fp8_fusion_test"


@custom_op(f"{NS}::acc_quant", mutates_args=("out", "scale"))
def acc_quant(out: Tensor, x: Tensor, scale: Tensor) -> None:
    amax = x.float().abs().amax().reshape(1)
    scale.copy_(torch.maximum(scale, amax / arch.fp8_max(x.device)))  # reads the incoming value, like atomicMax
    fp8_max = arch.fp8_max(x.device)
    out.copy_((x.float() / scale).clamp(-fp8_max, fp8_max).to(out.dtype))


@acc_quant.register_fake
def _(out, x, scale):
    return None


@custom_op(f"{NS}::unreg_quant", mutates_args=("out", "scale"))
def unreg_quant(out: Tensor, x: Tensor, scale: Tensor) -> None:
    torch.ops.fp8_fusion.dynamic_per_tensor_quant(out, x, scale)


@unreg_quant.register_fake
def _(out, x, scale):
    return None


_LIBS: list = []  # a Library's definitions vanish when it is garbage collected


def sgl_like_op(ns: str):
    """An op with sgl-kernel's per-tensor quant schema (its outputs are not declared mutable) in namespace ``ns``."""
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("sgl_per_tensor_quant_fp8(Tensor input, Tensor output_q, Tensor output_s, bool is_static) -> ()")
    _LIBS.append(lib)
    return getattr(torch.ops, ns).sgl_per_tensor_quant_fp8.default


ACC = torch.ops.fp8_fusion_test.acc_quant.default
UNREG = torch.ops.fp8_fusion_test.unreg_quant.default


def register_test_ops() -> None:
    register_scale_writer(ACC, "scale", ACCUMULATES, evidence="tests/scale_test_ops.py: torch.maximum(scale, ...)")


def unregister_test_ops() -> None:
    unregister_scale_writer(ACC, "scale")
