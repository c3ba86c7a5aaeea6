"""Registers, spills and shared memory of the decode-attention kernel, compiled offline for sm_90 (no GPU needed).

    python benchmarks/attention_regs.py --rows 32,64 --configs 4:2,8:2      (warps:stages)
    python benchmarks/attention_regs.py --rows 4 --ropes llama --configs 8:2 --splits 3    (8B heads, batch 8)

Each case is ``_decode_attention_kernel`` at a head dim of 128, ``rows`` query rows per kv head (min(rows, 8) heads
x the rest in tokens), the upto form with the o_proj's quant, with and without the RoPE prologue (Qwen3's norms or
Llama's RoPE alone), compiled by this environment's Triton for an sm_90 target and read back with the ``cuobjdump
-res-usage`` that Triton ships. The kernel is compiled as Triton's JIT would compile the engine's launch: the op is
called on CPU tensors laid out as a decode step leaves them, its launch is recorded instead of run, and each
argument is specialized the JIT's way (an int equal to 1 becomes a constant, an int or pointer divisible by 16 is
marked so). That matters: the cache's unit stride and the 16-byte alignments are what let the key loop load whole
16-byte vectors into shared memory ahead of use; compiled without them (this script before 2026-12-07) the same
kernel loaded one bf16 at a time and took 255 registers a thread in every case.

Why: a config that spills (``stack`` bytes a thread) pays local-memory round trips on every use of what spilled,
which the timings alone do not say, and registers and shared memory bound the programs an SM holds. The figures are
this Triton's: Triton 3.6 (the device's) and 3.9 (this machine's) compile the same kernel differently, so the
version is printed with them.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from fp8_fusion_pass.kernels.triton import decode_attention as kernel  # noqa: E402

BATCH, KV_HEADS, HEAD_DIM, MAX_SEQ, CONTEXT, GROUP = 8, 8, 128, 576, 512, 128


class _Recorder:
    """Stands in for the kernel: ``kernel[grid](*args, **kwargs)`` keeps the call instead of running it."""

    def __init__(self):
        self.call = None

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.call = (args, kwargs)

        return record


def recorded_launch(rows: int, rope: str, block_t: int, splits: int) -> tuple[dict, dict]:
    """``(arguments by name, launch options)`` of the op's launch for a step of ``rows`` query rows per kv head on
    CPU tensors (``rope``: "none", "llama" or "qwen3"), its keys in ``splits`` splits; recorded, not run."""
    import decode
    import rope_attention

    g = min(rows, 8)
    tokens = max(1, rows // g)
    device, decode.DEVICE = decode.DEVICE, "cpu"  # rope_attention.inputs builds its tensors there
    try:
        args = rope_attention.inputs(BATCH, rope == "qwen3", MAX_SEQ, CONTEXT, g * KV_HEADS, KV_HEADS, HEAD_DIM, tokens)
    finally:
        decode.DEVICE = device
    q, kc, vc, pos = args[0], args[9], args[10], args[8]
    scale, cfg = HEAD_DIM**-0.5, kernel.AttentionConfig(block_t=block_t, programs=1)
    recorder, real, real_plan = _Recorder(), kernel._decode_attention_kernel, kernel.plan
    kernel._decode_attention_kernel = recorder
    kernel.plan = lambda pairs, t, sms, cfg: (splits, triton.cdiv(triton.cdiv(t, cfg.block_t), splits) * cfg.block_t)
    try:
        if rope != "none" and tokens > 1:
            kernel.rope_decode_attention_tokens_quant(*args, pos, scale, GROUP, cfg)
        elif rope != "none":
            kernel.rope_decode_attention(*args, pos.view(-1), scale, GROUP, cfg)
        elif tokens > 1:  # the RoPE op's output, [B, Hq, S, D]
            q_out = q.transpose(1, 2).contiguous()
            kernel.decode_attention_tokens_quant(q_out, kc, vc, pos, scale, GROUP, cfg)
        else:
            q_out = q.reshape(BATCH, KV_HEADS, g, HEAD_DIM).contiguous()
            kernel.decode_attention_upto_quant(q_out, kc, vc, pos.view(-1), scale, GROUP, cfg)
    finally:
        kernel._decode_attention_kernel, kernel.plan = real, real_plan
    call_args, options = recorder.call
    params = list(inspect.signature(real.fn).parameters)
    given = {**dict(zip(params, call_args)), **options}
    return {name: given[name] for name in params}, {k: v for k, v in options.items() if k not in params}


def specialized(named: dict, constexprs: dict) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` by parameter index (``named`` in the kernel's parameter order), as Triton's
    JIT builds them from these arguments (``JITFunction._pack_args``): a non-constexpr int equal to 1 becomes a
    constant, a key with "D" (divisible by 16) becomes ``tt.divisibility``."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = list(named)
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(params):
        value = named[name]
        if name in constexprs:
            sig[name], consts[(i,)] = "constexpr", constexprs[name]
            continue
        kind, key = native_specialize_impl(BaseBackend, value, False, True, True)[:2]
        sig[name] = kind
        if kind == "constexpr":
            consts[(i,)] = value
        elif isinstance(key, str) and BaseBackend.parse_attr(key):
            attrs[(i,)] = BaseBackend.parse_attr(key)
    return sig, consts, attrs


def sm90_constexprs(named: dict) -> dict:
    """The kernel's constexpr arguments of the recorded launch, as an sm_90 launch sets them where the CPU's differ:
    the interpreter's casts, PTX, and with it the RoPE's new k / v (the CPU's launch takes those
    from registers, as off NVIDIA, where sm_90 stores them and reads them back; until the thirty-eighth session
    this script compiled that other path for every RoPE case)."""
    sm90 = dict(EMULATE_CAST=False, PTX=True)
    sm90["NEW_FROM_REGISTERS"] = named["ROPE"] and kernel.new_from_registers(sm90)
    params = inspect.signature(kernel._decode_attention_kernel.fn).parameters.values()  # JIT or interpreter's
    constexprs = {p.name: sm90.get(p.name, named[p.name]) for p in params if "constexpr" in str(p.annotation)}
    if constexprs["FNUZ"]:
        raise RuntimeError("the CPU's fp8 flavour is not sm_90's (e4m3fn)")
    return constexprs


def usage(rows: int, rope: str, warps: int, stages: int, splits: int = 1, block_t: int = 128) -> dict[str, int]:
    """``{"regs", "stack", "shared"}`` of one compile: a thread's registers and spilled bytes, a program's shared
    memory (static and dynamic); ``rope``: "none", "llama" or "qwen3" (normed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    named, _ = recorded_launch(rows, rope, block_t, splits)
    if named["SPLITS"] != splits:
        raise RuntimeError(f"the recorded launch has {named['SPLITS']} splits, not {splits}: too few keys for them")
    sig, consts, attrs = specialized(named, sm90_constexprs(named))
    src = ASTSource(kernel._decode_attention_kernel, sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    path = f"/tmp/attention_regs_{os.getpid()}.cubin"
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    os.remove(path)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if found is None:
        raise RuntimeError(f"no resource line in cuobjdump's output: {out[-300:]}")
    regs, stack, static_shared, _ = map(int, found.groups())
    return {"regs": regs, "stack": stack, "shared": static_shared + compiled.metadata.shared}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="32,64", help="query rows per kv head (min(rows, 8) heads x the rest in tokens)")
    p.add_argument("--ropes", default="none,llama,qwen3", help="none (no RoPE prologue), llama, qwen3 (its norms too)")
    p.add_argument("--configs", default="4:2,4:3,8:2", help="warps:stages,...")
    p.add_argument("--block-t", type=int, default=128, help="keys per loop step")
    p.add_argument("--splits", type=int, default=1, help="programs per (batch row, kv head): above 1 the merge too")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels are then the interpreter's, which do not compile
        raise SystemExit("attention_regs.py compiles for sm_90: run it without TRITON_INTERPRET=1")
    from tabulate import tabulate

    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        for rope in args.ropes.split(","):
            for cfg in args.configs.split(","):
                warps, stages = (int(x) for x in cfg.split(":"))
                got = usage(rows, rope, warps, stages, args.splits, args.block_t)
                table.append([rows, rope, warps, stages, got["regs"], got["stack"], got["shared"] // 1024])
    print(
        f"_decode_attention_kernel, sm_90, Triton {triton.__version__} (offline, arguments specialized as the JIT "
        f"would), head dim 128, {args.block_t}-key tiles, {args.splits} split(s)"
    )
    print(tabulate(table, headers=["rows", "rope", "warps", "stages", "registers", "spilled bytes", "shared KiB"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
