"""Llama's q / k RoPE (no per-head norms): both tensors in one op, as ``norm_rope`` does for Qwen3.

    before (Llama attention: the q / k views of the projection go straight to RoPE)
    q = reshape(q, [B, S, Hq, D]) -> permute(0, 2, 1, 3) -> q * cos + rotate_half(q) * sin
    k = reshape(k, [B, S, Hk, D]) -> permute(0, 2, 1, 3) -> k * cos + rotate_half(k) * sin

    after
    q, k = qk_rope(reshape(q), reshape(k), cos, sin)

On its own this trades Inductor's two RoPE kernels for one launch. What it is for is ``rope_cache``, which runs
next: with the op in the graph the k- and v-cache writes of a decode step move into the same launch, so three
launches (Inductor's q RoPE, k RoPE + k-cache write, v-cache write) become one. The H200 figures are in
``docs/benchmarks.md`` ("RoPE and the KV-cache writes in one launch").

The chain is ``norm_rope``'s (``norm_rope.rope_chain``), started at a ``reshape`` into ``[B, S, H, D]`` whose only
user is the ``permute``: a norm's output never starts one (``norm_rope`` takes those), so with ``norm_rope`` off a
Qwen3 graph keeps its norms and RoPEs to Inductor. Pairing and guards are ``norm_rope``'s (without eps): under
Inductor's ``combo_kernels`` only where the cache writes join (``unfused_pair_faster``), bf16, a power-of-two head
dim and ``[B or 1, S, D]`` tables (``no_fused_kernel``), a q chain paired with a k chain on the same tables
(``no_norm_rope_pair``). The op rounds each product and the sum as eager does, where Inductor's fusion keeps fp32
between them: not bit-exact against the unfused compile, so deterministic mode keeps it off.
"""

from __future__ import annotations

import torch
from torch.fx import Graph

from . import _graph, norm_rope
from .norm_rope import Norm

NAME = "qk_rope"


def heads(graph: Graph) -> list[Norm]:
    """Every ``reshape`` to a 4-D tensor whose only user is a ``permute(0, 2, 1, 3)``, as a norm-less ``Norm``."""
    out = []
    for n in graph.nodes:
        users = _graph.data_users(n) if n.op == "call_function" else []
        if n.target is torch.ops.aten.reshape.default and len(users) == 1:  # sym_size reads of its shape aside
            p = users[0]
            if p.target is torch.ops.aten.permute.default and list(p.args[1]) == [0, 2, 1, 3]:
                out.append(Norm(n, n, None, None))
    return out


def run(graph: Graph, report, rope_cache: bool = True) -> None:
    # a start whose permute is no RoPE (v, say) is dropped by rope_chain, silently: no candidate
    norm_rope.pair_and_rewrite(graph, report, NAME, heads(graph), rope_cache)
