"""The norm kernel with the L2 hint's programs (``L2_PROGRAMS``) builds its IR for an NVIDIA sm_90 target without a
GPU, and issues the bulk prefetch exactly when asked (the interpreter never compiles the hint: it is NVIDIA-only).
Built in a child process, as ``test_attention_kernel_compiles.py`` explains."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHILD = r"""
import sys
try:  # Triton's compiler internals (3.4+): the IR is built from the kernel's AST for a target, no device needed
    from triton._C import libtriton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
except ImportError as e:
    print(f"SKIP this Triton has no ASTSource / make_backend to build IR offline: {e}")
    sys.exit(0)
from fp8_fusion_pass.kernels.triton import rms_norm

fn = rms_norm._rms_norm_kernel
pointers = {"q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "pf_ptr": "*fp8e4nv"}
sig = {p.name: "constexpr" if p.is_constexpr else pointers.get(p.name, "*bf16") if p.name.endswith("_ptr")
       else "fp32" if p.name == "eps" else "i32" for p in fn.params}
one_pass, l2 = (v == "1" for v in sys.argv[1:3])
constexprs = dict(G=128, GPC=32, TAIL=8 if one_pass else 0, BLOCK_M=1, ONE_PASS=one_pass, EVEN_K=True,
                  PREFETCH=False, HAS_RESIDUAL=True, QUANT=True, FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False,
                  EMULATE_CAST=False, PTX=True, PDL=False, L2_PROGRAMS=132 if l2 else 0, L2_LANES=128)
src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
options = backend.parse_options({})
context = libtriton.ir.context()
libtriton.ir.load_dialects(context)
backend.load_dialects(context)
ir = str(src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context))
print("PREFETCH", "cp.async.bulk.prefetch.L2" in ir)
"""


@pytest.mark.parametrize("one_pass, l2", [(True, True), (False, True), (True, False)])
def test_the_norm_kernel_builds_with_and_without_the_hint(one_pass, l2):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(int(one_pass)), str(int(l2))], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    if done.stdout.startswith("SKIP"):
        pytest.skip(done.stdout[5:].strip())
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"PREFETCH {l2}" in done.stdout, done.stdout
