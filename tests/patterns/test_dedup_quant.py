"""Identical group_quants of one tensor collapse into the earliest one; different ones stay."""

from __future__ import annotations

import torch
from pattern_helpers import BlockLinear, capture, count, graph_text, ops, run_pass

from fp8_fusion_pass.config import FusionConfig

BF16 = torch.bfloat16


class Quants(torch.nn.Module):
    """One bf16 tensor quantized ``groups`` times (e.g. (128, 128, 64)), each result feeding a GEMM."""

    def __init__(self, groups):
        super().__init__()
        self.lins = torch.nn.ModuleList(BlockLinear(256, 128, g, seed=i) for i, g in enumerate(groups))

    def forward(self, x):
        y = torch.relu(x)  # a producer the fusions do not know: only the dedup acts
        return [lin(y) for lin in self.lins]


def x():
    return torch.randn(6, 256, dtype=BF16)


def test_identical_quants_collapse_into_the_first():
    gm0 = capture(Quants((128, 128, 128)), x())[0]
    r, gm = run_pass(gm0)
    assert r.counts()["dedup_quant"] == 2
    assert count(gm, ops.group_quant.default) == 1
    first = next(n for n in gm0.graph.nodes if n.target is ops.group_quant.default)
    assert all(d.detail.startswith(f"shares {first.name}") for d in r.applied)
    mms = [n for n in gm.graph.nodes if n.target is ops.blockscale_mm.default]
    assert len(mms) == 3 and len({m.args[0] for m in mms}) == 1
    # the quants that stay are reported (their producer, relu, has no fused op)
    assert r.rejection_reasons() == {"producer_not_fusable": 1}


def test_different_group_sizes_do_not_collapse():
    r, gm = run_pass(capture(Quants((128, 64, 128)), x())[0])
    assert r.counts()["dedup_quant"] == 1
    assert count(gm, ops.group_quant.default) == 2


def test_dedup_off_leaves_the_graph_alone():
    gm0 = capture(Quants((128, 128, 128)), x())[0]
    r, gm = run_pass(gm0, FusionConfig(dedup_quant=False))
    assert graph_text(gm) == graph_text(gm0) and "dedup_quant" not in r.counts()
