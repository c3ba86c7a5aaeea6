import re, triton
from triton.backends.compiler import GPUTarget
from fp8_fusion_pass.kernels.triton import _small_m_kernels as smk
MM = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32",
      "as_ptr": "*fp32", "bs_ptr": "*fp32", **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_bn",
      "stride_cm", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk", "k_tiles_per_split")},
      **{f"{n}{g}": "i32" for g in (1, 2) for n in ("N", "stride_bn", "stride_bsn", "stride_bsk")},
      "b1_ptr": "*fp8e4nv", "b2_ptr": "*fp8e4nv", "bs1_ptr": "*fp32", "bs2_ptr": "*fp32",
      "a_desc": "tensordesc<fp8e4nv[16, 128]>", "b_desc": "tensordesc<fp8e4nv[64, 128]>"}
fn = smk._small_m_kernel
names = fn.arg_names
for tma in (True, False):
  for sa in (1, 2, 3):
    c = dict(GROUP_K=128, SCALE_BLOCK=128, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, K_UNROLL=1, MODE=0, GROUPS=1,
             FMA=False, QUANT_A=False, FP8_MAX=448.0, FP8_MIN_EXP=-6, FNUZ=False, EMULATE_CAST=False, PDL=False,
             PREFETCH=False, TMA=tma, SCALES_AHEAD=sa)
    sig = {n: ("constexpr" if n in c else MM[n]) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if MM.get(n, "").startswith("*") or n in ("K",)}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs, constexprs={(names.index(k),): v for k, v in c.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 4})
    ir, ptx = k.asm["ttgir"], k.asm["ptx"]
    allocs = re.findall(r"ttg.local_alloc[^\n]*: \(\) -> !ttg.memdesc<([0-9x]+)x", ir)
    print(f"tma={tma} sa={sa} allocs={allocs} "
          f"async_copy={ir.count('async_copy_global_to_local')} tma_copy={ir.count('async_tma_copy_global_to_local')} "
          f"ld.global={len(re.findall(r'ld.global', ptx))} wait_group={ptx.count('wgmma.wait_group')} cp.async.wait={ptx.count('cp.async.wait_group')} mbar_wait={ptx.count('mbarrier.try_wait')}")
