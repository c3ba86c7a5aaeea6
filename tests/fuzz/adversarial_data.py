"""Adversarial activations for the fused ops and the whole-model tests, and the numerics contract as assertions.

Pathologies (``KINDS``), placed by hypothesis at random rows / columns on top of random data: NaN, +-inf, an
all-zero group, an all-zero row, values exactly at fp8 max (+-448) and beyond it (+-1e4, bf16's max 3.39e38),
one bf16 denormal, a whole denormal group, one outlier per group (the rest of the row 1e-3), a row scaled to
1e-30 (its fp32 sum of squares underflows), a row whose sum of squares overflows fp32.

Contract (DESIGN.md, ``kernels/reference.py``; bounds from ``tests/tolerances.py``): the SiLU fusion is
bit-exact against ``silu_and_mul`` + ``group_quant``; the norm fusion may move a value by one fp8 step on at most
5% of values, scales within one bf16 rounding; NaN / +inf / -inf land on the same positions everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tolerances
import torch
from hypothesis import strategies as st

KINDS = ("nan", "posinf", "neginf", "zero_group", "zero_row", "fp8_max", "beyond_fp8_max", "bf16_max", "denormal",
         "denormal_group", "outlier_per_group", "tiny_row", "overflow_row")
BF16_MAX = 3.3895e38
BF16_DENORMAL = 1e-39  # bf16 (like fp32) has subnormals below 1.18e-38


def _group(col: int, group: int) -> slice:
    start = col - col % group
    return slice(start, start + group)


def apply_kind(x: torch.Tensor, kind: str, row: int, col: int, group: int = 128) -> None:
    """Write one pathology into fp32 ``x [M, K]`` in place."""
    r = x[row]
    if kind == "nan":
        r[col] = float("nan")
    elif kind in ("posinf", "neginf"):
        r[col] = float("inf") if kind == "posinf" else float("-inf")
    elif kind == "zero_group":
        r[_group(col, group)] = 0.0
    elif kind == "zero_row":
        r.zero_()
    elif kind == "fp8_max":  # at the fp8 max, its negative, and the rounding boundary just past it (464)
        r[col] = 448.0
        r[(col + 1) % r.numel()] = -448.0
        r[(col + 2) % r.numel()] = 464.0
    elif kind == "beyond_fp8_max":
        r[col] = 1e4
        r[(col + 7) % r.numel()] = -3e5
    elif kind == "bf16_max":
        r[col] = BF16_MAX
    elif kind == "denormal":
        r[col] = BF16_DENORMAL
    elif kind == "denormal_group":
        g = r[_group(col, group)]
        g.copy_(torch.where(g >= 0, BF16_DENORMAL, -BF16_DENORMAL))
    elif kind == "outlier_per_group":
        r.mul_(1e-3)
        r[col % group :: group] = 1e4
    elif kind == "tiny_row":
        r.mul_(1e-30)
    elif kind == "overflow_row":
        r.mul_(1e20)  # x^2 ~ 1e40 > fp32 max: the norm's mean of squares is inf
    else:
        raise ValueError(kind)


@st.composite
def matrices(draw, m: int, k: int, group: int = 128, max_edits: int = 6) -> torch.Tensor:
    """fp32 [m, k]: seeded normal data at a drawn magnitude, plus 0..max_edits pathologies."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(m, k, generator=gen) * draw(st.sampled_from((1e-3, 1.0, 30.0, 448.0)))
    for _ in range(draw(st.integers(0, max_edits))):
        apply_kind(x, draw(st.sampled_from(KINDS)), draw(st.integers(0, m - 1)), draw(st.integers(0, k - 1)), group)
    return x


@st.composite
def norm_weights(draw, k: int) -> torch.Tensor:
    """RMSNorm weights: ones, HF-like noise, large (normed values beyond fp8 max), or with zeroed groups."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(("ones", "noisy", "large", "zero_groups")))
    if kind == "ones":
        return torch.ones(k)
    w = 1.0 + 0.1 * torch.randn(k, generator=gen)
    if kind == "large":
        w *= 1e3
    elif kind == "zero_groups":
        w[: k // 2] = 0.0
    return w


# ---------------------------------------------------------------- the contract as assertions


def fp8_codes(q: torch.Tensor) -> torch.Tensor:
    """fp8 bytes as integers ordered like the values (sign-magnitude -> two's complement): |a - b| = fp8 steps."""
    byte = q.view(torch.uint8).to(torch.int32)
    return (byte & 0x7F) * (1 - 2 * (byte >> 7))


def same_specials(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    fa, fb = a.float(), b.float()
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        assert torch.equal(test(fa), test(fb)), f"{what}: {name} positions differ"


def bit_exact(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, what
    same_specials(a, b, what)
    keep = ~a.float().isnan()
    assert torch.equal(a.float()[keep], b.float()[keep]), f"{what}: {(a.float() != b.float())[keep].sum()} differ"


def within_norm_bound(q, s, q_ref, s_ref, what: str) -> dict:
    """DESIGN.md fused-norm bound; returns the measured flips and scale error (for the tally)."""
    assert q.shape == q_ref.shape and s.shape == s_ref.shape, what
    same_specials(s, s_ref, f"{what} scale")
    same_specials(q, q_ref, f"{what} q")
    finite = torch.isfinite(s) & torch.isfinite(s_ref)
    rel = ((s - s_ref).abs() / s_ref.abs().clamp_min(1e-30))[finite]
    scale_err = rel.max().item() if rel.numel() else 0.0
    assert scale_err <= tolerances.SCALE_REL_TOL, f"{what}: scale rel error {scale_err:.3g}"
    valid = ~q.float().isnan()
    steps = (fp8_codes(q) - fp8_codes(q_ref)).abs()[valid]
    flips = (steps > 0).float().mean().item() if steps.numel() else 0.0
    assert flips <= tolerances.NORM_FUSED_MAX_FLIP_FRACTION, f"{what}: {flips:.2%} of fp8 values flipped"
    assert not steps.numel() or steps.max().item() <= tolerances.NORM_FUSED_MAX_FP8_STEPS, f"{what}: > 1 step"
    return {"flips": flips, "scale_err": scale_err}


# ---------------------------------------------------------------- whole models: edit embedding rows


@contextlib.contextmanager
def embedding_rows(model: torch.nn.Module, edits: list[tuple[str, int]], group: int = 128) -> Iterator[list[int]]:
    """Apply ``(kind, column)`` pathologies to one embedding row each (the last vocab rows, one per edit) and
    restore the table on exit; yields the token ids carrying them."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.model.embed_tokens
    saved = emb.weight.detach().clone()
    tokens = [emb.num_embeddings - 1 - i for i in range(len(edits))]
    try:
        with torch.no_grad():
            rows = emb.weight[tokens].float()
            for i, (kind, col) in enumerate(edits):
                apply_kind(rows, kind, i, col % rows.shape[1], group)
            emb.weight[tokens] = rows.to(emb.weight.dtype)
        yield tokens
    finally:
        with torch.no_grad():
            emb.weight.copy_(saved)
