"""fp8-fusion-pass: an Inductor custom pass that fuses block-FP8 quantization into RMSNorm and SiLU-mul.

Public API only. Names resolve lazily (PEP 562), so ``import fp8_fusion_pass`` does no work: no patterns
traced, no config patched, no GPU touched.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # the pass and its entry points
    "FP8FusionPass": "fusion_pass",
    "FusionConfig": "config",
    "backend": "backend",
    "fuse": "backend",
    # reports
    "FusionReport": "report",
    "last_report": "report",
    # models
    "quantize_block_fp8": "quantize",
    "quantize_fp8_per_tensor": "quantize",
    "BlockFP8Linear": "quantize",
    "PerTensorFP8Linear": "quantize",
    "QuantizeSummary": "quantize",
    "e4m3fn_to_e4m3fnuz": "quantize",
    "load_fp8_checkpoint": "checkpoint",
    "write_tiny_fp8_checkpoint": "checkpoint",
    "build_model": "models",
    "example_inputs": "models",
    "engine_from_hf": "models",
    "PRESETS": "models",
    "tensor_parallel": "models.tp",
    "TPShardError": "models.tp",
    "tp_shapes": "models.tp",
    # scale semantics (zero-fill stripping)
    "register_scale_writer": "scale_semantics",
    "probe_scale_semantics": "scale_semantics",
    "scale_semantics_of": "scale_semantics",
    "unregister_scale_writer": "scale_semantics",
    # kernels
    "set_backend": "kernels.backends",
    "use_backend": "kernels.backends",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fp8_fusion_pass' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
