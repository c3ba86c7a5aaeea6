"""The decode-attention kernel's variants compile to Triton IR for an NVIDIA sm_90 target, without a GPU.

The interpreter (every other CPU kernel test) runs the kernel as Python and skips Triton's front end, which rejects
what it accepts: a loop-carried name that changes type (a RoPE slot named like the softmax's ``p``) passed every CPU
test and failed to compile on the H200. This builds the TTIR of each variant (the front end's checks), as the GPU
would before running it, in a child process: the test session may have set ``TRITON_INTERPRET``, under which
``triton.jit`` gives interpreted functions with no front end.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHILD = r"""
import sys
import triton
try:  # Triton's compiler internals (3.4+): the IR is built from the kernel's AST for a target, no device needed
    from triton._C import libtriton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
except ImportError as e:
    print(f"SKIP this Triton has no ASTSource / make_backend to build IR offline: {e}")
    sys.exit(0)
from fp8_fusion_pass.kernels.triton import decode_attention as kernel

POINTERS = {"o_ptr": "*fp8e4nv", "part_ptr": "*fp32", "ml_ptr": "*fp32", "cnt_ptr": "*i32", "s_ptr": "*fp32",
            "keep_ptr": "*i64", "pos_ptr": "*i64"}
fn = kernel._decode_attention_kernel
sig = {}
for p in fn.params:
    if p.is_constexpr:
        sig[p.name] = "constexpr"
    elif p.name.endswith("_ptr"):
        sig[p.name] = POINTERS.get(p.name, "*bf16")
    else:
        sig[p.name] = "fp32" if p.name in ("scale", "eps") else "i32"
rope, norm, quant, upto, ptx = (v == "1" for v in sys.argv[1:6])
tokens = int(sys.argv[6])
constexprs = dict(D=128, BLOCK_R=16, BLOCK_D=128, BLOCK_T=64, SPLITS=3, UPTO=upto, EMULATE_CAST=False,
                  QUANT=quant, G=128, FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False, PTX=ptx, ROPE=rope, NORM=norm,
                  NEW_FROM_REGISTERS=rope and not ptx, TOKENS=tokens, BLOCK_NEW=triton.next_power_of_2(tokens),
                  VISIBLE=upto, MERGE_R=4)
src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
options = backend.parse_options({})
context = libtriton.ir.context()
libtriton.ir.load_dialects(context)
backend.load_dialects(context)
ir = str(src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context))
print("DOT", "tt.dot" in ir, "MULRN", "mul.rn.f32" in ir)
"""


@pytest.mark.parametrize("rope, norm, quant, upto, ptx, tokens", [
    (False, False, False, False, True, 1), (False, False, True, True, True, 1),
    (True, False, False, True, True, 1), (True, True, True, True, True, 1),
    (True, True, True, True, False, 1),  # ROCm's path (no PTX, the select)
    (False, False, True, True, True, 4),  # decode_attention_tokens_quant: rows as (head, token), a position each
    (True, True, True, True, True, 4), (True, False, True, True, True, 3),  # rope_decode_attention_tokens_quant
    (True, True, True, True, False, 4),  # its ROCm path: each token's k / v row picked out of the tile in the loop
    (True, True, False, True, True, 4),  # rope_decode_attention_tokens: the same without the quant
])  # fmt: skip
def test_every_variant_builds_its_ir(rope, norm, quant, upto, ptx, tokens):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    flags = [str(int(f)) for f in (rope, norm, quant, upto, ptx, tokens)]
    done = subprocess.run([sys.executable, "-c", CHILD, *flags], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.stdout.startswith("SKIP"):
        pytest.skip(done.stdout[5:].strip())
    assert done.returncode == 0, done.stderr[-3000:]
    # the MMAs are there; RoPE's products go by mul.rn exactly when the variant has the RoPE prologue on NVIDIA
    assert f"DOT True MULRN {rope and ptx}" in done.stdout, done.stdout
