"""Probe: the next layer's residual add + RMSNorm + group quant done by the o_proj GEMV's last program, against the
GEMV and the ``add_rms_norm_group_quant`` launch after it. One row (batch 1), the o_proj shapes.

    python benchmarks/gemv_norm_tail.py                 # on the H200: ~30 s
    python benchmarks/gemv_norm_tail.py --dry-run       # CPU, Triton interpreter, one tiny shape: checks the script

Why: at Qwen3-32B batch 1 the decode step with the pass is 0.3% short of 1.10x (docs/benchmarks.md, "The o_proj quant
at batch 1"), ~0.45 us per layer, and a layer's two norm launches cost ~2.5 us each in the profile, mostly launch and
ramp for 10 KB of row. The question before building a fused op and its rewrite: does a tail in the GEMV's last
program (a ticket across the programs, as the split-K "last" sum and decode_attention's merge take) cost less than
the launch it removes?

- "pair": ``gemv_mm`` (the TABLE's GEMV config for the shape), then ``add_rms_norm_group_quant`` (the pass's op);
- "tail": this file's kernel: the same GEMV body and config, then, in the program that takes the last ticket, the
  row's residual add, RMSNorm and 1 x 128 quant with ``rms_norm.py``'s steps on one [1, N / 128, 128] tile;
- "gemv": the GEMV alone (what the tail adds to).
Checked first: the GEMV output and the residual sum bit for bit the pair's; q and the scales equal or, where the sum
of squares reduces in another order (one tile here, the norm kernel's tiles there), within one fp8 step (reported).
Timing as ``benchmarks/quant_gemm.py``: CUDA-graph replays cycling weight copies beyond the L2, medians. A probe,
not a library kernel: nothing in the pass calls it.

Measured (H200, 2026-12-03, commit 8b7508f; docs/benchmarks.md): pair 9.35 / tail 9.41 us at 4096 x 4096, pair 17.09
/ tail 22.58 us at Qwen3-32B's 5120 x 8192, q bit for bit at both; 8 or 16 warps were slower still (``--tail-warps``).
The tail costs a launch or more: ruled out.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if "--dry-run" in sys.argv:  # must precede the first triton import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl
from _timing import time_graph
from tabulate import tabulate

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._fp8 import kernel_constexprs, round_to
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, _chunk_dot, _weight_chunk, _x_chunk, gemv_mm
from fp8_fusion_pass.kernels.triton._small_m_kernels import _last_arrival
from fp8_fusion_pass.kernels.triton.rms_norm import _cols, _load_w, _normalize_store, _rstd, _sum_inputs, _sum_sq
from fp8_fusion_pass.kernels.triton.rms_norm_group_quant import add_rms_norm_group_quant

SHAPES = [("qwen3-8b / llama3.1-8b o", 4096, 4096), ("qwen3-32b o", 5120, 8192)]  # (name, N = hidden, K)
DEVICE = "cuda"  # "cpu" under --dry-run
ROTATE_BYTES = 150e6
G = 128
EPS = 1e-6


def log(msg: str) -> None:
    print(f"[gemv_norm_tail {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@triton.jit
def _gemv_norm_tail_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr,  # the GEMV's: q [1, K], w_q [N, K], out [1, N], scales
    r_ptr, w_ptr, res_out_ptr, q_ptr, s_ptr,  # the norm's: residual [1, N], weight [N], residual_out, q, scales
    cnt_ptr,  # one int32 ticket counter, zero before and after the launch
    N, K, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk, eps,
    ROWS: tl.constexpr, K_CHUNK: tl.constexpr, SCALE_BLOCK: tl.constexpr, GROUPS: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr, FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr,
    PTX: tl.constexpr,
):  # fmt: skip
    DTYPE = c_ptr.dtype.element_ty
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rn_ok = rn < N
    rn = tl.minimum(rn, N - 1).to(tl.int64)
    acc = tl.zeros((ROWS,), dtype=tl.float32)
    for k0 in range(0, K, K_CHUNK):  # _gemv_kernel's loop at one row: its sums, in its order
        w, ws = _weight_chunk(b_ptr, bs_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK, SCALE_BLOCK)
        x, xs = _x_chunk(a_ptr, as_ptr, 0, k0, K, 0, stride_asm, stride_ask, K_CHUNK, SCALE_BLOCK, False,
                         b_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip
        acc += _chunk_dot(w, ws, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)
    tl.store(c_ptr + rn, round_to(acc, DTYPE, EMULATE_CAST), mask=rn_ok)
    if _last_arrival(cnt_ptr, 0, tl.num_programs(0)):  # every program's columns are stored and visible
        tl.store(cnt_ptr, 0)  # ready for the next launch (stream order makes it visible)
        rows = tl.arange(0, 1)
        cols = _cols(0, GROUPS, SCALE_BLOCK)
        mask = (rows < 1)[:, None, None] & (cols < N)
        xo = tl.load(c_ptr + cols + rows[:, None, None], mask=mask, other=0.0, cache_modifier=".cg")  # from L2
        r = tl.load(r_ptr + cols + rows[:, None, None], mask=mask, other=0.0)
        xf = _sum_inputs(xo, r, res_out_ptr, rows, cols, mask, N, True, True, DTYPE, EMULATE_CAST)
        rstd = _rstd(_sum_sq(xf, 1), N, tl.cast(eps, tl.float32))
        wn = _load_w(w_ptr, cols, N, 1, False)
        _normalize_store(xf, wn, rstd, c_ptr, q_ptr, s_ptr, rows, rows < 1, mask, cols, 0, N, tl.cdiv(N, SCALE_BLOCK),
                         True, GROUPS, 1, DTYPE, FP8_MAX, FP8_MIN_EXP, FNUZ, EMULATE_CAST, PTX)  # fmt: skip


def gemv_norm_tail(q, x_scale, w_q, w_scale, residual, norm_w, eps, config: GemvConfig, counter):
    """(o_proj output, q, scales, residual_out) of one row in one launch: the probe's fused kernel."""
    n, k = w_q.shape
    out = torch.empty((1, n), dtype=residual.dtype, device=q.device)
    res_out = torch.empty_like(residual)
    qo = torch.empty((1, n), dtype=w_q.dtype, device=q.device)
    so = torch.empty((1, n // G), dtype=torch.float32, device=q.device)
    _gemv_norm_tail_kernel[(triton.cdiv(n, config.rows),)](
        q, w_q, out, x_scale, w_scale, residual, norm_w, res_out, qo, so, counter,
        n, k, w_q.stride(0), *x_scale.stride(), *w_scale.stride(), eps,
        ROWS=config.rows, K_CHUNK=config.k_chunk, SCALE_BLOCK=G, GROUPS=triton.next_power_of_2(n // G),
        **kernel_constexprs(q.device), num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return out, qo, so, res_out


def run_point(name: str, n: int, k: int, config: GemvConfig, tail_warps: int | None = None) -> dict:
    """``tail_warps``: the tail kernel's warps (its GEMV's too; default the GEMV config's)."""
    tail_config = dataclasses.replace(config, warps=tail_warps or config.warps)
    fp8, fp8_max = arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE)
    copies = max(2, math.ceil(ROTATE_BYTES / (n * k)))
    ws = [ref.quantize_weight_blockwise(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.05, (128, 128),
                                        fp8, fp8_max) for _ in range(copies)]  # fmt: skip
    xq, xs = ref.group_quant(torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16), G, fp8, fp8_max)
    residual = torch.randn(1, n, device=DEVICE, dtype=torch.bfloat16)
    norm_w = 1 + 0.1 * torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    counter = torch.zeros(1, dtype=torch.int32, device=DEVICE)

    def gemv(c):
        return gemv_mm(xq, xs, *ws[c], torch.bfloat16, config)

    def pair(c):
        return (o := gemv(c)), *add_rms_norm_group_quant(o, residual, norm_w, EPS, G)

    def tail(c):
        return gemv_norm_tail(xq, xs, *ws[c], residual, norm_w, EPS, tail_config, counter)

    (o1, q1, s1, r1), (o2, q2, s2, r2) = pair(0), tail(0)
    if not (torch.equal(o1, o2) and torch.equal(r1, r2)) or counter.item() != 0:
        raise SystemExit(f"{name}: the tail kernel's GEMV output / residual sum differ from the pair's: WRONG")
    steps = (q1.float() - q2.float()).abs() / torch.maximum(q1.float().abs(), q2.float().abs()).clamp_min(1e-30)
    off = int((steps > 0.2).sum())  # more than one fp8 step (e4m3: 2^-3 relative) apart
    if off or not torch.allclose(s1, s2, rtol=1e-6, atol=0):
        raise SystemExit(f"{name}: the tail's quant is {off} values / scales off the pair's: WRONG")
    differ = int((q1.view(torch.uint8) != q2.view(torch.uint8)).sum())
    dry = DEVICE == "cpu"
    return {"shape": name, "N": n, "K": k, "config": str(config), "tail_warps": tail_config.warps, "gemv_us": time_graph(gemv, copies, dry),
            "pair_us": time_graph(pair, copies, dry), "tail_us": time_graph(tail, copies, dry),
            "q_values_differing": differ}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, one tiny shape (no timing)")
    p.add_argument("--tail-warps", default="", help="comma-separated warps for the tail kernel (default: the GEMV's)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gemv_norm_tail.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    a = arch.arch_of(DEVICE)
    shapes = [("tiny", 384, 512)] if args.dry_run else SHAPES  # 384: three quant groups, a masked tile column
    rows = []
    for name, n, k in shapes:
        choice = bm.plan(a, DEVICE, arch.fp8_dtype(DEVICE), 1, n, k, G, torch.bfloat16)
        config = choice.config if choice.path == "gemv" else GemvConfig(8, 1024, 4, 1)
        if args.dry_run:
            config = GemvConfig(4, 256, 4, 1)
        log(f"{name}: GEMV {config}")
        for warps in [int(w) for w in args.tail_warps.split(",") if w] or [None]:
            rows.append(run_point(name, n, k, config, warps))
    print(tabulate([[r["shape"], r["gemv_us"], r["pair_us"], r["tail_warps"], r["tail_us"], r["pair_us"] - r["tail_us"],
                     r["q_values_differing"]] for r in rows],
                   headers=["o_proj", "GEMV us", "GEMV + norm launch us", "tail warps", "GEMV with the tail us",
                            "saved us", "q values differing"], floatfmt=".2f"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
