"""Guards: pure predicates over FakeTensor metadata (``node.meta["val"]``) that decide whether a match is fused.

``can_*`` says whether the fused graph would be legal, ``should_*`` whether it would be faster. Each returns a
``Verdict(ok, reason, detail)``; ``reason`` is a key of ``REASONS`` (the one table of rejection codes, each
explained, with what to change, in ``docs/guards.md``) and ``detail`` a sentence with the numbers. A guard never
raises and never asserts; the pass still wraps every call, and a guard that raises anyway is recorded as an
error and the match is left alone.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import arch as _arch
from .config import ENV_DISABLE, FusionConfig

# code -> one-line meaning. Every reason the pass records comes from here (docs/guards.md has one section each).
REASONS = {
    # legality: dtype, device, shape
    "dtype_not_bf16": "the activation is not bfloat16; the fused kernels take bf16 only",
    "weight_dtype_mismatch": "the RMSNorm weight's dtype differs from the activation's",
    "no_fused_kernel": "no fused kernel runs on this device / arch (or a requested backend is unavailable)",
    "group_size_not_configured": "the quant's group size is not in FusionConfig.group_sizes",
    "k_not_multiple_of_group": "the quantized last dim K is not a multiple of the group size",
    "k_dynamic": "the quantized last dim K is symbolic; the fused kernels need it static",
    "last_dim_not_contiguous": "an input is not contiguous in its last dim",
    "reshape_changes_last_dim": "a reshape between the producer and the quant changes the last dim",
    # legality: graph structure
    "consumer_not_blockscale_mm": "a quant output feeds something other than fp8_fusion.blockscale_mm",
    "extra_consumer": "the norm / silu (gemm_silu_quant: GEMM) output also feeds another consumer (e.g. a bf16 GEMM)",
    "multiple_quants": "the norm / silu output feeds several group_quants that were not collapsed into one",
    "no_quant_consumer": "the norm / silu output feeds no group_quant (e.g. the final norm -> bf16 lm_head)",
    "producer_not_fusable": "the group_quant's input is not a norm or silu-mul output (e.g. attention -> o_proj)",
    "eps_graph_input": "eps became a runtime graph input (dynamic=True lifts Python floats); the fused op needs it",
    "unrecognized_spelling": "looks like a norm / silu but its graph spelling matches no registered pattern",
    "inline_changes_output": "inline_norm: the aten ops would not stand in for the op's outputs one for one",
    "operand_defined_later": "group_gemm: a weight or scale is computed after the group's first GEMM; norm_rope: "
                             "an input of the q / k pair is computed from one of their outputs; rope_cache: the "
                             "cache positions are",
    "no_norm_rope_pair": "norm_rope / qk_rope: a q / k (norm +) RoPE with no second one on the same cos / sin to "
                         "share a launch",
    "cache_write_not_in_place": "rope_cache: k feeds more than its cache write, or the cache is not a graph input "
                                "written only there (Inductor could not write it in place)",
    "no_kv_write_pair": "rope_cache: not exactly one other cache write (the v write) at the k write's slots",
    "kv_cache_mismatch": "rope_cache: k, v and the two caches differ in shape or dtype",
    "query_too_long": "gqa_attention: more query tokens per head than GQA_MAX_QUERY_TOKENS, or a symbolic count "
                      "not bounded within it (prefill); the KV copy stays",
    "kv_heads_dynamic": "gqa_attention: the head counts, head dim or cache length are symbolic (dynamic=True); only "
                        "the batch may be; decode_attention: the kv heads or head dim are",
    "kv_copy_shared": "gqa_attention: key and value are not both a repeat_kv copy made for this attention alone, "
                      "with the query's heads per kv head",
    "attention_not_plain": "gqa_attention: causal, dropout, a mask not per batch row / head / key, or another "
                           "output of the attention read; decode_attention: the softmax's input is not fp32 scaled "
                           "scores with -inf where a bool mask says (an additive mask), the keys / values not "
                           "[B, Hkv, T, D] tensors, a padding other than pad_mm's of the rows, or a step also read "
                           "elsewhere",
    "attention_rows_above_decode": "decode_attention: more than 16 query rows per kv head (heads per kv head x "
                                   "tokens: a prefill, or a step verifying more draft tokens; at 32 rows the kernel "
                                   "measured slower at batch 1-8, H100); the GEMMs and softmax stay",
    "attention_rows_dynamic": "decode_attention: the query rows per kv head are a symbolic token count whose range "
                              "is not known to stay within 16 (a token dim marked dynamic without max=)",
    "rope_attention_not_single": "rope_attention: more than one token, the RoPE op's q also read elsewhere or not "
                                 "grouped as the attention's rows, the attention reads other caches (or views of "
                                 "them) or a mask, or a head dim the fused kernel cannot take",
    # profit
    "small_m_prefers_bf16": "the small-M table says this GEMM is faster fed bf16 than pre-quantized at this M",
    "m_above_small_m": "group_gemm / gemm_silu_quant: static M above the small-M kernels' rows (decode only)",
    "m_above_gemv": "quant_gemm: static M above the quantizing GEMV's 4 rows (batch 1-4 decode only)",
    "unfused_pair_faster": "gemm_silu_quant / quant_gemm: at this M and shape the fused launch has no measured win "
                           "over two; norm_rope / qk_rope: Inductor's combo kernels measured faster here; "
                           "rope_attention: with q / k norms, above 256 batch rows x kv heads",
    "single_key": "gqa_attention: a cache of one key (a first token without a cache): its copy is one row per "
                  "head, and SDPA's memory-efficient kernel rejects the grouped mask Inductor lays out for it",
    "kv_copy_faster": "gqa_attention at one token: batch x query heads under guards.GQA_MIN_BATCH_HEADS; the grouped "
                      "SDPA's few programs measured slower than the copy + per-head SDPA (H100)",
    # runtime gates
    "disabled_by_config": "the fusion is switched off in FusionConfig",
    "disabled_by_env": f"the fusion is listed in the environment variable {ENV_DISABLE}",
    "deterministic_mode": "torch.use_deterministic_algorithms(True) keeps non-bit-exact (norm) fusions off",
    # whole graph / failures
    "not_inference": "the graph needs gradients (training); the pass leaves training graphs alone",
    "replacement_failed": "a guard or replacement raised; that match was left unrewritten",
}


class Verdict(NamedTuple):
    ok: bool
    reason: str = ""  # a REASONS key when not ok
    detail: str = ""


OK = Verdict(True)


def reject(reason: str, detail: str = "") -> Verdict:
    if reason not in REASONS:  # a programming error, caught by tests; never reaches users as an exception
        detail = f"(unknown reason code {reason!r}) {detail}"
        reason = "replacement_failed"
    return Verdict(False, reason, detail)


def first_failure(*checks: Callable[[], Verdict]) -> Verdict:
    """Run the checks in order (lazily: later ones may assume earlier ones held); the first rejection wins."""
    for check in checks:
        verdict = check()
        if not verdict.ok:
            return verdict
    return OK


# ---------------------------------------------------------------- runtime gates


def can_run_fusion(switch: str, bit_exact: bool, config: FusionConfig, env_disabled: Iterable[str],
                   deterministic: bool) -> Verdict:
    """Per-fusion config switch, then ``FP8_FUSION_DISABLE``, then deterministic mode (norm fusions only: they
    may move a value by one fp8 step; the silu fusion is bit-exact and stays on)."""
    if not getattr(config, switch, False):
        return reject("disabled_by_config", f"FusionConfig.{switch} is False")
    if switch in set(env_disabled):
        return reject("disabled_by_env", f"{ENV_DISABLE} lists {switch}")
    if deterministic and not bit_exact:
        return reject("deterministic_mode", "torch.are_deterministic_algorithms_enabled() is True and this fusion "
                      "is not bit-exact (reduction order, or a backend that skips the bf16 rounding, may move a value "
                      "by one fp8 step)")
    return OK


# Backends whose fused kernels reproduce the unfused ops' bf16 roundings, so a fusion declared bit-exact (silu)
# really is. aiter's fused kernels keep fp32 up to the fp8 cast (kernels/aiter.py docstring): on aiter no fusion
# is bit-exact, and deterministic mode keeps them all off.
BIT_EXACT_BACKENDS = ("reference", "triton")


def is_bit_exact(declared: bool, op: str, device: torch.device) -> bool:
    """``declared`` (the fusion table's promise) holds only on a backend that keeps the unfused roundings."""
    if not declared:
        return False
    from .kernels import backends

    try:
        return backends.backend_for(op, device) in BIT_EXACT_BACKENDS
    except Exception:  # noqa: BLE001 - no backend: can_run_kernel gives the reason; here, assume not exact
        return False


# ---------------------------------------------------------------- dtype, device, shape


def _dtype(v) -> torch.dtype | None:
    return v.dtype if isinstance(v, torch.Tensor) else None


def can_dtype(x, w=None, residual=None) -> Verdict:
    """Activations bf16; the norm weight and the residual in the activation dtype (fp32 weights crashed strict
    kernels in vLLM #44694)."""
    if _dtype(x) != torch.bfloat16:
        return reject("dtype_not_bf16", f"activation dtype is {_dtype(x)}")
    if residual is not None and _dtype(residual) != torch.bfloat16:
        return reject("dtype_not_bf16", f"residual dtype is {_dtype(residual)}")
    if w is not None and _dtype(w) != _dtype(x):
        return reject("weight_dtype_mismatch", f"norm weight is {_dtype(w)}, activation {_dtype(x)}")
    return OK


def can_run_kernel(op: str, device: torch.device) -> Verdict:
    """A fused kernel for ``op`` exists on ``device``: any backend on the CPU (the reference is the CPU's kernel),
    a real one on a GPU (the pure-torch reference there is many kernels: slower than Inductor's own fusion),
    unless the user explicitly asked for the reference."""
    from .kernels import backends

    try:
        name = backends.backend_for(op, device)
    except Exception as e:  # BackendUnavailable, or a backend that fails to import
        return reject("no_fused_kernel", f"{type(e).__name__}: {e}")
    if device.type != "cpu" and name == "reference" and backends.explicit_choice() != "reference":
        a = _arch.arch_of(device)
        return reject("no_fused_kernel", f"only the pure-torch reference implements {op} on {a.name}")
    return OK


def can_group_gemms(device: torch.device) -> Verdict:
    """``blockscale_mm_grouped`` runs on the backend that runs the separate ``blockscale_mm``s. On ROCm those are
    aiter's, which has no grouped kernel: the grouped op would fall to Triton's, measured on no AMD GPU."""
    return can_fuse_on_gemm_backend("blockscale_mm_grouped", "blockscale_mm", device)


def can_fuse_on_gemm_backend(fused_op: str, gemm_op: str, device: torch.device) -> Verdict:
    """The GEMM-based fused op ``fused_op`` runs on the backend that runs the GEMM op ``gemm_op`` it replaces (both
    ``fp8_fusion`` op names); otherwise the fused launch would be another backend's (on ROCm: Triton's instead of
    aiter's GEMM, measured on no AMD GPU)."""
    from .kernels import backends

    try:
        single, fused = (backends.backend_for(op, device) for op in (gemm_op, fused_op))
    except Exception as e:  # BackendUnavailable, or a backend that fails to import
        return reject("no_fused_kernel", f"{type(e).__name__}: {e}")
    if single != fused:
        return reject("no_fused_kernel", f"the GEMMs run on the {single} backend, which has no {fused_op} kernel "
                      f"(it would be {fused}'s)")  # fmt: skip
    return OK


# The GEMM-epilogue and grouped kernels are small-M (decode) kernels: kernels/triton/blockscale_mm.SMALL_M_MAX.
SMALL_M_MAX = 64


def can_small_m(rows, kernel: str) -> Verdict:
    """A static row count within the small-M kernels' ``SMALL_M_MAX`` (above it their ops would run the unfused
    GEMMs, for nothing); a symbolic one passes, and the op picks per call."""
    if isinstance(rows, int) and rows > SMALL_M_MAX:
        return reject("m_above_small_m", f"M={rows} is above the {kernel}'s {SMALL_M_MAX} rows")
    return OK


def can_fuse_gemm_epilogue(weights, scales) -> Verdict:
    """On Triton, the fused gate/up GEMM reads gate and up in place: a merged weight's halves must not share a
    128-row scale block, and gate and up must have one layout (fake tensors carry their strides)."""
    from .kernels import backends

    if backends.backend_for("blockscale_mm_silu_mul_group_quant", weights[0].device) != "triton":
        return OK  # the other backends compose the unfused ops
    from .kernels.triton import blockscale_mm_silu_quant as fused

    reason = fused.layout_unsupported(weights, scales)
    return OK if reason is None else reject("no_fused_kernel", f"the fused gate/up kernel cannot read them: {reason}")


def should_fuse_gemm_epilogue(q, x_scale, weights, out_dtype: torch.dtype, group_size: int) -> Verdict:
    """At a static M, the Triton fused gate/up GEMM + silu-quant has a measured config (its table has a row that
    prefers the fused launch, and the kernel takes the shape); other backends compose the same ops."""
    from .kernels import backends

    if backends.backend_for("blockscale_mm_silu_mul_group_quant", q.device) != "triton":
        return OK
    from .kernels.triton import blockscale_mm_silu_quant as fused

    m, k = q.shape
    i = sum(w.shape[0] for w in weights) // 2
    a = _arch.arch_of(q.device)
    if fused.fused_config(a, q.device.type, q.dtype, m, i, k, k // x_scale.shape[1], group_size, out_dtype) is None:
        why = ("measured no faster than the two launches (or its config does not fit the shape)"
               if fused.measured(a, m, i, k) else "never measured on this GPU, so not assumed faster")  # fmt: skip
        return reject("unfused_pair_faster", f"M={m}, I={i}, K={k} on {a.name}: the fused launch was {why} "
                      "(blockscale_mm_silu_quant.TABLE); the GEMM and the silu-quant stay two launches")
    return OK


def should_quant_in_gemm(x, w, out_dtype: torch.dtype, group_size: int) -> Verdict:
    """At a static M, the Triton GEMV that quantizes its own input has a measured win for this GEMM (its table
    says so, and ``blockscale_mm`` runs the GEMV there); other backends compose the same two ops."""
    from .kernels import backends

    if backends.backend_for("group_quant_blockscale_mm", x.device) != "triton" or not isinstance(x.shape[0], int):
        return OK
    from .kernels.triton import group_quant_blockscale_mm as fused

    (m, k), n = x.shape, w.shape[0]
    a = _arch.arch_of(x.device)
    if fused.fused_config(a, x.device.type, w.dtype, m, n, k, group_size, out_dtype) is None:
        why = ("measured no faster than the two launches"
               if fused.measured(a, m, n, k) else "never measured on this GPU, so not assumed faster")  # fmt: skip
        return reject("unfused_pair_faster", f"M={m}, N={n}, K={k} on {a.name}: the quantizing GEMV was {why} "
                      "(group_quant_blockscale_mm.TABLE); the quant stays its own launch")
    return OK


def should_fuse_norm_rope(cache_writes_join: bool) -> Verdict:
    """Inductor's ``combo_kernels`` merges its q / k RoPE and KV-cache-write kernels into one launch. Our RoPE launch
    beside the cache writes lost to that on the H200 (Qwen3-8B decode 1.5% slower: ``docs/benchmarks.md``, "The q / k
    norms and RoPE in one launch"); with the writes inside it (``rope_cache`` on, and k written into a static cache)
    it won there too (1.116 / 1.091x against 1.100 / 1.085x at batch 1 / 64, "RoPE and the KV-cache writes in one
    launch"). With Inductor's defaults our launch won either way."""
    from torch._inductor import config

    if getattr(config, "combo_kernels", False) and not cache_writes_join:
        return reject("unfused_pair_faster", "Inductor's combo_kernels is on and no KV-cache write joins the launch: "
                      "its combined RoPE / cache-write launch measured faster than ours beside the writes (H200)")
    return OK


# gqa_attention at one query token: the fewest batch rows x query heads (the heads the KV copy makes: B x Hkv x G)
# at which the grouped SDPA is taken. cuDNN runs the grouped form as one program per (batch row, kv head) pair, each
# streaming its L keys and values: about constant time until the GPU is full (H100, 1024 slots: 24.5-26.1 us from 1
# to 8 pairs), while the copy + per-head SDPA grows with the heads it makes: 6.7 us at 1 kv head x G = 4, 7.3 at
# 1 x 8, 14.8 at 2 x 4, 19.4 at 2 x 8, 21.2 at 4 x 4, then 31.1 at 4 x 8, 31.6 at 8 x 4, 52.7 at 8 x 8 (batch 1,
# benchmarks/gqa_tokens.py --kv-heads 1,2,4,8 --batches 1 --tokens 1): the grouped form 0.27-0.86x up to 16
# heads, 1.23-2.02x from 32. Both costs grow with the slots, so the bound holds across cache lengths (8 kv heads,
# G = 4, batch 1: 1.22x at 576 slots, 1.18x at 2048). The whole step at 32 (batch 1, 8 kv heads, G = 4; H100, HF
# form, 3 interleaved rounds of one run): Llama-3.1-8B 4.086 ms grouped vs 4.146 with the copy, Qwen3-8B 4.317 vs
# 4.396; at 64 (Qwen3-32B, G = 8) 13.519 vs 14.064 (docs/benchmarks.md, "Fewer than 32 copied heads at one token
# keep the copy"). H200, Qwen3-8B at 32: the attention kernels 16.3 vs 13.5 us per layer and the 2-layer step 0.4%
# faster grouped; from 64 up the kernels 1.2-5.4x faster ("Grouped-query attention at decode", where a whole-model
# comparison across two runs had set the bound at 16 pairs = 64 heads).
GQA_MIN_BATCH_HEADS = 32

# gqa_attention: the most query tokens per head a step may have (a decode step has one; one verifying draft tokens
# a few). Above one the mask is copied per group, B x Hq x S x L elements, against the 2 x B x Hq x L x D of the KV
# copy it saves (the bytes break even at S = 2 x D). H100, benchmarks/gqa_tokens.py (eager, cuDNN, 1024 slots, head
# dim 128, 8 kv heads), the grouped attention against copy + SDPA at 1-128 tokens: faster everywhere measured,
# 1.18-2.15x at batch 1, 1.54-24.3x at batch 8 / 32, the least at 128 tokens (1.34-1.59x) and falling with S
# (docs/benchmarks.md, "A step of several query tokens"). Above 128 (a prefill) nothing was measured: the copy stays.
GQA_MAX_QUERY_TOKENS = 128


def should_read_cache_grouped(batch, kv_heads: int, groups: int, tokens: int | None = 1) -> Verdict:
    """At one query token and a static batch, at least ``GQA_MIN_BATCH_HEADS`` batch rows x query heads (below, the
    grouped SDPA's few programs lose to the copy); a symbolic batch is taken (one graph serves every size, and the
    copy's cost grows with it; Dynamo compiles batch 1, the size that loses most, apart and static). With more
    tokens the per-head SDPA slows (cuDNN, H100: 30.7 -> 48.5 us from 1 to 2 tokens at batch 1, 8 kv heads, G = 4,
    1024 slots) and the grouped one was 1.34-2.15x faster at batch 1, 2-128 tokens (``benchmarks/gqa_tokens.py``),
    its output equal to the copy's, so there every batch is taken (``tokens`` None: a count marked dynamic, which
    Dynamo keeps at 2 or more)."""
    if tokens == 1 and isinstance(batch, int) and batch * kv_heads * groups < GQA_MIN_BATCH_HEADS:
        heads = kv_heads * groups
        return reject("kv_copy_faster", f"batch {batch} x {heads} query heads = {batch * heads} copied heads, under "
                      f"{GQA_MIN_BATCH_HEADS}, at one token: the grouped SDPA's {batch * kv_heads} programs measured "
                      "slower than the copy (guards.GQA_MIN_BATCH_HEADS)")
    return OK


def can_eps(eps) -> Verdict:
    """eps is a number when the graph is compiled (the fused ops take it as a float). Under ``dynamic=True``
    Dynamo lifts Python floats into runtime graph inputs; then the norm stays unfused."""
    if isinstance(eps, (int, float)) and not isinstance(eps, bool):
        return OK
    return reject("eps_graph_input", f"eps is {getattr(eps, 'name', eps)}, a runtime value (dynamic=True lifts "
                  "Python floats); use fp8_fusion_pass.fuse(model, dynamic=True) or "
                  "torch._dynamo.config.specialize_float=True")


def can_group(k, group_size: int, group_sizes: Iterable[int]) -> Verdict:
    """K static, the group size configured, and K a multiple of it."""
    if not isinstance(k, int):
        return reject("k_dynamic", f"K = {k} is symbolic")
    if group_size not in tuple(group_sizes):
        return reject("group_size_not_configured", f"group size {group_size} not in {tuple(group_sizes)}")
    if k % group_size:
        return reject("k_not_multiple_of_group", f"K = {k} is not a multiple of {group_size}")
    return OK


def can_layout(**tensors) -> Verdict:
    """Every named tensor is contiguous in its last dim (the fused ops read rows with stride 1)."""
    for name, v in tensors.items():
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            continue
        if v.shape[-1] != 1 and not statically_known_true(v.stride(-1) == 1):
            return reject("last_dim_not_contiguous", f"{name} has strides {tuple(v.stride())}")
    return OK


# ---------------------------------------------------------------- graph structure (over summaries)


def can_feed_gemms(bad_consumers: list[str]) -> Verdict:
    """The quant's q and scale feed only block-scale GEMMs (``_graph.quant_consumers`` lists the others)."""
    if bad_consumers:
        return reject("consumer_not_blockscale_mm", "; ".join(bad_consumers))
    return OK


def can_own_output(other_consumers: list[str], quants: int) -> Verdict:
    """The producer's output goes to this one quant only: another quant (not collapsed) or a bf16 consumer would
    need the unquantized output, which the fused ops do not return."""
    if quants > 1:
        return reject("multiple_quants", f"output feeds {quants} group_quants (is dedup_quant on? group sizes "
                      "or shapes differ?)")
    if other_consumers:
        return reject("extra_consumer", "output also feeds " + ", ".join(other_consumers))
    return OK


# ---------------------------------------------------------------- profit


def should_fuse_small_m(arch_name: str, m, gemms: Iterable[tuple[int, int]]) -> Verdict:
    """The per-arch small-M table (``kernels/small_m.py``, owned by the AMD path): where a consumer GEMM is
    faster fed bf16 at this M, leave the norm unfused. A symbolic M never matches (deciding would need a shape
    guard); a missing table means no entry."""
    prefers = _small_m_table()
    if prefers is None:
        return OK
    for n, k in gemms:
        if isinstance(m, int) and prefers(arch_name, m, n, k):
            return reject("small_m_prefers_bf16", f"{arch_name}: GEMM N={n} K={k} at M={m} is faster fed bf16")
    return OK


def _small_m_table():
    try:
        from .kernels.small_m import prefers_bf16_input
    except ImportError:  # the AMD engineer's table not installed: no entry anywhere
        return None
    return prefers_bf16_input


def static_rows(x) -> int | None:
    """M = numel / K of an activation when every dim is static, else None."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return None
    m = 1
    for s in x.shape[:-1]:
        if not isinstance(s, int):
            return None
        m *= s
    return m
