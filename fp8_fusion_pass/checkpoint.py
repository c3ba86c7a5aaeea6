"""Block-FP8 checkpoints in the published Qwen3-FP8 / DeepSeek-V3 layout, loaded into our modules.

Layout (``../shared/research/kernels.md`` §4.1):
- ``config.json`` with ``quantization_config: {quant_method: "fp8", weight_block_size: [128, 128],
  activation_scheme: "dynamic", fmt: "e4m3"}``;
- ``*.safetensors`` with ``<linear>.weight`` F8_E4M3 ``[N, K]`` and ``<linear>.weight_scale_inv``
  ``[ceil(N/128), ceil(K/128)]``: bf16 in Qwen3 checkpoints, fp32 in DeepSeek-V3. Loading casts scales to fp32.

transformers' own FineGrainedFP8 path is not used: from 5.4 on it fetches its kernels from the HF hub at run
time, which cannot work offline. The model is built from the config on the meta device (hub access switched
off), every linear that has a ``weight_scale_inv`` becomes a ``BlockFP8Linear``, and each module is
materialized and filled straight from the safetensors, so no bf16 copy of a quantized weight ever exists.
On gfx942 the e4m3fn weights are re-encoded as e4m3fnuz (``quantize.e4m3fn_to_e4m3fnuz``, scales doubled).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from . import arch
from . import quantize as q

CONFIG = "config.json"
REQUIRED_QUANT_FIELDS = ("quant_method", "weight_block_size", "activation_scheme")


def _quant_config(raw: dict, where: Path) -> dict:
    qc = raw.get("quantization_config") or {}
    if not qc:
        raise ValueError(f"{where}: no quantization_config; expected a block-FP8 checkpoint "
                         "(quant_method fp8, weight_block_size [128, 128], activation_scheme dynamic)")
    missing = [f for f in REQUIRED_QUANT_FIELDS if f not in qc]
    if missing:
        raise ValueError(f"{where}: quantization_config is missing {', '.join(missing)}")
    if qc["quant_method"] != "fp8":
        raise ValueError(f"{where}: quant_method must be 'fp8', got {qc['quant_method']!r}")
    if list(qc["weight_block_size"] or []) != list(q.BLOCK):
        raise ValueError(f"{where}: weight_block_size must be {list(q.BLOCK)} (the kernels' weight block), "
                         f"got {qc['weight_block_size']!r}")
    if qc["activation_scheme"] != "dynamic":
        raise ValueError(f"{where}: activation_scheme must be 'dynamic', got {qc['activation_scheme']!r}")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"{where}: fmt must be 'e4m3', got {qc['fmt']!r}")
    return qc


def _tensor_index(path: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Tensor name -> safetensors file holding it (single file or sharded), and -> dtype ("F8_E4M3", "BF16"...),
    read from the headers without loading any tensor."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file")
    index, dtypes = {}, {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names = st.keys()  # safe_open handles are not iterable
            for k in names:
                index[k], dtypes[k] = f, st.get_slice(k).get_dtype()
    return index, dtypes


class _Reader:
    """Reads tensors on demand, keeping one open handle per shard."""

    def __init__(self, index: dict[str, Path]) -> None:
        self.index, self._open = index, {}

    def get(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        f = self.index[key]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt")
        return self._open[f].get_tensor(key)


def _swap_in_fp8(model: nn.Module, keys, dtype, fp8_dtype) -> q.QuantizeSummary:
    summary = q.QuantizeSummary("block-fp8 checkpoint")
    for name, lin in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]:
        if f"{name}.weight_scale_inv" not in keys:
            summary.skipped[name] = "stored unquantized in the checkpoint (no weight_scale_inv)"
            continue
        new = q.BlockFP8Linear(lin.in_features, lin.out_features, lin.bias is not None, fp8_dtype=fp8_dtype,
                               device="meta", dtype=dtype)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        summary.converted.append(name)
    return summary


def _check_fp8_pairs(model: nn.Module, dtypes: dict[str, str]) -> None:
    for name, mod in model.named_modules():
        fp8 = dtypes.get(f"{name}.weight") == "F8_E4M3"
        if isinstance(mod, nn.Linear) and fp8 and f"{name}.weight_scale_inv" not in dtypes:
            raise ValueError(f"checkpoint stores {name}.weight in fp8 but has no {name}.weight_scale_inv")


def _load_module(mod: nn.Module, prefix: str, reader: _Reader, device, dtype, fp8_dtype, used: set) -> None:
    """Materialize ``mod``'s own tensors on ``device`` and fill them from the checkpoint."""
    names = [n for n, _ in mod.named_parameters(recurse=False)]
    names += [n for n, _ in mod.named_buffers(recurse=False) if n not in mod._non_persistent_buffers_set]
    if not names:
        return
    mod.to_empty(device=device, recurse=False)
    loaded = {}
    for n in names:
        key = prefix + n
        if key not in reader.index:
            raise ValueError(f"checkpoint is missing tensor {key!r}")
        loaded[n] = reader.get(key)
        used.add(key)
    if isinstance(mod, q.BlockFP8Linear):
        w, s = loaded["weight"], loaded["weight_scale_inv"].to(torch.float32)
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"{prefix}weight must be F8_E4M3 (float8_e4m3fn), got {w.dtype}")
        want = tuple(mod.weight_scale_inv.shape)
        if tuple(s.shape) != want:
            raise ValueError(f"{prefix}weight_scale_inv must be [ceil(N/128), ceil(K/128)] = {list(want)} for "
                             f"weight {list(w.shape)}, got {list(s.shape)}")
        if fp8_dtype == torch.float8_e4m3fnuz:
            w, s = q.e4m3fn_to_e4m3fnuz(w, s)
        loaded["weight"], loaded["weight_scale_inv"] = w, s
    with torch.no_grad():
        for n, t in loaded.items():
            target = getattr(mod, n)
            if tuple(t.shape) != tuple(target.shape):
                raise ValueError(f"{prefix}{n}: checkpoint shape {list(t.shape)} != model shape {list(target.shape)}")
            target.copy_(t)  # casts bf16 / fp32 tensors to the model dtype


def load_fp8_checkpoint(
    path: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    form: str = "hf",
) -> nn.Module:
    """Load a block-FP8 checkpoint directory into an HF-form (or engine-form) model with ``BlockFP8Linear`` s.

    Never contacts the hub. The conversion summary is attached as ``model.quantize_summary``.
    """
    from .models.build import FORMS, _rebuild_rotary, _transformers_class, family_of_model_type, hf_on_meta

    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG}")
    raw = json.loads((path / CONFIG).read_text())
    _quant_config(raw, path / CONFIG)
    if "model_type" not in raw:
        raise ValueError(f"{path / CONFIG}: missing model_type")
    fields = {k: v for k, v in raw.items() if k != "quantization_config"}
    config = _transformers_class(family_of_model_type(raw["model_type"]), 0).from_dict(fields)
    config.use_cache = False

    device = torch.device(device)
    fp8_dtype = arch.arch_of(device).fp8_dtype
    index, dtypes = _tensor_index(path)
    reader = _Reader(index)
    model = hf_on_meta(config, dtype)
    _check_fp8_pairs(model, dtypes)
    summary = _swap_in_fp8(model, index, dtype, fp8_dtype)
    tied = getattr(config, "tie_word_embeddings", False)
    used: set = set()
    for name, mod in model.named_modules():
        if tied and name == "lm_head":
            continue
        _load_module(mod, f"{name}." if name else "", reader, device, dtype, fp8_dtype, used)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    _rebuild_rotary(model, device)
    unused = sorted(set(index) - used - ({"lm_head.weight"} if tied else set()))
    if unused:
        raise ValueError(f"checkpoint has tensors the {type(model).__name__} has no place for: {unused[:8]}")
    model.quantize_summary = summary
    model.requires_grad_(False)
    if form == "engine":
        from .models.engine import engine_from_hf

        engine = engine_from_hf(model, consume=True)
        engine.quantize_summary = summary
        return engine.requires_grad_(False)
    return model


def write_tiny_fp8_checkpoint(
    path: str | os.PathLike, preset: str = "qwen3-tiny", scale_dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> nn.Module:
    """Write a preset with random weights as a block-FP8 checkpoint (``config.json`` + ``model.safetensors``).

    Every decoder linear is quantized 128x128 in e4m3fn (as published checkpoints are), its scale stored in
    ``scale_dtype`` (bf16 like Qwen3, fp32 like DeepSeek); lm_head stays bf16. Returns the in-memory HF model
    with exactly the written values (scales rounded to ``scale_dtype``), for round-trip comparisons.
    """
    from safetensors.torch import save_file

    from .models.build import build_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = build_model(preset, form="hf", scheme="bf16", seed=seed)
    q.quantize_block_fp8(model)  # CPU: e4m3fn, max 448, the published format
    tensors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, q.BlockFP8Linear):
            mod.weight_scale_inv = mod.weight_scale_inv.to(scale_dtype).to(torch.float32)
    for key, t in model.state_dict().items():
        if key.endswith("weight_scale_inv"):
            t = t.to(scale_dtype)
        tensors[key] = t.contiguous()
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.update(
        architectures=[type(model).__name__],
        torch_dtype="bfloat16",
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": list(q.BLOCK)},
    )
    (path / CONFIG).write_text(json.dumps(config, indent=2, default=str))
    return model

