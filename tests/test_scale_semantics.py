"""Scale-semantics registry (schema-checked entries) and the poison probe that verifies them."""

from __future__ import annotations

import pytest
import torch
from scale_test_ops import ACC, UNREG, register_test_ops, sgl_like_op, unregister_test_ops

import fp8_fusion_pass
from fp8_fusion_pass import scale_semantics as ss
from fp8_fusion_pass.kernels import backends
from fp8_fusion_pass.scale_probe import DEFAULT_SHAPES, default_make_args, probe_scale_semantics, resolve_op

OURS = torch.ops.fp8_fusion.dynamic_per_tensor_quant
SMALL = ((17, 256), (4, 128))  # odd M, and a decode-sized tensor
# Under a max-reduction these pre-fills survive (the scale changes); -inf / -1e30 / zeros lose to amax / FP8_MAX.
ACC_CHANGED = {"+inf", "NaN", "1e30"}


@pytest.fixture
def test_ops_registered():
    register_test_ops()
    yield
    unregister_test_ops()


# ---------------------------------------------------------------- registry


def test_public_api_exports():
    assert fp8_fusion_pass.register_scale_writer is ss.register_scale_writer
    assert fp8_fusion_pass.probe_scale_semantics is probe_scale_semantics


def test_builtin_entries():
    table = {(e.op, e.arg): e.semantics for e in ss.registered_scale_writers() if e.builtin}
    assert table == {
        ("fp8_fusion::dynamic_per_tensor_quant", "scale"): "overwrites",
        ("aiter::dynamic_per_tensor_quant", "scale"): "overwrites",
        ("_C::dynamic_scaled_fp8_quant", "scale"): "accumulates",
        ("sgl_kernel::sgl_per_tensor_quant_fp8", "output_s"): "accumulates",
    }
    assert all(e.evidence for e in ss.registered_scale_writers() if e.builtin)


@pytest.mark.parametrize("op", [OURS, OURS.default, "fp8_fusion::dynamic_per_tensor_quant",
                                "torch.ops.fp8_fusion.dynamic_per_tensor_quant.default"])
def test_lookup_by_any_spelling(op):
    assert ss.scale_semantics_of(op, "scale") == "overwrites"
    assert ss.scale_semantics_of(op, "out") is None  # only the scale argument is registered


def test_ops_not_loaded_are_looked_up_by_name():
    assert ss.scale_semantics_of("aiter::dynamic_per_tensor_quant") == "overwrites"
    assert ss.scale_semantics_of("_C::dynamic_scaled_fp8_quant") == "accumulates"
    assert ss.scale_semantics_of("nobody::quant") is None


@pytest.mark.parametrize("arg, semantics, message", [
    ("nope", "overwrites", "has no argument 'nope'"),
    ("x", "overwrites", "not declared mutable"),
    ("scale", "overwrite", "semantics must be one of"),
])
def test_register_checks_the_schema(arg, semantics, message):
    with pytest.raises(ValueError, match=message):
        ss.register_scale_writer(OURS, arg, semantics)


def test_register_rejects_non_ops():
    with pytest.raises(TypeError):
        ss.register_scale_writer(len)
    with pytest.raises(ValueError, match="cannot parse"):
        ss.register_scale_writer("no_namespace")


def test_register_unregister_and_fingerprint():
    from fp8_fusion_pass.fusion_pass import FP8FusionPass

    before, uuid_before = ss.fingerprint(), FP8FusionPass().uuid()
    entry = ss.register_scale_writer(UNREG, "scale", "overwrites", evidence="test")
    try:
        assert entry.op == "fp8_fusion_test::unreg_quant.default"
        assert ss.scale_semantics_of(UNREG, "scale") == "overwrites"
        assert ss.fingerprint() != before
        # a registration changes the pass's cache key: no graph compiled before it is served after it
        assert FP8FusionPass().uuid() != uuid_before
    finally:
        assert ss.unregister_scale_writer(UNREG, "scale") == entry
    assert ss.scale_semantics_of(UNREG, "scale") is None
    assert ss.fingerprint() == before and FP8FusionPass().uuid() == uuid_before


def test_entry_for_an_op_defined_later_is_checked_when_seen():
    # Registered by name before the op exists; its schema then turns out not to declare the scale mutable.
    ss.register_scale_writer("fp8_fusion_late::q", "scale", "overwrites")
    try:
        lib = torch.library.Library("fp8_fusion_late", "FRAGMENT")
        lib.define("q(Tensor(a!) out, Tensor x, Tensor scale) -> ()")
        found = ss.lookup(torch.ops.fp8_fusion_late.q.default, "scale")
        assert found.entry is not None and found.semantics is None
        assert "not declared mutable" in found.error
        assert ss.scale_semantics_of(torch.ops.fp8_fusion_late.q, "scale") is None
    finally:
        ss.unregister_scale_writer("fp8_fusion_late::q", "scale")


def test_accumulates_may_name_a_schema_read_only_argument():
    # sgl-kernel declares output_s without (a!); keeping its fill is always safe, so the entry is accepted.
    op = sgl_like_op("fp8_fusion_sgl")
    ss.register_scale_writer(op, "output_s", "accumulates")
    try:
        assert ss.lookup(op, "output_s").semantics == "accumulates"
        with pytest.raises(ValueError, match="not declared mutable"):
            ss.register_scale_writer(op, "output_s", "overwrites")
    finally:
        ss.unregister_scale_writer(op, "output_s")


@pytest.mark.parametrize("name, parts", [
    ("aiter::dynamic_per_tensor_quant", ("aiter", "dynamic_per_tensor_quant", "")),
    ("_C::dynamic_scaled_fp8_quant.default", ("_C", "dynamic_scaled_fp8_quant", "default")),
    ("torch.ops.sgl_kernel.sgl_per_tensor_quant_fp8", ("sgl_kernel", "sgl_per_tensor_quant_fp8", "")),
])
def test_split_name(name, parts):
    assert ss.split_name(name) == parts


# ---------------------------------------------------------------- probe


def test_probe_classifies_our_op_as_overwriting():
    result = probe_scale_semantics(OURS, shapes=SMALL, device="cpu")
    assert result.semantics == "overwrites"
    assert result.agrees_with_registry is True and result.deterministic
    assert len(result.outcomes) == len(SMALL) * 6
    assert all(o.outputs_identical and o.scale_identical for o in result.outcomes)
    assert "OVERWRITES" in result.render() and "-1e30" in result.render()


def test_probe_real_shape_4096():
    # One seed-PR shape at full size (~1 s on the CPU reference); the default shapes stay the seed's three.
    assert DEFAULT_SHAPES == ((4096, 4096), (1024, 5120), (17, 4096))
    result = probe_scale_semantics("fp8_fusion::dynamic_per_tensor_quant", shapes=((4096, 4096),), device="cpu")
    assert result.semantics == "overwrites"
    assert result.baseline[(4096, 4096)] > 0


def test_probe_classifies_accumulating_op(test_ops_registered):
    result = probe_scale_semantics(ACC, shapes=SMALL, device="cpu")
    assert result.semantics == "accumulates"
    assert result.agrees_with_registry is True
    for o in result.outcomes:
        assert o.scale_identical == (o.poison not in ACC_CHANGED), o
    inf = next(o for o in result.outcomes if o.poison == "+inf")
    assert inf.scale == float("inf") and not inf.outputs_identical  # x / inf quantizes everything to 0


def test_probe_flags_a_wrong_registration():
    ss.register_scale_writer(ACC, "scale", "overwrites")  # a lie the probe must catch
    try:
        result = probe_scale_semantics(ACC, shapes=((4, 128),), device="cpu")
        assert result.semantics == "accumulates" and result.agrees_with_registry is False
        assert "DISAGREES" in result.render()
    finally:
        ss.unregister_scale_writer(ACC, "scale")


def test_probe_with_custom_args_and_argument_name():
    lib = torch.library.Library("fp8_fusion_probe", "FRAGMENT")
    lib.define("q(Tensor input, Tensor(a!) output_q, Tensor(b!) output_s, bool is_static) -> ()")
    lib.impl("q", lambda input, output_q, output_s, is_static: OURS(output_q, input, output_s), "CPU")
    op = torch.ops.fp8_fusion_probe.q.default
    make = default_make_args(op, "output_s")
    args = make((4, 128), torch.device("cpu"))
    assert set(args) == {"input", "output_q", "output_s", "is_static"} and args["is_static"] is False
    assert probe_scale_semantics(op, arg="output_s", shapes=((4, 128),), make_args=make).semantics == "overwrites"


def test_resolve_op_errors():
    assert resolve_op(OURS) is OURS.default
    with pytest.raises(ValueError, match="no op 'nobody::quant'"):
        resolve_op("nobody::quant")
    with pytest.raises(ValueError, match="cannot build default arguments"):
        default_make_args(torch.ops.aten.add.Tensor, "other")


def _available(entry) -> bool:
    try:
        resolve_op(entry.op)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("entry", ss.registered_scale_writers(), ids=lambda e: f"{e.op}({e.arg})")
def test_every_registry_entry_available_here_agrees_with_the_probe(entry):
    if not _available(entry):
        pytest.skip(f"{entry.op} is not installed here")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = probe_scale_semantics(entry.op, arg=entry.arg, shapes=SMALL, device=device)
    assert result.semantics == entry.semantics, result.render()


def test_triton_backend_overwrites_too():
    # Our op must overwrite on every backend; on the CPU Triton runs under the interpreter (small shapes only):
    # 17x256 takes the one-launch path, 4x8192 the two-kernel path (amax partials, then quant).
    reason = backends.unavailable_reason("triton", torch.device("cpu"))
    if reason:
        pytest.skip(reason)
    with backends.use_backend("triton"):
        assert backends.backend_for("dynamic_per_tensor_quant", torch.device("cpu")) == "triton"
        result = probe_scale_semantics(OURS, shapes=((17, 256), (4, 8192)), device="cpu")
    assert result.semantics == "overwrites", result.render()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_gpu_our_op_overwrites_at_seed_shapes(backend):
    with backends.use_backend(backend):
        result = probe_scale_semantics(OURS, device="cuda")  # the seed PR's three shapes
    print(result.render())
    assert result.semantics == "overwrites", result.render()
