"""The accuracy of quantized KV caches: decode output over an int8 cache (attn.KVCache(dtype='int8')) and over a
bfloat16 cache, against the same keys and values in a float32 cache, on random inputs and on inputs with outlier
channels (a few channels of K many times larger than the rest, as real K caches have). Prints one row per input kind:
the relative error max |out - out_f32| / max |out_f32| over every query row, and its median over the rows.

    python3 bench/kv_cache_accuracy.py [--keys 4096] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

import attn

HQ, HKV, D, BS = 32, 8, 128, 16


def _inputs(rng: np.random.Generator, keys: int, outliers: float) -> tuple:
    k = rng.standard_normal((keys, HKV, D)).astype(np.float32)
    v = rng.standard_normal((keys, HKV, D)).astype(np.float32)
    if outliers:
        k[:, :, :4] *= outliers  # four channels of every head `outliers` times larger
    q = rng.standard_normal((4, HQ, D)).astype(np.float32)
    return q, k, v


def _decode(dtype: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Four decode queries (one per sequence) over four sequences holding the same keys."""
    keys = k.shape[0]
    cache = attn.KVCache(4 * -(-keys // BS), BS, HKV, D, dtype=dtype)
    ids = [cache.add_sequence() for _ in range(4)]
    cu = np.arange(0, 5 * keys, keys, dtype=np.int32)
    kk, vv = np.concatenate([k] * 4), np.concatenate([v] * 4)
    if dtype == "float16":  # the cache's dtype (an int8 cache quantizes float32 rows itself)
        kk, vv = kk.astype(np.float16), vv.astype(np.float16)
    cache.append(ids, kk, vv, cu)
    return cache.attention(q if dtype != "float16" else q.astype(np.float16), ids).astype(
        np.float64
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"decode, {args.keys} keys, Hq {HQ} Hkv {HKV} D {D}: error against a float32 cache (max over rows, median)"
    )
    for label, outliers in (("random N(0, 1)", 0.0), ("K with 4 outlier channels x20", 20.0)):
        q, k, v = _inputs(rng, args.keys, outliers)
        exact = _decode("float32", q, k, v)
        scale = np.abs(exact).max(axis=-1, keepdims=True)
        for dtype in ("int8", "float16"):
            err = np.abs(_decode(dtype, q, k, v) - exact).max(axis=-1, keepdims=True) / scale
            print(f"  {label:32s} {dtype:8s} max {err.max():.2e}  median {np.median(err):.2e}")


if __name__ == "__main__":
    main()
