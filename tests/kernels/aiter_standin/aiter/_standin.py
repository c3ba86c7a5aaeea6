"""Stand-in state and shared arithmetic (not a real aiter module).

- ``set_gfx(name)``: the GPU the stand-in pretends to be ("gfx942" -> fp8 = float8_e4m3fnuz, "gfx950" -> e4m3fn),
  mirroring ``aiter/utility/dtypes.py: defaultDtypes`` and ``aiter/jit/utils/chip_info.py: get_gfx()``.
- the two group-quant formulas aiter uses, and the registry of weights shuffled by ``aiter.ops.shuffle``.
"""

from __future__ import annotations

import weakref

import torch

from .utility import dtypes

_FP8_BY_GFX = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}  # aiter defaultDtypes
_state = {"gfx": "gfx950"}
# storage data_ptr -> storage of every tensor returned by shuffle_weight (dies with the storage)
_shuffled: "weakref.WeakValueDictionary[int, torch.UntypedStorage]" = weakref.WeakValueDictionary()


def set_gfx(name: str) -> None:
    if name not in _FP8_BY_GFX:
        raise ValueError(f"stand-in knows {sorted(_FP8_BY_GFX)}, got {name!r}")
    _state["gfx"] = name
    dtypes.fp8 = _FP8_BY_GFX[name]


def get_gfx() -> str:
    return _state["gfx"]


def check_fp8(fn: str, dtype: torch.dtype) -> None:
    # The real kernels take any dtype here; the other fp8 flavour than the GPU's is a silent wrong answer on gfx942
    # (fnuz bits read as fn are half the value) or unsupported, so the stand-in refuses it.
    if dtype != dtypes.fp8:
        raise AssertionError(f"{fn}: quant dtype {dtype} is not this GPU's fp8 ({get_gfx()}: {dtypes.fp8})")


def check_16bit(fn: str, name: str, x: torch.Tensor) -> None:
    # HIP kernels dispatch with AITER_DISPATCH_FLOATING16_TYPES: fp16 / bf16 only.
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"{fn}: {name} must be fp16 or bf16 (AITER_DISPATCH_FLOATING16_TYPES), got {x.dtype}")


def triton_group_quant(y: torch.Tensor, group_size: int, dtype: torch.dtype):
    """aiter Triton ``_fp8_quant_op``: amax floor 1e-10, ``scale = amax / DTYPE_MAX``, ``q = clamp(y * (1/scale))``.

    y: fp32 [M, N]; masked lanes past N load as 0.0, so N need not be a multiple of group_size.
    """
    fmax = torch.finfo(dtype).max
    m, n = y.shape
    groups = -(-n // group_size)
    yp = torch.nn.functional.pad(y, (0, groups * group_size - n)).view(m, groups, group_size)
    scale = yp.abs().amax(-1).clamp_min(1e-10) / fmax
    q = (yp * (1.0 / scale)[..., None]).clamp(-fmax, fmax).to(dtype)
    return q.view(m, -1)[:, :n], scale


def hip_group_quant(x: torch.Tensor, group_size: int, dtype: torch.dtype):
    """aiter HIP ``dynamic_per_group_scaled_quant_kernel``: absMax starts at 1e-10,
    ``scale = absMax * (1 / DTYPE_MAX)``, ``q = x * (1.0f / scale)`` (csrc/kernels/quant_kernels.cu)."""
    fmax = torch.finfo(dtype).max
    xg = x.to(torch.float32).view(-1, group_size)
    scale = xg.abs().amax(-1).clamp_min(1e-10) * torch.tensor(1.0 / fmax, dtype=torch.float32)
    q = (xg * (1.0 / scale)[:, None]).clamp(-fmax, fmax).to(dtype)
    return q.view(x.shape), scale


def mark_shuffled(w: torch.Tensor) -> None:
    storage = w.untyped_storage()
    _shuffled[storage.data_ptr()] = storage


def is_shuffled(w: torch.Tensor) -> bool:
    return w.untyped_storage().data_ptr() in _shuffled


def unshuffle(w: torch.Tensor) -> torch.Tensor:
    """Inverse of ``shuffle_weight(layout=(16, 16))`` for 1-byte dtypes, by scattering through the forward
    permutation (deliberately not the adapter's inverse permute, so one cannot hide a bug in the other)."""
    n, k = w.shape
    perm = torch.arange(n * k).view(1, n // 16, 16, k // 32, 2, 16).permute(0, 1, 3, 4, 2, 5).reshape(-1)
    flat = torch.empty(n * k, dtype=torch.uint8)
    flat[perm] = w.contiguous().view(torch.uint8).reshape(-1).cpu()
    return flat.view(n, k).to(w.device).view(w.dtype)
