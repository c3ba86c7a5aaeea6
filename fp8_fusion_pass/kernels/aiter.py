"""aiter backend (ROCm): thin adapters to aiter's kernels - argument reordering and layout conversion, no math.

Checked against the ROCm/aiter sources, read (never run: no AMD hardware was available to this project) at
HEAD ``e4048607`` (2026-08-22, after tag v0.1.20.post1) and tag ``v0.1.7`` (``de14bec0``, 2025-11-10; the PyPI
wheel amd-aiter 0.1.7.post2.dev18 has its signatures, per research/kernels.md). Every function below has the same
arithmetic in both and the same signature up to trailing keywords we do not pass.

| our op                   | aiter function (file at HEAD)                                                  |
|--------------------------|--------------------------------------------------------------------------------|
| rms_norm_group_quant     | ``fused_rms_fp8_group_quant`` (aiter/ops/triton/quant/fused_fp8_quant.py)     |
| add_rms_norm_group_quant | the same, residual through ``res1`` -> ``out_res1``                             |
| silu_mul_group_quant     | ``act_mul_and_fp8_group_quant(x, "silu", g)`` (aiter/ops/triton/activation.py)  |
| group_quant (g = 128)    | ``get_hip_quant(QuantType.per_1x128)`` -> ``per_group_quant_hip`` (ops/quant.py) |
| blockscale_mm            | ``gemm_a8w8_blockscale`` / ``gemm_a8w8_blockscale_bpreshuffle`` (ops/gemm_op_a8w8.py) |
| dynamic_per_tensor_quant | ``dynamic_per_tensor_quant(out, x, scale)`` (ops/quant.py; csrc/kernels/quant_kernels.cu) |

Not in the table (the next backend serves them): ``rms_norm`` / ``add_rms_norm`` / ``silu_and_mul`` - aiter's
``rmsnorm2d_fwd(_with_add)`` and ``silu_and_mul`` compute in fp32 and round once, while our contract rounds like HF
(normalized value to bf16, then times w; silu to bf16, then times up), so they are not the same op; and
``per_tensor_mm`` - aiter's fp8 per-tensor GEMM is ``gemm_a8w8`` with per-token x per-channel scales, off every
fusion path, so not adapted.

Scale layout contract between the fused producers and ``blockscale_mm`` (decided here): every op returns and takes
the **row-major** ``scale [M, K/g]`` (``transpose_scale=False``, aiter's default), because ``ops.py``'s fakes
declare that layout and Inductor asserts extern-kernel output strides against the fakes. The plain CK GEMM reads
that layout directly. The bpreshuffle GEMM (weights from ``preshuffle_weight``) needs column-major bytes,
``x_scale.t().contiguous().view(M, K/128)``, which ``blockscale_mm`` makes here: one copy of M * K/128 fp32 values
(32 KiB at M = 64, K = 4096; 1 MiB at M = 8192). Saving it would need a column-major scale in the op vocabulary,
produced by ``transpose_scale=True``.

Numerics (aiter's, not the reference's; tests/kernels/test_aiter.py states the bounds): the fused Triton kernels
keep the normalized / activated value in fp32 up to the fp8 cast (no rounding to bf16), normalise the fp32 sum
``x + residual`` (``out_res1`` is that sum rounded to x.dtype, equal to the reference's residual_out) - so on this
backend even ``silu_mul_group_quant`` is not bit-exact with ``silu_and_mul`` + ``group_quant`` - and use
``scale = max(amax, 1e-10) / finfo(fp8).max`` and ``q = clamp(x * (1 / scale))``. The HIP group quant uses
``scale = amax * (1 / max)``. ``dynamic_per_tensor_quant`` has no amax floor: an all-zero input gives scale 0 and
NaN values (the reference gives zeros). fp8 max is ``finfo``'s: 240 for gfx942's e4m3fnuz, 448 for gfx950's e4m3fn.

Calls aiter cannot take go to the next backend (Triton on a GPU, the reference on the CPU): fp32 activations for the
HIP kernels (they dispatch bf16 / fp16 only), fp32 GEMM output (bf16 / fp16 only), group sizes other than 128 for
``group_quant`` / ``blockscale_mm``, an fp8 flavour other than the GPU's, and empty inputs.
"""

from __future__ import annotations

import importlib
import logging
import weakref
from typing import Callable

import torch

from .. import arch as _arch

log = logging.getLogger("fp8_fusion_pass")

_HALF = (torch.bfloat16, torch.float16)
# aiter function -> module paths to try, newest first. The Triton files moved into sub-folders in v0.1.10
# (aiter 4c2a3025); HEAD still resolves the old paths through _BACKWARD_COMPAT_MAP, v0.1.7 has only those.
_SOURCES = {
    "fused_rms_fp8_group_quant": ("aiter.ops.triton.quant.fused_fp8_quant", "aiter.ops.triton.fused_fp8_quant"),
    "act_mul_and_fp8_group_quant": ("aiter.ops.triton.activation",),
    "get_hip_quant": ("aiter",),
    "QuantType": ("aiter",),
    "gemm_a8w8_blockscale": ("aiter",),
    "gemm_a8w8_blockscale_bpreshuffle": ("aiter",),
    "dynamic_per_tensor_quant": ("aiter",),
    "shuffle_weight": ("aiter.ops.shuffle",),
}
_import_error: list[str] = []  # first failure of ``import aiter`` (it runs rocminfo: not retried on every op call)


def unavailable_reason() -> str | None:
    """Why the aiter backend cannot run here, or None. Imports aiter only on (possibly simulated) ROCm."""
    arch = _arch.arch_of()
    if not arch.is_rocm:
        return f"aiter runs on ROCm only (this device is {arch.name})"
    if _import_error:
        return _import_error[0]
    try:
        aiter = importlib.import_module("aiter")
    except Exception as e:  # noqa: BLE001 - ImportError, or rocminfo failing inside aiter's import
        why = f"{type(e).__name__}: {e}"
        _import_error.append(f"aiter is not importable ({why}); on ROCm: pip install fp8-fusion-pass[rocm]")
        return _import_error[0]
    aiter_fp8 = getattr(getattr(aiter, "dtypes", None), "fp8", None)
    if aiter_fp8 != arch.fp8_dtype:  # aiter.dtypes.fp8 comes from rocminfo; arch.py from gcnArchName
        return f"aiter's fp8 dtype here is {aiter_fp8} but {arch.name} uses {arch.fp8_dtype} (arch.py): they disagree"
    return None


def _forget_import_error() -> None:
    """Tests only: let ``unavailable_reason`` try ``import aiter`` again."""
    _import_error.clear()


def _resolve(name: str):
    for path in _SOURCES[name]:
        try:
            return getattr(importlib.import_module(path), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"aiter has no {name} in {', '.join(_SOURCES[name])}")


def _fp8(x: torch.Tensor) -> torch.dtype:
    return _arch.arch_of(x.device).fp8_dtype


def _delegate(op: str, device: torch.device) -> Callable:
    """The kernel the next backend runs, for a call aiter cannot take."""
    from . import backends  # lazy: backends imports this module lazily too

    for name in ("reference",) if device.type == "cpu" else ("triton", "reference"):
        if backends.unavailable_reason(name, device) is None:
            with backends.use_backend(name):
                return backends.get_kernel(op, device)
    raise AssertionError("unreachable: the reference runs everywhere")


def _rows(x: torch.Tensor) -> torch.Tensor:
    # aiter's launchers unpack ``M, N = x.shape``: flatten the leading dims.
    return x.reshape(-1, x.shape[-1])


def _lead(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    # [M, n] -> [*shape[:-1], n]
    return t.view(*shape[:-1], t.shape[-1])


# ---------------------------------------------------------------- fused producers


def _norm_quant(fused):
    def rms_norm_group_quant(x, w, eps, group_size):
        if x.numel() == 0:
            return _delegate("rms_norm_group_quant", x.device)(x, w, eps, group_size)
        # transpose_scale left at its default False: row-major scale (see the layout contract above)
        (q, scale), _, _, _ = fused(_rows(x), w, eps, group_size=group_size, dtype_quant=_fp8(x))
        return _lead(q, x.shape), _lead(scale, x.shape)

    def add_rms_norm_group_quant(x, residual, w, eps, group_size):
        if x.numel() == 0:
            return _delegate("add_rms_norm_group_quant", x.device)(x, residual, w, eps, group_size)
        (q, scale), _, _, residual_out = fused(
            _rows(x), w, eps, group_size=group_size, dtype_quant=_fp8(x), res1=_rows(residual)
        )
        return _lead(q, x.shape), _lead(scale, x.shape), residual_out.view(x.shape)

    return {"rms_norm_group_quant": rms_norm_group_quant, "add_rms_norm_group_quant": add_rms_norm_group_quant}


def _silu_quant(act_mul):
    def silu_mul_group_quant(x, group_size):
        if x.numel() == 0:
            return _delegate("silu_mul_group_quant", x.device)(x, group_size)
        q, scale = act_mul(_rows(x), "silu", group_size, dtype_quant=_fp8(x))  # gate = first half, as ours
        return _lead(q, x.shape), _lead(scale, x.shape)

    return {"silu_mul_group_quant": silu_mul_group_quant}


def _group_quant(get_hip_quant, quant_type):
    per_1x128 = get_hip_quant(quant_type.per_1x128)  # functools.partial(per_group_quant_hip, group_size=128)

    def group_quant(x, group_size):
        if group_size != 128 or x.dtype not in _HALF or x.numel() == 0:
            return _delegate("group_quant", x.device)(x, group_size)
        # y shaped like x, scale [*x.shape[:-1], K/128] row-major (transpose_scale=False); needs a contiguous x
        return per_1x128(x.contiguous(), quant_dtype=_fp8(x))

    return {"group_quant": group_quant}


def _per_tensor_quant(quant):
    def dynamic_per_tensor_quant(out, x, scale):
        # Overwrites scale (initializeScale(scale, 0) then atomicMax): never reads it.
        if x.dtype not in _HALF or out.dtype != _fp8(x) or x.numel() == 0:
            return _delegate("dynamic_per_tensor_quant", x.device)(out, x, scale)
        x = x.contiguous()  # the kernel indexes rows as blockIdx.x * cols
        if out.is_contiguous():
            quant(out, x, scale)
        else:
            tmp = torch.empty_like(x, dtype=out.dtype)
            quant(tmp, x, scale)
            out.copy_(tmp)

    return {"dynamic_per_tensor_quant": dynamic_per_tensor_quant}


# ---------------------------------------------------------------- block-scale GEMM


def _gemm(gemm, gemm_bpreshuffle):
    def blockscale_mm(q, x_scale, w_q, w_scale, out_dtype):
        m, k = q.shape
        shuffled = is_preshuffled(w_q)
        if out_dtype not in _HALF or x_scale.shape[1] * 128 != k or q.dtype != _fp8(q) or m == 0:
            w = unshuffle_weight(w_q) if shuffled else w_q
            return _delegate("blockscale_mm", q.device)(q, x_scale, w, w_scale, out_dtype)
        q, w_scale = q.contiguous(), w_scale.contiguous()
        if shuffled:
            x_scale_col = x_scale.t().contiguous().view(m, -1)  # column-major bytes, as bpreshuffle reads them
            return gemm_bpreshuffle(q, w_q, x_scale_col, w_scale, dtype=out_dtype)
        return gemm(q, w_q.contiguous(), x_scale.contiguous(), w_scale, dtype=out_dtype)

    return {"blockscale_mm": blockscale_mm}


# storage data_ptr -> {(storage_offset, shape, stride)} of weights made by preshuffle_weight; an entry leaves with
# its storage, so views and nn.Parameter wrappers of a preshuffled weight are recognised, nothing else.
_preshuffled: dict[int, set] = {}


def _layout_key(w: torch.Tensor) -> tuple:
    return (w.storage_offset(), tuple(w.shape), tuple(w.stride()))


def is_preshuffled(w_q: torch.Tensor) -> bool:
    """True for a weight returned by ``preshuffle_weight`` (or a Parameter / same-layout view of it)."""
    keys = _preshuffled.get(w_q.untyped_storage().data_ptr())
    return keys is not None and _layout_key(w_q) in keys


def preshuffle_weight(w_q: torch.Tensor) -> torch.Tensor:
    """``aiter.ops.shuffle.shuffle_weight(w_q, layout=(16, 16))``, marked so that ``blockscale_mm`` runs aiter's
    ``gemm_a8w8_blockscale_bpreshuffle`` on it. Do it once, at load time; the result is the same shape [N, K] but
    only the aiter backend reads it correctly (other backends get ``unshuffle_weight`` of it, a copy per call).

    Needs N % 16 == 0 and K % 32 == 0 (every Qwen3 / Llama linear). Shuffle after loading the checkpoint: the mark
    belongs to the storage, so data copied into it later (``load_state_dict``) must be shuffled already. On gfx950,
    sglang takes this path only with ROCm >= 7.2 ("ROCm 7.0 hipcc miscompiles gemm_a8w8_blockscale_bpreshuffle on
    gfx95", sglang #23319).
    """
    from .backends import BackendUnavailable

    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"preshuffle_weight needs aiter: {reason}")
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 2 or w_q.dtype != _fp8(w_q):
        got = f"{tuple(w_q.shape)} {w_q.dtype}" if isinstance(w_q, torch.Tensor) else type(w_q).__name__
        raise ValueError(f"preshuffle_weight: w_q must be a 2-D {_fp8(w_q)} weight [N, K], got {got}")
    n, k = w_q.shape
    if n % 16 or k % 32:
        raise ValueError(f"preshuffle_weight: w_q [N, K] needs N % 16 == 0 and K % 32 == 0, got [{n}, {k}]")
    shuffled = _resolve("shuffle_weight")(w_q.contiguous(), layout=(16, 16))
    storage = shuffled.untyped_storage()
    if storage.data_ptr() not in _preshuffled:
        _preshuffled[storage.data_ptr()] = set()
        weakref.finalize(storage, _preshuffled.pop, storage.data_ptr(), None)
    _preshuffled[storage.data_ptr()].add(_layout_key(shuffled))
    return shuffled


def unshuffle_weight(w_q: torch.Tensor) -> torch.Tensor:
    """Inverse of ``shuffle_weight(layout=(16, 16))`` for a 1-byte dtype: the plain [N, K] weight (a copy).

    shuffle_weight views [N, K] as (N/16, 16, K/32, 2, 16) and permutes it to (N/16, K/32, 2, 16, 16).
    """
    n, k = w_q.shape
    blocks = w_q.contiguous().view(torch.uint8).view(n // 16, k // 32, 2, 16, 16)
    return blocks.permute(0, 3, 1, 2, 4).reshape(n, k).view(w_q.dtype)


# ---------------------------------------------------------------- the table

# op group -> (aiter functions it needs, factory of the adapters)
_ADAPTERS = (
    (("fused_rms_fp8_group_quant",), _norm_quant),
    (("act_mul_and_fp8_group_quant",), _silu_quant),
    (("get_hip_quant", "QuantType"), _group_quant),
    (("dynamic_per_tensor_quant",), _per_tensor_quant),
    (("gemm_a8w8_blockscale", "gemm_a8w8_blockscale_bpreshuffle"), _gemm),
)


def kernels() -> dict:
    """Our op name -> adapter, for the ops this aiter installation has (empty when aiter is unavailable)."""
    if unavailable_reason() is not None:
        return {}
    table = {}
    for needs, factory in _ADAPTERS:
        try:
            functions = [_resolve(name) for name in needs]
        except ImportError as e:
            log.info("fp8_fusion_pass: aiter backend leaves an op to the next backend: %s", e)
            continue
        table.update(factory(*functions))
    return table
