"""PyTorch's scaled_dot_product_attention arguments mapped onto attn's contract (shared by attn and attn.torch)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_FN = "attn.scaled_dot_product_attention"


def is_torch_tensor(x: Any) -> bool:
    """Whether x is a torch.Tensor, without importing torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _as_array(x: Any, name: str) -> Any:
    if is_torch_tensor(x) or isinstance(x, np.ndarray):
        return x
    if x is None:
        raise TypeError(f"{_FN}: {name} must be an array, got None")
    try:
        return np.asarray(x)
    except Exception as e:  # ragged lists and the like
        raise TypeError(f"{_FN}: {name} must be an array, got {type(x).__name__}: {e}") from None


def _is_bool(mask: Any) -> bool:
    dtype = mask.dtype
    if is_torch_tensor(mask):
        return dtype == sys.modules["torch"].bool
    return dtype == np.bool_


def _expand(x: Any, shape: tuple) -> Any:
    if tuple(x.shape) == shape:
        return x
    return x.expand(*shape) if is_torch_tensor(x) else np.broadcast_to(x, shape)


def random_seed(torch_rng: bool) -> int:
    """A fresh dropout seed from the caller's framework RNG (torch.manual_seed / np.random.seed reproduce it)."""
    if torch_rng:
        torch = sys.modules["torch"]
        return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())
    return int(np.random.randint(0, 2**62, dtype=np.int64))


def prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Returns (q, k, v, options for attn.attention, squeeze) for PyTorch's SDPA semantics.

    PyTorch's shapes are query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev]; 2-D inputs
    [L, E] get a leading dim of 1 (squeeze=True: drop it from the result). A 3-D input [N, L, E] is the
    same problem as N heads, so it needs no change. Leading dims broadcast as in torch.matmul.
    """
    q, k, v = _as_array(query, "query"), _as_array(key, "key"), _as_array(value, "value")
    nd = q.ndim
    if nd < 2 or k.ndim != nd or v.ndim != nd:
        raise ValueError(
            f"{_FN}: query, key and value must have one rank >= 2 ([..., L, E]), got query {tuple(q.shape)}, "
            f"key {tuple(k.shape)}, value {tuple(v.shape)}"
        )
    squeeze = nd == 2
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq != hkv and not (enable_gqa or hkv == 1):  # Hkv == 1 broadcasts in torch (multi-query)
        raise ValueError(
            f"{_FN}: query has {hq} heads and key/value {hkv}; pass enable_gqa=True for grouped-query "
            f"attention (query {tuple(query.shape)}, key {tuple(key.shape)})"
        )
    batch_q, batch_k, batch_v = tuple(q.shape[:-3]), tuple(k.shape[:-3]), tuple(v.shape[:-3])
    if not (batch_q == batch_k == batch_v):
        try:
            batch = np.broadcast_shapes(batch_q, batch_k, batch_v)
        except ValueError:
            raise ValueError(
                f"{_FN}: leading dims of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                f"{tuple(value.shape)} do not broadcast"
            ) from None
        q = _expand(q, batch + tuple(q.shape[-3:]))
        k = _expand(k, batch + tuple(k.shape[-3:]))
        v = _expand(v, batch + tuple(v.shape[-3:]))

    options: dict[str, Any] = {"scale": scale, "dropout_p": float(dropout_p)}
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"{_FN}: attn_mask must be None when is_causal=True (as in torch)")
        mask = _as_array(attn_mask, "attn_mask")
        options["mask"] = mask
        options["mask_type"] = "keep" if _is_bool(mask) else "add"  # torch: True = may attend; floats added
    if is_causal:
        options["causal"] = True
        options["align"] = "top-left"  # torch's is_causal: query i sees keys j <= i
    if dropout_p > 0.0:
        options["seed"] = random_seed(any(is_torch_tensor(x) for x in (query, key, value)))
    return q, k, v, options, squeeze
