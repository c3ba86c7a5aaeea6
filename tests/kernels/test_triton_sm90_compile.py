"""The Triton elementwise kernels and the small-M GEMM compile for sm_90 (H100 / H200) on any machine, GPU or not.

The CPU interpreter runs the kernels' Python, not Triton's compiler: a helper whose static branches return tensors
of different shapes, or a layout Triton can only reach through shared memory, passes there and fails or slows down
on the GPU. This test compiles the default GPU tiles (and the fallbacks) with the installed Triton for
``GPUTarget("cuda", 90, 32)`` in a subprocess without ``TRITON_INTERPRET`` (Triton's NVIDIA backend ships ptxas in
its wheel; no driver needed), and checks the one structural property the norm's speed rests on: no full-tile
``convert_layout`` (a shared-memory round trip of the row) in the fused norm without residual (``_tiles.py``).
The ``PDL`` variants (``_pdl.py``) must keep their grid-dependency control in the PTX: ``griddepcontrol.wait`` before
any global load, store or atomic, then ``griddepcontrol.launch_dependents``, and in the small-M GEMM with
``PREFETCH`` the ``cp.async.bulk.prefetch.L2`` of its weight slab (inline asm that a refactor could drop silently).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    r"""
    import json, re, sys
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from fp8_fusion_pass.kernels.triton import _tiles, dynamic_per_tensor_quant as pt, group_quant as gq
    from fp8_fusion_pass.kernels.triton import rms_norm as rn, silu_and_mul as sm

    _tiles._budget = lambda: (_tiles.TILE, _tiles.TARGET_PROGRAMS)  # the GPU tiles
    FP8 = dict(FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False, EMULATE_CAST=False, PTX=True)
    OFF, PDL = dict(PDL=False), dict(PDL=True)  # the PDL constexpr of the kernels that have one (_pdl.py)
    NORM = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "res_out_ptr": "*bf16",
            "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "M": "i32", "K": "i32", "stride_x": "i32", "stride_r": "i32",
            "eps": "fp32"}
    EW = {"x_ptr": "*bf16", "y_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "M": "i32", "K": "i32",
          "I": "i32", "stride_x": "i32"}
    PT = {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "partial_ptr": "*fp32", "P": "i32", "scale_ptr": "*fp32",
          "N": "i32", "ITERS": "i32"}

    # a global load, store or atomic (predicated or not); cp.async.bulk.prefetch is not one of them
    MEMORY = re.compile(r"(@!?%p\d+ )?(ld\.global|st\.global|atom\.|red\.|cp\.async\.(ca|cg|bulk\.tensor))")

    def pdl_facts(ptx):
        # griddepcontrol in order, the prefetches, and every global memory access before the first wait
        lines = [line.strip() for line in ptx.splitlines()]
        wait = next((i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")), len(lines))
        launch = next((i for i, line in enumerate(lines) if line.startswith("griddepcontrol.launch_dependents")), -1)
        early = [line for line in lines[:wait] if MEMORY.match(line)]
        return {"wait": wait < len(lines), "launch_after_wait": launch > wait, "early": early,
                "prefetch": ptx.count("cp.async.bulk.prefetch.L2.global")}

    def build(fn, sig, consts, warps):
        names = fn.arg_names
        sig = {n: ("constexpr" if n in consts else sig[n]) for n in names}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if sig[n].startswith("*") or n in ("K", "I", "stride_x", "stride_r")}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                        constexprs={(names.index(k),): v for k, v in consts.items()})
        options = {"num_warps": warps, **({"launch_pdl": True} if consts.get("PDL") else {})}
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        if consts.get("PDL"):
            pdl[fn.__name__ + " " + str(sorted(consts.items()))] = pdl_facts(k.asm["ptx"])
        ptx = k.asm["ptx"]  # the quant step's fma32 is the hardware fma here, never the interpreter's fp64 emulation
        arith["f64"] += len(re.findall(r"\.f64\b", ptx))
        arith["fma.rn.f32"] += ptx.count("fma.rn.f32") if consts.get("QUANT", True) and "FP8_MAX" in consts else 0
        if consts.get("TMA"):  # the tiles come by the copy engine, not by per-thread loads of the same bytes
            pdl["TMA copies " + fn.__name__] = k.asm["ptx"].count("cp.async.bulk.tensor")
        full = []  # layout conversions of 3-D tiles with a real column axis: [BLOCK_M, GPC, G > 1]
        for line in k.asm["ttgir"].splitlines():
            m = re.search(r"ttg.convert_layout %\S+ : tensor<([0-9x]+)x[a-z]", line)
            if m and len(m.group(1).split("x")) >= 3 and int(m.group(1).split("x")[-1]) > 1:
                full.append(m.group(1))
        return full

    out, pdl, arith = {}, {}, {"f64": 0, "fma.rn.f32": 0}
    for k, res, quant in [(4096, False, True), (5120, False, True), (5120, True, True), (8192, False, True),
                          (1024, True, False), (7168, False, True), (2048, False, True)]:
        t = _tiles.row_tile(8192, k, 128, res)
        even = k == (t.gpc + t.tail) * 128 if t.one_pass else k % (t.gpc * 128) == 0
        c = dict(G=128, GPC=t.gpc, TAIL=t.tail, BLOCK_M=t.block_m, ONE_PASS=t.one_pass, EVEN_K=even,
                 PREFETCH=t.prefetch and t.one_pass, HAS_RESIDUAL=res, QUANT=quant, **FP8, **OFF, SPLIT=1, GPS=1)
        out[f"norm K={k} residual={res} quant={quant} {t}"] = build(rn._rms_norm_kernel, NORM, c, t.num_warps)
        if k == 4096:
            out[f"norm PDL K={k} residual={res} quant={quant} {t}"] = build(rn._rms_norm_kernel, NORM, {**c, **PDL},
                                                                            t.num_warps)
    # a row over several programs (_tiles.SPLIT_ROWS: decode sizes), each the whole row's sum and its own groups
    for k, res, split in [(4096, False, 8), (5120, True, 5), (5120, False, 10)]:
        main = 1 << ((k // 128).bit_length() - 1)
        t = _tiles.Tile(1, main, 4, True, k // 128 - main, split=split)
        c = dict(G=128, GPC=t.gpc, TAIL=t.tail, BLOCK_M=1, ONE_PASS=True, EVEN_K=True, PREFETCH=False,
                 HAS_RESIDUAL=res, QUANT=True, **FP8, **OFF, SPLIT=split, GPS=(t.gpc + t.tail) // split)
        out[f"norm split K={k} residual={res} quant=True {t}"] = build(rn._rms_norm_kernel, NORM, c, 4)
    for quant in (True, False):
        t = _tiles.elementwise_tile(8192, 96, 128, "silu_mul")
        c = dict(G=128, GPC=t.gpc, BLOCK_M=t.block_m, QUANT=quant, **FP8, **OFF)
        out[f"silu quant={quant} {t}"] = build(sm._silu_and_mul_kernel, EW, c, t.num_warps)
    out[f"silu PDL quant=True {t}"] = build(sm._silu_and_mul_kernel, EW, {**c, "QUANT": True, **PDL}, t.num_warps)
    t = _tiles.elementwise_tile(8192, 32, 128, "group_quant")
    for flag in (OFF, PDL):
        out[f"group_quant{' PDL' if flag['PDL'] else ''} {t}"] = build(
            gq._group_quant_kernel, EW, dict(G=128, GPC=t.gpc, BLOCK_M=t.block_m, **FP8, **flag), t.num_warps)
    for single in (True, False):
        c = dict(BLOCK=pt.BLOCK, P_BLOCK=256, SINGLE_PROGRAM=single, **FP8)
        out[f"per_tensor single={single}"] = build(pt._per_tensor_quant_kernel, PT, c, pt.NUM_WARPS)
    out["amax"] = build(pt._amax_kernel, PT, dict(BLOCK=pt.BLOCK, EMULATE_CAST=False), pt.NUM_WARPS)
    from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
    MM = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32",
          "as_ptr": "*fp32", "bs_ptr": "*fp32", **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_bn",
          "stride_cm", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "k_tiles_per_split")},
          **{f"{n}{g}": "i32" for g in (1, 2) for n in ("N", "stride_bn", "stride_bsn", "stride_bsk")},
          "b1_ptr": "*fp8e4nv", "b2_ptr": "*fp8e4nv", "bs1_ptr": "*fp32", "bs2_ptr": "*fp32",
          "a_desc": "*fp8e4nv", "b_desc": "*fp8e4nv"}
    # the small-M GEMM: fp8 input with the in-launch split-K sum, the bf16-input variant (its quant inside; it
    # once failed to compile on the GPU only: two returns of different types), the GEMV, and
    # three GEMMs sharing the activation in one launch (q / k / v: each N tile selects its group's weight); with
    # PDL and the weight prefetch: the in-launch sum, and the two-launch sum of three groups
    for quant_a, mode, fma, block_m, block_n, groups, pdl_on in [
            (False, 2, False, 16, 64, 1, False), (True, 2, False, 16, 64, 1, False), (True, 1, True, 1, 16, 1, False),
            (False, 2, False, 16, 64, 3, False), (False, 2, False, 16, 64, 1, True),
            (False, 1, False, 16, 64, 3, True)]:
        sig = dict(MM, a_ptr="*bf16", a_desc="*bf16") if quant_a else MM
        c = dict(GROUP_K=128, SCALE_BLOCK=128, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, K_UNROLL=1,
                 MODE=mode, GROUPS=groups, FMA=fma, QUANT_A=quant_a, FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False,
                 EMULATE_CAST=False, PDL=pdl_on, PREFETCH=pdl_on, TMA=False, SWAP=True)
        name = f"small_m{' PDL' if pdl_on else ''} quant_a={quant_a} mode={mode} fma={fma} groups={groups}"
        out[name] = build(smk._small_m_kernel, sig, c, 4)
    # and with both operand tiles by TMA (tensor descriptors; 64 activation rows, the in-launch split-K sum)
    sig = dict(MM, a_desc="tensordesc<fp8e4nv[64, 128]>", b_desc="tensordesc<fp8e4nv[64, 128]>")
    c = dict(GROUP_K=128, SCALE_BLOCK=128, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, K_UNROLL=1, MODE=2, GROUPS=1,
             FMA=False, QUANT_A=False, FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False, EMULATE_CAST=False, PDL=False,
             PREFETCH=False, TMA=True, SWAP=True)
    out["small_m TMA mode=2"] = build(smk._small_m_kernel, sig, c, 4)
    # the activation rows on the MMA's M side (tuning idea 20): one weight scale per tile, a transpose at the end
    out["small_m TMA mode=2 swap=False"] = build(smk._small_m_kernel, sig, dict(c, SWAP=False), 4)
    # the gate/up GEMM with the SiLU-and-mul and group quant in its epilogue (_small_m_silu_kernels.py): one
    # program's whole sum, the last split's, and with PDL
    from fp8_fusion_pass.kernels.triton import _small_m_silu_kernels as sms
    SILU = {"a_ptr": "*fp8e4nv", "bg_ptr": "*fp8e4nv", "bu_ptr": "*fp8e4nv", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32",
            "p_ptr": "*fp32", "y_ptr": "*fp32", "cnt_ptr": "*i32", "as_ptr": "*fp32", "bgs_ptr": "*fp32",
            "bus_ptr": "*fp32",
            **{n: "i32" for n in ("M", "I", "K", "stride_am", "stride_bn", "stride_asm", "stride_ask", "stride_bsn",
                                  "stride_bsk", "k_tiles_per_split")},
            "a_desc": "*fp8e4nv", "bg_desc": "*fp8e4nv", "bu_desc": "*fp8e4nv"}
    # block_n 64 / 32: a quant group over 2 / 4 programs (GROUP_TILES), alone and after the split-K ticket
    for mode, block_m, pdl_on, block_n in [(0, 16, False, 128), (2, 16, False, 128), (2, 64, True, 128),
                                           (0, 16, False, 64), (2, 64, False, 32)]:
        c = dict(GROUP_K=128, SCALE_BLOCK=128, OUT_DTYPE=tl.bfloat16, G=128, GROUP_TILES=128 // block_n,
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, K_UNROLL=1, MODE=mode, **FP8, PDL=pdl_on,
                 TMA=False, SWAP=True)
        out[f"small_m_silu{' PDL' if pdl_on else ''} mode={mode} block_m={block_m} block_n={block_n}"] = build(
            sms._small_m_silu_quant_kernel, SILU, c, 8 if block_n == 128 else 4)
    # and with the gate, up and activation tiles by TMA: one program's sum, and the last split's over 2 programs;
    # then with the activation rows on the MMA's M side (tuning idea 20)
    for mode, block_m, block_n, swap in [(0, 16, 128, True), (2, 64, 64, True), (0, 64, 128, False),
                                         (2, 64, 64, False)]:
        w_desc = f"tensordesc<fp8e4nv[{block_n}, 128]>"
        sig = dict(SILU, a_desc=f"tensordesc<fp8e4nv[{block_m}, 128]>", bg_desc=w_desc, bu_desc=w_desc)
        c = dict(GROUP_K=128, SCALE_BLOCK=128, OUT_DTYPE=tl.bfloat16, G=128, GROUP_TILES=128 // block_n,
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, K_UNROLL=1, MODE=mode, **FP8, PDL=False, TMA=True,
                 SWAP=swap)
        out[f"small_m_silu TMA mode={mode} block_m={block_m} block_n={block_n} swap={swap}"] = build(
            sms._small_m_silu_quant_kernel, sig, c, 4)
    # the GEMV (M <= 4): one row and four rows of activations
    from fp8_fusion_pass.kernels.triton import _gemv_kernels as gv
    GEMV = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "as_ptr": "*fp32", "bs_ptr": "*fp32",
            "b2_ptr": "*fp8e4nv", "b3_ptr": "*fp8e4nv", "bs2_ptr": "*fp32", "bs3_ptr": "*fp32",
            **{n: "i32" for n in ("M", "N", "K", "N1", "N2", "stride_am", "stride_bn", "stride_cm", "stride_asm",
                                  "stride_ask", "stride_bsn", "stride_bsk")}}
    # and the GEMV that quantizes its bf16 input itself (QUANT_A: group_quant_tile per chunk)
    for block_m, quant_a in ((1, False), (4, False), (1, True)):
        sig = dict(GEMV, a_ptr="*bf16") if quant_a else GEMV
        c = dict(ROWS=4, K_CHUNK=1024, BLOCK_M=block_m, SCALE_BLOCK=128, QUANT_A=quant_a, GROUPS=1, **FP8)
        out[f"gemv block_m={block_m} quant_a={quant_a}"] = build(gv._gemv_kernel, sig, c, 4)
    # most M = 1 TABLE rows: 4 rows x 2048 values on 2 warps (blockscale_mm.py, GEMV_WIDE); and HF's q / k / v in
    # one launch at that config (the grouped GEMV: a per-program choice of weight pointers)
    for groups in (1, 3):
        c = dict(ROWS=4, K_CHUNK=2048, BLOCK_M=1, SCALE_BLOCK=128, QUANT_A=False, GROUPS=groups, **FP8)
        out[f"gemv rows=4 k_chunk=2048 warps=2 groups={groups}"] = build(gv._gemv_kernel, GEMV, c, 2)
    # the GEMV with the SiLU-and-mul and group quant in its epilogue: a group over 16 programs (the ticket) at four
    # activation rows, and rows = G (each program quantizes its own group) at one. That one at a 128-column chunk:
    # at 512, its two [128, 512] weight tiles (no TABLE row uses them) had not compiled after 6 (Triton 3.9) / 8
    # (3.8) minutes of a CPU core; at 4 activation rows it took 52 s (Triton 3.9, ptxas half of it), at one 8.5 s
    from fp8_fusion_pass.kernels.triton import _gemv_silu_kernels as gvs
    GSILU = {n: SILU[n] for n in SILU if n not in ("p_ptr", "k_tiles_per_split")}
    for rows, block_m, k_chunk in ((8, 4, 512), (128, 1, 128)):
        c = dict(OUT_DTYPE=tl.bfloat16, G=128, GROUP_TILES=max(1, 128 // rows), ROWS=rows, K_CHUNK=k_chunk,
                 BLOCK_M=block_m, SCALE_BLOCK=128, **FP8)
        out[f"gemv_silu rows={rows} block_m={block_m}"] = build(gvs._gemv_silu_quant_kernel, GSILU, c, 4)
    # Qwen3's q / k norms and their RoPE in one launch (rms_norm_rope.py)
    from fp8_fusion_pass.kernels.triton import rms_norm_rope as nr
    ROPE = {**{n: "*bf16" for n in ("q_ptr", "k_ptr", "wq_ptr", "wk_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr",
                                    "v_ptr", "vc_ptr")}, "pos_ptr": "*i64",
            **{n: "i32" for n in ("S", "HQ", "HK", "n_q_rows", "n_rows", "T", "sq_b", "sq_s", "sq_h", "sq_d",
                                  "sk_b", "sk_s", "sk_h", "sk_d", "sc_b", "sc_s", "sc_d", "ss_b", "ss_s", "ss_d",
                                  "sv_b", "sv_h", "sv_s", "sv_d", "sko_b", "sko_h", "sko_t", "sko_d", "svc_b", "svc_h",
                                  "svc_t", "svc_d", "sp_b", "sp_s")}, "eps": "fp32"}  # fmt: skip
    for name, norm, cache in (("rms_norm_rope", True, False), ("rms_norm_rope_cache", True, True),
                              ("qk_rope_cache", False, True)):  # fmt: skip
        for _, (rows, warps) in nr.TILES:  # every tile tile_for picks, contiguous rows; and one D-strided
            out[f"{name} rows={rows} warps={warps}"] = build(nr._rms_norm_rope_kernel, ROPE, dict(
                D=128, ROWS=rows, NORM=norm, CACHE=cache, UNIT_D=True, EMULATE_CAST=False), warps)  # fmt: skip
        out[f"{name} strided"] = build(nr._rms_norm_rope_kernel, ROPE, dict(
            D=128, ROWS=4, NORM=norm, CACHE=cache, UNIT_D=False, EMULATE_CAST=False), 4)  # fmt: skip
    RED = {"p_ptr": "*fp32", "c_ptr": "*bf16", "MN": "i32", "SPLIT": "i32"}
    out["splitk_reduce PDL"] = build(smk._splitk_reduce_kernel, RED, dict(BLOCK=1024, EMULATE_CAST=False, PDL=True), 4)
    from fp8_fusion_pass.kernels.triton import _blockscale_kernels as bk
    TILED = {n: MM[n] for n in ("a_ptr", "b_ptr", "c_ptr", "as_ptr", "bs_ptr", "M", "N", "K", "stride_am",
             "stride_bn", "stride_cm", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk")}
    out["tiled PDL"] = build(bk._blockscale_mm_kernel, TILED, dict(GROUP_K=128, SCALE_BLOCK=128, BLOCK_M=64,
                             BLOCK_N=128, BLOCK_K=128, GROUP_M=8, EVEN_K=True, PDL=True), 4)
    out["PDL facts"] = pdl
    out["arith"] = arith
    print("RESULT " + json.dumps(out))
    """
)


def _backend_available() -> str | None:
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        return f"this Triton has no offline compile API: {e}"
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return None if os.path.exists(ptxas) else "this Triton wheel ships no ptxas"


def test_kernels_compile_for_sm90():
    reason = _backend_available()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    pdl = result.pop("PDL facts")
    arith = result.pop("arith")
    # no fp64 anywhere on the GPU (fma32's fp64 path is the interpreter's), and the quant kernels' fmas are fma.rn
    assert arith["f64"] == 0 and arith["fma.rn.f32"] > 0, arith
    # the TMA GEMMs load their operand tiles with cp.async.bulk.tensor: activation and weight; and the up weight
    assert pdl.pop("TMA copies _small_m_kernel") >= 2, "the TMA small-M GEMM's tiles are not bulk tensor copies"
    assert pdl.pop("TMA copies _small_m_silu_quant_kernel") >= 3, "the TMA SiLU-quant GEMM's tiles are not bulk copies"
    assert len(result) == 57, sorted(result)  # GROUP_TILES, the GEMVs, the RoPE launch at its 3 tiles + strided
    # norm, silu, group_quant, small-M x 2, small-M SiLU-quant, split-K sum, tiled
    assert len(pdl) == 8 and sum("_small_m_kernel" in name for name in pdl) == 2, sorted(pdl)
    for name, facts in pdl.items():
        assert facts["wait"] and facts["launch_after_wait"], f"{name}: griddepcontrol missing or out of order"
        assert facts["early"] == [], f"{name}: global memory accessed before griddepcontrol.wait: {facts['early']}"
        assert facts["prefetch"] == (1 if "_small_m_kernel " in name else 0), f"{name}: {facts['prefetch']} prefetches"
    for name, full_tile_conversions in result.items():
        if name.startswith("norm") and "residual=False" in name and "one_pass=True" in name:
            assert full_tile_conversions == [], f"{name}: rows move through shared memory: {full_tile_conversions}"
