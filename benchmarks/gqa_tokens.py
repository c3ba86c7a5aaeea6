"""How many query tokens per step ``gqa_attention`` should take: the KV copy against the grouped SDPA, by tokens.

    PYTHONPATH=. python benchmarks/gqa_tokens.py --batches 1,8,32 --tokens 1,2,4,8,16,32,64,128

transformers' SDPA attention copies the KV cache to every query head (``repeat_kv``) whenever it passes a mask,
which a static cache always does. ``gqa_attention`` drops the copy and gives SDPA the cache itself, a kv head's
G query heads x S tokens as its G * S query rows; at S > 1 the [B, 1, S, L] mask must then be laid out per group,
a [B, Hkv, G * S, L] copy that grows with S while the KV copy it saves does not. So there is a token count above
which the copy is cheaper (and a prefill's attention is compute-bound anyway). This times both forms of one
attention, eager (each form is what the graph runs with and without the rewrite: the copies as copy kernels, the
SDPA kernel op the dispatcher chose for the copy's shapes, forced for both with ``sdpa_kernel``), CUDA-graph medians
over rotating input copies (beyond L2, as each layer's own cache is), outputs checked against each other, and each
against the attention in fp32 (which rounds nearer: at one token and batch 1 the two differ by ~2e-3 on cuDNN).

Shapes: head dim 128, ``--kv-heads`` kv heads (8: the 8B and 32B models unsharded; fewer per GPU under tensor
parallelism, and with them fewer (batch row, kv head) pairs, the programs cuDNN runs for the grouped form);
G = 4 (Llama-3.1-8B, Qwen3-8B) and 8 (Qwen3-32B); a ``--cache``-slot cache.
``--dry-run``: the CPU, tiny sizes, wall-clock times (checks the script; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _timing import rotating_copies, time_graph  # noqa: E402

from fp8_fusion_pass.kernels import reference  # noqa: E402

BF16 = torch.bfloat16


def copy_form(q, k, v, mask):
    """What transformers runs: the cache copied to every query head, then SDPA per head."""
    b, hkv, length, d = k.shape
    g = q.shape[1] // hkv
    k_rep = k[:, :, None].expand(b, hkv, g, length, d).reshape(b, hkv * g, length, d)
    v_rep = v[:, :, None].expand(b, hkv, g, length, d).reshape(b, hkv * g, length, d)
    return F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask)


def grouped_form(q, k, v, mask):
    """What ``gqa_attention`` leaves: SDPA on the cache, G x S query rows per kv head, the mask laid out per group."""
    b, hq, s, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    g = hq // hkv
    rows = mask.expand(b, hq, s, length).reshape(b, hkv, g * s, length)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g * s, d), k, v, attn_mask=rows)
    return out.reshape(b, hq, s, d)


def inputs(b, hkv, g, s, length, d, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, hkv * g, s, d, generator=gen, device=device).to(BF16)
    k, v = (torch.randn(b, hkv, length, d, generator=gen, device=device).to(BF16) for _ in range(2))
    # a static-cache step's mask: the slots up to each token's position (the cache's last S slots are the step's)
    slot = torch.arange(length, device=device)
    pos = length - s + torch.arange(s, device=device)
    mask = torch.zeros(b, 1, s, length, device=device, dtype=BF16).masked_fill(slot > pos[:, None], float("-inf"))
    return q, k, v, mask


def exact(q, k, v, mask):
    """The attention in fp32, as [B, Hq, S, D] (the reference both forms are measured against: which one rounds
    nearer): the library's reference on the grouped rows, fed fp32 so it rounds nothing."""
    b, hq, s, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    keep = (mask == 0).expand(b, hq, s, length).reshape(b, hkv, hq // hkv * s, length)
    out = reference.decode_attention(q.float().reshape(b, hkv, hq // hkv * s, d), k, v, keep, d**-0.5)
    return out.reshape(b, hq, s, d)


def rel(x, ref) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def chosen_backend(q, k, v, mask):
    """The SDPA backend PyTorch picks for the copy form's shapes (the op the compiled graph holds, either form)."""
    from torch.nn.attention import SDPBackend

    rep = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # the copy, as copy_form makes it
    return SDPBackend(torch._fused_sdp_choice(q, rep, rep, mask, 0.0, False))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128")
    p.add_argument("--groups", default="4,8", help="query heads per kv head")
    p.add_argument("--kv-heads", default="8", help="kv heads per GPU (8 unsharded; e.g. 1,2,4,8)")
    p.add_argument("--cache", type=int, default=1024, help="slots in the static cache (all read: SDPA masks them)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    from torch.nn.attention import sdpa_kernel

    device = "cpu" if args.dry_run else "cuda"
    d = 16 if args.dry_run else 128
    length = min(args.cache, 64) if args.dry_run else args.cache
    rows = []
    sizes = (args.kv_heads, args.groups, args.batches, args.tokens)
    cells = itertools.product(*(map(int, a.split(",")) for a in sizes))
    for hkv, g, b, s in cells:
        if s > length:
            continue
        per_copy = 2 * (b * hkv * length * d) * 2 + b * hkv * g * s * (d + length) * 2
        copies = rotating_copies(per_copy, args.dry_run, most=16)
        sets = [inputs(b, hkv, g, s, length, d, device, i) for i in range(copies)]
        backend = chosen_backend(*sets[0])
        with sdpa_kernel([backend]):
            want, got = copy_form(*sets[0]), grouped_form(*sets[0])
            err, ref = rel(got, want.float()), exact(*sets[0])
            err_copy, err_grouped = rel(want, ref), rel(got, ref)
            t_copy = time_graph(lambda i: copy_form(*sets[i]), copies, args.dry_run)
            t_grouped = time_graph(lambda i: grouped_form(*sets[i]), copies, args.dry_run)
        rows.append((hkv, g, b, s, backend.name, t_copy, t_grouped, err, err_copy, err_grouped))
        print(f"Hkv={hkv} G={g} B={b} S={s} {backend.name}: copy {t_copy:.1f} us, grouped {t_grouped:.1f} us, "
              f"{t_copy / t_grouped:.2f}x, rel L2 {err:.1e} (vs fp32: copy {err_copy:.1e}, grouped "
              f"{err_grouped:.1e})", flush=True)
    print(f"\ncache {length} slots, head dim {d}; us per attention (CUDA-graph median)")
    print("| kv heads | G | batch | tokens | SDPA kernel | KV copy + SDPA | grouped SDPA | speed-up | rel L2 | "
          "copy vs fp32 | grouped vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for hkv, g, b, s, name, tc, tg, err, ec, eg in rows:
        print(f"| {hkv} | {g} | {b} | {s} | {name} | {tc:.1f} | {tg:.1f} | {tc / tg:.2f}x | {err:.1e} | {ec:.1e} | "
              f"{eg:.1e} |")
    bad = [r for r in rows if not r[7] < 2e-2]
    if bad:
        print(f"outputs differ (rel L2 >= 2e-2): {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
