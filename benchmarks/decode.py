"""Decode-step and prefill benchmark: block-FP8 model with the pass vs the same compile without it, and bf16.

    PYTHONPATH=. python benchmarks/decode.py --presets qwen3-8b,llama3.1-8b --forms engine,hf --batches 1,8,32,64

How every variant is compiled and timed (the only difference between "block" and "block+pass" is the
``post_grad_custom_post_pass``):
- ``--compile regional`` (default): each decoder layer is its own ``torch.compile`` region (``Module.compile``),
  the way vLLM compiles a model: identical layers share one compiled graph, so all 36 layers of Qwen3-8B cost
  one or two layer compiles per batch instead of one 36-layer compile (which did not fit a session's device time).
  The whole step (embedding, RoPE tables, every layer, final norm, lm_head) is then captured into one CUDA graph
  by hand (``torch.cuda.CUDAGraph``), so a step is one graph launch with no Python in it.
- ``--compile full``: the whole step in one ``torch.compile`` with ``triton.cudagraphs`` (cudagraph trees).
- ``--inductor NAME=VALUE,...``: Inductor options for every compile of the run, with and without the pass alike
  (say ``combo_kernels=True``), so a compiler setting is measured as what it does to both sides.
- ``--also=-norm_rope`` (or ``+NAME``): a third variant in the same run, the pass with those rewrites switched off /
  on, so a rewrite is measured against the default pass on one machine and one baseline.
Time per step: replays back to back between two CUDA events (the CPU queues them ahead, as a serving loop does),
median of several rounds. ``--interleave R``: every block-FP8 variant of a preset's batch is captured first (the
models kept alive side by side), then timed in R rounds that visit the variants in turn, so a drift of the GPU's
clocks or memory during the run falls on all of them alike; the table has the medians and a line per cell gives
the speed-up of every round (for close calls: a ratio near a target is read with its spread, not one number).
Every other round visits the variants in reverse order. The prefill is timed as without it, while the other variants'
models are held; bf16 runs after the cell is timed and its models freed. HF ``generate()`` with a static cache under
``reduce-overhead`` failed on the H200 image (torch 2.11, transformers 5.17) with "accessing tensor output of CUDAGraphs
that has been overwritten", so the benchmark owns its decode loop. The KV cache is static (engine ``KVCache`` / HF
``StaticCache``) and pre-filled with random values up to ``--context`` tokens, so every step attends over the same
length.

Accuracy: each block-FP8 variant's logits against the same model run eagerly (``torch.compiler.set_stance
("force_eager")``, same weights and KV cache, the cache's token count reset before each), and pass against no pass
(``--compile full``: the logits of the last timed step, whose HF cache state differs from the eager one). Random weights
through 36 layers amplify any rounding difference, so compare the pass's error against eager with the no-pass compile's,
not with zero. In the HF form the no-pass compile reads the farther from eager: Inductor keeps in fp32 what eager rounds
to bf16 (HF's RMSNorm), which the fp8 quants amplify; the pass's kernels round as eager does (docs/benchmarks.md, "Every
cell on one commit: engine and HF forms").

A run stopped by SIGTERM (``timeout 560 python benchmarks/decode.py ...``, to fit a device call) still prints the
table, with the accuracy columns, of every cell that finished.

``--dry-run``: the same code on the CPU with a tiny preset (``qwen3-tiny``), each "graph replay" a plain call and
times from the wall clock, so a test checks the harness end to end; its times mean nothing.

``--scheme per-tensor``: the fp8 model's linears quantized per tensor (``quantize.convert_linears``) instead of in
128 x 128 blocks; the variants keep their labels ("block" is the fp8 model, "block+pass" it with the pass) and each
JSON row says its ``scheme``.

``--tokens S``: each step feeds S new tokens per row (at ``--context`` .. ``--context`` + S - 1), as a step verifying
S - 1 draft tokens does; the table's batch column then reads "B x S".

Roofline per step: bytes of every weight read once (fp8 linears + their scales + bf16 embeddings row, norms and
lm_head) plus the KV cache read, over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import signal
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _decode_options import also_variant, inductor_options, pass_config, set_thresholds  # noqa: E402
from _timing import copy_bandwidth  # noqa: E402

from fp8_fusion_pass import report  # noqa: E402
from fp8_fusion_pass.config import FUSIONS, FusionConfig  # noqa: E402
from fp8_fusion_pass.fusion_pass import FP8FusionPass  # noqa: E402
from fp8_fusion_pass.models import build_model, engine  # noqa: E402
from fp8_fusion_pass.models.presets import get_preset  # noqa: E402

DEVICE = "cuda"  # "cpu" with --dry-run


def log(msg: str) -> None:
    print(f"[decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compile_step(fn, config: FusionConfig | None):
    """``torch.compile`` of ``fn`` with the pass under ``config`` (None: without the pass)."""
    return torch.compile(fn, options={"triton.cudagraphs": True, **pass_options(config)}, dynamic=False)


# The pass's config for every "+pass" variant (``--without`` switches rewrites off).
PASS_CONFIG = FusionConfig()


def variant_config(variant: str) -> FusionConfig | None:
    """The pass's config for a variant label: ``block`` / ``bf16`` -> None (no pass), ``block+pass`` ->
    ``PASS_CONFIG``, and ``block+pass`` followed by ``+REWRITE`` / ``-REWRITE`` items (``--also``) -> ``PASS_CONFIG``
    with those rewrites switched on / off: ``block+pass-norm_rope``. So one run compares the default pass with a
    candidate change on the same baseline."""
    scheme, sep, rest = variant.partition("+")
    if not sep:
        return None
    changes = re.findall(r"([+-])([a-z0-9_]+)", rest.removeprefix("pass"))
    if not rest.startswith("pass") or "".join(sign + name for sign, name in changes) != rest.removeprefix("pass"):
        raise SystemExit(f"variant {variant!r}: expected {scheme}+pass, then +REWRITE / -REWRITE items")
    unknown = [name for _, name in changes if name not in FUSIONS]
    if unknown:
        raise SystemExit(f"variant {variant!r}: unknown fusion(s) {unknown}; known: {', '.join(FUSIONS)}")
    return dataclasses.replace(PASS_CONFIG, **{name: sign == "+" for sign, name in changes})


# Inductor options for every compile of a run, with the pass and without (``--inductor``): an A/B of the pass
# must not give one side a compiler setting the other lacks.
INDUCTOR_OPTIONS: dict = {}


def pass_options(config: FusionConfig | None) -> dict:
    """Inductor options of one compile: the run's ``--inductor`` ones, and the pass under ``config`` unless None."""
    return {**INDUCTOR_OPTIONS, **({"post_grad_custom_post_pass": FP8FusionPass(config)} if config is not None else {})}


def compile_regions(model, config: FusionConfig | None, variants: int = 1) -> None:
    """Compile every decoder layer in place as its own region (shared code: identical layers share a graph).
    ``variants``: how many compiles share dynamo's caches before a reset (``--interleave``: all of a cell's)."""
    # One graph per layer signature and batch; HF layers also specialise on their ``layer_idx`` (and on the cache
    # layer's first-step state: ~2 x layers per batch, 512 for Qwen3-32B at four batches, then the prefill): room
    # for all, per variant, as the limit counts every compile of the code object, whichever backend made it.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024 * variants)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           4096 * variants)  # fmt: skip
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):  # a layer left eager would time wrong, silently
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    for layer in model.model.layers:
        layer.compile(options=pass_options(config), dynamic=False)


class _Call:
    """--dry-run's stand-in for a captured graph: ``replay()`` calls the step."""

    def __init__(self, step, args):
        self.step, self.args = step, args

    def replay(self):
        return self.step(*self.args)


def capture(step, args, warmup: int = 3):
    """Run ``step(*args)`` ``warmup`` times on a side stream (compiles, allocates), then capture it into one CUDA
    graph. Returns (graph, static output)."""
    if DEVICE == "cpu":
        return _Call(step, args), step(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*args)
    return graph, out


def time_replays(graph: torch.cuda.CUDAGraph, steps: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean ms per replay of ``steps`` back-to-back replays."""
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        graph.replay()
        return (time.perf_counter() - t0) * 1e3
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def weight_bytes(model) -> int:
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "embed_tokens" in name:
            continue  # one row per token is read, not the table
        if name.endswith("inv_freq"):
            continue
        total += t.numel() * t.element_size()
    return total


class EngineRunner:
    def __init__(self, model, batch: int, max_seq: int, context: int, tokens: int = 1):
        self.model, self.batch = model, batch
        self.cache = model.new_kv_cache(batch, max_seq)
        for t in self.cache.k + self.cache.v:
            t.normal_()
        self.pos = (context + torch.arange(tokens, device=DEVICE)).expand(batch, tokens).contiguous()
        self.ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=DEVICE)

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.cache.k + self.cache.v)

    def reset(self) -> None:
        """Nothing to reset: a step writes its k / v at a fixed position and reads the same slots every time."""

    def step_fn(self):
        model, cache = self.model, self.cache

        def step(ids, pos):
            return model(ids, pos, cache)

        return step

    def args(self):
        return self.ids, self.pos


class HFRunner:
    def __init__(self, model, batch: int, max_seq: int, context: int, tokens: int = 1):
        from transformers import StaticCache

        self.model, self.batch = model, batch
        self.cache = StaticCache(config=model.config, max_cache_len=max_seq)
        self.ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=DEVICE)
        self.cache_position = context + torch.arange(tokens, device=DEVICE)
        # Initialise the lazily allocated cache with one eager step, then fill it with random values.
        with torch.no_grad():
            model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.cache_position, use_cache=True)
        for layer in self.cache.layers:
            layer.keys.normal_()
            layer.values.normal_()
        # transformers 5.x StaticCache layers count the tokens written (``cumulative_length``), and every step adds
        # one: two identical eager steps differ (0.18 relative L2 on the CPU, tiny Qwen3). reset() puts it back.
        self._lengths = [la.cumulative_length.clone() for la in self.cache.layers if hasattr(la, "cumulative_length")]

    def reset(self) -> None:
        layers = [la for la in self.cache.layers if hasattr(la, "cumulative_length")]
        for layer, length in zip(layers, self._lengths):
            layer.cumulative_length.copy_(length)

    def kv_bytes(self) -> int:
        return sum(la.keys.numel() * la.keys.element_size() * 2 for la in self.cache.layers)

    def step_fn(self):
        model, cache = self.model, self.cache

        def step(ids, cache_position):
            return model(input_ids=ids, past_key_values=cache, cache_position=cache_position, use_cache=True).logits

        return step

    def args(self):
        return self.ids, self.cache_position


def time_steps(step, args, steps: int) -> tuple[float, torch.Tensor]:
    """Median ms per step over ``steps`` CUDA-graph replays (each timed with events)."""
    out = None
    for _ in range(3):  # warm-up: compile, record the graph
        torch.compiler.cudagraph_mark_step_begin()
        out = step(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.compiler.cudagraph_mark_step_begin()
        start.record()
        out = step(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out.detach().float().clone()


def fusion_summary(reports) -> dict:
    """Rewrites applied, per compiled graph the pass ran on: with regional compiles every batch size compiles the
    layer graphs again, and graphs served from the FX graph cache carry no counts (the pass did not run)."""
    if not reports:  # decode.py hands the pass to Inductor itself: a compile served from a cache leaves no report
        return {"graphs the pass ran on": 0, "note": "no report: every graph came from a compile cache "
                "(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 shows the decisions)"}  # fmt: skip
    ran = [r for r in reports if not r.cache_hit]
    counts = report.merged(ran).counts() if ran else {}
    return {"graphs the pass ran on": len(ran), "served from the FX graph cache": len(reports) - len(ran), **counts}


def bench_prefill(model, form: str, config: FusionConfig | None, seq: int, steps: int, mode: str) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=DEVICE)
    if form == "engine":
        fn = lambda i: model(i)  # noqa: E731
    else:
        fn = lambda i: model(input_ids=i, use_cache=False).logits  # noqa: E731
    if mode == "regional":
        graph, _ = capture(fn, (ids,))
        return time_replays(graph, steps)
    ms, _ = time_steps(compile_step(fn, config), (ids,), steps)
    return ms


def time_decode(runner, config: FusionConfig | None, steps: int, mode: str) -> tuple[float, torch.Tensor]:
    if mode == "regional":
        graph, out = capture(runner.step_fn(), runner.args())
        ms = time_replays(graph, steps)
        logits = out.detach().float().clone()
        del graph
        return ms, logits
    return time_steps(compile_step(runner.step_fn(), config), runner.args(), steps)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (x - ref).norm().item() / ref.norm().item()


def run_variant(preset, form, label, args, bw, rows, reference_logits, eager_logits, held):
    scheme, config = label.split("+")[0], variant_config(label)
    quant = args.scheme if scheme == "block" else scheme  # "block" labels the fp8 model in --scheme's quantization
    log(f"{preset} {form} {label}: building ({quant})")
    torch.manual_seed(0)
    model = build_model(preset, form=form, scheme=quant, layers=args.layers, device=DEVICE)
    wbytes = weight_bytes(model)
    report.clear_reports()
    # --interleave keeps the compiled code of the variants captured so far: a reset drops it, and Triton unloads a
    # dropped kernel's module, which their CUDA graphs still launch (main resets after timing them)
    if not args.interleave:
        torch._dynamo.reset()
    if args.compile == "regional":
        compile_regions(model, config, args.variants_per_reset)
    for batch in args.batches:
        t0 = time.monotonic()
        runner = (EngineRunner if form == "engine" else HFRunner)(model, batch, args.context + 64, args.context,
                                                                   args.tokens)
        key = (preset, form, batch)
        if scheme == "block" and key not in eager_logits:
            runner.reset()
            with torch.compiler.set_stance("force_eager"):
                eager_logits[key] = runner.step_fn()(*runner.args()).detach().float().clone()
        if args.interleave and scheme == "block":  # captured now, timed with the other variants (interleave())
            graph, out = capture(runner.step_fn(), runner.args())
            ms, logits = None, out.detach().float().clone()
            held.append((key, label, graph, runner, model))
        else:
            ms, logits = time_decode(runner, config, args.steps, args.compile)
        if args.compile == "regional":  # the compiled step's logits from the state the eager step started from
            runner.reset()
            logits = runner.step_fn()(*runner.args()).detach().float().clone()
        log(f"{preset} {form} {label} batch {batch}: " + (f"{ms:.3f} ms/step" if ms is not None else "captured")
            + f" ({time.monotonic() - t0:.0f} s with compile)")
        roof_ms = (wbytes + runner.kv_bytes()) / bw * 1e3
        err = err_eager = ""
        if scheme == "block":
            err_eager = f"{rel_err(logits, eager_logits[key]):.2e}"
            if key in reference_logits:
                err = f"{rel_err(logits, reference_logits[key]):.2e}"
            else:
                reference_logits[key] = logits
        rows.append(dict(preset=preset, form=form, variant=label, batch=batch, tokens=args.tokens, ms=ms,
                         roofline_ms=roof_ms, err=err, err_eager=err_eager, scheme=quant))
        del runner  # (an interleaved cell's runner and graph stay in ``held``)
        if args.compile == "full":
            torch._dynamo.reset()
        torch.cuda.empty_cache()
    fused = fusion_summary(report.all_reports()) if config is not None else {}
    prefill_ms = None
    if args.prefill:
        log(f"{preset} {form} {label}: prefill {args.prefill}")
        prefill_ms = bench_prefill(model, form, config, args.prefill, max(3, args.steps // 5), args.compile)
        log(f"{preset} {form} {label} prefill {args.prefill}: {prefill_ms:.3f} ms")  # in the log if the table is lost
    rows.append(dict(preset=preset, form=form, variant=label, batch=f"prefill {args.prefill}", ms=prefill_ms,
                     roofline_ms=None, err="", err_eager="", fused=fused, scheme=quant))
    del model
    if not args.interleave:
        torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def interleave(held: list, rows: list[dict], rounds: int, steps: int) -> None:
    """Time the captured graphs of ``held`` (``(key, label, graph, runner, model)``) in ``rounds`` rounds, each
    visiting every variant of a cell once (``time_replays`` with one round), and put each variant's median into its
    row; each "block+pass..." row gets its speed-up over "block" per round (``per_round``)."""
    cells: dict = {}
    for key, label, graph, _, _ in held:
        cells.setdefault(key, {})[label] = graph
    for key, graphs in cells.items():
        times: dict[str, list[float]] = {label: [] for label in graphs}
        order = list(graphs)
        for i in range(rounds):  # every other round in reverse: what the order does falls on both sides alike
            for label in order if i % 2 == 0 else order[::-1]:
                times[label].append(time_replays(graphs[label], steps, rounds=1))
        for r in rows:
            if (r["preset"], r["form"], r["batch"]) == key and r["variant"] in times:
                r["ms"] = statistics.median(times[r["variant"]])
                if r["variant"] != "block" and "block" in times:
                    r["per_round"] = [b / t for b, t in zip(times["block"], times[r["variant"]])]
        log(f"{key} interleaved, {rounds} rounds: " + "; ".join(
            f"{label} {statistics.median(ts):.3f} ms ({min(ts):.3f}-{max(ts):.3f})" for label, ts in times.items()))
    held.clear()  # the graphs, runners and models go


class Stopped(BaseException):
    """SIGTERM (``timeout N python decode.py ...``): stop, and print the table of the cells that finished. A
    BaseException, as KeyboardInterrupt is: a SIGTERM during a compile must not become Inductor's InductorError (it
    wraps every Exception), which ended a run on the H200 without its table."""


def _stopped(e: BaseException) -> bool:
    """``e`` is Stopped, or was raised while handling one (something that wraps even BaseExceptions)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Stopped):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _stop(signum, frame):
    raise Stopped()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="qwen3-8b,llama3.1-8b")
    p.add_argument("--forms", default="engine,hf")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--layers", type=int, default=None, help="shorten the model (default: all layers)")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache at each decode step")
    p.add_argument("--prefill", type=int, default=2048, help="prefill length at batch 1 (0: skip)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tokens", type=int, default=1,
                   help="new tokens per row in each step (more than one: a step verifying draft tokens)")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 model")
    p.add_argument("--scheme", choices=("block", "per-tensor"), default="block",
                   help="the fp8 model's quantization (the variants keep their 'block' labels)")
    p.add_argument("--attention", choices=engine.DECODE_ATTENTION_IMPLS, default=engine.DECODE_ATTENTION,
                   help="engine form: how a decode step attends (benchmarks/attention_decode.py)")
    p.add_argument("--also", default="", metavar="[+-]REWRITE,...",
                   help="one more variant, timed in the same run: the pass with these rewrites switched on (+) or "
                        "off (-), e.g. --also=-norm_rope")
    p.add_argument("--without", default="",
                   help="rewrites the +pass variant runs without, e.g. inline_norm,group_gemm (FusionConfig names)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, wall-clock times: checks the script")
    p.add_argument("--json", metavar="PATH", help="also write every cell (the table's rows, as measured) to PATH")
    p.add_argument("--set", default="", metavar="MODULE.NAME=VALUE,...",
                   help="a threshold of the pass for the whole run, e.g. guards.GQA_MIN_BATCH_HEADS=1 "
                        "(fp8_fusion_pass's module and name; a number it has already)")
    p.add_argument("--inductor", default="", metavar="NAME=VALUE,...",
                   help="Inductor options for every compile, with and without the pass (e.g. combo_kernels=True)")
    p.add_argument("--interleave", type=int, default=0, metavar="R",
                   help="capture every block-FP8 variant of a cell, then time them in R alternating rounds (regional "
                        "compile; the models stay in memory side by side)")
    p.add_argument("--compile", choices=("regional", "full"), default="regional",
                   help="regional: layers compiled one by one, the step captured into one CUDA graph (default); "
                        "full: one torch.compile of the step with cudagraph trees")
    args = p.parse_args(argv)
    if args.dry_run and args.compile != "regional":
        raise SystemExit("--dry-run runs the regional compile only")
    if args.interleave and args.compile != "regional":
        raise SystemExit("--interleave times captured graphs: the regional compile only")
    if not 1 <= args.tokens <= 64:
        raise SystemExit(f"--tokens takes 1-64 tokens per step (the cache has 64 slots past --context), got "
                         f"{args.tokens}")
    if args.interleave < 0:
        raise SystemExit(f"--interleave takes a number of rounds >= 1 (0: off), got {args.interleave}")
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    engine.DECODE_ATTENTION = args.attention
    global PASS_CONFIG, INDUCTOR_OPTIONS
    PASS_CONFIG = pass_config(args.without)
    INDUCTOR_OPTIONS = inductor_options(args.inductor)
    thresholds = set_thresholds(args.set)
    args.batches = [int(b) for b in args.batches.split(",")]
    variants = ["block", "block+pass", *also_variant(args.also), *([] if args.no_bf16 else ["bf16"])]
    for label in variants:
        variant_config(label)  # a misspelt --also exits here, not after the first variant's compiles
    # --interleave: the block-FP8 variants share dynamo's caches until their cell is timed; bf16 runs after that
    args.variants_per_reset = len(variants) - (not args.no_bf16) if args.interleave else 1
    torch.set_grad_enabled(False)
    bw = copy_bandwidth(dry_run=args.dry_run)
    device_name = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name()
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s; torch {torch.__version__}; {device_name}; Inductor options "
        f"{INDUCTOR_OPTIONS or 'default'}; pass thresholds {thresholds or 'as committed'}; fp8 {args.scheme}")
    rows: list[dict] = []
    held: list = []  # --interleave: the captured cells of the current preset and form (timed, then cleared)
    # An HF cell costs 50-90 s of layer recompiles on the H200, so a run may outlast its device call: under
    # `timeout`, SIGTERM ends it with the table (and the accuracy columns) of every cell that finished.
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for preset in args.presets.split(","):
            get_preset(preset)
            for form in args.forms.split(","):
                reference_logits: dict = {}
                eager_logits: dict = {}
                held.clear()  # (interleave() has cleared it after the last preset / form; a no-op then)
                for label in variants:
                    if label == "bf16" and args.interleave:  # after the held models are timed and freed
                        interleave(held, rows, args.interleave, args.steps)
                        torch._dynamo.reset()
                    run_variant(preset, form, label, args, bw, rows, reference_logits, eager_logits, held)
                interleave(held, rows, args.interleave, args.steps)
                torch._dynamo.reset()
    except BaseException as e:
        if not _stopped(e):
            raise
        log(f"stopped (SIGTERM) after {len(rows)} cells: the table has those")
        if held:  # cells captured for --interleave but not yet timed: one round each, so the table has them
            interleave(held, rows, 1, args.steps)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_table(rows)
    if args.json:  # also after SIGTERM: the cells that finished
        with open(args.json, "w") as f:
            json.dump({"bandwidth": bw, "device": device_name, "torch": torch.__version__, "argv": sys.argv[1:],
                       "rows": rows}, f, indent=1, default=str)  # fmt: skip
    return 0


def print_table(rows: list[dict]) -> None:
    from tabulate import tabulate

    by_key = {(r["preset"], r["form"], r["variant"], str(r["batch"])): r for r in rows}
    table = []
    for (preset, form, variant, batch), r in by_key.items():
        if not variant.startswith("block+pass"):
            continue
        base = by_key.get((preset, form, "block", batch))
        bf16 = by_key.get((preset, form, "bf16", batch))
        ms = r["ms"]
        table.append([
            preset, form, variant.removeprefix("block+"),
            batch if r.get("tokens", 1) == 1 else f"{batch} x {r['tokens']}",
            f"{base['ms']:.3f}" if base and base["ms"] else "-",
            f"{ms:.3f}" if ms else "-",
            f"{base['ms'] / ms:.3f}x" if base and base["ms"] and ms else "-",
            f"{bf16['ms']:.3f}" if bf16 and bf16["ms"] else "-",
            f"{bf16['ms'] / ms:.2f}x" if bf16 and bf16["ms"] and ms else "-",
            f"{r['roofline_ms']:.3f}" if r.get("roofline_ms") else "-",
            r.get("err", ""),
            base.get("err_eager", "") if base else "",
            r.get("err_eager", ""),
        ])
    print(tabulate(table, headers=["preset", "form", "pass", "batch (x tokens)", "fp8 ms", "fp8+pass ms",
                                   "pass speed-up", "bf16 ms", "vs bf16", "roofline ms", "pass vs no pass",
                                   "fp8 vs eager", "fp8+pass vs eager"]))
    for r in rows:
        if r.get("per_round"):
            ratios = " ".join(f"{x:.3f}x" for x in r["per_round"])
            print(f"speed-up per round ({r['preset']} {r['form']} {r['variant']} batch {r['batch']}): {ratios}")
    for r in rows:
        if r.get("fused"):
            extra = "" if r["variant"] == "block+pass" else f" {r['variant']}"
            print(f"fused ({r['preset']} {r['form']}{extra}): {r['fused']}")


if __name__ == "__main__":
    sys.exit(main())
