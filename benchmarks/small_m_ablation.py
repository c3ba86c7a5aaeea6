"""What bounds the small-M GEMM at M = 16-64: the committed kernel timed against copies of itself with one part of
its K loop taken out (a probe; the ablated copies give wrong products and are only timed).

    PYTHONPATH=. python benchmarks/small_m_ablation.py --ms 16,32,64            # H200: every TABLE small-M row
    PYTHONPATH=. python benchmarks/small_m_ablation.py --check                  # any machine: the edits still apply

The edits are to the swap-AB K loop (tuning idea 20's rows, with the activation rows on the MMA's M side, run it
unedited: ``copy`` and the committed kernel only). Measured 2026-12-04: ``docs/benchmarks.md``, "What the promotion
costs, and the activation rows on the MMA's M side".

Variants: a copy of ``_small_m_kernels.py`` with textual edits (``EDITS``; its relative imports made absolute, the
copy written to a temporary directory and imported from there, never into the package), and the
activation scales passed column-major (``[M, K / 128]`` with strides ``(1, M)``: a K tile's scales for all rows
contiguous, the layout DeepGEMM asks for):
- ``copy``: no edit (the control: a copy of the module times as the module does);
- ``noscale``: no promotion by the scales (``acc += part``): the scale loads are dead and compiled away, so this
  bounds what any change to the scales' layout or timing (tuning ideas 12, 19) could gain;
- ``no_w`` / ``no_x``: only the weight's / only the activation's scales taken out (which of the two loads costs);
- ``chain``: no promotion at all, ``acc = tl.dot(w, x, acc)``: the plain FP8 GEMM whose MMAs Triton keeps in
  flight across K tiles; this bounds what overlapping the promotion with the MMA (ideas 17, 18) could gain;
- ``w_scalar``: the tile's weight scale loaded once per K tile as a scalar (every row of a tile of <= 128 rows is
  in one 128-row scale block) instead of once per row: the same products, bit for bit;
- ``xs_cols`` / ``w_scalar+xs_cols``: the committed kernel / ``w_scalar`` with column-major activation scales:
  bit for bit too (the same values, loaded from other addresses);
- ``xs_cols_nospec``: column-major scales with ``stride_asm`` not specialized to 1, so Triton cannot vectorize the
  scale load into another layout (and convert it back through shared memory each K tile); the warp's lanes still
  read neighbouring words, which the hardware coalesces.
The exact variants are checked bit for bit against the committed kernel at every point (``same`` column).
Timing is ``gemm.py``'s: CUDA-graph medians, weights rotating beyond L2, the committed TABLE config per point.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import tempfile

import torch

from fp8_fusion_pass import arch
from fp8_fusion_pass.kernels.triton import _small_m_kernels
from fp8_fusion_pass.kernels.triton import blockscale_mm as bm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROMOTE = "acc += part * w_s[:, None] * x_s[None, :]"
DOT = "part = tl.dot(w, x)"
JIT = '@triton.jit(do_not_specialize=["M", "k_tiles_per_split"])'
WS = "ws_ptrs = bs_ptr + (rn // SCALE_BLOCK) * stride_bsn"
EDITS = {
    "copy": [],
    "noscale": [(PROMOTE, "acc += part")],
    "no_w": [(PROMOTE, "acc += part * x_s[None, :]")],
    "no_x": [(PROMOTE, "acc += part * w_s[:, None]")],
    "chain": [(DOT, "part = tl.dot(w, x, acc)"), (PROMOTE, "acc = part")],
    "w_scalar": [(WS, "ws_ptrs = bs_ptr + (row0 // SCALE_BLOCK) * stride_bsn"),
                 (PROMOTE, "acc += part * w_s * x_s[None, :]")],
    "nospec": [(JIT, JIT.replace('"k_tiles_per_split"]', '"k_tiles_per_split", "stride_asm"]'))],
}
# (name, module, activation scales column-major, bit for bit the committed kernel's output)
VARIANTS = [("copy", "copy", False, True), ("noscale", "noscale", False, False), ("no_w", "no_w", False, False),
            ("no_x", "no_x", False, False), ("chain", "chain", False, False), ("w_scalar", "w_scalar", False, True),
            ("xs_cols", None, True, True), ("w_scalar+xs_cols", "w_scalar", True, True),
            ("xs_cols_nospec", "nospec", True, True)]


PACKAGE = "fp8_fusion_pass.kernels.triton"
_tmp: list[str] = []  # the directory the variants are written to, made once per process


def variant_source(name: str) -> str:
    with open(_small_m_kernels.__file__) as f:
        src = f.read()
    # the copy lives outside the package: its relative imports name the package
    src = re.sub(r"^from \.\.\. import ", "from fp8_fusion_pass import ", src, flags=re.MULTILINE)
    src = re.sub(r"^from \. import ", f"from {PACKAGE} import ", src, flags=re.MULTILINE)
    src = re.sub(r"^from \.(\w)", rf"from {PACKAGE}.\1", src, flags=re.MULTILINE)
    for old, new in EDITS[name]:
        if src.count(old) != 1:
            raise RuntimeError(f"small_m_ablation: {old!r} is not in _small_m_kernels.py exactly once")
        src = src.replace(old, new)
    return src


def load_variant(name: str):
    """The edited copy as the module ``_small_m_ablate_<name>``, from a temporary directory (Triton reads a kernel's
    source from its file, so the copy is a real file)."""
    if not _tmp:
        _tmp.append(tempfile.mkdtemp(prefix="small_m_ablation_"))
        sys.path.insert(0, _tmp[0])
    with open(os.path.join(_tmp[0], f"_small_m_ablate_{name}.py"), "w") as f:
        f.write(variant_source(name))
    return importlib.import_module(f"_small_m_ablate_{name}")


def time_variants(shape, m: int, cfg, mods: dict, time_graph) -> tuple[float, dict, bool]:
    """Microseconds of the committed kernel (``blockscale_mm.run``) and of each variant, same inputs; and whether
    every exact variant gave the committed output bit for bit."""
    _, q, xs = shape.inputs(m)
    xs_cols = xs.t().contiguous().t()  # same values, strides (1, M)
    base = time_graph(lambda i: bm.run("small_m", q, xs, *shape.w8[i], torch.bfloat16, config=cfg), shape.copies)
    want = bm.run("small_m", q, xs, *shape.w8[0], torch.bfloat16, config=cfg)
    times, same = {}, True
    for name, module, cols, exact in VARIANTS:
        mm = mods[module].small_m_mm if module else _small_m_kernels.small_m_mm
        s = xs_cols if cols else xs
        times[name] = time_graph(lambda i, mm=mm, s=s: mm(q, s, *shape.w8[i], torch.bfloat16, cfg), shape.copies)
        if exact:
            same = same and torch.equal(mm(q, s, *shape.w8[0], torch.bfloat16, cfg), want)
    return base, times, same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="16,32,64")
    p.add_argument("--check", action="store_true", help="only check that every edit applies (no GPU)")
    args = p.parse_args(argv)
    if args.check:
        for name in EDITS:
            variant_source(name)
        print("every edit applies")
        return 0
    import gemm
    from _timing import time_graph
    from tabulate import tabulate

    if not torch.cuda.is_available():
        print("small_m_ablation: needs a CUDA GPU (--check runs anywhere)", file=sys.stderr)
        return 2
    gemm.DEVICE = "cuda"
    a = arch.arch_of("cuda")
    mods = {name: load_variant(name) for name in EDITS}
    rows = []
    for name, n, k in gemm.SHAPES:
        shape = gemm.Shape(n, k)
        for m in (int(v) for v in args.ms.split(",")):
            choice = bm.TABLE.get((a.name, bm.m_bucket(m), n, k))
            if choice is None or choice.path != "small_m":
                continue
            base, t, same = time_variants(shape, m, choice.config, mods, time_graph)
            cfg = choice.config
            names = [v[0] for v in VARIANTS]
            rows.append([name, m, f"split {cfg.split_k} tma {cfg.tma} block_m {cfg.block_m}", base,
                         *[t[v] / base for v in names], same])
            print(f"{name} M={m}: {base:.2f} us; " + ", ".join(f"{v} {t[v] / base:.3f}" for v in names)
                  + f"; exact variants bit for bit: {same}", file=sys.stderr, flush=True)
        del shape
        torch.cuda.empty_cache()
    print(tabulate(rows, headers=["shape", "M", "config", "committed us", *[v[0] for v in VARIANTS], "same"],
                   floatfmt=".3f"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
