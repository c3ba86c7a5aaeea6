"""Registers and spills of the decode-attention kernel, compiled offline for sm_90 (no GPU needed).

    python benchmarks/attention_regs.py --rows 32,64 --configs 4:2,8:2      (warps:stages)

Each case is ``_decode_attention_kernel`` at a head dim of 128, ``rows`` query rows per kv head (8 heads x
rows / 8 tokens), the upto form with the o_proj's quant, with and without the RoPE prologue (Qwen3's norms or
Llama's RoPE alone), compiled by this environment's Triton for an sm_90 target and read back with the ``cuobjdump
-res-usage`` that Triton ships. Why: a config that spills (``stack`` bytes a thread) pays local-memory round trips
on every use of what spilled, which the timings alone do not say; the RoPE prologue's [rows, D] steps spill on 4
warps where 8 hold them (``decode_attention._launch``). The figures are this Triton's: Triton 3.6 (the device's)
and 3.9 (this machine's) compile the same kernel differently, so the version is printed with them.
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

from fp8_fusion_pass.kernels.triton import decode_attention as kernel  # noqa: E402

POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "keep_ptr": "*i64", "o_ptr": "*fp8e4nv",
            "part_ptr": "*fp32", "ml_ptr": "*fp32", "cnt_ptr": "*i32", "s_ptr": "*fp32", "wq_ptr": "*bf16",
            "wk_ptr": "*bf16", "kn_ptr": "*bf16", "vn_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
            "pos_ptr": "*i64"}  # fmt: skip
FLOATS = ("scale", "eps")


def usage(rows: int, rope: str, warps: int, stages: int, splits: int = 1, block_t: int = 128) -> dict[str, int]:
    """``{"regs", "stack", ...}`` a thread of one compile; ``rope``: "none", "llama" or "qwen3" (normed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tokens = max(1, rows // 8)
    const = dict(D=128, BLOCK_R=max(16, triton.next_power_of_2(rows)), BLOCK_D=128, BLOCK_T=block_t, SPLITS=splits,
                 BLOCK_S=triton.next_power_of_2(splits), UPTO=True, EMULATE_CAST=False, QUANT=True, G=128,
                 FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False, PTX=True, ROPE=rope != "none", NORM=rope == "qwen3",
                 NEW_FROM_REGISTERS=False, TOKENS=tokens, BLOCK_NEW=triton.next_power_of_2(tokens))  # fmt: skip
    params = list(inspect.signature(kernel._decode_attention_kernel.fn).parameters)
    sig = {p: "constexpr" if p in const else POINTERS.get(p, "fp32" if p in FLOATS else "i32") for p in params}
    src = ASTSource(kernel._decode_attention_kernel, sig, constexprs={(params.index(k),): v for k, v in const.items()})
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
    return dict(zip(("regs", "stack", "shared", "local"), map(int, found.groups())))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="32,64", help="query rows per kv head (8 heads x rows / 8 tokens)")
    p.add_argument("--ropes", default="none,llama,qwen3", help="none (no RoPE prologue), llama, qwen3 (its norms too)")
    p.add_argument("--configs", default="4:2,4:3,8:2", help="warps:stages,...")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels are then the interpreter's, which do not compile
        raise SystemExit("attention_regs.py compiles for sm_90: run it without TRITON_INTERPRET=1")
    from tabulate import tabulate

    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        for rope in args.ropes.split(","):
            for cfg in args.configs.split(","):
                warps, stages = (int(x) for x in cfg.split(":"))
                got = usage(rows, rope, warps, stages)
                table.append([rows, rope, warps, stages, got["regs"], got["stack"]])
    print(f"_decode_attention_kernel, sm_90, Triton {triton.__version__} (offline), head dim 128, one split")
    print(tabulate(table, headers=["rows", "rope", "warps", "stages", "registers", "spilled bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
