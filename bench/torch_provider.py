"""torch.nn.functional.scaled_dot_product_attention with attn.torch.enable() against torch's own CPU kernel, side by
side in one process (issue 51's rows): the per-call time of a tiny call (B 1, H 1, L 1, D 64: the fixed cost), and a
Llama-shaped causal prefill (Hq 32, Hkv 8 with enable_gqa, D 128, L 4096 by default) in f32 and bf16, forward and
forward + backward, and a decode step over a 32768-key cache. Medians of --reps calls, alternating torch and attn
call by call.

    python3 bench/torch_provider.py [--threads 2] [--reps 5] [--seq 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch as at


def _time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _side_by_side(fn, reps: int) -> tuple[float, float]:
    """(torch seconds, attn seconds): medians over rounds that run torch then attn."""
    t_torch, t_attn = [], []
    for _ in range(reps):
        t_torch.append(_time(fn, 1))
        with at.enable():
            t_attn.append(_time(fn, 1))
    return statistics.median(t_torch), statistics.median(t_attn)


def _tiny(reps: int) -> None:
    q = torch.randn(1, 1, 1, 64)

    def calls():
        for _ in range(1000):
            F.scaled_dot_product_attention(q, q, q)

    t, a = _side_by_side(calls, reps)
    print(
        f"tiny call (B1 H1 L1 D64): torch {t * 1e3:.2f} us, attn {a * 1e3:.2f} us per call; attn / torch {a / t:.2f}"
    )


def _prefill(seq: int, dtype: torch.dtype, backward: bool, reps: int) -> None:
    q = torch.randn(1, 32, seq, 128, dtype=dtype, requires_grad=backward)
    k = torch.randn(1, 8, seq, 128, dtype=dtype, requires_grad=backward)
    v = torch.randn(1, 8, seq, 128, dtype=dtype, requires_grad=backward)

    def call():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if backward:
            out.sum().backward()

    t, a = _side_by_side(call, reps)
    what = "fwd + bwd" if backward else "fwd"
    print(
        f"Llama prefill {str(dtype).removeprefix('torch.')} {what} (Hq 32, Hkv 8, D 128, L {seq}, causal): "
        f"torch {t * 1e3:.1f} ms, attn {a * 1e3:.1f} ms; torch / attn {t / a:.2f}"
    )


def _decode(cache: int, dtype: torch.dtype, reps: int) -> None:
    q = torch.randn(1, 32, 1, 128, dtype=dtype)
    k = torch.randn(1, 8, cache, 128, dtype=dtype)
    v = torch.randn(1, 8, cache, 128, dtype=dtype)
    t, a = _side_by_side(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), reps)
    print(
        f"decode {str(dtype).removeprefix('torch.')} (Hq 32, Hkv 8, D 128, one query, {cache} cached keys): "
        f"torch {t * 1e3:.2f} ms, attn {a * 1e3:.2f} ms; torch / attn {t / a:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    info = attn.build_info()
    print(
        f"torch {torch.__version__}, {args.threads} threads; attn {info['version']} on {info['isa']}, {info['cpu']}"
    )
    _tiny(args.reps)
    for dtype in (torch.float32, torch.bfloat16):
        for backward in (False, True):
            _prefill(args.seq, dtype, backward, args.reps)
        _decode(32768, dtype, args.reps)


if __name__ == "__main__":
    main()
