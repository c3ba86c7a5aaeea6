"""Stand-in of ``aiter/ops/shuffle.py: shuffle_weight`` (HEAD signature; v0.1.7 has only x, layout, use_int4)."""

import torch

from aiter import _standin


def shuffle_weight(
    x: torch.Tensor,
    layout=(16, 16),
    use_int4=False,
    is_guinterleave=False,
    gate_up: bool = False,
    pad_k_to: int = 0,
) -> torch.Tensor:
    if use_int4 or is_guinterleave or gate_up or pad_k_to:
        raise NotImplementedError("stand-in models the plain (16, 16) fp8 shuffle only")
    x_type = x.dtype
    IN, IK = layout
    BK = IK * 2
    K = 16 // x.element_size()
    BN = IN
    assert x.shape[-2] % BN == 0, f"{x.shape[-2]} % {BN} == {x.shape[-2] % BN}"
    assert x.shape[-1] % BK == 0, f"{x.shape[-1]} % {BK} == {x.shape[-1] % BK}"
    x_ = x.view(torch.uint8).view(-1, x.shape[-2] // BN, BN, x.shape[-1] // BK, BK // K, K)
    x_ = x_.permute(0, 1, 3, 4, 2, 5).contiguous().view(*x.shape).view(x_type)
    x_.is_shuffled = True  # HEAD sets this; v0.1.7 does not
    _standin.mark_shuffled(x_)
    return x_
