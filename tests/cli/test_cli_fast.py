"""CLI tests that compile nothing: help, version, every bad-input message, the diff normaliser, the verify figures."""

from __future__ import annotations

import json
import operator
import pathlib
import re

import pytest
import torch
import torch.fx
from cli_run import run_cli

import fp8_fusion_pass
from fp8_fusion_pass import cli, cli_support, graph_diff, verify

HERE = pathlib.Path(__file__).resolve().parent

# ---------------------------------------------------------------- help and version (argparse only: no torch import)


def test_help_lists_every_verb_and_version_matches_package():
    top = run_cli("--help")
    assert top.returncode == 0, top.stderr
    for verb in ("diff", "verify", "scale-probe"):
        assert re.search(rf"^\s+{verb}\s", top.stdout, re.M), f"{verb} missing from --help:\n{top.stdout}"
    assert "package.module:factory" in top.stdout
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"fp8-fusion {fp8_fusion_pass.__version__}"


@pytest.mark.parametrize(
    "verb, options",
    [
        ("diff", ["--form", "--scheme", "--layers", "--batch", "--seq", "--cache", "--dtype", "--device", "--dynamic",
                  "--only", "--dump-dir", "--format", "--no-color", "--debug"]),
        ("verify", ["--form", "--scheme", "--layers", "--cache", "--device", "--dynamic", "--only", "--tol",
                    "--cases"]),
        ("scale-probe", ["--shapes", "--device", "--format"]),
    ],
)
def test_each_verb_help_names_its_options(verb, options):
    text = run_cli(verb, "--help")
    assert text.returncode == 0, text.stderr
    missing = [o for o in options if o not in text.stdout]
    assert not missing, f"{verb} --help lacks {missing}"
    assert len(text.stdout.splitlines()) < 60, "help must stay short"


def test_no_verb_prints_help_and_fails():
    res = run_cli()
    assert res.returncode == 2 and "VERB" in res.stdout


# ---------------------------------------------------------------- bad input: one line on stderr, exit 2, no traceback

CUDA = torch.cuda.is_available()
BAD_INPUTS = [
    (["diff", "qwen9"], r"unknown model 'qwen9': known presets are .*qwen3-tiny.*llama-tiny"),
    (["diff", "no_such_pkg.mod:make"], r"cannot import no_such_pkg\.mod: ModuleNotFoundError"),
    (["diff", "cli_factories:not_a_module"], r"not_a_module\(\) returned int, not a torch\.nn\.Module"),
    (["verify", "cli_factories:raises"], r"raises\(\) raised RuntimeError: factory exploded on purpose"),
    (["diff", "cli_factories:no_such_factory"], r"cli_factories has no callable 'no_such_factory'"),
    (["diff", "cli_factories:module_only"], r"without example inputs .* return \(module, example_inputs\)"),
    (["diff", "qwen3-tiny", "--only", "norm_quant,fuse_everything"], r"--only .*unknown fusion\(s\) fuse_everything"),
    (["verify", "qwen3-tiny", "--cases", "random-1,typo"], r"--cases: unknown case\(s\) typo; known: random-1"),
    (["diff", "qwen3-tiny", "--dtype", "fp4"], r"--dtype fp4: expected one of bfloat16"),
    (["diff", "qwen3-tiny", "--layers", "0"], r"--layers 0: must be >= 1"),
    (["diff", "qwen3-tiny", "--batch", "0"], r"--batch 0: must be >= 1"),
    (["verify", "cli_factories:raises", "--seq", "-3"], r"--seq -3: must be >= 1"),  # before the factory runs
    (["diff", "qwen3-tiny", "--context", "-1"], r"--context -1: must be >= 0"),
    (["diff", "qwen3-tiny", "--cache", "4"], r"--cache 4: must be >= 8"),  # the default 8 tokens must fit in it
    (["verify", "cli_factories:module_and_inputs", "--cache", "16"], r"--cache builds a decode step for a preset"),
    (["verify", "qwen3-tiny", "--tol", "nan"], r"--tol nan: must be a positive number"),
    (["verify", "qwen3-tiny", "--tol", "0"], r"--tol 0.0: must be a positive number"),
    (["scale-probe", "fp8_fusion::no_such_op"], r"no op 'fp8_fusion::no_such_op' is registered"),
    (["scale-probe", "fp8_fusion::dynamic_per_tensor_quant", "--shapes", "17by4096"], r"--shapes 17by4096: expected"),
]
if not CUDA:
    BAD_INPUTS.append((["diff", "qwen3-tiny", "--device", "cuda"], r"--device cuda: no CUDA GPU is visible"))


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_with_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    assert cli.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fp8-fusion: error: ") and re.search(message, err[0]), err[0]


def test_bad_input_through_the_real_entry_point_and_debug_traceback():
    plain = run_cli("diff", "qwen9")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines()[-1].startswith("fp8-fusion: error: unknown model 'qwen9'")
    debug = run_cli("diff", "qwen9", "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "CliError" in debug.stderr


def test_factory_with_inputs_loads_without_compiling(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    args = cli.build_parser().parse_args(["diff", "cli_factories:module_and_inputs"])
    loaded = cli_support.load_model(args.model, args, cli_support.Progress(quiet=True))
    assert isinstance(loaded.model, torch.nn.Module) and loaded.inputs[0].shape == (2, 8)
    assert "_TwoLinear" in loaded.description


# ---------------------------------------------------------------- the diff normaliser


def _chain_graph(middle_op):
    # x -> neg -> <middle_op> -> relu -> sin -> output: replacing the middle op must leave `sin` untouched.
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.ops.aten.neg.default, (x,))
    b = g.call_function(middle_op, (a,))
    c = g.call_function(torch.ops.aten.relu.default, (b,))
    d = g.call_function(torch.ops.aten.sin.default, (c,))
    g.output(d)
    return g, b


def test_rewrite_changes_only_its_lines_and_direct_readers():
    g, middle = _chain_graph(torch.ops.aten.exp.default)
    # Extra exp nodes after the rewrite site: FX-style or global ordinals would rename them; ours must not.
    with g.inserting_after(list(g.nodes)[-2]):
        tail = g.call_function(torch.ops.aten.exp.default, (list(g.nodes)[-2],))
    list(g.nodes)[-1].args = (tail,)
    before = graph_diff.snapshot(g)
    with g.inserting_before(middle):
        new = g.call_function(torch.ops.aten.cos.default, (middle.args[0],))
    middle.replace_all_uses_with(new)
    g.erase_node(middle)
    after = graph_diff.snapshot(g)
    diff = graph_diff.unified_diff([graph_diff.GraphCapture(before, after)], context=10)
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert removed == ["-exp_0 = aten.exp(neg_0)", "-relu_0 = aten.relu(exp_0)"]
    assert added == ["+cos_0 = aten.cos(neg_0)", "+relu_0 = aten.relu(cos_0)"]
    assert " exp_1 = aten.exp(sin_0)" in diff, "a later node of the same op kept its name"
    assert before.kernel_ops() == after.kernel_ops() == 5


def test_kernel_op_count_skips_getitem_views_and_allocations():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    v = g.call_function(torch.ops.aten.reshape.default, (x, [-1]))
    e = g.call_function(torch.ops.aten.empty.memory_format, ([4],))
    z = g.call_function(torch.ops.aten.zeros.default, ([4],))
    s = g.call_function(torch.ops.aten.add.Tensor, (v, z))
    t = g.call_function(torch.ops.aten.split.Tensor, (s, 2))
    i = g.call_function(operator.getitem, (t, 0))
    g.output((i, e))
    snap = graph_diff.snapshot(g)
    assert snap.kernel_ops() == 2  # zeros (a fill kernel) and add
    assert "getitem_0 = split_0[0]" in graph_diff.normalised_text(snap, graph_diff.name_map(
        graph_diff.GraphCapture(snap, snap)))


def test_colour_only_when_asked():
    lines = ["--- before", "+++ after", "@@ -1 +1 @@", "-a", "+b", " c"]
    coloured = graph_diff.colourise(lines)
    assert coloured[3] == "\033[31m-a\033[0m" and coloured[4] == "\033[32m+b\033[0m" and coloured[5] == " c"


# ---------------------------------------------------------------- verify figures and exit status


def test_compare_flags_moved_nan_and_large_error():
    a = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 4.0]])
    same = verify.compare("c", "logits", a, a.clone(), 0.05)
    assert same.ok and same.rel_l2 == 0 and same.nonfinite_without == same.nonfinite_with == 2
    moved = a.clone()
    moved[0, 2], moved[0, 1] = 1.0, float("nan")
    bad = verify.compare("c", "logits", a, moved, 0.05)
    assert not bad.positions_agree and not bad.ok
    off = verify.compare("c", "logits", a, a * 1.1, 0.05)  # 10% relative error on every finite value
    assert off.positions_agree and off.rel_l2 == pytest.approx(0.1, rel=1e-6) and not off.ok


def test_bound_widens_to_the_compile_noise_measured_against_eager():
    eager = torch.linspace(1, 2, 64)
    without = eager * 1.06  # Inductor's own compile: 6% off eager
    with_pass = without * 1.08  # the pass: 8% off the compile without it
    outs = {"random-1": [("logits", without)]}
    plain = verify.check(outs, {"random-1": [("logits", with_pass)]}, 0.05)
    assert not plain[0].ok and plain[0].noise is None and plain[0].bound == 0.05
    widened = verify.check(outs, {"random-1": [("logits", with_pass)]}, 0.05, eager={"random-1": [("logits", eager)]})
    assert widened[0].noise == pytest.approx(0.06, rel=1e-4)  # ||without - eager|| / ||eager||
    assert widened[0].bound == pytest.approx(verify.NOISE_FACTOR * widened[0].noise) and widened[0].ok
    worse = verify.check(outs, {"random-1": [("logits", without * 1.2)]}, 0.05, eager={"random-1": [("logits", eager)]})
    assert not worse[0].ok, "20% off is beyond twice a 6% compile noise"


def test_an_output_over_its_bound_is_held_to_exact_attention():
    # an engine decode step: the pass's attention is closer to fp32 than the plain graph's, so with vs without may
    # exceed the bound while the pass is the nearer to exact attention; held there, it passes; farther, it breaks
    exact = torch.linspace(1, 2, 64)
    without = exact * 1.06
    outs, with_near = {"random-1": [("logits", without)]}, {"random-1": [("logits", exact * 1.004)]}
    held = verify.check(outs, with_near, 0.05, exact={"random-1": [("logits", exact)]})
    assert not held[0].within_bound and held[0].ok and held[0].exact == pytest.approx((0.004, 0.06), rel=1e-3)
    assert "ok: vs exact attention 4.00e-03, without the pass 6.00e-02" in verify.render(held)
    far = {"random-1": [("logits", exact * 1.2)]}
    assert not verify.check(outs, far, 0.05, exact={"random-1": [("logits", exact)]})[0].ok  # 20% > 1.5 x 6%
    assert verify.check(outs, with_near, 0.05)[0].exact is None  # no exact outputs: the bound alone
    within = verify.check(outs, {"random-1": [("logits", without)]}, 0.05, exact={"random-1": [("logits", exact)]})
    assert within[0].ok and within[0].exact is None  # within the bound: never compared with exact attention


class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_verify_exits_1_when_the_contract_is_broken(monkeypatch, capsys):
    model = _Double()
    inputs = (torch.randn(2, 4),)
    calls = []

    def fake_compile(model, inputs, fusion_pass, dynamic=False, stop=True, progress=None):
        calls.append(fusion_pass)
        broken = len(calls) == 2

        def run(x):
            y = x * 2
            if broken:
                y = y.clone()
                y[0, 0] = float("nan")  # the "with pass" compile puts a NaN where the other has none
            return y

        return [], run

    monkeypatch.setattr(cli, "load_model", lambda spec, args, progress: cli_support.LoadedModel(model, inputs, "fake"))
    monkeypatch.setattr(cli, "make_fusion_pass", lambda config: "the-pass")
    monkeypatch.setattr(graph_diff, "compile_and_capture", fake_compile)
    assert cli.main(["verify", "fake", "--quiet", "--cases", "random-1,large,nan"]) == 1
    out = capsys.readouterr().out
    assert calls == [None, "the-pass"]
    # The nan case puts its own NaN on [0, 0] of both runs, so only the other two cases break.
    assert "NUMERICS CONTRACT BROKEN in 2 of 3 checks" in out, out
    assert re.search(r"^random-1\s+output\s.*\sNO\s+BROKEN$", out, re.M), out
    assert re.search(r"^nan\s+output\s.*\syes\s+ok$", out, re.M), out


# ---------------------------------------------------------------- scale-probe on test ops (in-process: no compile)


def test_scale_probe_classifies_an_accumulating_op_and_fails_on_a_wrong_registry_entry(capsys, monkeypatch):
    from fp8_fusion_pass.scale_semantics import register_scale_writer, unregister_scale_writer

    monkeypatch.syspath_prepend(str(HERE.parent))  # tests/: scale_test_ops
    argv = ["scale-probe", "fp8_fusion_test::acc_quant", "--import", "scale_test_ops", "--shapes", "4x128", "-q"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("fp8_fusion_test::acc_quant.default (scale) on cpu: ACCUMULATES")
    assert re.search(r"^4x128\s.*\+inf\s+DIFFERS\s+DIFFERS\s+inf$", out, re.M), out
    # A registry that claims "overwrites" for it is exactly the bug the probe exists to catch: exit 1.
    previous = unregister_scale_writer("fp8_fusion_test::acc_quant")  # another test module may have registered it
    register_scale_writer("fp8_fusion_test::acc_quant", semantics="overwrites", evidence="wrong on purpose")
    try:
        assert cli.main([*argv, "--format", "json"]) == 1
    finally:
        unregister_scale_writer("fp8_fusion_test::acc_quant")
        if previous is not None:
            register_scale_writer(previous.op, previous.arg, previous.semantics, evidence=previous.evidence)
    result = json.loads(capsys.readouterr().out)
    assert (result["semantics"], result["registered"], result["agrees_with_registry"]) == (
        "accumulates", "overwrites", False)


def test_scale_probe_import_failure_is_one_line(capsys):
    assert cli.main(["scale-probe", "x::y", "--import", "no_such_ops_module", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fp8-fusion: error: --import no_such_ops_module: cannot import no_such_ops_module: "
                   "ModuleNotFoundError: No module named 'no_such_ops_module'")
