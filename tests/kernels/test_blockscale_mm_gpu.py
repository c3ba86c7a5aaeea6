"""On a CUDA GPU: every block-scale GEMM path against the fp32 dequantized oracle at the real model K and odd M.

Run on the H200 with ``python -m pytest tests/kernels/test_blockscale_mm_gpu.py -m gpu -q -s``; ``-s`` shows the
table of relative errors per path (Frobenius-relative, and max |error| / max |oracle|) that the notes quote.
Paths: cuBLAS v1 (``torch._scaled_mm``, only where K/128 % 4 == 0), cuBLAS v2 (``F.scaled_mm``, weight scales
padded to a multiple of 4 K blocks), Triton tiled, Triton small-M (every variant of ``_small_m_kernels.py``: the
in-launch split-K sum also repeated 100 times and replayed in a CUDA graph, bitwise against the two-launch sum;
the bf16-input GEMM); and the public op, whatever it picks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gemm_helpers import dequant_weight_128, make_inputs, rel_errors
from tabulate import tabulate
from tolerances import GEMM_REL_ERR_BF16_OUT

import fp8_fusion_pass.kernels.ops  # noqa: F401
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, cublas
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._gemv_kernels import GEMV_MAX_M
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton.per_tensor_mm import per_tensor_mm

pytestmark = pytest.mark.gpu
BF16, FP32 = torch.bfloat16, torch.float32

# This module's tolerance (tests/tolerances.py has no GPU fp32-output entry): with fp32 output there is no
# output rounding to hide the FP8 tensor cores' own accumulation, which keeps about 14 mantissa bits
# (DeepSeek-V3 report §3.3.2; Triton's default on sm90 is max_num_imprecise_acc = 2**30). Our kernels promote
# to fp32 every 128 K (as DeepGEMM does), so the error is that of one 128-long sum: ~2^-14 x a few. 1e-3 still
# catches every layout bug seen (K/128 % 4 != 0 on v1: 0.32).
GPU_FP32_OUT_REL_ERR = 1e-3
TOL = {BF16: GEMM_REL_ERR_BF16_OUT, FP32: GPU_FP32_OUT_REL_ERR}

# (N, K): Qwen3-8B qkv / o / down, Llama-3.1-8B down, Qwen3-32B qkv / o / down. K covers 4096, 5120, 8192,
# 12288, 14336, 25600; N covers 4096 and 6144.
SHAPES = [(6144, 4096), (4096, 4096), (4096, 12288), (4096, 14336), (10240, 5120), (5120, 8192), (5120, 25600)]
ODD_M = (1, 3, 17, 33, 2049)
ROWS: list[tuple] = []  # (test, path, M, N, K, out dtype, rel err, max err) for the printed table


@pytest.fixture(scope="module", autouse=True)
def _report():
    torch.backends.cuda.matmul.allow_tf32 = False  # the oracle must be a true fp32 matmul
    yield
    if ROWS:
        headers = ["test", "path", "M", "N", "K", "out", "rel err (Frobenius)", "max err / max |y|"]
        print("\n" + tabulate(ROWS, headers=headers, floatfmt=".2e"))


def _check(test, path, y, want, out_dtype, m, n, k):
    fro, worst = rel_errors(y, want)
    ROWS.append((test, path, m, n, k, str(out_dtype).removeprefix("torch."), fro, worst))
    assert y.dtype == out_dtype and y.shape == want.shape
    assert fro <= TOL[out_dtype] and worst <= TOL[out_dtype], f"{path} M={m} N={n} K={k}: {fro:.2e} / {worst:.2e}"


_WEIGHTS: dict = {}


def _weights(n, k):
    # One weight (and its fp32 dequantization) per shape, shared by every M and path of this module
    # (all of SHAPES together: about 1.5 GB of fp32 on the GPU).
    if (n, k) not in _WEIGHTS:
        _, _, w_q, w_s = make_inputs(1, n, k, device="cuda", seed=n + k)
        _WEIGHTS[(n, k)] = (w_q, w_s, dequant_weight_128(w_q, w_s))
    return _WEIGHTS[(n, k)]


def _activations(m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device="cuda", dtype=BF16)
    return ref.group_quant(x, 128, arch.fp8_dtype("cuda"), arch.fp8_max("cuda"))


def _paths(k, m=None):
    on_hopper = arch.arch_of("cuda").blockwise_scaled_mm
    paths = [("tiled", None), ("small_m", None)]
    if m is not None and m <= GEMV_MAX_M:  # the GEMV's own rows (M = 1) and an odd M it also takes
        paths.append(("gemv", None))
    if on_hopper and (k // 128) % 4 == 0:
        paths.append(("cublas", "v1"))
    if on_hopper and cublas.has_v2():
        paths.append(("cublas", "v2"))
    return paths


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", ODD_M)
def test_every_path_matches_oracle(m, n, k):
    w_q, w_s, w32 = _weights(n, k)
    q, xs = _activations(m, k)
    want = ref.dequant_activation(q, xs) @ w32.t()
    for path, variant in _paths(k, m):
        y = bm.run(path, q, xs, w_q, w_s, BF16, variant=variant)
        _check("every path", f"{path} {variant or ''}".strip(), y, want, BF16, m, n, k)
    for path in ("tiled", "small_m", *(("gemv",) if m <= GEMV_MAX_M else ())):  # fp32 out: no rounding hides the sums
        _check("fp32 out", path, bm.run(path, q, xs, w_q, w_s, FP32), want, FP32, m, n, k)


@pytest.mark.parametrize("m", [1, 4, 16, 32, 64, 128, 256, 2048, 2049])
@pytest.mark.parametrize("n, k", [(4096, 4096), (5120, 25600), (24576, 4096)])
def test_public_op_matches_oracle(m, n, k):
    # Whatever the plan picks (the measured TABLE once filled), through the op and the Triton backend.
    w_q, w_s, w32 = _weights(n, k)
    q, xs = _activations(m, k)
    with backends.use_backend("triton"):
        y = torch.ops.fp8_fusion.blockscale_mm(q, xs, w_q, w_s, BF16)
    _check("public op", bm.plan_for(q, xs, w_q, w_s, BF16).path, y, ref.dequant_activation(q, xs) @ w32.t(),
           BF16, m, n, k)  # fmt: skip


def test_every_table_entry_is_correct():
    a = arch.arch_of("cuda")
    entries = [(key, choice) for key, choice in bm.TABLE.items() if key[0] == a.name]
    for (_, bucket, n, k), choice in entries:
        w_q, w_s, w32 = _weights(n, k)
        q, xs = _activations(min(bucket, 4096), k)
        y = bm.run(choice.path, q, xs, w_q, w_s, BF16, config=choice.config)
        _check("table", f"{choice.path} {choice.config}", y, ref.dequant_activation(q, xs) @ w32.t(), BF16,
               q.shape[0], n, k)  # fmt: skip


@pytest.mark.parametrize("k", [384, 640, 1152])  # K/128 = 3, 5, 9
def test_k_blocks_not_multiple_of_4_never_reach_v1(k):
    m, n = 16, 4096
    q, xs, w_q, w_s = make_inputs(m, n, k, device="cuda")
    want = ref.dequant_activation(q, xs) @ ref.dequant_weight(w_q, w_s).t()
    with pytest.raises(ValueError, match="silently" if arch.arch_of(q.device).blockwise_scaled_mm else "SM90"):
        bm.run("cublas", q, xs, w_q, w_s, BF16, variant="v1")
    assert cublas.blockwise_variant(k) != "v1"
    for rows in (1, 16, 17, 256, 2048):  # the public path at every bucket is correct
        qr, xr = _activations(rows, k, seed=rows)
        y = bm.blockscale_mm(qr, xr, w_q, w_s, BF16)
        wr = ref.dequant_activation(qr, xr) @ ref.dequant_weight(w_q, w_s).t()
        _check("K/128 % 4 != 0", bm.plan_for(qr, xr, w_q, w_s, BF16).path, y, wr, BF16, rows, n, k)
    if arch.arch_of("cuda").blockwise_scaled_mm and cublas.has_v2():
        _check("K/128 % 4 != 0", "cublas v2", bm.run("cublas", q, xs, w_q, w_s, BF16), want, BF16, m, n, k)
        # For the record only: what raw v1 does with the unpadded layout (0.32 on torch 2.11, or an error).
        try:
            raw = torch._scaled_mm(q, w_q.t(), scale_a=xs.t().contiguous().t(), scale_b=w_s.t(), out_dtype=BF16)
            fro, worst = rel_errors(raw, want)
        except RuntimeError:
            fro = worst = float("nan")
        ROWS.append(("hazard (not used)", "raw _scaled_mm v1 unpadded", m, n, k, "bfloat16", fro, worst))


def test_v2_under_torch_compile_fullgraph(monkeypatch):
    # F.scaled_mm graph-breaks Dynamo on 2.11 / 2.12; inside the custom op it is never traced.
    if not (arch.arch_of("cuda").blockwise_scaled_mm and cublas.has_v2()):
        pytest.skip("needs SM90 and F.scaled_mm")
    monkeypatch.setattr(backends, "get_kernel", lambda op, device: lambda *a: bm.run("cublas", *a))
    q, xs, w_q, w_s = make_inputs(32, 4096, 640, device="cuda")
    f = torch.compile(lambda *a: torch.ops.fp8_fusion.blockscale_mm(*a, BF16), fullgraph=True)
    want = ref.dequant_activation(q, xs) @ ref.dequant_weight(w_q, w_s).t()
    _check("compile fullgraph", "cublas v2", f(q, xs, w_q, w_s), want, BF16, 32, 4096, 640)


@pytest.mark.parametrize("path, k", [("tiled", 4096), ("tiled", 4104), ("cublas", 4096), (None, 4104)])
@pytest.mark.parametrize("m", [1, 3, 17, 2049])
def test_per_tensor(path, k, m):
    n = 4096
    g = torch.Generator().manual_seed(m)
    fp8, fp8_max = arch.fp8_dtype("cuda"), arch.fp8_max("cuda")
    qa, sa = ref.per_tensor_quant(torch.randn(m, k, generator=g).cuda(), fp8, fp8_max)
    qw, sw = ref.per_tensor_quant(torch.randn(n, k, generator=g).cuda() * 0.05, fp8, fp8_max)
    want = (qa.float() * sa) @ (qw.float() * sw).t()
    y = per_tensor_mm(qa, sa, qw, sw, BF16, path=path)
    _check("per-tensor", path or "auto", y, want, BF16, m, n, k)


def test_ceil_blocks_on_gpu():
    n, k = 4160, 4224  # 32.5 and 33 weight blocks
    q, xs, w_q, w_s = make_inputs(17, n, k, device="cuda")
    want = ref.dequant_activation(q, xs) @ dequant_weight_128(w_q, w_s).t()
    for path in ("tiled", "small_m"):
        _check("ceil blocks", path, bm.run(path, q, xs, w_q, w_s, BF16), want, BF16, 17, n, k)


SMALL_M_VARIANTS = [
    SmallMConfig(64, 4, 4, 4, "last"),
    SmallMConfig(64, 4, 4, 4, "last", k_unroll=2),
    SmallMConfig(128, 3, 8, 4, "last"),
    SmallMConfig(256, 8, 8, 3, "last"),
    SmallMConfig(32, 1, 4, 4),
    SmallMConfig(32, 4, 4, 3, "last", fma=True),
    SmallMConfig(16, 8, 4, 3, "last", fma=True),
    SmallMConfig(64, 4, 4, 4, "last", tma=True),
    SmallMConfig(128, 1, 4, 4, "last", tma=True),
    SmallMConfig(32, 8, 4, 4, "kernel", tma=True),
    # tuning idea 20: the activation rows on the MMA's M side (the M = 64 TABLE rows' families)
    SmallMConfig(64, 1, 4, 6, "last", tma=True, swap=False),
    SmallMConfig(128, 3, 4, 4, "last", tma=True, swap=False),
    SmallMConfig(32, 2, 4, 4, "last", tma=True, swap=False),
    SmallMConfig(64, 2, 4, 4, "kernel", swap=False),
]


@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 12288), (5120, 8192)])
@pytest.mark.parametrize("m", [1, 5, 16, 40, 64, 100])
@pytest.mark.parametrize("cfg", [c for c in SMALL_M_VARIANTS if c.tma])
def test_tma_tiles_equal_pointer_tiles_bitwise_on_gpu(m, n, k, cfg):
    # Same tiles, same MMA, same promotion order: TMA loads must not change a bit (rows past M read as zeros).
    q, xs, w_q, w_s = make_inputs(m, n, k, device="cuda")
    plain = SmallMConfig(**{**cfg.__dict__, "tma": False})
    assert torch.equal(bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg),
                       bm.run("small_m", q, xs, w_q, w_s, BF16, config=plain))  # fmt: skip


@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 14336), (10240, 5120), (5120, 25600)])
@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_small_m_variants_match_oracle(m, n, k):
    w_q, w_s, w32 = _weights(n, k)
    q, xs = _activations(m, k)
    want = ref.dequant_activation(q, xs) @ w32.t()
    for cfg in SMALL_M_VARIANTS:
        if cfg.fma and m > smk.FMA_MAX_M:
            continue
        y = bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg)
        _check("small-M variant", f"small_m {cfg}", y, want, BF16, m, n, k)


@pytest.mark.parametrize("n, k", [(6144, 4096), (5120, 8192)])
@pytest.mark.parametrize("m, cfg", [
    (64, SmallMConfig(64, 1, 4, 4, "last", tma=True, block_m=32)),
    (64, SmallMConfig(64, 2, 4, 4, "last", tma=True, block_m=16)),
    (40, SmallMConfig(128, 1, 4, 4, "last", tma=True, block_m=16)),  # the last row tile of 8 rows
    (64, SmallMConfig(64, 3, 4, 4, "kernel", block_m=32)),
])  # fmt: skip
def test_rows_split_over_programs_matches_oracle(m, cfg, n, k):
    # Idea 15: programs sharing a weight tile, each with its own activation rows; the same sums as one program
    # holding all rows (the MMA's N differs, so bit equality is not promised: checked, and printed, beside it).
    w_q, w_s, w32 = _weights(n, k)
    q, xs = _activations(m, k)
    y = bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg)
    _check("rows split", f"small_m {cfg}", y, ref.dequant_activation(q, xs) @ w32.t(), BF16, m, n, k)
    whole = bm.run("small_m", q, xs, w_q, w_s, BF16, config=SmallMConfig(**{**cfg.__dict__, "block_m": 0}))
    print(f"rows split {cfg} M={m} N={n} K={k}: bit for bit the whole-rows launch: {torch.equal(y, whole)}")


@pytest.mark.parametrize("m, n, k, cfg", [
    (16, 6144, 4096, SmallMConfig(32, 8, 4, 4)),  # 192 N tiles x 8 splits: 1536 programs racing for tickets
    (100, 4096, 14336, SmallMConfig(64, 7, 4, 4)),  # two 64-row tiles
    (1, 5120, 25600, SmallMConfig(16, 16, 4, 3, fma=True)),
])  # fmt: skip
def test_last_program_sum_is_repeatable_and_equals_reduce_kernel(m, n, k, cfg):
    # A missing release / acquire would let the last program read a stale partial now and then: 100 calls must
    # all equal the two-launch sum bit for bit (same partials, same order), and the counters end at zero.
    q, xs, w_q, w_s = make_inputs(m, n, k, device="cuda")
    want = bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg)
    last = SmallMConfig(**{**cfg.__dict__, "reduce": "last"})
    mismatches = sum(not torch.equal(bm.run("small_m", q, xs, w_q, w_s, BF16, config=last), want) for _ in range(100))
    assert mismatches == 0
    assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0
    _check("last == kernel x100", f"small_m {last}", bm.run("small_m", q, xs, w_q, w_s, BF16, config=last),
           ref.dequant_activation(q, xs) @ dequant_weight_128(w_q, w_s).t(), BF16, m, n, k)  # fmt: skip


def test_last_program_sum_in_cuda_graph():
    # The counters are reset by the kernel itself, so graph replays need no memset: 50 replays, each compared.
    m, n, k = 4, 6144, 4096
    q, xs, w_q, w_s = make_inputs(m, n, k, device="cuda")
    cfg = SmallMConfig(64, 4, 4, 4, "last")
    want = bm.run("small_m", q, xs, w_q, w_s, BF16, config=SmallMConfig(64, 4, 4, 4, "kernel"))
    bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg)  # allocates the counters outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bm.run("small_m", q, xs, w_q, w_s, BF16, config=cfg)
    bad = 0
    for _ in range(50):
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        bad += not torch.equal(y, want)
    assert bad == 0


# Known failures on the H200 (torch 2.11, Triton 3.6, 2026-11-29); strict, so a fix shows up as XPASS -> failure.
# Neither path is used by default: blockscale_mm.TABLE pins reduce="kernel" and nothing dispatches small_m_mm_bf16.
def test_last_program_sum_under_cudagraph_trees(monkeypatch):
    # torch.compile(mode="reduce-overhead"): the counters are first allocated during a cudagraph-tree warmup run
    # (on a helper thread, outside the tree's pool: this failed with "tensor(s) in the cudagraph pool not tracked
    # as outputs" while they were allocated on this thread), then every replay must still find them at zero.
    m, n, k = 4, 4096, 4096
    last, twin = SmallMConfig(64, 4, 4, 4, "last"), SmallMConfig(64, 4, 4, 4, "kernel")
    monkeypatch.setitem(bm.TABLE, (arch.arch_of("cuda").name, bm.m_bucket(m), n, k), bm.Choice("small_m", last))
    monkeypatch.setattr(smk, "_counters", {})
    w_q, w_s, _ = _weights(n, k)
    f = torch.compile(lambda q, xs: torch.ops.fp8_fusion.blockscale_mm(q, xs, w_q, w_s, BF16), mode="reduce-overhead")
    reduces, real = [], smk._splitk_reduce_kernel

    class SpyReduce:  # the two-launch sum's second launch
        def __getitem__(self, grid):
            reduces.append(grid)
            return real[grid]

    monkeypatch.setattr(smk, "_splitk_reduce_kernel", SpyReduce())
    with backends.use_backend("triton"):
        calls = []
        for seed in range(8):
            q, xs = _activations(m, k, seed)
            torch.compiler.cudagraph_mark_step_begin()
            calls.append((q, xs, f(q, xs).clone()))
        # the warmup made the counters of the stream the tree captures on, so the graph took the tickets
        assert reduces == []
        for seed, (q, xs, y) in enumerate(calls):
            assert torch.equal(y, bm.run("small_m", q, xs, w_q, w_s, BF16, config=twin)), f"call {seed}"
    # one buffer: the tree's stream's (not this thread's current stream), zero after every replay
    ((device, stream),) = smk._counters
    assert device == q.device and stream != torch.cuda.current_stream().cuda_stream
    assert int(smk._counters[(device, stream)].abs().sum()) == 0


@pytest.mark.parametrize("n, k", [(6144, 4096), (5120, 25600)])
@pytest.mark.parametrize("m", [1, 5, 16, 64])
def test_bf16_input_gemm_matches_oracle(m, n, k):
    w_q, w_s, w32 = _weights(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device="cuda", dtype=BF16)
    q, xs = ref.group_quant(x, 128, arch.fp8_dtype("cuda"), arch.fp8_max("cuda"))
    want = ref.dequant_activation(q, xs) @ w32.t()
    for cfg in (SmallMConfig(64, 4, 4, 4, "last"), SmallMConfig(32, 1, 4, 4)):
        y = smk.small_m_mm_bf16(x, w_q, w_s, BF16, 128, cfg)
        same = torch.equal(y, smk.small_m_mm(q, xs, w_q, w_s, BF16, cfg))
        _check("bf16 input", f"small_m_bf16 {cfg} (bitwise = fp8 input: {same})", y, want, BF16, m, n, k)


@pytest.mark.parametrize("ns, k", [((4096, 1024, 1024), 4096), ((14336, 14336), 4096), ((8192, 1024, 1024), 5120),
                                   ((25600, 25600), 5120)])  # fmt: skip
@pytest.mark.parametrize("m", [1, 3])
def test_grouped_gemv_is_the_separate_gemvs_bitwise(m, ns, k):
    # HF's separate q / k / v and gate / up (Llama-3.1-8B, Qwen3-32B) in one GEMV launch at the merged shape's
    # TABLE config (blockscale_mm_grouped at one row): each weight read in place, each row summed as gemv_mm sums it
    from fp8_fusion_pass.kernels.triton import blockscale_mm_grouped as bmg
    from fp8_fusion_pass.kernels.triton._gemv_kernels import gemv_mm

    q, xs, _, _ = make_inputs(m, 128, k, device="cuda", seed=1)
    ws, ss = zip(*[make_inputs(m, n, k, device="cuda", seed=2 + i)[2:] for i, n in enumerate(ns)])
    choice = bmg.grouped_choice(q, xs, ws, ss, BF16)
    assert m > 1 or choice.path == "gemv", choice  # M = 1: every merged shape here has a GEMV row
    if choice.path != "gemv":
        return  # M = 3 (bucket 4): the small-M rows, covered above
    with backends.use_backend("triton"):
        got = torch.ops.fp8_fusion.blockscale_mm_grouped(q, xs, list(ws), list(ss), BF16)
    want = torch.cat([gemv_mm(q, xs, w, s, BF16, choice.config) for w, s in zip(ws, ss)], -1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("ns, k", [((4096, 1024, 1024), 4096), ((12288, 12288), 4096), ((8192, 1024, 1024), 5120)])
@pytest.mark.parametrize("m", [33, 64])
def test_grouped_launch_at_the_m64_rows_is_the_separate_launches_bitwise(m, ns, k):
    # HF's separate q / k / v and gate / up at batch 33-64: blockscale_mm_grouped takes the merged shape's M = 64
    # TABLE row (the activation rows on the MMA's M side since idea 20) and runs it through pointer tiles (a
    # descriptor addresses one weight); each weight's tiles as a launch of its own with pointer tiles sums them.
    from fp8_fusion_pass.kernels.triton import blockscale_mm_grouped as bmg

    q, xs, _, _ = make_inputs(m, 128, k, device="cuda", seed=1)
    ws, ss = zip(*[make_inputs(m, n, k, device="cuda", seed=2 + i)[2:] for i, n in enumerate(ns)])
    choice = bmg.grouped_choice(q, xs, ws, ss, BF16)
    assert choice is not None and choice.path == "small_m", choice
    with backends.use_backend("triton"):
        got = torch.ops.fp8_fusion.blockscale_mm_grouped(q, xs, list(ws), list(ss), BF16)
    plain = dataclasses.replace(choice.config, tma=False)
    want = torch.cat([smk.small_m_mm(q, xs, w, s, BF16, plain) for w, s in zip(ws, ss)], -1)
    assert torch.equal(got, want), f"{choice.config}"
