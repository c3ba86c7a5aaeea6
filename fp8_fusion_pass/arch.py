"""Every device fact the library depends on: platform, fp8 flavour, fp8 max, capabilities.

No other module calls ``torch.cuda.get_device_capability`` or reads ``gcnArchName``: they ask
``arch_of(device)``. Tests simulate another arch with ``simulate_arch("gfx942")``.

Facts and their sources (``../shared/research/kernels.md`` §0, §2.1; ``inductor_api.md`` §5):
- NVIDIA sm89+ and AMD gfx950 use OCP ``float8_e4m3fn`` (max 448).
- AMD gfx942 (MI300X / MI325X) uses ``float8_e4m3fnuz`` (max 240, as aiter's
  ``torch.finfo(dtype).max`` gives it; vLLM and sglang clip to 224 instead, aiter does not).
- cuBLASLt 1x128 x 128x128 block-scaled ``torch._scaled_mm`` exists on SM90 only (``_check_deepseek_support``);
  never on ROCm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from typing import Iterator

import torch


@dataclasses.dataclass(frozen=True)
class Arch:
    platform: str  # "cuda" | "rocm" | "cpu"
    name: str  # "sm90", "gfx942", "gfx950", "cpu", ...
    fp8_dtype: torch.dtype
    fp8_max: float
    # Smallest normal exponent of the fp8 format (e4m3fn: 2^-6, e4m3fnuz: 2^-7); the emulated cast needs it.
    fp8_min_normal_exp: int
    # Triton can cast to this fp8 flavour on the device (sm89+, gfx942, gfx950; the CPU interpreter emulates it).
    triton_fp8: bool
    # cuBLASLt block-wise (1x128 activation, 128x128 weight) scaling through torch._scaled_mm: SM90 only.
    blockwise_scaled_mm: bool
    # Per-tensor torch._scaled_mm (sm89+ and ROCm hipBLASLt).
    per_tensor_scaled_mm: bool
    # Programmatic dependent launch: griddepcontrol and cp.async.bulk.prefetch (sm90+; kernels/triton/_pdl.py).
    pdl: bool = False
    # The tensor memory accelerator behind Triton's tensor descriptors (sm90+; the small-M GEMM's ``tma`` tiles).
    tma: bool = False

    @property
    def is_rocm(self) -> bool:
        return self.platform == "rocm"


E4M3FN_MAX = 448.0
E4M3FNUZ_MAX = 240.0

CPU = Arch("cpu", "cpu", torch.float8_e4m3fn, E4M3FN_MAX, -6, False, False, False)

# AMD archs by gcnArchName prefix. gfx942: fnuz (kernels.md §0.3); gfx950: OCP fn.
_ROCM_ARCHS = {
    "gfx942": Arch("rocm", "gfx942", torch.float8_e4m3fnuz, E4M3FNUZ_MAX, -7, True, False, True),
    "gfx950": Arch("rocm", "gfx950", torch.float8_e4m3fn, E4M3FN_MAX, -6, True, False, True),
}

_local = threading.local()


def _cuda_arch(index: int) -> Arch:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        gcn = getattr(props, "gcnArchName", "").split(":")[0]
        for prefix, arch in _ROCM_ARCHS.items():
            if gcn.startswith(prefix):
                return arch
        # An AMD arch we have no facts for: no fp8 kernels, fused ops fall back to the reference.
        return Arch("rocm", gcn or "rocm-unknown", torch.float8_e4m3fn, E4M3FN_MAX, -6, False, False, False)
    return _nvidia(props.major, props.minor)


def _nvidia(major: int, minor: int) -> Arch:
    fp8 = (major, minor) >= (8, 9)
    return Arch(
        "cuda",
        f"sm{major}{minor}",
        torch.float8_e4m3fn,
        E4M3FN_MAX,
        -6,
        triton_fp8=fp8,
        blockwise_scaled_mm=major == 9,
        per_tensor_scaled_mm=fp8,
        pdl=major >= 9,
        tma=major >= 9,
    )


@functools.lru_cache(maxsize=None)
def _detected(device_type: str, index: int) -> Arch:
    if device_type == "cuda":
        return _cuda_arch(index)
    return CPU


def arch_of(device: torch.device | str | None = None) -> Arch:
    """The facts for ``device`` (default: the current CUDA device if any, else CPU)."""
    simulated = getattr(_local, "simulated", None)
    if simulated is not None:
        return simulated
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "meta":
        return CPU
    if device.type != "cuda":
        return CPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _detected("cuda", index)


def fp8_dtype(device: torch.device | str | None = None) -> torch.dtype:
    return arch_of(device).fp8_dtype


def fp8_max(device: torch.device | str | None = None) -> float:
    return arch_of(device).fp8_max


def fp8_min_normal_exp(dtype: torch.dtype) -> int:
    """Exponent of the smallest normal number of an fp8 e4m3 flavour (for the emulated cast)."""
    return -7 if dtype == torch.float8_e4m3fnuz else -6


def fp8_max_of(dtype: torch.dtype) -> float:
    """fp8 max for a dtype (used where the dtype, not the device, is known: checkpoints, weights)."""
    return E4M3FNUZ_MAX if dtype == torch.float8_e4m3fnuz else E4M3FN_MAX


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels run on the CPU (CI checks their numerics this way)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextlib.contextmanager
def simulate_arch(name: str) -> Iterator[Arch]:
    """Pretend the device is ``name`` ("gfx942", "gfx950", "sm90", "cpu") in this thread. Tests only."""
    if name in _ROCM_ARCHS:
        arch = _ROCM_ARCHS[name]
    elif name == "cpu":
        arch = CPU
    elif name.startswith("sm"):
        arch = _nvidia(int(name[2:-1]), int(name[-1]))
    else:
        raise ValueError(f"unknown arch {name!r}; known: cpu, sm80, sm89, sm90, {', '.join(_ROCM_ARCHS)}")
    previous = getattr(_local, "simulated", None)
    _local.simulated = arch
    try:
        yield arch
    finally:
        _local.simulated = previous
