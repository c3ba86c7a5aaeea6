"""Probe (not a benchmark of record): why the SiLU-quant GEMV at one row is ~3-4 us slower than the plain GEMV on
the merged weight plus the silu-quant launch. A copy of ``_gemv_silu_quant_kernel`` with a TAIL switch:
0 the committed epilogue (y to the workspace, acq_rel ticket, the last program quantizes its group); 1 y stored and
no ticket (wrong output: timing only); 2 the ticket relaxed (no ordering: timing only); 3 no y store, no ticket
(the GEMV's loop and the SiLU alone). Against the plain GEMV on [2I, K] at TABLE's config and the pair.

    python benchmarks/silu_gemv_probe.py
"""

from __future__ import annotations

import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _timing import time_graph

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._fp8 import kernel_constexprs
from fp8_fusion_pass.kernels.triton._gemv_kernels import GemvConfig, _chunk_dot, _weight_chunk, _x_chunk, gemv_mm
from fp8_fusion_pass.kernels.triton._gemv_silu_kernels import gemv_silu_quant
from fp8_fusion_pass.kernels.triton._small_m_kernels import tile_counters
from fp8_fusion_pass.kernels.triton._small_m_silu_kernels import _quant_store, _silu_mul
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant


@triton.jit(do_not_specialize=["M"])
def _probe(a_ptr, bg_ptr, bu_ptr, q_ptr, s_ptr, y_ptr, cnt_ptr, as_ptr, bgs_ptr, bus_ptr, M, I, K,
           stride_am, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk,
           G: tl.constexpr, GROUP_TILES: tl.constexpr, ROWS: tl.constexpr, K_CHUNK: tl.constexpr,
           BLOCK_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_EXP: tl.constexpr,
           FNUZ: tl.constexpr, EMULATE_CAST: tl.constexpr, PTX: tl.constexpr, TAIL: tl.constexpr,
           ONE_TILE: tl.constexpr, SPREAD: tl.constexpr):
    pid = tl.program_id(0)
    if SPREAD:  # adjacent programs in different quant groups: no two concurrent tickets on one counter
        n_groups = I // G
        group = pid % n_groups
        base = group * G + (pid // n_groups) * ROWS
    else:
        group = pid // GROUP_TILES
        base = pid * ROWS
    rn = (base + tl.arange(0, ROWS)).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    acc_g = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((ROWS, BLOCK_M), dtype=tl.float32)
    if ONE_TILE:  # gate rows then up rows as one [2 ROWS, K_CHUNK] tile of the merged weight (up = gate + I rows)
        j = tl.arange(0, 2 * ROWS)
        rn2 = (base + j % ROWS + (j // ROWS) * I).to(tl.int64)
        acc = tl.zeros((2 * ROWS, BLOCK_M), dtype=tl.float32)
        for k0 in range(0, K, K_CHUNK):
            w, ws = _weight_chunk(bg_ptr, bgs_ptr, rn2, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK,
                                  SCALE_BLOCK)
            for m in tl.static_range(BLOCK_M):
                x, xs = _x_chunk(a_ptr, as_ptr, tl.minimum(m, M - 1), k0, K, stride_am, stride_asm, stride_ask,
                                 K_CHUNK, SCALE_BLOCK, False, bg_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ,
                                 EMULATE_CAST, PTX)
                part = _chunk_dot(w, ws, x, xs, 2 * ROWS, K_CHUNK, SCALE_BLOCK)
                acc = tl.where(offs_m[None, :] == m, acc + part[:, None], acc)
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (2, ROWS, BLOCK_M)), (1, 2, 0)))
    for k0 in range(0, K if not ONE_TILE else 0, K_CHUNK):
        wg, wgs = _weight_chunk(bg_ptr, bgs_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK, SCALE_BLOCK)
        wu, wus = _weight_chunk(bu_ptr, bus_ptr, rn, k0, K, stride_bn, stride_bsn, stride_bsk, K_CHUNK, SCALE_BLOCK)
        for m in tl.static_range(BLOCK_M):
            x, xs = _x_chunk(a_ptr, as_ptr, tl.minimum(m, M - 1), k0, K, stride_am, stride_asm, stride_ask,
                             K_CHUNK, SCALE_BLOCK, False, bg_ptr.dtype.element_ty, FP8_MAX, FP8_MIN_EXP, FNUZ,
                             EMULATE_CAST, PTX)
            hit = offs_m[None, :] == m
            acc_g = tl.where(hit, acc_g + _chunk_dot(wg, wgs, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)[:, None], acc_g)
            acc_u = tl.where(hit, acc_u + _chunk_dot(wu, wus, x, xs, ROWS, K_CHUNK, SCALE_BLOCK)[:, None], acc_u)
    y = _silu_mul(acc_g, acc_u, tl.bfloat16, EMULATE_CAST, PTX)
    rows = offs_m.to(tl.int64)[None, :] * I
    ok_m = (offs_m < M)[None, :]
    if TAIL == 3:
        tl.store(q_ptr + rows + rn[:, None], y.to(q_ptr.dtype.element_ty), mask=ok_m)
    else:
        tl.store(y_ptr + rows + rn[:, None], y, mask=ok_m)
        if TAIL == 0:
            tl.debug_barrier()
            last = tl.atomic_add(cnt_ptr + group, 1, sem="acq_rel", scope="gpu") == GROUP_TILES - 1
        elif TAIL == 2:
            last = tl.atomic_add(cnt_ptr + group, 1, sem="relaxed", scope="gpu") == GROUP_TILES - 1
        else:
            last = False
        if last:
            g0 = group * G
            yg = tl.load(y_ptr + rows + (g0 + tl.arange(0, G))[:, None], mask=ok_m, other=0.0, cache_modifier=".cg")
            _quant_store(yg, q_ptr, s_ptr, g0, offs_m, M, I, G, G, BLOCK_M, FP8_MAX, FP8_MIN_EXP, FNUZ,
                         EMULATE_CAST, PTX)
            tl.store(cnt_ptr + group, 0)


def probe(q, xs, wg, sg, wu, su, cfg: GemvConfig, tail: int, one_tile: bool = False, spread: bool = False):
    m, k = q.shape
    i = wg.shape[0]
    q_out = torch.empty((m, i), dtype=arch.arch_of(q.device).fp8_dtype, device=q.device)
    s_out = torch.empty((m, i // 128), dtype=torch.float32, device=q.device)
    y = torch.empty((m, i), dtype=torch.float32, device=q.device)
    cnt = tile_counters(q.device, i // 128)
    _probe[(i // cfg.rows,)](q, wg, wu, q_out, s_out, y, cnt, xs, sg, su, m, i, k, q.stride(0), wg.stride(0),
                             *xs.stride(), *sg.stride(), G=128, GROUP_TILES=128 // cfg.rows, ROWS=cfg.rows,
                             K_CHUNK=cfg.k_chunk, BLOCK_M=1, SCALE_BLOCK=128, **kernel_constexprs(q.device),
                             TAIL=tail, ONE_TILE=one_tile, SPREAD=spread, num_warps=cfg.warps,
                             num_stages=cfg.stages)
    return q_out, s_out


def main() -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    fp8, fp8_max = arch.fp8_dtype(dev), arch.fp8_max(dev)
    tile_counters(torch.device(dev), 1)  # allocated outside any capture
    cfgs = [GemvConfig(2, 2048, 2, 1), GemvConfig(2, 2048, 2, 3), GemvConfig(4, 1024, 2, 1), GemvConfig(4, 1024, 2, 3),
            GemvConfig(8, 1024, 4, 1), GemvConfig(8, 512, 4, 1), GemvConfig(2, 1024, 2, 1), GemvConfig(4, 512, 2, 1)]
    # (tail, one_tile, spread)
    variants = [(0, False, False), (0, False, True), (0, True, False), (0, True, True), (1, True, False),
                (3, True, False)]
    shapes = ((12288, 4096), (25600, 5120)) if dev == "cuda" else ((256, 512),)
    if dev == "cpu":
        cfgs, variants = [GemvConfig(2, 256, 2, 1), GemvConfig(32, 256, 2, 1)], [v for v in variants if v[0] == 0]
    print(f"{'shape':>14} {'what':>52} {'us':>7}")
    for i, k in shapes:
        copies = max(2, math.ceil(150e6 / (2 * i * k)))
        w8 = [ref.quantize_weight_blockwise(torch.randn(2 * i, k, device=dev, dtype=torch.bfloat16).mul_(0.05),
                                            (128, 128), fp8, fp8_max) for _ in range(copies)]
        halves = [(w[:i], s[: i // 128], w[i:], s[i // 128:]) for w, s in w8]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        q, xs = ref.group_quant(x, 128, fp8, fp8_max)

        def plain(c, q=q, xs=xs, w8=w8):
            return bm.blockscale_mm(q, xs, *w8[c], torch.bfloat16)

        rows = {"plain GEMV [2I, K], TABLE": (plain, None),
                "pair (GEMV + silu-quant)": (lambda c, plain=plain: silu_mul_group_quant(plain(c), 128), None)}
        for cfg in cfgs:
            name = tuple(cfg.__dict__.values())
            wide = GemvConfig(2 * cfg.rows, cfg.k_chunk, cfg.warps, cfg.stages)
            committed = lambda c, cfg=cfg, q=q, xs=xs, h=halves: gemv_silu_quant(q, xs, *h[c], torch.bfloat16, 128,
                                                                               cfg)
            # one tile: bit for bit the plain GEMV at twice the rows on the merged weight, then the silu-quant
            wide_pair = lambda c, wide=wide, q=q, xs=xs, w8=w8: silu_mul_group_quant(
                gemv_mm(q, xs, *w8[c], torch.bfloat16, wide), 128)
            rows[f"plain gemv_mm {tuple(wide.__dict__.values())}"] = (
                lambda c, wide=wide, q=q, xs=xs, w8=w8: gemv_mm(q, xs, *w8[c], torch.bfloat16, wide), None)
            rows[f"committed kernel {name}"] = (committed, None)
            for tail, one, spread in variants:
                rows[f"tail {tail} {'one tile' if one else 'two tiles'}{' spread' if spread else ''} {name}"] = (
                    lambda c, cfg=cfg, t=tail, o=one, sp=spread, q=q, xs=xs, h=halves: probe(q, xs, *h[c], cfg, t, o,
                                                                                             sp),
                    (wide_pair if one else committed) if tail == 0 else None)
        for name, (call, want_call) in rows.items():
            try:
                out = call(0)
                if want_call is not None:
                    want = want_call(0)
                    same = torch.equal(out[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(
                        out[1], want[1])
                    name += " =" if same else " (NOT bit-equal)"
                t = time_graph(call, copies, dev == "cpu")
            except Exception as e:  # noqa: BLE001 - a probe: print and go on
                print(f"{i}x{k}: {name}: {type(e).__name__} {str(e)[:200]}")
                continue
            print(f"{f'{i}x{k}':>14} {name:>52} {t:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
