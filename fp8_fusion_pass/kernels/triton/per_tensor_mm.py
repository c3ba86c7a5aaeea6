"""``per_tensor_mm`` on the Triton backend: ``y = (q * x_scale) @ (w_q * w_scale)^T``, one fp32 scale each.

Order of preference, first that can run the shape:
1. per-tensor ``torch._scaled_mm`` (cuBLASLt on sm89+, hipBLASLt on ROCm; ``kernels/cublas.py`` has its rules:
   K and N multiples of 16, any M);
2. the Triton tiled GEMM of ``blockscale_mm`` with both scales read through stride 0 (any K: a masked tail);
3. the reference (dequantize, fp32 matmul) where Triton cannot run (a CPU without ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from ... import arch as _arch
from .. import checks, cublas
from .. import reference as _ref
from ._blockscale_kernels import tiled_mm, triton_unsupported


def path_for(q: torch.Tensor, w_q: torch.Tensor, out_dtype: torch.dtype) -> str:
    """"cublas", "tiled" or "dequant" for these inputs."""
    a = _arch.arch_of(q.device)
    if cublas.per_tensor_unsupported(a, q.device.type, w_q.shape[0], q.shape[1], out_dtype) is None:
        return "cublas"
    return "tiled" if triton_unsupported(a, q.device.type) is None else "dequant"


def per_tensor_mm(q, x_scale, w_q, w_scale, out_dtype: torch.dtype, path: str | None = None) -> torch.Tensor:
    """``path`` forces one implementation (tests); None picks ``path_for``."""
    checks.per_tensor_mm_args("per_tensor_mm", q, x_scale, w_q, w_scale, out_dtype)
    path = path or path_for(q, w_q, out_dtype)
    if path == "cublas":
        return cublas.per_tensor_mm(q, x_scale, w_q, w_scale, out_dtype)
    if path == "tiled":
        reason = triton_unsupported(_arch.arch_of(q.device), q.device.type)
        if reason is not None:
            raise ValueError(f"per_tensor_mm: the Triton path cannot run here: {reason}")
        q, w_q = q.contiguous(), w_q.contiguous()  # the kernel walks K with stride 1
        return tiled_mm(q, x_scale.reshape(1), w_q, w_scale.reshape(1), out_dtype, per_tensor=True)
    if path == "dequant":
        return _ref.per_tensor_mm(q, x_scale, w_q, w_scale, out_dtype)
    raise ValueError(f"per_tensor_mm: unknown path {path!r}; known: cublas, tiled, dequant")
