"""Build models by preset name: Hugging Face form (``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` ...) or engine form.

Real shapes must build without holding the whole bf16 model: Llama-3.1-70B is 141 GB in bf16 (more than one
H200's 139 GiB) but 71 GB in block-FP8. So the model is constructed on the meta device, then materialized one
decoder layer at a time on the target device, given seeded random weights, and quantized before the next layer
is materialized: peak memory = the quantized model + one bf16 layer (1.7 GB for 70B).

No hub access: the config comes from ``presets.py`` and the model class is instantiated directly, with
``HF_HUB_OFFLINE=1`` set while transformers runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from .. import quantize as q
from .presets import get_preset

FORMS = ("hf", "engine")
SCHEMES = ("block", "per-tensor", "bf16")

# family -> (config class, causal LM class) in transformers
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}

# Random init: HF's initializer_range for linears and embeddings; norm weights 1 + N(0, 0.1) instead of HF's
# ones, so that a swapped q_norm / k_norm or input / post-attention norm changes the output and tests see it.
INIT_STD = 0.02
NORM_NOISE = 0.1
# Linear weights get a log-normal magnitude per output row and per input column (exp(N(0, 0.5^2)), variance
# kept at INIT_STD^2), as trained weights have outlier channels. With iid weights every 128x128 block has the
# same amax within ~10%, so a scale applied to the wrong block would go unnoticed; with this spread block scales
# differ up to ~10x and a misplaced scale is a visible error.
CHANNEL_LOG_STD = 0.5


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Belt and braces around transformers calls: the guarantee is that we never call a hub API (no
    ``from_pretrained``, no ``kernelize``); the env vars make a hub call fail fast should one slip in, for a
    huggingface_hub imported after this point (it reads them once, at import)."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _transformers_class(family: str, which: int):
    try:
        names = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unsupported model family {family!r}; supported: {', '.join(FAMILIES)}") from None
    with hub_offline():
        return getattr(importlib.import_module("transformers"), names[which])


def family_of_model_type(model_type: str) -> str:
    for family, mt in MODEL_TYPES.items():
        if mt == model_type:
            return family
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(MODEL_TYPES.values())}")


def hf_config(name: str, layers: int | None = None):
    """The transformers config of preset ``name`` (``layers`` overrides the layer count)."""
    preset = get_preset(name)
    kwargs = dict(preset.config)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        kwargs["num_hidden_layers"] = layers
    config = _transformers_class(preset.family, 0)(**kwargs)
    config.use_cache = False  # no DynamicCache in compiled graphs; the engine form has its own static cache
    return config


def hf_on_meta(config, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """An HF causal LM for ``config`` with every tensor on the meta device (no memory, no init cost)."""
    family = family_of_model_type(config.model_type)
    cls = _transformers_class(family, 1)
    with hub_offline(), torch.device("meta"):
        model = cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def _is_norm(mod: nn.Module) -> bool:
    return type(mod).__name__.endswith("RMSNorm")


def _init_(mod: nn.Module, gen: torch.Generator | None) -> None:
    """Seeded random values for the tensors a module owns itself (not its children)."""
    if gen is None:  # meta: nothing to fill
        return
    with torch.no_grad():
        for name, p in mod.named_parameters(recurse=False):
            if _is_norm(mod):
                p.normal_(0.0, NORM_NOISE, generator=gen).add_(1.0)
                continue
            if not (isinstance(mod, nn.Linear) and name == "weight"):
                p.normal_(0.0, INIT_STD, generator=gen)
                continue
            # fp32 arithmetic: a broadcast bf16 mul_ is ~10x slower on the CPU
            w = torch.empty(p.shape, device=p.device, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
            rows, cols = (_channel_factors(n, p.device, gen) for n in p.shape)
            p.copy_(w.mul_(rows[:, None]).mul_(cols[None, :]))


def _channel_factors(n: int, device, gen) -> torch.Tensor:
    f = torch.empty(n, device=device, dtype=torch.float32).normal_(0.0, CHANNEL_LOG_STD, generator=gen)
    return (f - CHANNEL_LOG_STD**2).exp()  # E[exp(2 * (N(0, s^2) - s^2))] = 1: the variance is kept


def _materialize(mod: nn.Module, device: torch.device, gen, recurse: bool) -> None:
    mods = list(mod.modules()) if recurse else [mod]
    for m in mods:
        if next(m.parameters(recurse=False), None) is None:
            continue
        m.to_empty(device=device, recurse=False)
        _init_(m, gen)


def _rebuild_rotary(model: nn.Module, device: torch.device) -> None:
    # inv_freq is a non-persistent buffer computed in __init__; on meta it holds no values, so rebuild it.
    for name, mod in list(model.named_modules()):
        if type(mod).__name__.endswith("RotaryEmbedding"):
            parent_name, _, child = name.rpartition(".")
            with torch.device(device):
                fresh = type(mod)(config=mod.config)
            setattr(model.get_submodule(parent_name) if parent_name else model, child, fresh)


def _quantizer(scheme: str, skip):
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    return None if scheme == "bf16" else (lambda m: q.convert_linears(m, scheme, skip))


def materialize_hf(
    model: nn.Module, device, scheme: str = "bf16", seed: int = 0, skip=("lm_head",)
) -> q.QuantizeSummary | None:
    """Give a meta-device HF model seeded random weights on ``device``, quantizing layer by layer."""
    device = torch.device(device)
    quantize = _quantizer(scheme, skip)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
    summary = q.QuantizeSummary(scheme) if quantize else None
    layers = model.model.layers
    for i, layer in enumerate(layers):
        _materialize(layer, device, gen, recurse=True)
        if quantize:
            summary.merge(quantize(layer), prefix=f"model.layers.{i}.")
    in_layers = {id(m) for m in layers.modules()}
    for m in model.modules():
        if id(m) not in in_layers:
            _materialize(m, device, gen, recurse=False)
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    _rebuild_rotary(model, device)
    if quantize:
        # Linears outside the decoder layers (lm_head): converted or listed as skipped like any other.
        top = nn.Module()
        top.lm_head = model.lm_head
        summary.merge(quantize(top))
        model.lm_head = top.lm_head
    return summary


def build_hf(name: str, scheme: str = "bf16", layers: int | None = None, dtype=torch.bfloat16, device="cpu",
             seed: int = 0) -> nn.Module:
    model = hf_on_meta(hf_config(name, layers), dtype)
    model.quantize_summary = materialize_hf(model, device, scheme, seed)
    model.requires_grad_(False)
    return model


def build_model(
    name: str,
    form: str = "hf",
    scheme: str = "block",
    layers: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> nn.Module:
    """A model by preset name with seeded random weights, in eval mode with gradients off.

    ``form``: "hf" (transformers ``*ForCausalLM``, sdpa attention, ``use_cache=False``) or "engine"
    (``models.engine``: our ops, merged qkv / gate_up, optional static KV cache).
    ``scheme``: "block" (1x128 / 128x128 FP8), "per-tensor" (one scale per tensor) or "bf16".
    The same name, seed, layers and scheme give the same weights in both forms (the engine form is converted
    from the HF one), except per-tensor: its engine form quantizes the merged bf16 weights.
    The conversion summary is attached as ``model.quantize_summary`` (None for bf16).
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    _quantizer(scheme, ())  # validates scheme
    get_preset(name)  # validates name before any work
    if form == "hf":
        return build_hf(name, scheme, layers, dtype, device, seed)
    from .engine import engine_from_hf

    hf_scheme = "bf16" if scheme == "per-tensor" else scheme
    hf = build_hf(name, hf_scheme, layers, dtype, device, seed)
    engine = engine_from_hf(hf, consume=True)
    engine.quantize_summary = hf.quantize_summary
    if scheme == "per-tensor":
        engine.quantize_summary = q.quantize_fp8_per_tensor(engine)
    return engine.eval().requires_grad_(False)


def example_inputs(model_or_name, batch: int = 2, seq: int = 8, device=None, seed: int = 0) -> tuple:
    """Positional inputs for ``model(*inputs)``: ``(input_ids,)`` for HF models and preset names,
    ``(input_ids, positions)`` for engine models. Token ids are seeded, so calls repeat."""
    if isinstance(model_or_name, str):
        vocab, engine = get_preset(model_or_name).config["vocab_size"], False
    else:
        vocab = model_or_name.config.vocab_size
        engine = not hasattr(model_or_name, "generate")
        if device is None:
            device = next(model_or_name.buffers(), next(model_or_name.parameters())).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device or "cpu")
    if not engine:
        return (ids,)
    positions = torch.arange(seq, device=ids.device).unsqueeze(0).expand(batch, seq)
    return ids, positions
