"""Idea 18's A/B at equal configs: the Triton TMA small-M kernel ("kernel" split-K sum) against the Gluon kernel
with its registers capped (None / 168 / 128), 64-row weight tiles, at M = 64 / 32 (a one-off, 26 s on the H200).

    PYTHONPATH=. python benchmarks/gemm_gluon_ab.py
"""
import sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
import gemm
from _timing import time_graph
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton import _small_m_gluon as glu
for name, n, k in [("qwen3-8b gate_up", 24576, 4096), ("qwen3-8b qkv", 6144, 4096), ("qwen3-32b o", 5120, 8192), ("qwen3-32b down", 5120, 25600)]:
    shape = gemm.Shape(n, k)
    for m in (64, 32):
        _, q, xs = shape.inputs(m)
        want = ref.dequant_activation(q, xs) @ shape.w32.t()
        for split in (1, 2, 4):
            for st in (4, 6):
                cfg = SmallMConfig(block_n=64, split_k=split, warps=4, stages=st, reduce="kernel", tma=True)
                t = gemm.measure(shape, q, xs, want, "small_m", cfg)
                res = [f"{name} M={m} split={split} st={st}: triton {t if isinstance(t,str) else round(t,2)}"]
                for mr in (None, 168, 128):
                    call = lambda i, mr=mr: glu.small_m_gluon_mm(q, xs, *shape.w8[i], torch.bfloat16, 64, split, st, 4, mr)
                    g = gemm.timed("g", call, want, shape.copies)
                    res.append(f"gluon[{mr}] {g if isinstance(g,str) else round(g,2)}")
                print("  ".join(res), flush=True)
    del shape; torch.cuda.empty_cache()
