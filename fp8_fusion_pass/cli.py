"""The ``fp8-fusion`` command: see what FP8FusionPass does to a model, check its numerics, probe scale semantics.

  fp8-fusion diff qwen3-tiny                 post-grad graph before/after the pass, report table, summary
  fp8-fusion verify llama-tiny               outputs with vs without the pass, fresh and adversarial inputs
  fp8-fusion scale-probe fp8_fusion::dynamic_per_tensor_quant

Exit status: 0 success, 1 numerics contract broken (verify) or an unexpected error, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import traceback
from pathlib import Path

from .cli_support import (
    CliError,
    Progress,
    at_least,
    fusion_config,
    import_user_module,
    load_model,
    make_fusion_pass,
    resolve_device,
)
from .config import FUSIONS

_EPILOG = (
    "MODEL is a preset (qwen3-tiny, llama-tiny, qwen3-8b, ...: random weights, no download) or "
    "package.module:factory returning an nn.Module or (module, example_inputs)."
)


# ---------------------------------------------------------------- argument parsing


def _common(p: argparse.ArgumentParser, top: bool = False) -> None:
    default = None if top else argparse.SUPPRESS  # the sub-command's flag must not reset the top-level one
    p.add_argument("--debug", action="store_true", default=False if top else default, help="show tracebacks")
    p.add_argument("-q", "--quiet", action="store_true", default=False if top else default,
                   help="no progress lines on stderr")


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="preset name or package.module:factory")
    p.add_argument("--form", choices=("hf", "engine"), default="hf",
                   help="preset form: transformers model (hf) or our engine-style model (default: hf)")
    p.add_argument("--scheme", choices=("block", "per-tensor"), default="block",
                   help="preset FP8 scheme: 1x128/128x128 block scales or per-tensor (default: block)")
    p.add_argument("--layers", type=int, help="decoder layers of a preset (default: the preset's own)")
    p.add_argument("--batch", type=int, default=2, help="batch of the example input (default: 2)")
    p.add_argument("--seq", type=int, default=8,
                   help="sequence length of the example input; with --cache, new tokens per row (default: 8)")
    p.add_argument("--cache", type=int, metavar="N",
                   help="one decode step over a static KV cache of N slots (random keys / values, as after a "
                   "prefill; --seq new tokens per row, e.g. --seq 1): the graph the decode-time rewrites "
                   "(decode_attention, rope_cache, rope_attention, gqa_attention) work on")
    p.add_argument("--dtype", default="bfloat16", help="activation dtype: bfloat16, float16, float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="(default: cpu)")
    p.add_argument("--dynamic", action="store_true",
                   help="dynamic shapes, floats kept constant as fp8_fusion_pass.fuse(model, dynamic=True) does")
    p.add_argument("--only", metavar="A,B",
                   help="enable only these fusions: " + ",".join(FUSIONS))


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="fp8-fusion", description="Inspect and check the FP8 fusion pass for torch.compile.", epilog=_EPILOG
    )
    parser.add_argument("--version", action="version", version=f"fp8-fusion {__version__}")
    _common(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    d = verbs.add_parser(
        "diff", help="diff the post-grad graph before/after the pass, then the report and a summary",
        description="Compile MODEL with the pass and print the post-grad graph diff (node names normalised to "
        "op + ordinal), the fusion report and the kernel-op count before -> after. On cpu one compile captures "
        "both graphs and stops before codegen; on cuda MODEL is fully compiled without and with the pass and the "
        "kernel launches per forward are counted with torch.profiler.", epilog=_EPILOG)
    _model_options(d)
    d.add_argument("--dump-dir", metavar="DIR", help="write before.txt, after.txt (+ raw graphs) and report.json")
    d.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one object (diff, report, summary)")
    d.add_argument("--no-color", action="store_true", help="plain diff even on a terminal")
    d.add_argument("--context", type=int, default=3, help="diff context lines (default: 3)")
    _common(d)
    d.set_defaults(func=cmd_diff)

    v = verbs.add_parser(
        "verify", help="compare outputs with vs without the pass on fresh and adversarial inputs",
        description="Fully compile MODEL without and with the pass and run both, and the eager model, on fresh "
        "random inputs and on adversarial ones (all-zero rows, tiny, large, overflowing, outlier, NaN, inf: see "
        "fp8_fusion_pass/verify.py). Each output must keep NaN/inf on the same positions, and its relative L2 "
        "error (with vs without the pass) must stay within max(--tol, 2 x noise), noise being the compile "
        "without the pass vs eager; at an engine model's decode step (--form engine --cache N), an output over "
        "that bound is held to the model run with exact (fp32) attention instead: no farther from it than 1.5 x "
        "the compile without the pass. Exit status 1 when the contract is broken.", epilog=_EPILOG)
    _model_options(v)
    v.add_argument("--tol", type=float, default=None, help="floor of the relative L2 bound (default: 0.05)")
    v.add_argument("--cases", metavar="A,B", help="run only these input cases (default: all; see the description)")
    v.add_argument("--format", choices=("text", "json"), default="text")
    _common(v)
    v.set_defaults(func=cmd_verify)

    s = verbs.add_parser(
        "scale-probe", help="classify an op as overwriting or accumulating into its scale argument",
        description="Run OP with its scale buffer pre-filled with +inf, -inf, NaN, +-1e30 and zeros, compare outputs "
        "and scales bit for bit, and classify the op (overwrites: its zero-fill can be stripped). Exit status 1 "
        "when the op is registered with the other semantics.")
    s.add_argument("op", metavar="OP", help="op name, e.g. fp8_fusion::dynamic_per_tensor_quant")
    s.add_argument("--shapes", metavar="MxK,...", help="input shapes (default: 4096x4096,1024x5120,17x4096)")
    s.add_argument("--import", dest="imports", metavar="MODULE", action="append", default=[],
                   help="import MODULE first (it registers OP with torch); repeatable")
    s.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="(default: cpu)")
    s.add_argument("--format", choices=("text", "json"), default="text")
    _common(s)
    s.set_defaults(func=cmd_scale_probe)
    return parser


# ---------------------------------------------------------------- diff


def cmd_diff(args) -> int:
    from . import diff_output as out
    from . import graph_diff as gd
    from .report import all_reports, clear_reports

    progress = Progress(args.quiet)
    config = fusion_config(args.only)  # bad flags fail before the model is built
    at_least("--context", args.context, 0)
    loaded = load_model(args.model, args, progress)
    fusion = make_fusion_pass(config)
    on_cuda = resolve_device(args.device).type == "cuda"
    launches: dict | None = None
    n = 2 if on_cuda else 1
    if on_cuda:
        progress(f"compile 1/{n}: without the pass (full Inductor compile) ...")
        _, compiled = gd.compile_and_capture(loaded.model, loaded.inputs, None, dynamic=args.dynamic,
                                             stop=False, progress=progress)
        launches = {"before": gd.launches_per_forward(compiled, loaded.inputs)}
    clear_reports()
    how = "full Inductor compile" if on_cuda else "stops after the pass: the diff needs no codegen"
    progress(f"compile {n}/{n}: with the pass ({how}) ...")
    captures, compiled = gd.compile_and_capture(loaded.model, loaded.inputs, fusion, dynamic=args.dynamic,
                                                stop=not on_cuda, progress=progress)
    report = out.renamed_report(all_reports(), captures)
    if on_cuda:
        launches["after"] = gd.launches_per_forward(compiled, loaded.inputs)
    progress(f"done: {len(captures)} graph(s) captured")
    if not captures:
        raise CliError(f"model {args.model!r}: torch.compile produced no graph (did the forward run any op?)")

    diff = gd.unified_diff(captures, context=args.context)
    summary = out.summary(captures, launches)
    if args.dump_dir:
        out.dump(Path(args.dump_dir), captures, report)
    if args.format == "json":
        print(json.dumps({"model": loaded.description, "diff": "\n".join(diff), "report": report.to_dict(),
                          "summary": summary}, indent=2))
        return 0
    colour = sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ
    print(f"# fp8-fusion diff: {loaded.description}")
    print("# The post-grad graph Inductor compiles, before (-) and after (+) FP8FusionPass rewrote it; node names")
    print("# are normalised to op + ordinal. The fusion report and a summary follow the diff.")
    print("\n".join(gd.colourise(diff) if colour else diff))
    print("\n== fusion report ==")
    print(out.render_report(report))
    print("\n== summary ==")
    print(out.render_summary(summary))
    return 0


# ---------------------------------------------------------------- verify


_CONTRACT = "relative L2 <= max({:g}, {:g} x noise), NaN/inf on the same positions"


def cmd_verify(args) -> int:
    from . import verify as vf
    from .graph_diff import compile_and_capture
    from .report import all_reports, clear_reports, merged

    progress = Progress(args.quiet)
    cases = vf.select_cases(args.cases)  # bad flags fail before the model is built
    if args.tol is not None and not (math.isfinite(args.tol) and args.tol > 0):
        raise CliError(f"--tol {args.tol}: must be a positive number (a relative L2 error)")
    config = fusion_config(args.only)
    loaded = load_model(args.model, args, progress)
    fusion = make_fusion_pass(config)
    bound = args.tol if args.tol is not None else vf.REL_L2_BOUND
    progress(f"running {len(cases)} input cases eagerly (the compile-noise reference) ...")
    eager = vf.run_cases(loaded.model, loaded.model, loaded.inputs, cases)
    progress("compile 1/2: without the pass (full Inductor compile) ...")
    _, compiled = compile_and_capture(loaded.model, loaded.inputs, None, dynamic=args.dynamic, stop=False,
                                      progress=progress)
    progress(f"running {len(cases)} input cases without the pass ...")
    without = vf.run_cases(compiled, loaded.model, loaded.inputs, cases)
    clear_reports()
    progress("compile 2/2: with the pass (full Inductor compile) ...")
    _, compiled = compile_and_capture(loaded.model, loaded.inputs, fusion, dynamic=args.dynamic, stop=False,
                                      progress=progress)
    report = merged(all_reports())
    progress(f"running {len(cases)} input cases with the pass ...")
    with_pass = vf.run_cases(compiled, loaded.model, loaded.inputs, cases)
    exact, exact_attention = None, vf.exact_attention(loaded.model, loaded.inputs)
    if exact_attention is not None:
        progress(f"running {len(cases)} input cases eagerly with exact (fp32) attention ...")
        with exact_attention:
            exact = vf.run_cases(loaded.model, loaded.model, loaded.inputs, cases)
    checks = vf.check(without, with_pass, bound, eager=eager, exact=exact)
    skipped = [name for name, outs in without.items() if outs is None]
    broken = [c for c in checks if not c.ok]
    fused = {k: v for k, v in report.counts().items() if v}
    if args.format == "json":
        print(json.dumps({"model": loaded.description, "fused": report.counts(), "bound": bound,
                          "checks": [c.to_dict() for c in checks], "skipped_cases": skipped,
                          "ok": not broken}, indent=2))
        return 1 if broken else 0
    print(f"# fp8-fusion verify: {loaded.description}")
    counts = ", ".join(f"{k}={v}" for k, v in fused.items()) or "nothing fused"
    print(f"# compiled with vs without FP8FusionPass; report: {counts}")
    print(vf.render(checks))
    if skipped:
        print(f"skipped (no input embedding or floating input to perturb): {', '.join(skipped)}")
    if not report.applied and not report.fills_stripped:
        print("warning: the pass changed nothing in this model, so both compiles run the same graph")
    if broken:
        contract = _CONTRACT.format(bound, vf.NOISE_FACTOR)
        print(f"NUMERICS CONTRACT BROKEN in {len(broken)} of {len(checks)} checks ({contract})")
        return 1
    held = sum(not c.within_bound for c in checks)
    exact_note = f"; {held} held to exact attention instead, x{vf.EXACT_FACTOR:g}" if held else ""
    print(f"ok: {len(checks)} checks within the contract ({_CONTRACT.format(bound, vf.NOISE_FACTOR)}{exact_note})")
    return 0


# ---------------------------------------------------------------- scale-probe


def _parse_shapes(text: str | None):
    if not text:
        return None
    try:
        return [tuple(int(d) for d in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--shapes {text}: expected MxK[,MxK...], e.g. 4096x4096,17x4096") from None


def cmd_scale_probe(args) -> int:
    from . import scale_semantics as ss

    device = resolve_device(args.device)
    shapes = _parse_shapes(args.shapes)
    for module in args.imports:
        import_user_module(module, f"--import {module}")
    try:
        op = ss.resolve_op(args.op)
    except (LookupError, ValueError, AttributeError, RuntimeError) as exc:
        raise CliError(f"scale-probe {args.op}: {exc}") from None
    Progress(args.quiet)(f"probing {args.op} on {device} ...")
    try:
        result = ss.probe_scale_semantics(op, device=device, **({"shapes": shapes} if shapes else {}))
    except ValueError as exc:  # no default arguments for this op's schema, bad shape
        raise CliError(f"scale-probe {args.op}: {exc}") from None
    if args.format == "json":
        print(json.dumps({"op": result.op, "arg": result.arg, "device": result.device, "semantics": result.semantics,
                          "registered": result.registered, "agrees_with_registry": result.agrees_with_registry,
                          "deterministic": result.deterministic,
                          "outcomes": [dataclasses.asdict(o) for o in result.outcomes]}, indent=2))
    else:
        print(result.render())
    # A registry entry the probe contradicts is the dangerous case (a stripped fill an op still reads): fail.
    return 1 if result.agrees_with_registry is False else 0


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CliError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"fp8-fusion: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fp8-fusion: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line for users; --debug gives the traceback
        if args.debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"fp8-fusion: error: {type(exc).__name__}: {first} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
