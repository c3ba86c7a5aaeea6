"""``models.decode_inputs``: the decode-step inputs of ``fp8-fusion diff / verify --cache``. Its one promise beyond
shapes is that calls repeat (verify runs the step once per input case, with and without the pass): every call
writes the same slots before it reads them, HF's StaticCache included, whose ``cumulative_length`` would move each
call's write one slot on."""

from __future__ import annotations

import pytest
import torch

from fp8_fusion_pass.models import build_model, decode_step


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_calls_repeat_and_write_only_the_step_slots(form):
    model = build_model("llama-tiny", form=form, layers=1)
    step = decode_step(model, batch=3, seq=2, cache_len=12)
    tensors = step.cache.k + step.cache.v if step.engine else [
        t for layer in step.cache.layers for t in (layer.keys, layer.values)]  # fmt: skip
    before = [t.clone() for t in tensors]
    with torch.no_grad():
        first = step.run(model)
        second = step.run(model)
    logits = (lambda out: out if isinstance(out, torch.Tensor) else out.logits)
    assert torch.equal(logits(first), logits(second))
    written = torch.zeros(3, 1, 12, 1, dtype=torch.bool)
    written[torch.arange(3).view(3, 1), 0, step.positions] = True
    for t, t0 in zip(tensors, before):
        keep = ~written.expand(t.shape)
        assert torch.equal(t[keep], t0[keep]), "a slot outside the step's was written"
        assert not torch.equal(t[~keep], t0[~keep]), "the step wrote nothing"


def test_rows_at_their_own_positions_and_a_step_that_does_not_fit():
    model = build_model("llama-tiny", form="engine", layers=1)
    assert decode_step(model, batch=3, seq=1, cache_len=8).positions.tolist() == [[7], [4], [1]]
    with pytest.raises(ValueError, match="does not fit a 8-slot cache"):
        decode_step(model, batch=1, seq=9, cache_len=8)


@pytest.mark.parametrize("form", ["engine", "hf"])
def test_mark_sees_the_tensors_the_model_gets(form):
    # a caller marking dims dynamic must mark what the model is called with: HF's cache_position is a copy of the
    # first row's positions, made inside run
    model = build_model("llama-tiny", form=form, layers=1)
    step = decode_step(model, batch=2, seq=3, cache_len=8)
    seen, got = [], []

    def fn(*args, **kwargs):
        got.append(kwargs.get("cache_position", args[1] if args else None))
        return model(*args, **kwargs)

    with torch.no_grad():
        step.run(fn, mark=lambda ids, positions: seen.append((ids.shape, positions)))
    ((ids_shape, positions),) = seen
    assert ids_shape == (2, 3) and positions is got[0]
    assert positions.shape == ((2, 3) if form == "engine" else (3,))
