"""Where the time goes inside the decode step's attention launch (``rope_decode_attention`` with the o_proj's quant):
each program's clock at its phases, no hardware counters needed.

    PYTHONPATH=. python benchmarks/attention_timeline.py [--batches 1,8] [--models llama,qwen3] [--hot]

Why: Nsight Compute (``attention_ncu.sh``) says the batch-8 launch moves its cache bytes at a third of the HBM's
rate, with 0.3 eligible warps a scheduler, but not which stretch of a program is slow. This copies
``decode_attention.py`` into a temporary module with marks added (``%clock64`` of each program at entry, after the
RoPE prologue's stores and barrier, after its key loop's partial is stored, after its merge ticket, after the merge,
at exit; ``%globaltimer`` at entry and exit; the SM it ran on), runs that copy's launch, and prints per phase the
median and the slowest program's cycles, with each program's key tiles, and the spread of the programs' start
times. Inside the one-token RoPE prologue two more marks split it: once its loads have landed (q's partner columns,
the new k / v rows) and once its norm / RoPE math is done (the roped q and k), each the latest thread's clock, read
after a test of the value it waits for (in order issue: the sm_90 SASS has each read after its test) and reduced
over the program (a barrier each, so the prologue reads a little longer with them). The shipped kernel is not
touched; the copy's marks cost a few stores a program, so its times are a bit above the kernel's. Each launch
follows a read of 128 MiB (the L2 flushed, as in a step, where every layer's cache comes from HBM) unless
``--hot``; a read, so the lines it leaves are clean. NVIDIA only (inline PTX).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from rope_attention import inputs  # noqa: E402

from fp8_fusion_pass.kernels.triton import decode_attention  # noqa: E402

# per program: clocks at entry, prologue, loop, ticket, merge, exit; globaltimer entry / exit; SM; won; then inside
# the one-token RoPE prologue, clocks once its loads have landed and once its norm / RoPE math is done
SLOTS = 12
PHASES = ("prologue", "key loop", "ticket", "merge")
PROLOGUE = ("prologue: loads land", "prologue: norm / RoPE math", "prologue: k / v stores, barrier")

MARKS = '''
@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _gtimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _clock_after(x):
    # %clock64 in each thread once its x is there: the read comes after a test of x (an unused asm input would not
    # hold it back; ptxas makes the predicated moves a read and a select, issued in order after the test); no
    # value here has the tested bits
    return tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.u32 p, $1, 0x7fc00001; @p mov.u64 $0, %clock64; "
                                     "@!p mov.u64 $0, 0; }", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _landed(x):
    """The clock (of the latest thread) once every element of the fp32 ``x`` is computed or loaded."""
    return tl.max(tl.reshape(_clock_after(x.to(tl.int32, bitcast=True)), [x.numel]), 0)


TRACE = [None]
'''

# (anchor in decode_attention.py, what replaces it): each anchor must occur exactly once
PATCHES = (
    ("o_ptr, part_ptr, ml_ptr, cnt_ptr, s_ptr,\n", "o_ptr, part_ptr, ml_ptr, cnt_ptr, s_ptr, trace_ptr,\n"),
    ("    split = tl.program_id(1)\n",
     "    split = tl.program_id(1)\n    _tr = trace_ptr + (pair * SPLITS + split) * 12\n"
     "    tl.store(_tr + 6, _gtimer())\n    tl.store(_tr + 0, _clock())\n"
     "    tl.store(_tr + 8, _smid().to(tl.int64))\n"),
    ("            tl.debug_barrier()\n", "            tl.debug_barrier()\n            tl.store(_tr + 1, _clock())\n"),
    ("  # the real rows: R of BLOCK_R\n", "  # the real rows: R of BLOCK_R\n        tl.store(_tr + 2, _clock())\n"),
    ("        if _last_arrival(cnt_ptr, pair, SPLITS):\n",
     "        _won = _last_arrival(cnt_ptr, pair, SPLITS)\n        tl.store(_tr + 3, _clock())\n"
     "        tl.store(_tr + 9, _won.to(tl.int64))\n        if _won:\n"),
    ("            tl.store(cnt_ptr + pair, 0)  # the counter is zero again for the next launch\n",
     "            tl.store(cnt_ptr + pair, 0)  # the counter is zero again for the next launch\n"
     "            tl.store(_tr + 4, _clock())\n"
     "        tl.store(_tr + 5, _clock())\n        tl.store(_tr + 7, _gtimer())\n"),
    ("out if counters is None else counters, scales if quant else out,\n",
     "out if counters is None else counters, scales if quant else out, TRACE[0],\n"),
    # the one-token RoPE prologue: its loads landed (the new k / v rows and q's partner columns, the last it loads),
    # then its math done (the roped q and k)
    ("            slot = tl.load(pos_ptr + b * sp_b).to(tl.int64)\n",
     "            slot = tl.load(pos_ptr + b * sp_b).to(tl.int64)\n"
     "            tl.store(_tr + 10, tl.maximum(_landed(to_fp32(k_xp, EMULATE_CAST) + to_fp32(v_new, EMULATE_CAST)),"
     " _landed(to_fp32(q_p, EMULATE_CAST))))\n"),
    ("                           NORM, dtype, EMULATE_CAST, PTX)  # fmt: skip\n",
     "                           NORM, dtype, EMULATE_CAST, PTX)  # fmt: skip\n"
     "            tl.store(_tr + 11, tl.maximum(_landed(to_fp32(k_new, EMULATE_CAST)),"
     " _landed(to_fp32(q, EMULATE_CAST))))\n"),
)


def traced_module(source: str | None = None):
    """decode_attention.py (or the file ``source``, another version of it) with the marks, imported as a sibling
    module (its relative imports resolve)."""
    if source:
        with open(source) as f:
            src = f.read()
    else:
        src = inspect.getsource(decode_attention)
    for anchor, new in PATCHES:
        if src.count(anchor) != 1:
            raise SystemExit(f"attention_timeline: anchor not found once in decode_attention.py: {anchor!r}")
        src = src.replace(anchor, new)
    src = src.replace("\n\n@triton.jit\ndef _mma_operand", MARKS + "\n\n@triton.jit\ndef _mma_operand", 1)
    path = os.path.join(tempfile.mkdtemp(), "_decode_attention_traced.py")
    with open(path, "w") as f:
        f.write(src)
    name = decode_attention.__name__ + "_traced"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def summarize(traces: list[torch.Tensor], tiles: list[int] | None) -> list[list]:
    """Per phase: the median program's and the slowest program's cycles (median over launches); the launch's
    spread of start times and span in ns; and (given each program's count of key tiles) their loops' cycles by it."""
    rows = []
    per_launch = {k: [] for k in ("start spread ns", "span ns", "GHz")}
    phase = {p: ([], []) for p in PHASES}
    by_tiles: dict[int, list[float]] = {}
    for tr in traces:
        tr = tr.double()
        c, g, inner = tr[:, :6], tr[:, 6:8], tr[:, 10:12]
        if bool((inner > 0).all()):  # entry -> loads land -> math -> stores and barrier (the prologue's mark)
            cuts = (c[:, 0], inner[:, 0], inner[:, 1], c[:, 1])
            for name, (a, b) in zip(PROLOGUE, zip(cuts, cuts[1:])):
                phase.setdefault(name, ([], []))
                phase[name][0].append(float((b - a).median()))
                phase[name][1].append(float((b - a).max()))
        per_launch["start spread ns"].append(float(g[:, 0].max() - g[:, 0].min()))
        per_launch["span ns"].append(float(g[:, 1].max() - g[:, 0].min()))
        per_launch["GHz"].append(float((c[:, 5] - c[:, 0]).sum() / (g[:, 1] - g[:, 0]).sum().clamp(min=1)))
        won = tr[:, 9] > 0
        for i, name in enumerate(PHASES):
            d = c[won, i + 1] - c[won, i] if name == "merge" else c[:, i + 1] - c[:, i]
            phase[name][0].append(float(d.median()))
            phase[name][1].append(float(d.max()))
        loop = c[:, 2] - c[:, 1]
        for n in set(tiles or ()):
            sel = torch.tensor([t == n for t in tiles])
            by_tiles.setdefault(n, []).append(float(loop[sel].median()))
    for name in (*PHASES[:1], *(n for n in PROLOGUE if n in phase), *PHASES[1:]):
        rows.append([name, f"{statistics.median(phase[name][0]):.0f}", f"{statistics.median(phase[name][1]):.0f}"])
    for n, v in sorted(by_tiles.items()):
        rows.append([f"key loop, {n} tile(s)", f"{statistics.median(v):.0f}", ""])
    for k, v in per_launch.items():
        rows.append([k, f"{statistics.median(v):.2f}" if k == "GHz" else f"{statistics.median(v):.0f}", ""])
    return rows


def main(argv=None) -> int:
    from tabulate import tabulate

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8")
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--heads", default="32,8")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-seq", type=int, default=576)
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--hot", action="store_true", help="no L2 flush before each launch")
    p.add_argument("--source", default="", help="trace this copy of decode_attention.py instead (e.g. an earlier "
                   "commit's, from git show), to compare two versions' phases")
    p.add_argument("--set", default="", help="NAME=int,...: module constants of the copy (e.g. SPLIT_VISIBLE=0)")
    a = p.parse_args(argv)
    constants = {}
    for item in filter(None, a.set.split(",")):
        name, _, value = item.partition("=")
        if not name.isupper() or not hasattr(decode_attention, name) or not value.lstrip("-").isdigit():
            raise SystemExit(f"attention_timeline: --set takes NAME=int of decode_attention's constants, got {item!r}")
        constants[name] = int(value)
    if not torch.cuda.is_available():
        raise SystemExit("attention_timeline.py needs an NVIDIA GPU (its marks are inline PTX)")
    hq, hk = (int(x) for x in a.heads.split(","))
    traced = traced_module(a.source or None)
    for name, value in constants.items():
        setattr(traced, name, value)
    # read, not written: a write leaves L2 full of dirty lines whose write-backs then share the HBM with the launch's
    # reads (the first timelines did that); a step's L2 holds the previous kernels' weights, clean
    flush = torch.ones(32 << 20, dtype=torch.int32, device="cuda")
    for batch in (int(b) for b in a.batches.split(",")):
        for model in a.models.split(","):
            args = inputs(batch, model == "qwen3", a.max_seq, a.context, hq, hk)
            last, scale = args[8].view(-1), args[0].shape[-1] ** -0.5
            cfg = traced.config_for(batch * hk)
            splits, per = traced.plan(batch * hk, a.max_seq, torch.cuda.get_device_properties(0).multi_processor_count,
                                      cfg)  # fmt: skip
            if splits == 1:  # no partial, ticket or merge: the marks after the key loop are never reached
                print(f"\nbatch {batch} {model}: one split per kv head ({cfg}); the timeline needs splits: skipped")
                continue
            visible = a.context + 1
            if traced.SPLIT_VISIBLE:
                n_tiles = -(-visible // cfg.block_t)
                tiles = [len(range(s, n_tiles, splits)) for s in range(splits)]
            else:
                tiles = [-(-max(0, min(per, visible - s * per)) // cfg.block_t) for s in range(splits)]
            tiles = [tiles[s] for _ in range(batch * hk) for s in range(splits)]  # program (pair, split) order
            traced.TRACE[0] = torch.zeros(batch * hk * splits * SLOTS, dtype=torch.int64, device="cuda")
            traced.rope_decode_attention(*args, last, scale, 128)  # compile; the merge counters
            traces = []
            for _ in range(a.launches):
                if not a.hot:
                    flush.sum()
                traced.TRACE[0].zero_()
                torch.cuda.synchronize()
                traced.rope_decode_attention(*args, last, scale, 128)
                torch.cuda.synchronize()
                traces.append(traced.TRACE[0].view(-1, SLOTS).cpu())
            print(f"\nbatch {batch} {model} {hq}/{hk}: {batch * hk} pairs x {splits} splits, {cfg}, "
                  f"{visible} of {a.max_seq} keys, {'hot L2' if a.hot else 'L2 flushed'}"
                  f"{' of ' + a.source if a.source else ''}"
                  f"{' ' + a.set if a.set else ''} (cycles; median of "
                  f"{a.launches} launches)")
            print(tabulate(summarize(traces, tiles), headers=["", "median program", "slowest program"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
