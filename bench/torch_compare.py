#!/usr/bin/env python3
"""attn against PyTorch's CPU scaled_dot_product_attention, side by side in one process.

The same shapes as `attn bench` (the issue's grid): forward and forward + backward, f32 and bf16, causal
or not, B x H in {8, 32}, L in {128, 512, 2048, 8192}, D in {64, 128}, and decode (Lk = 32768,
D = 128: 32 heads and Lq = 1, GQA with 8 kv heads, and with --decode also Lq = 4). Both libraries get
the same torch tensors (attn through attn.torch, zero-copy), the same thread count, and the same
number of timed runs; the median is printed with the ratio torch / attn (> 1: attn is faster).
Causal is top-left in torch (is_causal) and bottom-right in attn; on square shapes they are the same
mask.

    pip install torch ./python      # PyTorch is never a test dependency of attn
    python3 bench/torch_compare.py --threads 2 [--quick] [--modes fwd,fwdbwd] [--dtypes f32,bf16]

Next to the wall-clock medians it prints GFLOP per CPU-second per thread for each library ("GF/s/core"):
on a machine shared with other jobs, time-slicing stretches wall clock but not CPU time, so those columns
compare the kernels themselves. --torch-only skips attn (e.g. to set torch's per-core numbers next to
`attn bench`'s "cpu GF/s/core" column).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def median_seconds(fn, reps: int) -> tuple[float, float]:
    """Median wall-clock and median process CPU seconds of fn()."""
    fn()  # warm-up
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=0, help="threads for both (0: torch's default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="L 512 and 2048, D 64, BH 8")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--bh", default="8,32")
    ap.add_argument("--L", default="128,512,2048,8192")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument(
        "--decode",
        default="mha,gqa",
        help="decode rows (Lk 32768, D 128, no mask): mha (32 heads, Lq 1), gqa (32 query heads over 8 kv "
        "heads), spec (32 heads, Lq 4: speculative decoding's draft rows), gqa-spec",
    )
    ap.add_argument("--torch-only", action="store_true", help="time PyTorch only")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_compare.py needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    if not args.torch_only:
        import attn.torch as at

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    # The timed calls of one row, made by functions so that each closure holds its own row's tensors.
    def runners(mode, q, k, v, dout, causal):
        """fwd: one forward under no_grad; fwdbwd: forward then backward of dout."""
        if mode == "fwd":

            def run_torch():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def run_attn():
                with torch.no_grad():
                    at.attention(q, k, v, causal=causal, threads=threads)

            return run_torch, run_attn
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

        def run_torch():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            out.backward(dout)

        def run_attn():
            out = at.attention(qg, kg, vg, causal=causal, threads=threads)
            out.backward(dout)

        return run_torch, run_attn

    def decode_runners(q, k, v, gqa):
        def run_torch():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, **gqa)

        def run_attn():
            with torch.no_grad():
                at.attention(q, k, v, threads=threads)

        return run_torch, run_attn

    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    Ls = [int(x) for x in args.L.split(",")]
    Ds = [int(x) for x in args.D.split(",")]
    BHs = [int(x) for x in args.bh.split(",")]
    if args.quick:
        Ls, Ds, BHs = [512, 2048], [64], [8]
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    print(f"torch {torch.__version__}, {threads} threads, median of {args.reps} runs")
    print(
        f"{'mode':<7} {'dtype':<5} {'causal':<6} {'BH':>4} {'L':>6} {'D':>4} {'torch ms':>10} {'attn ms':>10} "
        f"{'torch/attn':>10} {'torch GF/s/core':>16} {'attn GF/s/core':>15}"
    )
    gen = torch.Generator().manual_seed(0)
    for mode in args.modes.split(","):
        for dt in args.dtypes.split(","):
            dtype = dtypes[dt]
            for bh in BHs:
                for D in Ds:
                    for L in Ls:
                        for causal in causals:
                            shape = (1, bh, L, D)
                            q, k, v, dout = (
                                torch.rand(shape, generator=gen).mul_(2).sub_(1).to(dtype)
                                for _ in range(4)
                            )
                            run_torch, run_attn = runners(mode, q, k, v, dout, causal)
                            flops = (
                                4.0
                                * bh
                                * L
                                * L
                                * D
                                * (0.5 if causal else 1.0)
                                * (1.0 if mode == "fwd" else 3.5)
                            )
                            t_torch, c_torch = median_seconds(run_torch, args.reps)
                            t_attn, c_attn = (
                                (float("nan"), float("nan"))
                                if args.torch_only
                                else median_seconds(run_attn, args.reps)
                            )
                            print(
                                f"{mode:<7} {dt:<5} {'yes' if causal else 'no':<6} {bh:>4} {L:>6} {D:>4} "
                                f"{t_torch * 1e3:>10.2f} {t_attn * 1e3:>10.2f} {t_torch / t_attn:>10.2f} "
                                f"{flops / c_torch * 1e-9:>16.1f} {flops / c_attn * 1e-9:>15.1f}",
                                flush=True,
                            )
    if not args.no_decode:
        rows = {"mha": (32, 32, 1), "gqa": (32, 8, 1), "spec": (32, 32, 4), "gqa-spec": (32, 8, 4)}
        for dt in args.dtypes.split(","):
            for row in args.decode.split(","):
                hq, hkv, lq = rows[row]
                dtype = dtypes[dt]
                q = torch.rand((1, hq, lq, 128), generator=gen).to(dtype)
                k = torch.rand((1, hkv, 32768, 128), generator=gen).to(dtype)
                v = torch.rand((1, hkv, 32768, 128), generator=gen).to(dtype)
                gqa = {"enable_gqa": True} if hq != hkv else {}  # torch >= 2.5
                run_torch, run_attn = decode_runners(q, k, v, gqa)
                t_torch = median_seconds(run_torch, args.reps)[0]
                t_attn = float("nan") if args.torch_only else median_seconds(run_attn, args.reps)[0]
                gbytes = 2 * k.numel() * k.element_size() * 1e-9  # K and V, each read once
                print(
                    f"decode  {dt:<5} {row:<8} Hq {hq} Hkv {hkv:>2} Lq {lq} Lk 32768 D 128: "
                    f"torch {t_torch * 1e3:.2f} ms, attn {t_attn * 1e3:.2f} ms "
                    f"({gbytes / t_attn:.1f} GB/s of K+V), torch/attn {t_torch / t_attn:.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
