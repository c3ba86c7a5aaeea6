"""On a CUDA sm90+ GPU: programmatic dependent launch (``FP8_FUSION_PDL=1``, ``_pdl.py``) changes no bit.

Run on the H200 with ``python -m pytest tests/kernels/test_pdl_gpu.py -m gpu -q``. Every output with PDL on (with
and without the GEMM's L2 prefetch) must equal the one with PDL off bitwise: the small-M GEMM at decode M with both
split-K sums, the grouped and bf16-input GEMMs, the tiled GEMM and the norm / silu / quant kernels; then a chain
of dependent kernels, two decoder MLP blocks (norm_quant -> gate_up GEMM -> silu_quant -> down GEMM ->
add_norm_quant -> ...), captured in one ``torch.cuda.CUDAGraph`` with PDL on and replayed on new inputs. A kernel
that read its producer's output before ``gdc_wait`` would read the previous replay's values there, and one that
stored before it could overwrite a buffer its predecessor still reads.
"""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import make_inputs

from fp8_fusion_pass.kernels.triton import _pdl
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
from fp8_fusion_pass.kernels.triton._blockscale_kernels import tiled_mm
from fp8_fusion_pass.kernels.triton._small_m_kernels import SmallMConfig
from fp8_fusion_pass.kernels.triton.add_rms_norm import add_rms_norm
from fp8_fusion_pass.kernels.triton.group_quant import group_quant
from fp8_fusion_pass.kernels.triton.rms_norm import rms_norm
from fp8_fusion_pass.kernels.triton.rms_norm_group_quant import add_rms_norm_group_quant, rms_norm_group_quant
from fp8_fusion_pass.kernels.triton.silu_and_mul import silu_and_mul
from fp8_fusion_pass.kernels.triton.silu_mul_group_quant import silu_mul_group_quant

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
EPS = 1e-6
HIDDEN, INTER = 4096, 12288  # Qwen3-8B
MS = (1, 16, 64)
REDUCES = ("kernel", "last")
# PDL off, on, on without the GEMM's L2 weight prefetch: _pdl.switched(on, prefetch)
MODES = {"off": (False, True), "on": (True, True), "on, no prefetch": (True, False)}


def pdl(mode: str):
    """The launches inside see PDL ``mode`` (the switch is read at each launch)."""
    return _pdl.switched(*MODES[mode])


@pytest.fixture(scope="module", autouse=True)
def _needs_sm90():
    with pdl("on"):
        if not _pdl.pdl_enabled("cuda"):
            pytest.skip("PDL needs a CUDA device of capability >= 9")


def assert_equal(got, want, what: str) -> None:
    """Tensors, or tuples of them, bitwise equal."""
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    torch.cuda.synchronize()
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"{what}: output {j} differs"


def assert_same_in_every_mode(call, what: str) -> None:
    """``call()`` gives bitwise the same with PDL off, on, and on without prefetch; with PDL on it is called
    four times (a race would show as a difference between calls)."""
    with pdl("off"):
        want = call()
    for mode in ("on", "on, no prefetch"):
        with pdl(mode):
            for i in range(4 if mode == "on" else 1):
                assert_equal(call(), want, f"{what}: PDL {mode}, call {i}")


_WEIGHTS: dict = {}


def weights(n: int, k: int):
    if (n, k) not in _WEIGHTS:
        _WEIGHTS[(n, k)] = make_inputs(1, n, k, device="cuda", seed=n + k)[2:]
    return _WEIGHTS[(n, k)]


def activations(m: int, k: int, seed: int = 0):
    q, xs, _, _ = make_inputs(m, 128, k, device="cuda", seed=seed)  # the 128 x k weight is not used
    return q, xs


@pytest.mark.parametrize("n, k", [(6144, 4096), (HIDDEN, INTER)])  # qkv, down
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("m", MS)
def test_small_m_gemm_bitwise(m, reduce, n, k):
    q, xs = activations(m, k, seed=m)
    w_q, w_s = weights(n, k)
    cfg = SmallMConfig(64, 4, 4, 4, reduce)
    assert_same_in_every_mode(lambda: smk.small_m_mm(q, xs, w_q, w_s, BF16, cfg), f"small_m M={m} {cfg}")


@pytest.mark.parametrize("m", MS)
def test_grouped_and_bf16_input_gemm_bitwise(m):
    q, xs = activations(m, HIDDEN, seed=m)
    qkv = [weights(n, HIDDEN) for n in (4096, 1024, 1024)]
    for cfg in (SmallMConfig(64, 4, 4, 4, "last"), SmallMConfig(64, 2, 4, 4, "kernel")):
        assert_same_in_every_mode(
            lambda cfg=cfg: smk.small_m_mm_grouped(q, xs, [w for w, _ in qkv], [s for _, s in qkv], BF16, cfg),
            f"grouped M={m} {cfg}",
        )
    x = torch.randn(m, HIDDEN, device="cuda", dtype=BF16)
    w_q, w_s = weights(6144, HIDDEN)
    assert_same_in_every_mode(lambda: smk.small_m_mm_bf16(x, w_q, w_s, BF16, 128), f"bf16 input M={m}")


@pytest.mark.parametrize("m", [*MS, 2048])
def test_elementwise_and_tiled_bitwise(m):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, HIDDEN, device="cuda", dtype=BF16, generator=g)
    res = torch.randn(m, HIDDEN, device="cuda", dtype=BF16, generator=g)
    w = 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16, generator=g)
    gate_up = torch.randn(m, 2 * INTER, device="cuda", dtype=BF16, generator=g)
    calls = {
        "rms_norm": lambda: rms_norm(x, w, EPS),
        "add_rms_norm": lambda: add_rms_norm(x, res, w, EPS),
        "rms_norm_group_quant": lambda: rms_norm_group_quant(x, w, EPS),
        "add_rms_norm_group_quant": lambda: add_rms_norm_group_quant(x, res, w, EPS),
        "silu_and_mul": lambda: silu_and_mul(gate_up),
        "silu_mul_group_quant": lambda: silu_mul_group_quant(gate_up),
        "group_quant": lambda: group_quant(x),
    }
    for name, call in calls.items():
        assert_same_in_every_mode(call, f"{name} M={m}")
    q, xs = activations(m, HIDDEN, seed=m)
    w_q, w_s = weights(4096, HIDDEN)
    assert_same_in_every_mode(lambda: tiled_mm(q, xs, w_q, w_s, BF16), f"tiled M={m}")


def mlp_chain(x, res, norm_w, gate_up, down, cfg_gate_up, cfg_down):
    """Two decoder MLP blocks back to back: every kernel reads what the one before it wrote."""
    q, s = rms_norm_group_quant(x, norm_w, EPS)
    for block in range(2):
        h = smk.small_m_mm(q, s, *gate_up, BF16, cfg_gate_up)
        q, s = silu_mul_group_quant(h)
        y = smk.small_m_mm(q, s, *down, BF16, cfg_down)
        if block == 0:
            q, s, res = add_rms_norm_group_quant(y, res, norm_w, EPS)
    return y, res


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("m", MS)
def test_chain_in_cuda_graph_bitwise(m, reduce):
    gate_up, down = weights(2 * INTER, HIDDEN), weights(HIDDEN, INTER)
    norm_w = 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16)
    cfgs = SmallMConfig(128, 2, 8, 4, reduce), SmallMConfig(64, 4, 4, 4, reduce)  # split-K in both GEMMs
    inputs = [(torch.randn(m, HIDDEN, device="cuda", dtype=BF16), torch.randn(m, HIDDEN, device="cuda", dtype=BF16))
              for _ in range(4)]  # fmt: skip
    with pdl("off"):
        wants = [mlp_chain(x, r, norm_w, gate_up, down, *cfgs) for x, r in inputs]
    for mode in ("on", "on, no prefetch"):
        with pdl(mode):
            assert_equal(mlp_chain(*inputs[0], norm_w, gate_up, down, *cfgs), wants[0], f"eager, PDL {mode}")
            static_x, static_r = (t.clone() for t in inputs[0])
            side = torch.cuda.Stream()  # warm-up off the capture stream, as torch.cuda.graph's docs ask
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                mlp_chain(static_x, static_r, norm_w, gate_up, down, *cfgs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = mlp_chain(static_x, static_r, norm_w, gate_up, down, *cfgs)
            for rep in range(3):
                for i, (x, r) in enumerate(inputs):  # a new input per replay: a stale read shows as a difference
                    static_x.copy_(x)
                    static_r.copy_(r)
                    graph.replay()
                    torch.cuda.synchronize()
                    assert_equal(outs, wants[i], f"graph replay {rep}, input {i}, PDL {mode}")
            del graph
