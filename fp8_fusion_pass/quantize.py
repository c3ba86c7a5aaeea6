"""Model conversion to the op vocabulary: ``nn.Linear`` -> block-FP8 (or per-tensor FP8) linears.

Block-FP8 (DeepSeek-V3 / Qwen3-FP8 recipe, ``../shared/research/kernels.md`` §0, §4.1):
- weight ``[N, K]`` quantized per 128x128 block: ``scale = amax(block) / FP8_MAX``, stored as the dequant
  multiplier ``weight_scale_inv [N/128, K/128]`` fp32 (checkpoints' name, despite the ``_inv``);
- activation quantized per row in 1 x ``group_size`` groups at run time (``group_quant``), then
  ``blockscale_mm``. The forward is written exactly as the pass's patterns expect it.

Per-tensor FP8: one weight scale per linear, dynamic per-tensor activation scale through the mutating
``dynamic_per_tensor_quant`` writing into a ``torch.zeros(1)`` buffer, the code shape of
``../shared/seeds/zero-fill-scale-pr.txt`` that the zero-fill rewrite strips.

The fp8 flavour of converted weights comes from ``arch.arch_of(device)``: e4m3fn (max 448) on NVIDIA / CPU /
gfx950, e4m3fnuz (max 240) on gfx942. Checkpoints are e4m3fn; ``e4m3fn_to_e4m3fnuz`` converts them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable

import torch
from torch import nn

from . import arch
from .kernels import checks, reference
from .kernels import ops as _ops  # noqa: F401  (registers torch.ops.fp8_fusion.*)

BLOCK = (128, 128)
# torch._scaled_mm (the per-tensor GEMM on CUDA) needs K and N multiples of 16.
PER_TENSOR_ALIGN = 16


class _FP8Module(nn.Module):
    """Shared by the FP8 linears: an fp8 ``weight [N, K]`` buffer, one fp32 scale buffer, an optional bias.

    Keeps the quantized tensors' dtypes through ``model.to(torch.bfloat16)``: ``Module.to(dtype)`` casts every
    floating tensor, and fp8 counts as floating, so a bf16 cast of the whole model would otherwise turn fp8
    weights into bf16 and round fp32 scales to bf16 (0.4% error per scale). Device moves still apply.
    """

    scale_name = ""  # the scale buffer's name (checkpoint naming)

    def _scale_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 fp8_dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        fp8_dtype = fp8_dtype or arch.fp8_dtype(device or "cpu")
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=fp8_dtype, device=device))
        self.register_buffer(self.scale_name, torch.empty(self._scale_shape(), dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), False) if bias else None

    @classmethod
    def _quantized(cls, linear: nn.Linear, quantize, **kwargs):
        """A module holding ``quantize(weight, arch)`` of ``linear``, in the fp8 flavour of its device."""
        w = linear.weight.detach()
        a = arch.arch_of(w.device)
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, fp8_dtype=a.fp8_dtype,
                  device=w.device, dtype=w.dtype, **kwargs)
        w_q, w_s = quantize(w, a)
        mod.weight.copy_(w_q)
        getattr(mod, cls.scale_name).copy_(w_s)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach())
        return mod

    def _apply(self, fn, recurse=True):
        kept = {n: self._buffers[n] for n in ("weight", self.scale_name) if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after.dtype != before.dtype:
                self._buffers[name] = before.to(device=after.device)
        return self


class BlockFP8Linear(_FP8Module):
    """``y = x @ dequant(weight, weight_scale_inv).T (+ bias)`` with x quantized 1 x group_size at run time.

    Buffers: ``weight`` fp8 ``[N, K]``, ``weight_scale_inv`` fp32 ``[ceil(N/128), ceil(K/128)]``; ``bias`` is a
    non-grad parameter in the activation dtype or None.
    """

    scale_name = "weight_scale_inv"

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, group_size: int = 128,
                 fp8_dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self.group_size = group_size
        super().__init__(in_features, out_features, bias, fp8_dtype=fp8_dtype, device=device, dtype=dtype)

    def _scale_shape(self):
        return -(-self.out_features // BLOCK[0]), -(-self.in_features // BLOCK[1])

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, block_size=BLOCK) -> BlockFP8Linear:
        def quantize(w, a):
            return reference.quantize_weight_blockwise(w, tuple(block_size), a.fp8_dtype, a.fp8_max)

        return cls._quantized(linear, quantize, group_size=group_size)

    @classmethod
    def from_fp8_linear(cls, linear: nn.Linear, group_size: int = 128) -> BlockFP8Linear:
        """Adopt the tensors of an already block-quantized linear (transformers' ``FP8Linear``): no requantization;
        e4m3fn weights are re-encoded for a fnuz device; the bias becomes bf16 (FP8Linear keeps it in fp32)."""
        w, s = linear.weight.detach(), linear.weight_scale_inv.detach().to(torch.float32)
        fp8 = arch.arch_of(w.device).fp8_dtype
        if fp8 == torch.float8_e4m3fnuz and w.dtype == torch.float8_e4m3fn:
            w, s = e4m3fn_to_e4m3fnuz(w, s)
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size=group_size,
                  fp8_dtype=w.dtype, device="meta")
        mod.weight, mod.weight_scale_inv = w, s
        if linear.bias is not None:
            mod.bias = nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K] -> [M, K]; this exact op sequence is what patterns/ matches.
        x2 = x.reshape(-1, self.in_features)
        q, s = torch.ops.fp8_fusion.group_quant(x2, self.group_size)
        y = torch.ops.fp8_fusion.blockscale_mm(q, s, self.weight, self.weight_scale_inv, x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized_weight(self) -> torch.Tensor:
        return reference.dequant_weight(self.weight, self.weight_scale_inv)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fp8={self.weight.dtype}, group_size={self.group_size}")


class PerTensorFP8Linear(_FP8Module):
    """``y = (q * x_scale) @ (weight * weight_scale).T (+ bias)`` with one dynamic activation scale per call."""

    scale_name = "weight_scale"

    def _scale_shape(self):
        return (1,)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PerTensorFP8Linear:
        return cls._quantized(linear, lambda w, a: reference.per_tensor_quant(w, a.fp8_dtype, a.fp8_max))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        # The engine code shape of the zero-fill seed: zeros(1) then an op that overwrites it.
        scale = torch.zeros(1, device=x.device, dtype=torch.float32)
        out = torch.empty(x2.shape, dtype=self.weight.dtype, device=x.device)
        torch.ops.fp8_fusion.dynamic_per_tensor_quant(out, x2, scale)
        y = torch.ops.fp8_fusion.per_tensor_mm(out, scale, self.weight, self.weight_scale, x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8={self.weight.dtype}"


@dataclasses.dataclass
class QuantizeSummary:
    """What a conversion did: every ``nn.Linear`` is either converted or skipped with a reason."""

    scheme: str
    converted: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> reason

    def merge(self, other: QuantizeSummary, prefix: str = "") -> QuantizeSummary:
        self.converted += [prefix + n for n in other.converted]
        self.skipped.update({prefix + n: r for n, r in other.skipped.items()})
        return self

    def render(self) -> str:
        lines = [f"{self.scheme}: {len(self.converted)} linear(s) converted, {len(self.skipped)} skipped"]
        lines += [f"  skipped {name}: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines)

    __str__ = render


def _matches(name: str, patterns: Iterable[str]) -> str | None:
    """The skip pattern that ``name`` matches: the full name, its last component, or an fnmatch glob."""
    leaf = name.rsplit(".", 1)[-1]
    for p in patterns:
        if name == p or leaf == p or fnmatch.fnmatchcase(name, p):
            return p
    return None


def _block_reason(lin: nn.Linear, block: tuple[int, int]) -> str | None:
    n, k = lin.out_features, lin.in_features
    bad = [f"{axis}={v} is not a multiple of {b}" for axis, v, b in (("N", n, block[0]), ("K", k, block[1])) if v % b]
    return "; ".join(bad) + " (left in " + str(lin.weight.dtype).replace("torch.", "") + ")" if bad else None


def _per_tensor_reason(lin: nn.Linear) -> str | None:
    n, k = lin.out_features, lin.in_features
    if n % PER_TENSOR_ALIGN or k % PER_TENSOR_ALIGN:
        return f"N={n}, K={k}: torch._scaled_mm needs multiples of {PER_TENSOR_ALIGN}"
    return None


def _adopt_reason(lin: nn.Linear) -> str | None:
    """Why an nn.Linear that already holds fp8 weights (transformers' ``FP8Linear``) cannot be adopted."""
    block, scale = getattr(lin, "block_size", None), getattr(lin, "weight_scale_inv", None)
    if block is None or tuple(block) != BLOCK:
        return f"already fp8 with block_size {block}; only {BLOCK} blocks are adopted"
    if getattr(lin, "activation_scale", None) is not None:
        return "already fp8 with a static activation scale; only dynamic activation quant is supported"
    if scale is None or not scale.dtype.is_floating_point:
        return "already fp8 without a float weight_scale_inv (ue8m0 scales are not supported)"
    return None


def _convert(model: nn.Module, scheme: str, skip: Iterable[str], reason_of, make, adopt=None) -> QuantizeSummary:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module to convert, got {type(model).__name__}")
    summary = QuantizeSummary(scheme)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)  # tuple("lm_head") would be its letters
    # Collect first: replacing while iterating named_modules would revisit or miss children.
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, lin in targets:
        pattern = _matches(name, skip)
        # An nn.Linear subclass holding fp8 weights (transformers' FP8Linear) is adopted, never requantized.
        fp8 = lin.weight.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
        if pattern is not None:
            reason = f"in skip list ({pattern!r})"
        elif fp8:
            reason = _adopt_reason(lin) if adopt else f"already fp8 ({type(lin).__name__}); {scheme} takes bf16 weights"
        else:
            reason = reason_of(lin)
        if reason is not None:
            summary.skipped[name] = reason
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        with torch.no_grad():
            setattr(parent, child, adopt(lin) if fp8 else make(lin))
        summary.converted.append(name)
    return summary


SCHEMES = ("block", "per-tensor")


def convert_linears(model: nn.Module, scheme: str, skip: Iterable[str] = ("lm_head",),
                    group_size: int = 128) -> QuantizeSummary:
    """The conversion behind the public functions, without the nothing-eligible error (for converting a model
    one decoder layer at a time, where a layer may legitimately hold no eligible linear)."""
    if scheme == "block":
        checks.power_of_two_group("quantize_block_fp8", group_size)  # else the first forward's group_quant refuses it
        return _convert(model, f"block-fp8 {BLOCK[0]}x{BLOCK[1]}", skip, lambda lin: _block_reason(lin, BLOCK),
                        lambda lin: BlockFP8Linear.from_linear(lin, group_size, BLOCK),
                        lambda lin: BlockFP8Linear.from_fp8_linear(lin, group_size))
    if scheme == "per-tensor":
        return _convert(model, "per-tensor fp8", skip, _per_tensor_reason, PerTensorFP8Linear.from_linear)
    raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def _require_some(model: nn.Module, summary: QuantizeSummary, what: str) -> QuantizeSummary:
    if summary.converted:
        return summary
    already = sum(isinstance(m, (BlockFP8Linear, PerTensorFP8Linear)) for m in model.modules())
    detail = "; ".join(f"{n}: {r}" for n, r in summary.skipped.items()) or "the model has no nn.Linear"
    if already:
        detail += f" ({already} module(s) are already FP8)"
    raise ValueError(f"{what}: no eligible nn.Linear in {type(model).__name__} ({detail})")


def quantize_block_fp8(
    model: nn.Module,
    block_size: tuple[int, int] = BLOCK,
    skip: Iterable[str] = ("lm_head",),
    group_size: int = 128,
) -> QuantizeSummary:
    """Replace every eligible ``nn.Linear`` of ``model`` in place with a ``BlockFP8Linear``.

    Eligible: not matched by ``skip`` (full name, last name component or glob) and N, K multiples of the block.
    Linears already holding 128x128 block-FP8 weights (transformers' ``FP8Linear``, whose forward fetches hub
    kernels from transformers 5.4 on) are adopted as they are, without requantization.
    Others stay as they are and are listed in the returned summary's ``skipped`` with the reason.
    Raises ``ValueError`` when nothing is eligible.
    """
    if tuple(block_size) != BLOCK:
        raise ValueError(f"block_size must be {BLOCK} (the kernels' weight block), got {tuple(block_size)}")
    return _require_some(model, convert_linears(model, "block", skip, group_size), "quantize_block_fp8")


def quantize_fp8_per_tensor(model: nn.Module, skip: Iterable[str] = ("lm_head",)) -> QuantizeSummary:
    """Replace every eligible ``nn.Linear`` in place with a ``PerTensorFP8Linear`` (one weight scale each)."""
    return _require_some(model, convert_linears(model, "per-tensor", skip), "quantize_fp8_per_tensor")


# fn byte 0x80 is -0.0, which in fnuz is the NaN encoding; fn NaNs (0x7f, 0xff) would become +-240 in fnuz.
_FN_NEG_ZERO = -128  # 0x80 as int8
_FN_NAN = (127, -1)  # 0x7f, 0xff as int8


def e4m3fn_to_e4m3fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode an e4m3fn weight as e4m3fnuz for gfx942 (sglang ``normalize_e4m3fn_to_e4m3fnuz``).

    The same bits read as fnuz are half the fn value (exponent bias 8 vs 7), so the scale doubles; 0x80
    (-0 in fn, NaN in fnuz) becomes +0 and fn NaN becomes fnuz NaN. Exact for every byte value.
    """
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"e4m3fn_to_e4m3fnuz: weight must be float8_e4m3fn, got {weight.dtype}")
    bits = weight.view(torch.int8)
    bits = torch.where(bits == _FN_NEG_ZERO, torch.zeros_like(bits), bits)
    bits = torch.where((bits == _FN_NAN[0]) | (bits == _FN_NAN[1]), torch.full_like(bits, _FN_NEG_ZERO), bits)
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0
