"""At batch 1, the fused norm's launch hints the first bytes of the next GEMM's weight into L2.

    before
    q, s, r = add_rms_norm_group_quant(x, residual, w, eps, 128)          x [1, K]: one row
    y = blockscale_mm(q, s, W, S, bf16)                                    W: 16 MB or more (qkv, gate_up)

    after
    q, s, r = add_rms_norm_group_quant(x, residual, w, eps, 128, prefetch=W)
    y = blockscale_mm(q, s, W, S, bf16)

Why: at batch 1 the GEMV after the norm streams its weight from HBM, and the norm's launch (~2.5 us) reads a few KB:
HBM idles while it runs. With ``prefetch`` the Triton kernel adds one program per SM that issues
``cp.async.bulk.prefetch.L2`` for the weight's first 8 MB and exits (``kernels/triton/_l2_prefetch.py``). Measured on
the H200 (``benchmarks/l2_prefetch.py``, docs/benchmarks.md): norm + GEMV 1.6% faster at Qwen3-32B's gate_up (68.65
-> 67.57 us) and 2.4% at Qwen3-8B's (29.50 -> 28.79 us), within 0.5% either way at the qkv GEMMs. A hint changes no
value, so the rewrite is bit-exact and stays on in deterministic mode.

The consumer may be any GEMM op the later rewrites left (``blockscale_mm``, the grouped one, the gate/up GEMM with
the silu-quant epilogue: its first weight). Guards: the switch; an NVIDIA sm_90+ GPU with the norm on the Triton
backend (``no_fused_kernel``: the bulk prefetch); a static M of 1 and a contiguous weight of at least 16 MB
(``prefetch_not_measured``: what the H200 runs covered); the weight defined before the norm
(``operand_defined_later``: a graph input, as a checkpoint's weights are).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .. import arch, guards
from . import _graph

NAME = "l2_prefetch"
NORMS = (torch.ops.fp8_fusion.rms_norm_group_quant.default, torch.ops.fp8_fusion.add_rms_norm_group_quant.default)
GEMMS = {  # op -> the weight (list) argument
    torch.ops.fp8_fusion.blockscale_mm.default: 2,
    torch.ops.fp8_fusion.blockscale_mm_grouped.default: 2,
    torch.ops.fp8_fusion.blockscale_mm_silu_mul_group_quant.default: 2,
}
MIN_WEIGHT_BYTES = 16_000_000  # the smallest weight measured was 25 MB (Qwen3-8B qkv); the k|v weights are 4 MB
PREFETCH_MB = 8  # kernels/triton/rms_norm.L2_PREFETCH_BYTES (not imported: the pass must not need Triton)


def _next_gemm(norm: Node) -> tuple[Node, Node] | None:
    """(the first GEMM in graph order reading the norm's q, its weight node), or None."""
    qs = [u for u in norm.users if u.target is operator.getitem and u.args[1] == 0]
    gemms = {user for q in qs for user, _ in _graph.final_users(q) if user.target in GEMMS}
    if not gemms:
        return None
    gemm = next(n for n in norm.graph.nodes if n in gemms)
    w = gemm.args[GEMMS[gemm.target]]
    return gemm, (w[0] if isinstance(w, (list, tuple)) else w)


def _check(norm: Node, w: Node) -> guards.Verdict:
    x, wv = _graph.val(norm.args[0]), _graph.val(w)
    return guards.first_failure(
        lambda: _hardware(x.device, norm.target._schema.name.split("::")[-1]),
        lambda: _measured(guards.static_rows(x), wv),
        lambda: _defined_before(w, norm),
    )


def _hardware(device: torch.device, op: str) -> guards.Verdict:
    from ..kernels import backends

    if device.type != "cuda" or not arch.arch_of(device).pdl:
        return guards.reject("no_fused_kernel", f"the L2 prefetch hint needs an NVIDIA sm_90+ GPU, not {device}")
    try:
        backend = backends.backend_for(op, device)
    except Exception as e:  # noqa: BLE001 - BackendUnavailable, or a backend that fails to import
        return guards.reject("no_fused_kernel", f"{type(e).__name__}: {e}")
    if backend != "triton":
        return guards.reject("no_fused_kernel", f"{op} runs on the {backend} backend, which takes no L2 hint")
    return guards.OK


def _measured(m, w) -> guards.Verdict:
    if m != 1:
        return guards.reject("prefetch_not_measured", f"M={m}: the hint was measured at batch 1 (one row) only")
    size = w.numel() * w.element_size() if isinstance(w, torch.Tensor) else 0
    if size < MIN_WEIGHT_BYTES:
        return guards.reject("prefetch_not_measured", f"the GEMM's weight is {size / 1e6:.1f} MB, under the "
                             f"{MIN_WEIGHT_BYTES / 1e6:.0f} MB the hint was measured on")  # fmt: skip
    if not w.is_contiguous():
        return guards.reject("last_dim_not_contiguous", "the GEMM's weight is not contiguous: nothing to hint")
    return guards.OK


def _defined_before(w: Node, norm: Node) -> guards.Verdict:
    for n in norm.graph.nodes:
        if n is w:
            return guards.OK
        if n is norm:
            break
    return guards.reject("operand_defined_later", f"the GEMM's weight {w.name} is computed after the norm")


def _hinting(norm: Node) -> bool:
    """The norm already has a ``prefetch`` argument (by keyword or position)."""
    at = [a.name for a in norm.target._schema.arguments].index("prefetch")
    return norm.kwargs.get("prefetch") is not None or (len(norm.args) > at and norm.args[at] is not None)


def rewrite(norm: Node, gemm: Node, w: Node) -> str:
    norm.kwargs = {**norm.kwargs, "prefetch": w}
    wv = _graph.val(w)
    size = wv.numel() * wv.element_size()
    return (f"the first {min(PREFETCH_MB, size / 1e6):.0f} MB of {gemm.name}'s weight {list(wv.shape)} "
            f"({size / 1e6:.0f} MB) hinted into L2 by this launch")  # fmt: skip


def run(graph: Graph, report) -> None:
    for norm in [n for n in graph.nodes if _graph.is_call(n, *NORMS)]:
        if _hinting(norm):
            continue
        found = _next_gemm(norm)
        if found is None:
            continue  # no GEMM reads it (the fusion guards make one): not this rewrite's candidate
        gemm, w = found
        verdict = _check(norm, w)
        report.settle(NAME, norm.name, _graph.shape_str(x=norm.args[0], W=w), _graph.dtype_str(norm.args[0]),
                      verdict, "no hint", rewrite, norm, gemm, w)  # fmt: skip
