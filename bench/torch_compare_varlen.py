#!/usr/bin/env python3
"""A ragged batch: attn's packed varlen attention against the PyTorch compositions users write today.

The varlen issue's batch: 16 causal sequences with lengths spread geometrically from 64 to 4096, Hq 16,
Hkv 4 (GQA), D 128, f32 and bf16, forward and forward + backward. Four ways, one process, the same thread
count and torch tensors:

    attn packed     attn.torch.attention_varlen on q [total, Hq, D], k, v [total, Hkv, D] with cu_seqlens
    attn loop       attn.torch.attention per sequence ([1, H, L, D] each)
    torch padded    F.scaled_dot_product_attention on the batch padded to the longest, a bool mask
                    (causal and the sequence's keys; padded query rows keep key 0, so no row is empty)
    torch loop      F.scaled_dot_product_attention per sequence (is_causal)

torch gets k and v expanded to Hq heads beforehand (untimed), its fastest form here.

Medians of --reps runs; ratios > 1 mean attn packed is faster. Mode paged: decode over a paged KV cache (8 sequences
of 1024 ... 32768 keys, Hq 32, Hkv 8, blocks of 16), attn.attention_paged against gathering each sequence's blocks
and SDPA.

    python3 bench/torch_compare_varlen.py --threads 2 [--reps 5] [--dtypes f32,bf16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

SEQS, HQ, HKV, D = 16, 16, 4, 128


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lengths() -> list[int]:
    return [round(64 * 64 ** (b / (SEQS - 1))) for b in range(SEQS)]


def make_inputs(torch, dtype):
    """Packed q, k, v, dout, cu_seqlens, the per-sequence views as [1, H, L, D] copies, and the padded batch
    with its mask."""
    lens = lengths()
    total, longest = sum(lens), max(lens)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.rand(shape, generator=gen).mul_(2).sub_(1).to(dtype)

    packed = dict(q=rand(total, HQ, D), k=rand(total, HKV, D), v=rand(total, HKV, D))
    packed["dout"] = rand(total, HQ, D)
    cu = torch.tensor([0] + [sum(lens[: b + 1]) for b in range(SEQS)], dtype=torch.int32)
    seqs = []
    for b in range(SEQS):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        seqs.append(
            {name: t[rows].transpose(0, 1).unsqueeze(0).contiguous() for name, t in packed.items()}
        )
    # torch gets k and v already expanded to Hq heads (not timed): its CPU flash kernel takes no GQA, and with
    # enable_gqa a padded batch of this size goes to the math path, which holds B Hq L^2 scores.
    for s in seqs:
        for name in ("k", "v"):
            s["torch_" + name] = s[name].repeat_interleave(HQ // HKV, dim=1)
    padded = {
        name: torch.zeros((SEQS, HQ, longest, D), dtype=dtype) for name in ("q", "k", "v", "dout")
    }
    for b, s in enumerate(seqs):
        for name in padded:
            padded[name][b, :, : lens[b]] = s["torch_" + name if name in ("k", "v") else name][0]
    j = torch.arange(longest)
    causal = j.view(1, -1) <= j.view(-1, 1)
    valid = j.view(1, 1, -1) < torch.tensor(lens).view(-1, 1, 1)
    mask = (causal.unsqueeze(0) & valid) | (j == 0).view(1, 1, -1)
    padded["mask"] = mask.unsqueeze(1)  # [B, 1, longest, longest]
    return lens, packed, cu, seqs, padded


def runners(torch, F, at, threads, backward, packed, cu, seqs, padded):
    """The four ways as functions: forward under no_grad, or forward then backward of dout."""
    import contextlib

    ctx = contextlib.nullcontext if backward else torch.no_grad

    def grad(t):
        return t.detach().requires_grad_(backward)

    pq, pk, pv = (grad(packed[n]) for n in ("q", "k", "v"))
    sq = [tuple(grad(s[n]) for n in ("q", "k", "v")) for s in seqs]
    tq = [tuple(grad(s[n]) for n in ("q", "torch_k", "torch_v")) for s in seqs]
    dq, dk, dv = (grad(padded[n]) for n in ("q", "k", "v"))

    def finish(out, dout):
        if backward:
            out.backward(dout)

    def attn_packed():
        with ctx():
            out = at.attention_varlen(pq, pk, pv, cu, cu, causal=True, threads=threads)
            finish(out, packed["dout"])

    def attn_loop():
        with ctx():
            for (q, k, v), s in zip(sq, seqs):
                finish(at.attention(q, k, v, causal=True, threads=threads), s["dout"])

    def torch_padded():
        with ctx():
            out = F.scaled_dot_product_attention(dq, dk, dv, attn_mask=padded["mask"])
            finish(out, padded["dout"])

    def torch_loop():
        with ctx():
            for (q, k, v), s in zip(tq, seqs):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                finish(out, s["dout"])

    return attn_packed, attn_loop, torch_padded, torch_loop


PAGED_SEQS, PAGED_HQ, PAGED_HKV, BLOCK = 8, 32, 8, 16


def paged_rows(torch, F, attn, threads: int, dtype_name: str, dtype, reps: int) -> None:
    """Decode over a paged cache (8 sequences of 1024 ... 32768 keys, Hq 32, Hkv 8, D 128, blocks of 16 shuffled):
    attn.attention_paged against what PyTorch users write for it, the blocks of each sequence gathered
    (index_select) and SDPA per sequence with enable_gqa."""
    lens = [round(1024 * 32 ** (b / (PAGED_SEQS - 1))) for b in range(PAGED_SEQS)]
    nblocks = [(n + BLOCK - 1) // BLOCK for n in lens]
    gen = torch.Generator().manual_seed(1)
    pool = sum(nblocks)
    k_pages = torch.rand((pool, BLOCK, PAGED_HKV, D), generator=gen).to(dtype)
    v_pages = torch.rand((pool, BLOCK, PAGED_HKV, D), generator=gen).to(dtype)
    order = torch.randperm(pool, generator=gen)
    table = torch.zeros((PAGED_SEQS, max(nblocks)), dtype=torch.int32)
    at = 0
    for b, n in enumerate(nblocks):
        table[b, :n] = order[at : at + n].to(torch.int32)
        at += n
    used = torch.tensor(lens, dtype=torch.int32)
    q = torch.rand((PAGED_SEQS, PAGED_HQ, D), generator=gen).to(dtype)

    def run_attn():
        attn.attention_paged(q, k_pages, v_pages, table, used, threads=threads)

    def run_torch():
        with torch.no_grad():
            for b, n in enumerate(lens):
                blocks = table[b, : nblocks[b]].long()
                k = k_pages.index_select(0, blocks).reshape(-1, PAGED_HKV, D)[:n].transpose(0, 1)
                v = v_pages.index_select(0, blocks).reshape(-1, PAGED_HKV, D)[:n].transpose(0, 1)
                F.scaled_dot_product_attention(q[b].unsqueeze(1), k, v, enable_gqa=True)

    t_attn, t_torch = median_seconds(run_attn, reps), median_seconds(run_torch, reps)
    gbytes = 2 * sum(lens) * PAGED_HKV * D * k_pages.element_size() * 1e-9
    print(
        f"paged  {dtype_name:<4} decode {PAGED_SEQS} sequences Lk {lens[0]}..{lens[-1]} Hq {PAGED_HQ} Hkv {PAGED_HKV} "
        f"D {D} blocks of {BLOCK}: attn {t_attn * 1e3:.2f} ms ({gbytes / t_attn:.1f} GB/s of K+V), torch gather + SDPA "
        f"{t_torch * 1e3:.2f} ms; torch / attn {t_torch / t_attn:.2f}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=0, help="threads for both (0: torch's default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument(
        "--modes", default="fwd,fwdbwd,paged", help="fwd, fwdbwd (the ragged batch), paged (decode)"
    )
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_compare_varlen.py needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    import attn
    import attn.torch as at

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    print(f"torch {torch.__version__}, {threads} threads, median of {args.reps} runs")
    for dt in args.dtypes.split(","):
        lens, packed, cu, seqs, padded = make_inputs(torch, dtypes[dt])
        for mode in args.modes.split(","):
            if mode == "paged":
                paged_rows(torch, F, attn, threads, dt, dtypes[dt], args.reps)
                continue
            ways = runners(torch, F, at, threads, mode == "fwdbwd", packed, cu, seqs, padded)
            t = [median_seconds(fn, args.reps) for fn in ways]
            print(
                f"varlen {dt:<4} {mode:<6} {SEQS} causal sequences L {min(lens)}..{max(lens)} "
                f"({sum(lens)} tokens) Hq {HQ} Hkv {HKV} D {D}: attn packed {t[0] * 1e3:.1f} ms, attn loop "
                f"{t[1] * 1e3:.1f} ms, torch padded {t[2] * 1e3:.1f} ms, torch loop {t[3] * 1e3:.1f} ms; "
                f"torch padded / attn packed {t[2] / t[0]:.2f}, torch loop / attn packed {t[3] / t[0]:.2f}, "
                f"attn packed / attn loop {t[0] / t[1]:.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
