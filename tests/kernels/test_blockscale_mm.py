"""blockscale_mm / per_tensor_mm on the Triton backend: every path against the fp32 dequantized reference.

CPU (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): the Triton tiled and small-M kernels at small N,
the pure dispatch rules (a simulated SM90 never sends K/128 % 4 != 0 to ``torch._scaled_mm`` v1), input
validation. On a GPU these run natively; ``test_blockscale_mm_gpu.py`` adds every path (cuBLAS v1, cuBLAS v2
padded, Triton tiled, Triton small-M) at the real K and odd M.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gemm_helpers import DEVICE, assert_close, make_inputs, oracle

import fp8_fusion_pass.kernels.ops  # noqa: F401  (registers torch.ops.fp8_fusion)
from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels import backends, cublas
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm
from fp8_fusion_pass.kernels.triton._blockscale_kernels import TiledConfig
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton.per_tensor_mm import path_for, per_tensor_mm

BF16, FP32 = torch.bfloat16, torch.float32


# ---------------------------------------------------------------- Triton kernels (interpreter on the CPU)

TRITON_PATHS = ("tiled", "small_m")


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize(
    "m, n, k",
    [
        (1, 128, 4096),  # decode row, Qwen3-8B / Llama hidden size, K/128 = 32
        (3, 256, 5120),  # Qwen3-32B hidden size, K/128 = 40
        (17, 128, 640),  # K/128 = 5: cuBLAS v1 would be silently wrong here
        (17, 256, 384),  # K/128 = 3
    ],
)
def test_triton_paths_match_reference(path, m, n, k):
    q, xs, w_q, w_s = make_inputs(m, n, k)
    want = oracle(q, xs, w_q, w_s)
    assert_close(bm.run(path, q, xs, w_q, w_s, FP32), want, FP32, f"{path} M={m} N={n} K={k}")


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize("out_dtype", [BF16, torch.float16])
def test_triton_paths_round_once_to_out_dtype(path, out_dtype):
    q, xs, w_q, w_s = make_inputs(5, 256, 640)
    assert_close(bm.run(path, q, xs, w_q, w_s, out_dtype), oracle(q, xs, w_q, w_s), out_dtype, path)


@pytest.mark.parametrize("path", TRITON_PATHS)
@pytest.mark.parametrize("m, n, k, group", [(3, 200, 640, 128), (5, 130, 320, 64), (2, 256, 384, 64)])
def test_ceil_blocks_and_group_64(path, m, n, k, group):
    # N=200 / 130, K=320: partial last weight blocks; group 64: two activation scales per weight block.
    q, xs, w_q, w_s = make_inputs(m, n, k, group=group)
    assert w_s.shape == (-(-n // 128), -(-k // 128))
    assert_close(bm.run(path, q, xs, w_q, w_s, FP32), oracle(q, xs, w_q, w_s), FP32, f"{path} N={n} K={k}")


@pytest.mark.parametrize(
    "config",
    [
        SmallMConfig(16, 2, 4, 2),
        SmallMConfig(32, 1, 4, 2),
        SmallMConfig(64, 3, 4, 2),
        SmallMConfig(128, 8, 4, 2),
        SmallMConfig(64, 64, 4, 2),
    ],
)
def test_small_m_split_k_variants(config):
    # K/128 = 5 tiles: split 3 -> 2+2+1 tiles, split 8 and 64 are clamped to 5 programs of one tile each.
    q, xs, w_q, w_s = make_inputs(33, 256, 640)  # 33 rows: two 32-row programs along M, the second nearly empty
    y = bm.run("small_m", q, xs, w_q, w_s, FP32, config=config)
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, str(config))


@pytest.mark.parametrize(
    "m, config",
    [
        (3, SmallMConfig(64, 3, 4, 2, "last")),  # 8 K tiles: 3 + 3 + 2, summed by the last program
        (3, SmallMConfig(32, 3, 4, 2, "last", k_unroll=2)),  # 4 + 4: each split a multiple of the unroll
        (3, SmallMConfig(32, 8, 4, 2, "kernel", k_unroll=2)),  # 8 splits asked, 4 run (2 tiles each)
        (1, SmallMConfig(16, 2, 4, 2, "last", fma=True)),  # GEMV
        (4, SmallMConfig(64, 1, 4, 2, fma=True)),
        (33, SmallMConfig(128, 4, 8, 2, "last")),
    ],
)
def test_small_m_variants(m, config):
    q, xs, w_q, w_s = make_inputs(m, 200, 1024)  # N=200: a partial last weight block and N tile
    assert_close(bm.run("small_m", q, xs, w_q, w_s, FP32, config=config), oracle(q, xs, w_q, w_s), FP32, str(config))


@pytest.mark.parametrize("split", [3, 6])  # 6: the last program's second group of four partials, two missing
def test_last_program_sum_equals_reduce_kernel_bitwise(split):
    # Same partials, same order: the in-launch sum must be bit-identical to the second launch's. 70 rows is two
    # 64-row tiles, so the counters of both row tiles are used; afterwards every counter is back at 0.
    q, xs, w_q, w_s = make_inputs(70, 200, 768)
    y_kernel = bm.run("small_m", q, xs, w_q, w_s, FP32, config=SmallMConfig(64, split, 4, 2, "kernel"))
    for _ in range(2):  # the second call reuses the counters the first one reset
        y_last = bm.run("small_m", q, xs, w_q, w_s, FP32, config=SmallMConfig(64, split, 4, 2, "last"))
        assert torch.equal(y_last, y_kernel)
    assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0
    assert_close(y_last, oracle(q, xs, w_q, w_s), FP32, "last")


@pytest.mark.parametrize("m, n, k, group, config", [
    (3, 200, 1024, 128, SmallMConfig(64, 3, 4, 2, "last", tma=True)),  # rows past N and M read as zeros
    (70, 200, 768, 128, SmallMConfig(64, 2, 4, 2, "kernel", tma=True)),  # two 64-row tiles, the second nearly empty
    (17, 256, 640, 64, SmallMConfig(32, 2, 4, 2, "last", k_unroll=2, tma=True)),  # 64-wide K tiles, unrolled
    (5, 256, 512, 128, SmallMConfig(128, 1, 4, 2, tma=True)),  # one program per tile, no split
])  # fmt: skip
def test_tma_tiles_equal_pointer_tiles_bitwise(m, n, k, group, config):
    # The copy engine moves the same tiles into the same MMA: the output must not change by a bit.
    q, xs, w_q, w_s = make_inputs(m, n, k, group=group)
    a_desc, _ = smk._descriptors(q, [(w_q, w_s)], config, smk.small_m_block_m(m), 128 if group == 128 else 64, False)
    assert a_desc is not q  # the TMA path is the one under test
    y = bm.run("small_m", q, xs, w_q, w_s, FP32, config=config)
    plain = dataclasses.replace(config, tma=False)
    assert torch.equal(y, bm.run("small_m", q, xs, w_q, w_s, FP32, config=plain))
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, str(config))


@pytest.mark.parametrize("m, config", [
    (64, SmallMConfig(64, 1, 4, 2, "last", tma=True, block_m=32)),  # two row tiles per weight tile, TMA
    (40, SmallMConfig(64, 3, 4, 2, "last", block_m=16)),  # three row tiles (the last partial) x split 3, "last"
    (33, SmallMConfig(32, 2, 4, 2, "kernel", tma=True, block_m=32)),  # a second row tile of one row, two launches
    (8, SmallMConfig(64, 2, 4, 2, "last", block_m=32)),  # M below block_m: one 16-row tile, as without it
])  # fmt: skip
def test_rows_split_over_programs(m, config):
    # block_m < M: several programs share a weight tile, each with its own activation rows (idea 15)
    q, xs, w_q, w_s = make_inputs(m, 200, 640)
    y = bm.run("small_m", q, xs, w_q, w_s, FP32, config=config)
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, str(config))
    if config.reduce == "last" and config.split_k > 1:
        assert int(smk.tile_counters(q.device, 1).abs().sum()) == 0  # the row tiles' counters are reset too


def _distinct(scales: torch.Tensor) -> torch.Tensor:
    """Factors 1, 2, 3, ... per weight-scale block: random weights give blocks of nearly equal scale, and a
    kernel reading another block's scale must not pass for one that reads its own."""
    return torch.arange(1, scales.numel() + 1, dtype=scales.dtype, device=scales.device).reshape(scales.shape)


@pytest.mark.parametrize("m, config", [
    (5, SmallMConfig(64, 3, 4, 2, "last", swap=False)),  # pointer tiles, in-launch split-K sum, 5 rows of 64
    (64, SmallMConfig(32, 1, 4, 2, "last", tma=True, swap=False)),  # TMA tiles, one split
    (40, SmallMConfig(128, 2, 4, 2, "kernel", tma=True, swap=False)),  # rows past M read as zeros, two launches
    (17, SmallMConfig(64, 2, 4, 2, "last", k_unroll=2, swap=False)),  # two K tiles per step
    (24, SmallMConfig(64, 2, 4, 2, "last", tma=True, block_m=16, swap=False)),  # 16-row tiles: two, one partial
])  # fmt: skip
def test_activation_rows_on_the_mma_m_side(m, config):
    # Tuning idea 20: the MMA's operands swapped and one weight scale per tile. N = 200: the last 64-row tile
    # starts in the second scale block and wraps past N, so a scale taken from the wrong row would show.
    q, xs, w_q, w_s = make_inputs(m, 200, 640)
    w_s = w_s * _distinct(w_s)
    y = bm.run("small_m", q, xs, w_q, w_s, FP32, config=config)
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, str(config))
    swapped = bm.run("small_m", q, xs, w_q, w_s, FP32, config=dataclasses.replace(config, swap=True))
    assert_close(y, swapped, FP32, f"{config} against swap-AB")
    if config.tma:  # the same tiles through pointers: the same bits
        assert torch.equal(y, bm.run("small_m", q, xs, w_q, w_s, FP32, config=dataclasses.replace(config, tma=False)))
    # three weights in one launch (q / k / v): each N tile takes its own weight's scales
    ws = [(w, s * _distinct(s)) for w, s in (make_inputs(m, n, 640, seed=n)[2:] for n in (128, 64, 192))]
    grouped = smk.small_m_mm_grouped(q, xs, [w for w, _ in ws], [s for _, s in ws], FP32, config)
    assert_close(grouped, torch.cat([oracle(q, xs, w, s) for w, s in ws], -1), FP32, f"{config} grouped")


def test_tma_falls_back_where_a_descriptor_cannot_address(monkeypatch):
    # A base off 16 bytes, or several weights in one launch: the pointer loads run, with the same result.
    q, xs, w_q, w_s = make_inputs(5, 256, 512)
    cfg = SmallMConfig(64, 2, 4, 2, "last", tma=True)
    shifted = torch.empty(5, 512 + 16, dtype=q.dtype)[:, 1:513]
    shifted.copy_(q)
    assert smk._descriptors(shifted, [(w_q, w_s)], cfg, 16, 128, False)[0] is shifted
    assert smk._descriptors(q, [(w_q, w_s)] * 2, cfg, 16, 128, False)[0] is q
    assert smk._descriptors(q, [(w_q, w_s)], cfg, 16, 128, True)[0] is q  # bf16 input: quantized inside
    monkeypatch.setattr(arch, "triton_interpreting", lambda: False)
    for name, has_tma in (("sm89", False), ("gfx942", False), ("sm90", True)):  # TMA: Hopper on
        with arch.simulate_arch(name):
            assert (smk._descriptors(q, [(w_q, w_s)], cfg, 16, 128, False)[0] is not q) == has_tma, name
    monkeypatch.undo()
    want = bm.run("small_m", q, xs, w_q, w_s, FP32, config=dataclasses.replace(cfg, tma=False))
    assert torch.equal(bm.run("small_m", shifted, xs, w_q, w_s, FP32, config=cfg), want)
    grouped = smk.small_m_mm_grouped(q, xs, [w_q, w_q[:128]], [w_s, w_s[:1]], FP32, cfg)
    assert torch.equal(grouped[:, :256], want)


def test_tma_config_rejects_the_gemv():
    with pytest.raises(ValueError, match="tma"):
        SmallMConfig(16, 1, 4, 2, fma=True, tma=True)


@pytest.mark.parametrize("cause", ["slots", "env"])
def test_last_falls_back_to_reduce_kernel(monkeypatch, cause):
    q, xs, w_q, w_s = make_inputs(3, 256, 512)
    want = bm.run("small_m", q, xs, w_q, w_s, BF16, config=SmallMConfig(64, 2, 4, 2, "kernel"))
    launches = []

    class SpyReduce:  # counts the second launch
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    real = smk._splitk_reduce_kernel
    monkeypatch.setattr(smk, "_splitk_reduce_kernel", SpyReduce())
    if cause == "slots":
        monkeypatch.setattr(smk, "COUNTER_SLOTS", 3)  # 4 N tiles x 1 row tile > 3 slots
    else:  # FP8_FUSION_TICKETS=0: no shared counters (models running concurrently on several streams)
        monkeypatch.setenv(smk.TICKETS_ENV, "0")
    assert torch.equal(bm.run("small_m", q, xs, w_q, w_s, BF16, config=SmallMConfig(64, 2, 4, 2, "last")), want)
    assert len(launches) == 1


def test_counters_per_stream_and_none_made_in_a_capture(monkeypatch):
    # CUDA's bookkeeping without a GPU: stream handles, a capture flag, an allocator that counts its buffers.
    now, made = {"stream": 7, "capturing": True}, []
    monkeypatch.setattr(smk, "_stream_handle", lambda device: now["stream"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: now["capturing"])
    monkeypatch.setattr(smk, "_allocate_off_thread", lambda device: made.append(torch.zeros(4)) or made[-1])
    monkeypatch.setattr(smk, "_counters", {})
    dev = torch.device("cuda", 0)
    # a capture before any buffer: none is made (it would live in the graph's private pool), "kernel" runs
    assert smk.tile_counters(dev, 4) is None and made == []
    now["capturing"] = False
    a = smk.tile_counters(dev, 4)
    assert a is made[0] and smk.tile_counters(dev, 4) is a  # one buffer per stream, made once
    now["stream"] = 9
    b = smk.tile_counters(dev, 4)
    assert b is made[1] and b is not a  # another stream: its own tickets, never stream 7's
    now["capturing"] = True
    assert smk.tile_counters(dev, 4) is b  # a capture on a stream with counters uses them
    now["stream"] = 11
    assert smk.tile_counters(dev, 4) is a and len(made) == 2  # one without: the device's first buffer
    now["capturing"] = False
    monkeypatch.setattr(smk, "MAX_STREAM_BUFFERS", 2)  # streams without end: past the cap, no more buffers
    assert smk.tile_counters(dev, 4) is None and len(made) == 2
    now["stream"] = 9
    assert smk.tile_counters(dev, 4) is b  # the streams that have one keep it


@pytest.mark.parametrize("m, group, config", [
    (5, 128, SmallMConfig(64, 3, 4, 2, "last", k_unroll=2)),
    (17, 64, SmallMConfig(32, 2, 4, 2, "kernel")),
    (2, 128, SmallMConfig(32, 4, 4, 2, "last", fma=True)),
])  # fmt: skip
def test_bf16_input_quantizes_inside_bitwise(m, group, config):
    # small_m_mm_bf16(x) == small_m_mm(group_quant(x)): the in-kernel quant is the reference's, bit for bit,
    # with an all-zero row, a huge group, and a tiny one (fp8 subnormals).
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 1024, generator=g).to(device=DEVICE, dtype=BF16)
    x[m // 2] = 0
    x[0, :group] *= 1e4
    x[-1, -group:] *= 1e-6
    q, xs = ref.group_quant(x, group, arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE))
    _, _, w_q, w_s = make_inputs(1, 256, 1024)
    y = smk.small_m_mm_bf16(x, w_q, w_s, FP32, group, config)
    assert torch.equal(y, smk.small_m_mm(q, xs, w_q, w_s, FP32, config))
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, "bf16 input")


def test_small_m_config_rules():
    with pytest.raises(ValueError, match="reduce"):
        SmallMConfig(reduce="atomic")
    with pytest.raises(ValueError, match="power of two"):
        SmallMConfig(block_n=48)
    with pytest.raises(ValueError, match="block_m"):
        SmallMConfig(block_m=8)
    with pytest.raises(ValueError, match="block_m"):
        SmallMConfig(block_m=16, fma=True)
    with pytest.raises(ValueError, match="swap False"):
        SmallMConfig(swap=False, fma=True)
    with pytest.raises(ValueError, match="swap False"):
        SmallMConfig(256, swap=False)  # a 256-row tile spans two weight-scale blocks
    q, xs, w_q, w_s = make_inputs(5, 128, 256)
    with pytest.raises(ValueError, match="M <= 4"):
        bm.run("small_m", q, xs, w_q, w_s, BF16, config=SmallMConfig(fma=True))
    x = torch.randn(5, 256, dtype=BF16, device=DEVICE)
    with pytest.raises(ValueError, match="group 384"):
        smk.small_m_mm_bf16(x, w_q, w_s, BF16, 384)
    with pytest.raises(ValueError, match="K-contiguous"):
        smk.small_m_mm_bf16(x.t().contiguous().t(), w_q, w_s, BF16)
    with pytest.raises(ValueError, match="swap False takes fp8"):
        smk.small_m_mm_bf16(x, w_q, w_s, BF16, 128, SmallMConfig(64, 1, 4, 2, "last", swap=False))


def test_tiled_grouped_launch_order_covers_every_tile():
    # 40 rows in 16-row tiles x 8 column tiles, GROUP_M=2: a remainder group of one row tile.
    q, xs, w_q, w_s = make_inputs(40, 256, 256)
    y = bm.run("tiled", q, xs, w_q, w_s, FP32, config=TiledConfig(16, 32, group_m=2, warps=4, stages=1))
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, "tiled grouped")


@pytest.mark.parametrize("path", TRITON_PATHS)
def test_zero_rows_and_huge_rows(path):
    q, xs, w_q, w_s = make_inputs(4, 128, 256)
    x = torch.randn(4, 256, dtype=BF16, device=DEVICE)
    x[1] = 0  # all-zero groups: scale 1e-10 / 448, q = 0 -> an exact zero row
    x[2] *= 1e30  # huge but finite after quant: the scale carries the magnitude
    q, xs = ref.group_quant(x, 128, arch.fp8_dtype(DEVICE), arch.fp8_max(DEVICE))
    y = bm.run(path, q, xs, w_q, w_s, FP32)
    assert torch.all(y[1] == 0)
    assert_close(y, oracle(q, xs, w_q, w_s), FP32, "zero / huge rows")


def test_empty_m():
    q, xs, w_q, w_s = make_inputs(1, 128, 256)
    for path in TRITON_PATHS:
        assert bm.run(path, q[:0], xs[:0], w_q, w_s, BF16).shape == (0, 128)


def test_public_launcher_uses_the_plan():
    # On the CPU: no cuBLAS, so M <= 64 -> small_m, above -> tiled; both match the oracle.
    for m, path in ((3, "small_m"), (65, "tiled")):
        q, xs, w_q, w_s = make_inputs(m, 128, 256)
        if DEVICE == "cpu":
            assert bm.plan_for(q, xs, w_q, w_s, BF16).path == path
        assert_close(bm.blockscale_mm(q, xs, w_q, w_s, BF16), oracle(q, xs, w_q, w_s), BF16, f"M={m}")


def test_op_through_triton_backend():
    q, xs, w_q, w_s = make_inputs(3, 128, 512)
    with backends.use_backend("triton"):
        assert backends.backend_for("blockscale_mm", q.device) == "triton"
        y = torch.ops.fp8_fusion.blockscale_mm(q, xs, w_q, w_s, BF16)
    assert_close(y, oracle(q, xs, w_q, w_s), BF16, "op")


def test_custom_op_hides_the_kernel_from_dynamo(monkeypatch):
    # F.scaled_mm (the v2 cuBLAS path) breaks Dynamo graphs on torch 2.11 / 2.12. It runs inside the real
    # implementation of the custom op, which Dynamo never traces: a graph break there is invisible to fullgraph.
    calls = []

    def kernel_with_graph_break(q, xs, w_q, w_s, out_dtype):
        torch._dynamo.graph_break()
        calls.append(q.shape[0])
        return bm.blockscale_mm(q, xs, w_q, w_s, out_dtype)

    monkeypatch.setattr(backends, "get_kernel", lambda op, device: kernel_with_graph_break)
    q, xs, w_q, w_s = make_inputs(4, 128, 256)
    f = torch.compile(lambda *a: torch.ops.fp8_fusion.blockscale_mm(*a, BF16) * 2, fullgraph=True, backend="eager")
    y = f(q, xs, w_q, w_s)
    assert calls == [4]
    assert_close(y / 2, oracle(q, xs, w_q, w_s), BF16, "compiled")


# ---------------------------------------------------------------- dispatch rules (pure, simulated archs)

FP8 = torch.float8_e4m3fn


def _plan(arch_name, m, n, k, group=128, out_dtype=BF16, device_type="cuda"):
    with arch.simulate_arch(arch_name) as a:
        return bm.plan(a, device_type, FP8, m, n, k, group, out_dtype)


@pytest.mark.parametrize("k", [384, 640, 1152, 5120 + 128])  # K/128 = 3, 5, 9, 41
def test_v1_never_gets_k_blocks_not_multiple_of_4(k):
    assert cublas.blockwise_variant(k) != "v1"
    with arch.simulate_arch("sm90") as a:
        reason = cublas.blockwise_unsupported(a, "cuda", FP8, 4096, k, 128, BF16, variant="v1")
        assert reason is not None and "silently" in reason
        assert cublas.blockwise_unsupported(a, "cuda", FP8, 4096, k, 128, BF16, variant="v2") == (
            None if cublas.has_v2() else "this torch has no torch.nn.functional.scaled_mm"
        )
    choice = _plan("sm90", 256, 4096, k)
    assert choice.path == ("cublas" if cublas.has_v2() else "tiled")


@pytest.mark.parametrize("k", [4096, 5120, 8192, 12288, 14336, 25600])
def test_v1_for_model_k(k):
    assert cublas.blockwise_variant(k) == "v1"
    assert _plan("sm90", 2048, 4096, k).path == "cublas"


@pytest.mark.parametrize(
    "arch_name, m, n, k, group, out_dtype, want",
    [
        ("sm90", 1, 4096, 4096, 128, BF16, "gemv"),  # decode, one row: the GEMV measured fastest
        ("sm90", 1, 4096, 4096, 64, BF16, "small_m"),  # the GEMV takes 1x128 groups only
        ("sm90", 64, 4096, 4096, 128, BF16, "small_m"),
        ("sm90", 65, 4096, 4096, 128, BF16, "cublas"),
        ("sm90", 2048, 4096, 4096, 128, FP32, "tiled"),  # only bf16 output was verified on cuBLAS
        ("sm90", 2048, 4096, 4096, 64, BF16, "tiled"),  # 1x64 groups: not a cuBLAS recipe
        ("sm90", 2048, 4160, 4096, 128, BF16, "tiled"),  # ceil blocks
        ("sm89", 2048, 4096, 4096, 128, BF16, "tiled"),  # block-wise cuBLASLt is SM90 only
        ("gfx942", 2048, 4096, 4096, 128, BF16, "tiled"),  # and never ROCm
        ("sm80", 2048, 4096, 4096, 128, BF16, "dequant"),  # no fp8 Triton
        ("sm90", 2048, 4096, 4096, 16, BF16, "dequant"),  # a 16-wide K tile cannot use an 8-bit MMA
    ],
)
def test_plan(arch_name, m, n, k, group, out_dtype, want):
    assert _plan(arch_name, m, n, k, group, out_dtype).path == want


def test_a_gpu_gemm_on_the_reference_path_is_named_once(monkeypatch):
    """The dequant path on a GPU is a silent slowdown of 10x and more: the reason is warned, once per kind of GEMM;
    the CPU (whose path the reference is) and every shape a kernel takes stay quiet."""
    with arch.simulate_arch("sm90") as a:
        message = bm.slow_path_warning(a, "cuda", FP8, 4096, 4096, 16, BF16)
        assert message and "activation group 16" in message and "group_size=128" in message
        assert bm.slow_path_warning(a, "cuda", FP8, 4096, 4096, 128, BF16) is None
        assert bm.slow_path_warning(a, "cuda", FP8, 4096, 4096, 64, BF16) is None  # Triton takes 1x64 groups
        assert bm.slow_path_warning(a, "cpu", FP8, 4096, 4096, 16, BF16) is None
    with arch.simulate_arch("sm80") as a:
        message = bm.slow_path_warning(a, "cuda", FP8, 4096, 4096, 128, BF16)
        assert "no fp8" in message.lower() and "group_size=128" not in message  # the group is not the cause
    # the launcher: a GEMM planned onto dequant warns where slow_path_warning has a reason, and only once
    monkeypatch.setattr(bm, "slow_path_warning", lambda *args: "slow on purpose")
    monkeypatch.setattr(bm, "_WARNED_SLOW", set())
    q, xs, w_q, w_s = make_inputs(3, 256, 256, group=16, device="cpu")
    with pytest.warns(UserWarning, match="slow on purpose") as record:
        bm.blockscale_mm(q, xs, w_q, w_s, BF16)
        bm.blockscale_mm(q, xs, w_q, w_s, BF16)
    assert len([w for w in record if "slow on purpose" in str(w.message)]) == 1


def test_table_entries_win_but_never_over_legality(monkeypatch):
    monkeypatch.setitem(bm.TABLE, ("sm90", 16, 4096, 4096), bm.Choice("tiled", TiledConfig(16, 64)))
    monkeypatch.setitem(bm.TABLE, ("sm90", 2048, 4096, 640), bm.Choice("cublas"))
    monkeypatch.setitem(bm.TABLE, ("sm89", 2048, 4096, 4096), bm.Choice("cublas"))
    assert _plan("sm90", 9, 4096, 4096) == bm.Choice("tiled", TiledConfig(16, 64))  # bucket 16 covers 5..16
    assert _plan("sm90", 2048, 4096, 640, out_dtype=FP32).path == "tiled"  # table says cuBLAS: illegal here
    assert _plan("sm89", 2048, 4096, 4096).path == "tiled"


def test_table_gemv_entry_only_for_its_rows(monkeypatch):
    gemv = bm.Choice("small_m", SmallMConfig(32, 4, reduce="last", fma=True))
    monkeypatch.setitem(bm.TABLE, ("sm90", 16, 4096, 4096), gemv)
    monkeypatch.setitem(bm.TABLE, ("sm90", 4, 4096, 4096), gemv)
    assert _plan("sm90", 3, 4096, 4096) == gemv
    assert _plan("sm90", 9, 4096, 4096) == bm.Choice("small_m")  # bucket 16 says GEMV: illegal at 9 rows


def test_m_buckets():
    assert [bm.m_bucket(m) for m in (1, 2, 4, 5, 16, 64, 65, 256, 257, 2048, 2049, 100000)] == [
        1, 4, 4, 16, 16, 64, 128, 256, 2048, 2048, 8192, 8192
    ]  # fmt: skip


def test_cublas_refuses_cpu_tensors_before_calling_torch(monkeypatch):
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: pytest.fail("cuBLAS must not be reached"))
    q, xs, w_q, w_s = make_inputs(4, 128, 384, device="cpu")
    with pytest.raises(ValueError, match="SM90"):
        cublas.blockwise_mm(q, xs, w_q, w_s, BF16, variant="v1")
    with pytest.raises(ValueError, match="unknown path"):
        bm.run("cutlass", q, xs, w_q, w_s, BF16)


# ---------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda a: {**a, "q": a["q"].float()}, TypeError, "q must be fp8"),
        (lambda a: {**a, "w_q": a["w_q"].to(torch.float8_e5m2)}, TypeError, "w_q must have q's fp8 dtype"),
        (lambda a: {**a, "x_scale": a["x_scale"].half()}, TypeError, "x_scale and w_scale must be fp32"),
        (lambda a: {**a, "x_scale": a["x_scale"][:, :1].repeat(1, 3)}, ValueError, "x_scale must be"),
        (lambda a: {**a, "w_scale": a["w_scale"][:1]}, ValueError, "w_scale must be"),
        (lambda a: {**a, "w_q": a["w_q"][:, :128]}, ValueError, "w_q must be"),
        (lambda a: {**a, "out_dtype": torch.int32}, TypeError, "out_dtype"),
    ],
)
def test_bad_input_names_the_argument(mutate, error, match):
    q, xs, w_q, w_s = make_inputs(2, 256, 512, device="cpu")
    args = mutate({"q": q, "x_scale": xs, "w_q": w_q, "w_scale": w_s, "out_dtype": BF16})
    with pytest.raises(error, match=match):
        bm.blockscale_mm(args["q"], args["x_scale"], args["w_q"], args["w_scale"], args["out_dtype"])


# ---------------------------------------------------------------- per-tensor


def _per_tensor_inputs(m, n, k, device=DEVICE):
    g = torch.Generator().manual_seed(1)
    fp8, fp8_max = arch.fp8_dtype(device), arch.fp8_max(device)
    qa, sa = ref.per_tensor_quant(torch.randn(m, k, generator=g).to(device), fp8, fp8_max)
    qw, sw = ref.per_tensor_quant(torch.randn(n, k, generator=g).to(device) * 0.05, fp8, fp8_max)
    return qa, sa, qw, sw


@pytest.mark.parametrize("m, n, k", [(5, 48, 100), (1, 128, 4096)])  # K=100: masked K tail
def test_per_tensor_tiled(m, n, k):
    qa, sa, qw, sw = _per_tensor_inputs(m, n, k)
    want = (qa.float() * sa) @ (qw.float() * sw).t()
    assert_close(per_tensor_mm(qa, sa, qw, sw, FP32, path="tiled"), want, FP32, "per-tensor tiled")
    assert_close(per_tensor_mm(qa, sa, qw, sw, BF16), want, BF16, "per-tensor auto")
    if DEVICE == "cpu":
        assert path_for(qa, qw, BF16) == "tiled"


def test_per_tensor_unknown_path():
    qa, sa, qw, sw = _per_tensor_inputs(2, 16, 32, device="cpu")
    with pytest.raises(ValueError, match="unknown path"):
        per_tensor_mm(qa, sa, qw, sw, BF16, path="cutlass")
