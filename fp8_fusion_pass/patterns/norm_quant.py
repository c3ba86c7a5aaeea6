"""RMSNorm -> 1 x group quant -> block-scale GEMM, with or without the residual add in front.

    before (plain: layer 0's input norm)            after
    y = rms_norm(x, w, eps)       [B, S, H] bf16     q, s = rms_norm_group_quant(x, w, eps, g)   [B, S, H]
    y2 = reshape(y, [-1, H])                          q2 = reshape(q, [-1, H]); s2 = reshape(s, [-1, H/g])
    q2, s2 = group_quant(y2, g)                       blockscale_mm(q2, s2, ...)   (q/k/v: each GEMM)
    blockscale_mm(q2, s2, W, W_s, bf16)

    before (add: every later norm)                   after
    r = x + residual              (also next residual)
    y = rms_norm(r, w, eps) -> reshape -> group_quant  q, s, r = add_rms_norm_group_quant(x, residual, w, eps, g)
                                                       (r's other users now read the fused op's residual_out)

Matched spellings (each traced from ``kernels/reference.py`` or the unfused op, for every torch version's
post-grad spelling, see ``_site.Form``):
- ``op``: ``fp8_fusion.rms_norm(x, w, eps)`` / ``fp8_fusion.add_rms_norm(x, residual, w, eps)[0]`` (engine-style
  model code, vLLM / sglang);
- ``torch``: ``reference.rms_norm``, i.e. transformers' ``Qwen3RMSNorm.forward`` / ``LlamaRMSNorm.forward``
  (``hidden_states.to(float32)``, ``pow(2).mean(-1, keepdim=True)``, ``* rsqrt(variance + eps)``,
  ``weight * hidden_states.to(input_dtype)``), and for the add form ``hidden_states = residual + hidden_states``
  of ``Qwen3DecoderLayer`` / ``LlamaDecoderLayer`` feeding it, whose sum is the next residual. Any eps (a
  ``KeywordArg``), any configured group size.

Guards (``guards.py``; ``_site.check`` runs them in this order): the ``norm_quant`` switch, ``FP8_FUSION_DISABLE``
and deterministic mode (not bit-exact: the fused reduction order may move a value by one fp8 step); bf16
activation, residual and weight; a fused kernel for the device; static K, configured group size, K % g == 0;
reshapes keep the last dim; last dims contiguous; the norm output feeds this one quant only (a bf16 consumer
such as the final norm's ``lm_head`` keeps it unfused: ``no_quant_consumer`` / ``extra_consumer``); the quant's
outputs feed only ``blockscale_mm``; the small-M table. Add form only: both addends have one shape and dtype
(a broadcast add, e.g. a bias, is not a residual add: the plain form is tried instead).
"""

from __future__ import annotations

import operator

import torch
from torch._inductor.pattern_matcher import Match

from ..kernels import reference
from . import BY_NAME, _graph
from ._site import Form, Site, group_size_of

aten = torch.ops.aten
ops = torch.ops.fp8_fusion

EPS_EXAMPLE = 1.2345e-5  # scalar_workaround example: must occur nowhere else in the trace


def _x_w():
    return torch.empty(4, 256, dtype=torch.bfloat16), torch.empty(256, dtype=torch.bfloat16)


def _x_res_w():
    x, w = _x_w()
    return x, torch.empty_like(x), w


def _rms_norm_op(x, w, eps):
    return ops.rms_norm(x, w, eps)


def _add_rms_norm_op(x, residual, w, eps):
    return ops.add_rms_norm(x, residual, w, eps)[0]


def _rms_norm_torch(x, w, eps):
    return reference.rms_norm(x, w, eps)


def _add_rms_norm_torch(x, residual, w, eps):
    return reference.add_rms_norm(x, residual, w, eps)[0]


_EPS = {"eps": EPS_EXAMPLE}

FORMS = {
    "add_norm_quant": (
        Form("op", _add_rms_norm_op, _x_res_w, _EPS, shared=(ops.add_rms_norm.default,)),
        Form("torch", _add_rms_norm_torch, _x_res_w, _EPS, shared=(aten.add.Tensor,)),
    ),
    "norm_quant": (
        Form("op", _rms_norm_op, _x_w, _EPS),
        Form("torch", _rms_norm_torch, _x_w, _EPS),
    ),
}


def _add_node(match: Match, form: str):
    """The residual add of an add-form match: the HF ``aten.add`` node, or the ``add_rms_norm`` node."""
    target = ops.add_rms_norm.default if form == "op" else aten.add.Tensor
    x, residual = match.kwargs["x"], match.kwargs["residual"]
    for n in match.nodes:
        if n.target is target and set(n.args[:2]) == {x, residual}:
            return n
    return None


def accepts(match: Match, fusion_name: str, form: str) -> bool:
    """Structural check before the guards: a residual add adds two tensors of one shape and dtype."""
    if fusion_name != "add_norm_quant":
        return True
    x, residual = match.kwargs["x"], match.kwargs["residual"]
    return (_add_node(match, form) is not None and _graph.same_shape(x, residual)
            and _graph.dtype_str(x) == _graph.dtype_str(residual))


def site(match: Match, fusion_name: str, form: str) -> Site:
    quant = match.output_node()
    producer, chain = _graph.strip_reshapes(quant.args[0])
    kw = match.kwargs
    common = dict(fusion=BY_NAME[fusion_name], form=form, quant=quant, producer=producer, chain=chain,
                  group_size=group_size_of(quant), x=kw["x"], matched=set(match.nodes), weight=kw["w"],
                  eps=kw["eps"])
    if fusion_name == "norm_quant":
        return Site(args=(kw["w"], kw["eps"]), **common)
    add = _add_node(match, form)
    if form == "op":  # add_rms_norm's residual_out is its getitem 1 (absent when nothing uses it)
        add = next((u for u in add.users if u.target is operator.getitem and u.args[1] == 1), None)
    return Site(args=(kw["residual"], kw["w"], kw["eps"]), residual_in=kw["residual"], residual=add, **common)
