"""FusionConfig: which rewrites the pass may make, plus the environment override.

The config is part of the pass's ``uuid()`` (through ``fingerprint()``), so Inductor's FX graph cache
never serves a graph compiled under another config.
"""

from __future__ import annotations

import dataclasses
import os

# Every switchable rewrite, by the name users give it (CLI ``--only``, env ``FP8_FUSION_DISABLE``).
FUSIONS = ("norm_quant", "silu_quant", "dedup_quant", "norm_rope", "qk_rope", "rope_cache", "inline_norm",
           "group_gemm", "gemm_silu_quant", "quant_gemm", "gqa_attention", "decode_attention",
           "rope_attention", "zero_fill")

ENV_DISABLE = "FP8_FUSION_DISABLE"


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    norm_quant: bool = True  # rms_norm (+ residual add) -> group_quant  =>  (add_)rms_norm_group_quant
    silu_quant: bool = True  # silu(gate) * up -> group_quant  =>  silu_mul_group_quant
    dedup_quant: bool = True  # identical group_quant(x) calls collapse to one
    zero_fill: bool = True  # zeros(1) scale buffers of ops that overwrite them  =>  empty(1)
    # Qwen3's q / k norm ops -> RoPE  =>  one rms_norm_rope launch for both. Measured on the H200: 0.8-2.4% off a
    # Qwen3-8B decode step (patterns/norm_rope.py). Not bit-exact against Inductor's fusion of the inlined norms
    # (deterministic mode keeps it off).
    norm_rope: bool = True
    # Llama's q / k RoPE (no norms)  =>  one qk_rope launch for both, which rope_cache then gives the cache writes
    # (patterns/qk_rope.py). Not bit-exact against Inductor's fp32 RoPE (deterministic mode keeps it off).
    qk_rope: bool = True
    # rms_norm_rope / qk_rope whose k (and a v beside it) go only into static KV caches by index  =>  the *_cache op,
    # the writes in the same launch (patterns/rope_cache.py). Bit-exact: the same k, v copied.
    rope_cache: bool = True
    # rms_norm / add_rms_norm ops left after the fusions  =>  their aten ops, for Inductor to fuse with neighbours.
    # Not bit-exact (deterministic mode keeps it off); measured on the H200 (patterns/inline_norm.py).
    inline_norm: bool = True
    # blockscale_mms of one quantized activation (HF q/k/v, gate/up)  =>  one blockscale_mm_grouped.
    # Not bit-exact (deterministic mode keeps it off); measured on the H200 (patterns/group_gemm.py).
    group_gemm: bool = True
    # blockscale_mm (gate/up) -> silu_mul_group_quant  =>  one op, the silu-quant in the GEMM's epilogue at decode,
    # where its measured table says so (Qwen3-32B, Llama-3.1-8B at 16 / 32 rows). Not bit-exact (deterministic mode
    # keeps it off); measured on the H200 (patterns/gemm_silu_quant.py).
    gemm_silu_quant: bool = True
    # group_quant -> blockscale_mm (the o_proj input at batch 1-4)  =>  one op, the quant inside the GEMV, where its
    # measured table says so (the 8B o_proj at batch 1). Not bit-exact (its GEMV config may differ from the GEMM's),
    # so deterministic mode keeps it off; measured on the H200 (patterns/quant_gemm.py).
    quant_gemm: bool = True
    # transformers' repeat_kv copies of the KV cache -> SDPA at decode  =>  SDPA on the cache itself, the query heads
    # of a kv head as its query rows (patterns/gqa_attention.py). Not promised bit-exact (the kernel may block the
    # rows differently), so deterministic mode keeps it off; measured on the H200 (docs/benchmarks.md).
    gqa_attention: bool = True
    # decode attention spelled as plain torch (score bmm, masked fp32 softmax, value bmm)  =>  one split-KV launch
    # (patterns/decode_attention.py). Closer to the fp32 reference than the graph it replaces, not equal to it, so
    # deterministic mode keeps it off; measured on the H200 (docs/benchmarks.md).
    decode_attention: bool = True
    # the RoPE op that writes the KV caches -> the decode attention that reads them, one token  =>  one launch (the
    # RoPE, its cache writes and the attention: patterns/rope_attention.py). Not promised bit-exact (Qwen3's norms sum
    # in another order; the fused kernel compiles apart), so deterministic mode keeps it off; measured on the H200.
    rope_attention: bool = True
    # Group sizes the pass fuses; 128 is the checkpoint layout (DeepSeek-V3 / Qwen3-FP8), 64 also has kernels.
    group_sizes: tuple[int, ...] = (128, 64)
    # Honour FP8_FUSION_DISABLE from the environment at compile time.
    use_env: bool = True

    def __post_init__(self) -> None:
        # Checked here, not at compile time: a string switch ("no") is truthy and would silently turn a fusion on,
        # and a group size that is no power of two can never match a group_quant (its op refuses those). Written
        # here, not taken from kernels.checks: config sits below everything and imports nothing of ours.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "group_sizes" and not isinstance(value, bool):
                raise TypeError(f"FusionConfig.{f.name} must be True or False, got {value!r}")
        sizes = self.group_sizes
        if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
            raise TypeError(f"FusionConfig.group_sizes must be a tuple of ints, e.g. (128, 64), got {sizes!r}")
        sizes = tuple(sizes)
        bad = [g for g in sizes if isinstance(g, bool) or not isinstance(g, int) or g <= 0 or g & (g - 1)]
        if bad:
            raise ValueError(f"FusionConfig.group_sizes: {', '.join(map(repr, bad))} not a power of two (the group "
                             f"quant's sizes, e.g. (128, 64)), got {sizes!r}")
        object.__setattr__(self, "group_sizes", sizes)  # a list becomes a tuple: the config stays hashable

    @classmethod
    def only(cls, names: str | tuple[str, ...] | list[str], **kwargs) -> FusionConfig:
        """A config that enables only the named fusions: ``FusionConfig.only("norm_quant,zero_fill")``."""
        wanted = _split(names)
        _check_names(wanted)
        return cls(**{f: f in wanted for f in FUSIONS}, **kwargs)

    @classmethod
    def without(cls, names: str | tuple[str, ...] | list[str], **kwargs) -> FusionConfig:
        """The default config with the named rewrites off: ``FusionConfig.without("inline_norm,group_gemm")``."""
        unwanted = _split(names)
        _check_names(unwanted, source="FusionConfig.without")
        return cls(**{f: False for f in unwanted}, **kwargs)

    def enabled(self, fusion: str) -> bool:
        """Is ``fusion`` on, after the environment override."""
        return getattr(self, fusion) and fusion not in self.env_disabled()

    def env_disabled(self) -> frozenset[str]:
        if not self.use_env:
            return frozenset()
        names = _split(os.environ.get(ENV_DISABLE, ""))
        _check_names(names, source=ENV_DISABLE)
        return frozenset(names)

    def fingerprint(self) -> str:
        """Stable text that changes whenever the effective config changes (feeds ``uuid()``)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return repr(sorted(fields.items())) + f"|env-disabled={sorted(self.env_disabled())}"


def _split(names) -> tuple[str, ...]:
    if isinstance(names, str):
        names = names.split(",")
    return tuple(n.strip() for n in names if n and n.strip())


def _check_names(names, source: str = "FusionConfig.only") -> None:
    unknown = [n for n in names if n not in FUSIONS]
    if unknown:
        raise ValueError(f"{source}: unknown fusion(s) {', '.join(unknown)}; known: {', '.join(FUSIONS)}")
