"""Random decode steps for the fuzz tests: a model from ``fuzz_models``, a static KV cache full of random keys and
values, 1-3 tokens per batch row at random positions, and the attention rewrites the pass must apply to it (an
oracle written from the guards' rules in DESIGN.md / docs/guards.md, independent of the pass's code).

The engine form (``models.engine``) writes each row's token at its own position (``index_put_``) and attends in
plain torch (``decode_attention``'s candidate); the HF form uses transformers' ``StaticCache`` (one position for
every row, ``index_copy_``) and SDPA over ``repeat_kv`` copies (``gqa_attention``'s candidate).

Dynamic shapes, as users get them: ``static``; ``batch`` (the batch dim of the ids, positions and caches marked
dynamic, as an engine serving any batch does; HF: of the ids and the StaticCache's tensors); ``tokens`` (the token
dim of the ids and positions marked dynamic, HF: of the ids and ``cache_position``, with or without ``max=``, as a
loop verifying a varying number of draft tokens per step does); ``both`` (the two); ``all`` (``dynamic=True``
with floats kept constant, what ``fp8_fusion_pass.fuse(model, dynamic=True)`` compiles: every input size symbolic
until a guard fixes it)."""

from __future__ import annotations

import copy
import dataclasses

import torch
from fuzz_models import BLOCK, VOCAB, DecoderSpec, build
from hypothesis import strategies as st

from fp8_fusion_pass import guards, verify
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.kernels import attention_ops
from fp8_fusion_pass.models import engine
from fp8_fusion_pass.models.decode_inputs import DecodeStep, static_cache
from fp8_fusion_pass.patterns import _decode_tokens, decode_attention, rope_attention

HALF = ("bf16", "fp16")
# Inputs: fresh random tokens (weighted), or one of verify's pathologies in a token's embedding row: NaN in batch row
# 0 and inf in the last (the other rows must stay finite: no kernel may mix rows), every other row zero, x1e4.
CASES = ("random-1", "random-1", "random-2", "nan", "inf", "zero-rows", "large", "outlier")
# The decode-time rewrites a user may switch off, one by one or together (the rewrites after them must cope)
SWITCHES = ("decode_attention", "norm_rope", "qk_rope", "rope_cache", "rope_attention", "gqa_attention", "quant_gemm",
            "gemm_silu_quant", "group_gemm", "inline_norm")
switched_off = st.lists(st.sampled_from(SWITCHES), min_size=1, max_size=3, unique=True)  # a third of the steps
# The models' FP8 scheme: mostly block (every fusion has a site); 1 in 4 per tensor, whose o_proj quant no attention
# launch can fold (the token form without the quant) and whose scale buffers are zero fills to strip
SCHEMES = ("block", "block", "block", "per-tensor")


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    model: DecoderSpec  # its shapes are unused: the step's are below
    batch: int
    cache_len: int
    steps: int  # decode steps, each ``tokens`` positions further
    dynamic: str  # "static" | "batch" | "tokens" | "both" (batch and tokens marked) | "all"
    seed: int = 0
    case: str = "random-1"  # verify.CASES: the input, or a pathology written into one token's embedding row
    tokens: int = 1  # per row and step: 1 is decode; 2-3 a speculative-decoding check or a prefill chunk
    disabled: tuple[str, ...] = ()  # FusionConfig switches turned off (FP8_FUSION_DISABLE): the rest must cope
    token_max: int = 0  # a marked token dim's max= (0: none, the token count unbounded)

    @property
    def marks_batch(self) -> bool:
        return self.dynamic in ("batch", "both")

    @property
    def marks_tokens(self) -> bool:
        return self.dynamic in ("tokens", "both")

    @property
    def config(self) -> FusionConfig:
        return FusionConfig(**{name: False for name in self.disabled})

    @property
    def span(self) -> int:
        """Cache slots the steps write per row."""
        return self.steps * self.tokens

    @property
    def groups(self) -> int:
        return self.model.heads // self.model.kv_heads

    def short(self) -> str:
        return (f"{self.model.short()} | decode batch={self.batch} T={self.cache_len} steps={self.steps} "
                f"tokens={self.tokens} {self.dynamic}{self.token_max or ''} {self.case} "
                f"off={','.join(self.disabled) or '-'}")


@st.composite
def decode_specs(draw, forms=("engine", "hf")) -> DecodeSpec:
    form = draw(st.sampled_from(forms))
    family = draw(st.sampled_from(("qwen3", "llama", "qwen2")))
    # head dims the fused kernels take (powers of two from 16) and ones they do not (48, 96)
    head_dim = draw(st.sampled_from((16, 32, 48, 64, 64, 96, 128, 128)))
    kv_heads = draw(st.sampled_from((1, 2, 2, 3, 4)))
    groups = draw(st.sampled_from((1, 2, 2, 4, 8, 17)))  # 17: above decode_attention.MAX_ROWS
    heads = kv_heads * groups
    hidden = heads * head_dim if family == "qwen2" else draw(st.sampled_from((128, 192, 256, 256)))
    hidden = -(-hidden // heads) * heads  # transformers wants a multiple of the heads (then maybe not of 128)
    if family == "qwen2" and hidden > 1024:  # Qwen2 derives head_dim from hidden / heads: keep the model small
        heads, groups = kv_heads, 1
        hidden = heads * head_dim
    model = DecoderSpec(
        family=family, form=form, hidden=hidden, inter=draw(st.sampled_from((128, 256, 384))), heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, layers=draw(st.integers(1, 2)),
        eps=draw(st.sampled_from((1e-6, 1e-5))), attn_bias=family == "qwen2" or draw(st.booleans()),
        mlp_bias=family == "llama" and draw(st.booleans()), dtype=draw(st.sampled_from(("bf16", "bf16", "fp16"))),
        dynamic=False, specialize_float=False, shapes=((1, 1),), seed=draw(st.integers(0, 2**16)),
        scheme=draw(st.sampled_from(SCHEMES)),
    )  # fmt: skip
    modes = ("static", "batch", "tokens", "both", "all")
    dynamic = draw(st.sampled_from(modes))
    batch = draw(st.sampled_from((1, 2, 3, 5, 8, 16, 20)))
    steps, tokens = draw(st.integers(1, 2)), draw(st.sampled_from((1, 1, 1, 2, 3)))
    # Dynamo refuses a dynamic dim of size 1 (it specializes 0 / 1): such a dim is left unmarked
    if batch == 1 and dynamic in ("batch", "both"):
        dynamic = {"batch": "static", "both": "tokens"}[dynamic]
    if tokens == 1 and dynamic in ("tokens", "both"):
        dynamic = {"tokens": "static", "both": "batch"}[dynamic]
    token_max = draw(st.sampled_from((0, 3, 8))) if dynamic in ("tokens", "both") else 0
    return DecodeSpec(model, batch=batch, cache_len=draw(st.integers(max(4, steps * tokens), 40)), steps=steps,
                      dynamic=dynamic, seed=draw(st.integers(0, 2**16)), case=draw(st.sampled_from(CASES)),
                      tokens=tokens, token_max=token_max,
                      disabled=tuple(sorted(draw(st.one_of(st.just(()), st.just(()), switched_off)))))


# ---------------------------------------------------------------- the model, its cache and its steps


@dataclasses.dataclass
class Exact:
    logits: torch.Tensor
    caches: list  # k then v per layer, as DecodeRun.tensors


class DecodeRun:
    """A built model, its cache (random contents, as after a prefill), and ``spec.steps`` steps over it."""

    def __init__(self, spec: DecodeSpec) -> None:
        if spec.cache_len < spec.span:
            raise ValueError(f"{spec.steps} steps of {spec.tokens} tokens need {spec.span} slots, the cache has "
                             f"{spec.cache_len}")
        self.spec = spec
        self.model = build(spec.model)
        gen = torch.Generator().manual_seed(spec.seed)
        b, t = spec.batch, spec.cache_len
        if spec.model.form == "engine":
            self.cache = self.model.new_kv_cache(b, t)
            self.tensors = self.cache.k + self.cache.v
            # a position per row, the first token's; every later token one further (0 and the last slots often)
            first = torch.randint(0, t - spec.span + 1, (b,), generator=gen)
            first[torch.rand(b, generator=gen) < 0.2] = 0
            first[torch.rand(b, generator=gen) < 0.2] = t - spec.span
            self.first = first
        else:
            self.cache, self.tensors = static_cache(self.model, b, t)
            self.first = torch.full((b,), int(torch.randint(0, t - spec.span + 1, (), generator=gen)))
        for i, c in enumerate(self.tensors):
            c.copy_(torch.randn(c.shape, generator=torch.Generator().manual_seed(spec.seed + i)))
        self.ids = [torch.randint(0, VOCAB, (b, spec.tokens), generator=gen) for _ in range(spec.steps)]

    def run_step(self, fn, i: int) -> tuple[list[torch.Tensor], Exact | None]:
        """Step ``i`` through ``fn`` (the compiled model) under the spec's input case; returns, per layer and cache
        (k then v), a bool mask of the cache slots the step writes, and (engine form) the step run eagerly with
        exact attention from the same cache."""
        b, t, n = self.spec.batch, self.spec.cache_len, self.spec.tokens
        positions = (self.first + i * n).view(b, 1) + torch.arange(n)  # [B, n]
        written = torch.zeros(b, 1, t, 1, dtype=torch.bool)
        written[torch.arange(b).view(b, 1), 0, positions, 0] = True
        with verify_cases()[self.spec.case].apply(self.model, (self.ids[i].clone(),)) as (ids,):
            engine_form = self.spec.model.form == "engine"
            exact = self._exact(ids, positions) if engine_form else None
            DecodeStep(ids, positions, self.cache, engine_form).run(fn, mark=self._mark)  # HF: positions[0]
        return [written.expand(c.shape) for c in self.tensors], exact

    def _mark(self, ids, positions) -> None:
        """The spec's dims marked dynamic on what the model gets: ids [B, S]; the engine's positions [B, S], HF's
        cache_position [S]."""
        bound = {"min": 2, "max": self.spec.token_max} if self.spec.token_max else {}
        for x in (ids, positions):
            if self.spec.marks_batch and x.dim() == 2:
                torch._dynamo.mark_dynamic(x, 0)
            if self.spec.marks_tokens:
                torch._dynamo.mark_dynamic(x, x.dim() - 1, **bound)

    def _exact(self, ids, positions) -> Exact:
        """The engine step run eagerly on copies of the caches, its attention in fp32 throughout (``engine``'s
        "fp32"): what ``decode_attention``'s numerics are held to, where the plain graph rounds scores and
        probabilities to bf16 (tests/patterns/test_pass_gpu.py compares the same way)."""
        cache = copy.copy(self.cache)
        cache.k, cache.v = [t.clone() for t in self.cache.k], [t.clone() for t in self.cache.v]
        with torch.no_grad(), engine.attention_impl("fp32"):
            logits = self.model(ids, positions, cache)
        return Exact(logits, cache.k + cache.v)

    def mark_cache_dynamic(self) -> None:
        if self.spec.marks_batch:
            for c in self.tensors:
                torch._dynamo.mark_dynamic(c, 0)


def verify_cases() -> dict:
    return {c.name: c for c in verify.CASES}


# ---------------------------------------------------------------- the oracle


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


@dataclasses.dataclass
class Expected:
    counts: dict  # rewrite -> report count (each layer once)
    candidates: set  # rewrites with a candidate in the graph: each one not applied is rejected, per layer
    either: set  # rewrites that may apply or be rejected (a size Dynamo may or may not have made static)


def expected_attention_counts(spec: DecodeSpec) -> Expected:
    """The attention rewrites the pass must apply to a decode step of ``spec`` (report counts, each layer once), and
    the rewrites that have a candidate in its graph (each one not applied must be rejected, with a reason, per layer):

    - the RoPE op (``norm_rope`` with Qwen3's q / k norms, else ``qk_rope``): bf16, a power-of-two head dim; a
      candidate in every graph;
    - ``rope_cache``: wherever the RoPE op is (k and v written at the same slots of their static caches); the batch
      may be symbolic;
    engine form (attention in plain torch)
    - ``decode_attention``: q / k / v one half dtype (else no candidate: nothing is rounded to a half dtype), at most
      ``MAX_ROWS`` query rows per kv head (G heads x the step's tokens; static: under ``dynamic=True`` a
      token count above one is symbolic, and a marked one always), head dim at most the kernel's; the batch and the
      cache length may be symbolic, heads never are (a kv-head count Dynamo fixed by a guard is static);
    - ``rope_attention``: both of the above, one token per step or the token form (``token_form``) of at most
      ``MAX_TOKEN_ROWS`` rows per kv head (``MAX_NORM_TOKEN_ROWS`` with q / k norms), a power-of-two head dim of at
      least 16, and with q / k norms a batch x kv heads known to be at most ``MAX_NORM_PAIRS``;
    HF form (SDPA over ``repeat_kv`` copies)
    - ``gqa_attention``: G > 1 (at G = 1 there is no copy: no candidate), at most ``GQA_MAX_QUERY_TOKENS`` tokens per
      step, static or marked with a ``max=`` (under ``dynamic=True``, or marked without one, a count above one is
      symbolic and unbounded: rejected, unless duck sizing tied it to a static size), and at one token a batch x
      query heads of at least ``GQA_MIN_BATCH_HEADS`` or a symbolic batch; the cache length may be symbolic.
    """
    m, layers = spec.model, spec.model.layers
    d, bf16 = m.head_dim, m.dtype == "bf16"
    rope_name = "norm_rope" if m.family == "qwen3" else "qk_rope"
    off = set(spec.disabled)  # a rewrite switched off applies nowhere and needs no rejection per site
    rope = bf16 and _pow2(d) and d <= 1024 and rope_name not in off
    # Dynamo specializes a size of 1; under dynamic=True a batch equal to the kv heads or the head dim shares their
    # symbol (duck sizing), which the model's views by its config fix to a number: a static batch after all
    tied = spec.dynamic == "all" and spec.batch in (m.kv_heads, m.head_dim)
    symbolic_batch = spec.dynamic in ("batch", "both", "all") and spec.batch > 1 and not tied
    # a marked token count is never specialized (a spec with 1 token is static); the attention takes it where its
    # mark's max= keeps the rows within the kernel's tile
    rows = spec.groups * (spec.token_max if spec.marks_tokens else spec.tokens)
    unbounded_tokens = spec.marks_tokens and not spec.token_max
    out, candidates, either = {}, {rope_name} - off, set()
    if m.form == "hf" and m.family == "qwen3" and not bf16:
        # HF's q / k norms in another dtype are rejected by the first norm matcher (norm_quant, dtype_not_bf16)
        # before norm_rope sees them; fuzz_harness.unexplained checks that every norm left is named
        candidates.discard(rope_name)
    if rope:
        out[rope_name] = layers
        if "rope_cache" not in off:
            out["rope_cache"] = layers
            candidates.add("rope_cache")
    if m.form == "hf":
        if spec.groups > 1 and "gqa_attention" not in off:
            candidates.add("gqa_attention")
            heads_ok = (symbolic_batch or spec.tokens > 1
                        or spec.batch * m.kv_heads * spec.groups >= guards.GQA_MIN_BATCH_HEADS)
            if spec.tokens <= guards.GQA_MAX_QUERY_TOKENS and heads_ok and not unbounded_tokens:
                if spec.tokens == 1 or spec.dynamic != "all":
                    out["gqa_attention"] = layers
                else:  # symbolic (query_too_long) unless duck sizing made it a static size it equals
                    return Expected(out, candidates, {"gqa_attention"})
        return Expected(out, candidates, set())
    if m.dtype in HALF and "decode_attention" not in off:
        candidates.add("decode_attention")
        # the token form has its own bound on the rows (_decode_tokens.MAX_ROWS)
        most = max(decode_attention.MAX_ROWS, _decode_tokens.MAX_ROWS if token_form(spec) else 0)
        if rows <= most and d <= attention_ops.ATTENTION_MAX_HEAD_DIM and not unbounded_tokens:
            out["decode_attention"] = layers
        if spec.tokens > 1 and spec.dynamic == "all":  # the token count is symbolic (rows: kv_heads_dynamic) unless
            either.add("decode_attention")  # duck sizing made it a static size it equals (3 tokens, 3 heads)
    if "decode_attention" in out and "rope_cache" in out and "rope_attention" not in off:
        candidates.add("rope_attention")
        pairs_ok = m.family != "qwen3" or (not symbolic_batch and spec.batch * m.kv_heads
                                           <= rope_attention.MAX_NORM_PAIRS)  # fmt: skip
        most_rows = rope_attention.MAX_NORM_TOKEN_ROWS if m.family == "qwen3" else rope_attention.MAX_TOKEN_ROWS
        rows_ok = spec.tokens == 1 or (token_form(spec) and rows <= most_rows)
        if rows_ok and d >= 16 and pairs_ok:
            out["rope_attention"] = layers
    if "decode_attention" in either:
        either.add("rope_attention")  # a candidate only where the attention was taken
    return Expected(out, candidates, either)


def token_form(spec: DecodeSpec) -> bool:
    """An engine step of a static S > 1 tokens: where ``decode_attention`` takes it, it is the token form, the
    copies of q and of the output and the mask gone (``patterns/_decode_tokens.py``); ``quantized_token_form`` says
    which of its two ops."""
    return spec.model.form == "engine" and spec.tokens > 1 and spec.dynamic in ("static", "batch")


def heads_fold_the_quant(spec: DecodeSpec) -> bool:
    """A block-FP8 o_proj (its N, the hidden size, a multiple of 128 too: else it stays bf16 and reads no quant), heads
    a power of two wide and whole 128-wide quant groups (the o_proj's input quant): the token form is
    ``decode_attention_tokens_quant``, the quant launch gone too; else ``decode_attention_tokens``, the output in
    q's dtype and the quant, if any, its own launch (a per-tensor quant's one scale spans the whole tensor: no launch
    per head can compute it)."""
    m = spec.model
    return m.scheme == "block" and m.hidden % BLOCK == 0 and m.head_dim % BLOCK == 0 and _pow2(m.head_dim)


ATTENTION_REWRITES = ("decode_attention", "norm_rope", "qk_rope", "rope_cache", "rope_attention", "gqa_attention")
