"""Zero-fill stripping: only fills whose every consumer overwrites them become ``empty``; the rest stay, with a reason.

Three layers: hand-built FX graphs (every spelling and guard, no compile), a compiled model with one quant site per
case under auto_functionalized v2 and v1, and per-tensor tiny Qwen3 / Llama end to end. The compiled cases run
``zero_fill.run`` through ``ZeroFillOnly``, a CustomGraphPass that isolates the rewrite from FP8FusionPass.
"""

from __future__ import annotations

import operator

import pytest
import torch
from scale_test_ops import ACC, UNREG, register_test_ops, sgl_like_op, unregister_test_ops
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

from fp8_fusion_pass import arch
from fp8_fusion_pass import scale_semantics as ss
from fp8_fusion_pass.config import FusionConfig
from fp8_fusion_pass.kernels import reference as ref
from fp8_fusion_pass.patterns import zero_fill
from fp8_fusion_pass.report import FusionReport

aten, HOP = torch.ops.aten, torch.ops.higher_order
OURS = torch.ops.fp8_fusion.dynamic_per_tensor_quant.default
CPU = torch.device("cpu")
FP8 = arch.fp8_dtype(CPU)


def _fulls(graph: torch.fx.Graph) -> int:
    return sum(n.target is aten.full.default for n in graph.nodes)


# ---------------------------------------------------------------- hand-built graphs


def _fill(g, size=(1,), value=0, target=aten.full.default):
    args = (list(size), value) if target is aten.full.default else (list(size),)
    n = g.call_function(target, args, dict(dtype=torch.float32, layout=torch.strided, device=CPU, pin_memory=False))
    n.meta["val"] = torch.zeros(size)
    return n


def _v2(g, x, scale, op=OURS, **view):
    out = g.call_function(aten.empty.memory_format, ([8, 128],), dict(dtype=FP8, device=CPU, pin_memory=False))
    af = g.call_function(HOP.auto_functionalized_v2, (op,),
                         dict(x=x, _out_base_index=0, _scale_base_index=1, _all_bases=[out, scale], **view))
    return g.call_function(operator.getitem, (af, 2))


def _v1(g, x, scale, op=OURS):
    out = g.call_function(aten.empty.memory_format, ([8, 128],), dict(dtype=FP8, device=CPU, pin_memory=False))
    af = g.call_function(HOP.auto_functionalized, (op,), dict(out=out, x=x, scale=scale))
    return g.call_function(operator.getitem, (af, 2))


def _run(g, config=FusionConfig(use_env=False)):
    report = FusionReport(graph=0)
    n = zero_fill.run(g, report, config)
    g.lint()
    return n, report


def _kept(report):
    return [d.reason for d in report.fills_kept]


@pytest.mark.parametrize("form", [_v2, _v1])
def test_graph_overwritten_fill_becomes_empty(form):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(form(g, x, _fill(g)))
    n, report = _run(g)
    assert n == 1 and _fulls(g) == 0 and not report.fills_kept
    empty = next(n for n in g.nodes if n.target is aten.empty.memory_format and n.args[0] == [1])
    assert empty.kwargs["dtype"] == torch.float32 and empty.meta["val"].shape == (1,)
    assert report.fills_stripped[0].detail == "consumer fp8_fusion::dynamic_per_tensor_quant(scale) overwrites it"
    assert report.fills_stripped[0].shapes == "float32[1]"


def test_graph_output_keeps():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    fill = _fill(g)
    g.output((_v2(g, x, fill), fill))
    assert _run(g)[0] == 0 and _fulls(g) == 1
    assert _kept(_run(g)[1]) == ["fill_graph_output"]


def test_v2_view_of_the_fill_keeps():
    # scale = zeros(2)[:1]: the op writes one element of two; the other must stay zero.
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(_v2(g, x, _fill(g, (2,)), _scale_slice_dim=0, _scale_slice_start=0, _scale_slice_end=1))
    n, report = _run(g)
    assert n == 0 and _fulls(g) == 1 and _kept(report) == ["fill_aliased"]


def test_v1_view_node_keeps():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    view = g.call_function(aten.slice.Tensor, (_fill(g, (2,)), 0, 0, 1))
    g.output(_v1(g, x, view))
    n, report = _run(g)
    assert n == 0 and _kept(report) == ["fill_aliased"]


def test_same_base_for_two_arguments_keeps():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    fill = _fill(g)
    af = g.call_function(HOP.auto_functionalized_v2, (OURS,),
                         dict(x=x, _out_base_index=0, _scale_base_index=0, _all_bases=[fill]))
    g.output(g.call_function(operator.getitem, (af, 1)))
    assert _kept(_run(g)[1]) == ["fill_aliased"]


def test_fill_read_as_input_keeps():
    g = torch.fx.Graph()
    fill = _fill(g)
    g.output(_v2(g, fill, fill))  # the op quantizes the zeros it also writes the scale into
    assert _kept(_run(g)[1]) == ["fill_other_reader"]


@pytest.mark.parametrize("spelling", ["zero_", "zero", "fill_", "fill"])
def test_zeroed_fresh_empty_becomes_the_empty(spelling):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    empty = g.call_function(aten.empty.memory_format, ([1],), dict(dtype=torch.float32, device=CPU))
    target = {"zero_": aten.zero_.default, "zero": aten.zero.default,
              "fill_": aten.fill_.Scalar, "fill": aten.fill.Scalar}[spelling]
    zeroed = g.call_function(target, (empty,) if spelling.startswith("zero") else (empty, 0.0))
    g.output(_v2(g, x, zeroed))
    n, _ = _run(g)
    assert n == 1 and all(node.target is not target for node in g.nodes)
    af = next(node for node in g.nodes if node.target is HOP.auto_functionalized_v2)
    assert af.kwargs["_all_bases"][1] is empty


def test_zeros_like_and_zeros_become_empty():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    like = g.call_function(aten.zeros_like.default, (x,), dict(dtype=torch.float32))
    like.meta["val"] = torch.zeros(1)
    g.output((_v1(g, x, like), _v2(g, x, _fill(g, target=aten.zeros.default))))
    n, report = _run(g)
    assert n == 2 and not report.fills_kept
    targets = {node.target for node in g.nodes}
    assert aten.empty_like.default in targets and aten.zeros_like.default not in targets
    assert aten.zeros.default not in targets


def test_fill_dtype_comes_from_meta():
    # full([1], 0) without dtype is int64 in eager; the replacement must match what the fill produced.
    g = torch.fx.Graph()
    x = g.placeholder("x")
    fill = g.call_function(aten.full.default, ([1], 0), {})
    fill.meta["val"] = torch.zeros(1, dtype=torch.float32)
    g.output(_v2(g, x, fill))
    assert _run(g)[0] == 1
    assert next(n for n in g.nodes if n.target is aten.empty.memory_format and n.args[0] == [1]).kwargs["dtype"] \
        == torch.float32


def test_shared_fill_gets_one_empty_per_consumer():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    fill = _fill(g)
    g.output((_v2(g, x, fill), _v2(g, x, fill)))
    n, report = _run(g)
    assert n == 1 and len(report.fills_stripped) == 1
    bases = [node.kwargs["_all_bases"][1] for node in g.nodes if node.target is HOP.auto_functionalized_v2]
    assert len(bases) == 2 and bases[0] is not bases[1]
    assert all(b.target is aten.empty.memory_format for b in bases)


def test_not_scale_buffers_are_left_alone_without_a_report_line():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    mask = g.call_function(aten.add.Tensor, (_fill(g, (8, 128)), x))  # a zeros used as a value
    g.output((mask, _v2(g, x, _fill(g, value=1.0))))  # a non-zero fill is not a zero fill
    n, report = _run(g)
    assert n == 0 and _fulls(g) == 2 and not report.fills_kept and not report.fills_stripped


def test_disabled_by_config_and_env(monkeypatch):
    def graph():
        g = torch.fx.Graph()
        g.output(_v2(g, g.placeholder("x"), _fill(g)))
        return g

    g = graph()
    assert _run(g, FusionConfig(zero_fill=False))[0] == 0 and _fulls(g) == 1
    monkeypatch.setenv("FP8_FUSION_DISABLE", "zero_fill")
    g = graph()
    n, report = _run(g, FusionConfig())
    assert n == 0 and _fulls(g) == 1 and not report.fills_kept


def test_direct_calls():
    # Graphs built by hand, and ops whose schema hides the write (sgl-kernel's output_s has no (a!)).
    sgl_like = sgl_like_op("fp8_fusion_zf")
    ss.register_scale_writer(sgl_like, "output_s", "accumulates")
    try:
        g = torch.fx.Graph()
        x = g.placeholder("x")
        out = g.call_function(aten.empty.memory_format, ([8, 128],), dict(dtype=FP8, device=CPU))
        g.call_function(OURS, (out, x, _fill(g)))
        g.call_function(sgl_like, (x, out, _fill(g), False))
        g.output(x)
        n, report = _run(g)
    finally:
        ss.unregister_scale_writer(sgl_like, "output_s")
    assert n == 1 and _fulls(g) == 1 and _kept(report) == ["fill_accumulating_op"]


def test_registry_entry_that_does_not_fit_the_schema_keeps():
    ss.register_scale_writer("fp8_fusion_zf2::q", "scale", "overwrites")  # checked only when seen
    try:
        lib = torch.library.Library("fp8_fusion_zf2", "FRAGMENT")
        lib.define("q(Tensor(a!) out, Tensor x, Tensor(b!) scale_out) -> ()")
        g = torch.fx.Graph()
        x = g.placeholder("x")
        out = g.call_function(aten.empty.memory_format, ([8, 128],), dict(dtype=FP8, device=CPU))
        af = g.call_function(HOP.auto_functionalized, (torch.ops.fp8_fusion_zf2.q.default,),
                             dict(out=out, x=x, scale_out=_fill(g)))
        g.output(g.call_function(operator.getitem, (af, 2)))
        n, report = _run(g)
        assert n == 0 and _kept(report) == ["fill_unregistered_op"]  # no entry for 'scale_out'
    finally:
        ss.unregister_scale_writer("fp8_fusion_zf2::q", "scale")


def test_v2_around_a_non_op_keeps():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(_v2(g, x, _fill(g), op=torch.add))  # v2 can wrap higher-order ops: no schema to consult
    assert _kept(_run(g)[1]) == ["fill_unregistered_op"]


def test_an_error_keeps_that_fill_and_is_reported(monkeypatch):
    calls = []

    def flaky(fill, user):
        calls.append(fill)
        if len(calls) == 1:
            raise RuntimeError("unexpected graph form")
        return real(fill, user)

    real = zero_fill._uses
    monkeypatch.setattr(zero_fill, "_uses", flaky)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((_v2(g, x, _fill(g)), _v2(g, x, _fill(g))))
    n, report = _run(g)
    assert n == 1 and _fulls(g) == 1
    assert [e.detail for e in report.errors] == ["deciding about this fill raised RuntimeError: unexpected graph form"]


def test_reason_table_is_what_the_report_uses():
    assert set(zero_fill.FILL_REASONS) == {"fill_graph_output", "fill_other_reader", "fill_aliased",
                                           "fill_registry_invalid", "fill_accumulating_op", "fill_unregistered_op"}


# ---------------------------------------------------------------- compiled: one quant site per case


class ZeroFillOnly(CustomGraphPass):
    """Runs only ``zero_fill.run`` on the post-grad graph and records the graph around it."""

    def __init__(self, strip: bool = True):
        self.strip, self.report, self.stripped = strip, FusionReport(graph=0), 0
        self.fills_before = self.fills_after = -1
        self.scale_bases: list = []  # target of the scale base of every fp8_fusion quant after the pass

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.fills_before = _fulls(graph)
        if self.strip:
            self.stripped = zero_fill.run(graph, self.report, FusionConfig(use_env=False))
        graph.lint()
        self.fills_after = _fulls(graph)
        self.scale_bases = [n.kwargs["_all_bases"][n.kwargs["_scale_base_index"]].target for n in graph.nodes
                            if n.target is HOP.auto_functionalized_v2 and n.args[0] is OURS]

    def uuid(self):
        return None  # never served from the FX graph cache: the pass must run on every compile


def _compile(model, inputs, strip: bool, v2: bool = True):
    torch._dynamo.reset()
    p = ZeroFillOnly(strip)
    options = {"post_grad_custom_post_pass": p, "enable_auto_functionalized_v2": v2, "fx_graph_cache": False}
    return torch.compile(model, options=options)(*inputs), p


SITES = ("ours", "accumulating", "unregistered", "second_reader")


class QuantSites(nn.Module):
    """One per-tensor quantized linear per site, each with its own ``torch.zeros(1)`` scale buffer."""

    def __init__(self, k: int = 128, n: int = 64, sites: tuple[str, ...] = SITES):
        super().__init__()
        self.sites = sites
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
        w_q, w_s = ref.per_tensor_quant(w, FP8, arch.fp8_max(CPU))
        self.register_buffer("w_q", w_q)
        self.register_buffer("w_s", w_s)

    def forward(self, x):
        ys = []
        for site in self.sites:
            scale = torch.zeros(1, device=x.device, dtype=torch.float32)
            extra = scale + x.float().amax() if site == "second_reader" else None  # reads the zeros
            out = torch.empty(x.shape, dtype=FP8, device=x.device)
            {"accumulating": ACC, "unregistered": UNREG}.get(site, OURS)(out, x, scale)
            y = torch.ops.fp8_fusion.per_tensor_mm(out, scale, self.w_q, self.w_s, x.dtype)
            ys.append(y if extra is None else y + extra.to(y.dtype))
        return torch.cat(ys, dim=-1)


@pytest.fixture(scope="module", params=[True, False], ids=["v2", "v1"])
def sites(request):
    register_test_ops()
    try:
        model, x = QuantSites(), (torch.randn(8, 128, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
        (y, p), (y0, p0) = (_compile(model, (x,), strip, request.param) for strip in (True, False))
    finally:
        unregister_test_ops()
    return y, p, y0, p0


def test_compiled_only_our_fill_is_stripped(sites):
    y, p, y0, p0 = sites
    assert (p.fills_before, p.fills_after, p.stripped) == (4, 3, 1)
    assert (p0.fills_before, p0.fills_after) == (4, 4)
    [stripped] = p.report.fills_stripped
    assert "fp8_fusion::dynamic_per_tensor_quant(scale)" in stripped.detail


def test_compiled_kept_fills_and_reasons(sites):
    y, p, *_ = sites
    kept = {d.reason: d.detail for d in p.report.fills_kept}
    assert set(kept) == {"fill_accumulating_op", "fill_unregistered_op", "fill_other_reader"}
    assert "fp8_fusion_test::acc_quant(scale)" in kept["fill_accumulating_op"]
    assert "fp8_fusion_test::unreg_quant(scale)" in kept["fill_unregistered_op"]
    assert "aten.add.Tensor" in kept["fill_other_reader"]


def test_compiled_outputs_bit_identical(sites):
    y, _, y0, _ = sites
    assert torch.equal(y, y0)


@pytest.mark.skipif(not hasattr(torch.Tag, "out"), reason="torch.Tag.out is new in torch 2.13")
def test_tag_out_op_leaves_no_fill_to_strip():
    # 2.13+: functionalization drops the user's buffer of a Tag.out op (_all_bases=[]); Inductor allocates it.
    lib = torch.library.Library("fp8_fusion_zf_out", "FRAGMENT")
    lib.define("amax(Tensor x, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))
    lib.impl("amax", lambda x, *, out: out.copy_(x.abs().amax().reshape(1)), "CompositeExplicitAutograd")
    torch.library.register_fake("fp8_fusion_zf_out::amax", lambda x, *, out: out, lib=lib)

    def f(x):
        scale = torch.zeros(1, dtype=torch.float32)
        torch.ops.fp8_fusion_zf_out.amax(x, out=scale)
        return scale * 2

    x = torch.randn(4, 8)
    y, p = _compile(f, (x,), strip=True)
    assert (p.fills_before, p.stripped) == (0, 0) and not p.report.fills_kept
    assert torch.equal(y, f(x))


def _kernels_per_call(fn, iters: int = 5) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA) / iters


@pytest.mark.gpu
def test_gpu_one_kernel_launch_fewer_per_stripped_fill():
    # On CUDA each zero fill is its own kernel (Inductor cannot fuse a fill into an extern op's input).
    model = QuantSites(k=4096, n=4096, sites=("ours",) * 3).cuda()
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    launches, outs = {}, {}
    for strip in (False, True):
        torch._dynamo.reset()
        p = ZeroFillOnly(strip)
        fn = torch.compile(model, options={"post_grad_custom_post_pass": p, "fx_graph_cache": False})
        outs[strip] = fn(x)
        launches[strip] = _kernels_per_call(lambda: fn(x))
    assert p.stripped == 3
    assert launches[False] - launches[True] == 3, launches
    assert torch.equal(outs[False], outs[True])


# ---------------------------------------------------------------- end to end: per-tensor tiny Qwen3 / Llama


@pytest.mark.parametrize("name", ["qwen3-tiny", "llama-tiny"])
def test_per_tensor_model_every_quant_fill_stripped(name):
    from fp8_fusion_pass.models import build_model, example_inputs
    from fp8_fusion_pass.quantize import PerTensorFP8Linear

    model = build_model(name, form="hf", scheme="per-tensor")
    linears = sum(isinstance(m, PerTensorFP8Linear) for m in model.modules())
    assert linears == 14  # 2 layers x (q, k, v, o, gate, up, down); lm_head stays bf16
    ids = example_inputs(model)
    (y, p), (y0, p0) = (_compile(model, ids, strip) for strip in (True, False))
    assert torch.equal(y.logits, y0.logits)
    assert p.stripped == len(p.report.fills_stripped) == linears and not p.report.fills_kept
    assert p.fills_before - p.fills_after == linears and p0.fills_before == p.fills_before
    assert p.scale_bases == [aten.empty.memory_format] * linears  # no quant op is left with a zero-filled scale
