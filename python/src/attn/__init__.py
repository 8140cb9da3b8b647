"""attn: exact scaled dot-product attention on the CPU.

NumPy and PyTorch bindings of the attn C++ library. Arrays are NumPy arrays or PyTorch CPU tensors (float64,
float32, float16, and bfloat16 for torch), read without a copy when their last dim is contiguous; results
come back as the caller's type (torch in, torch out).

    attn.attention(q, k, v, *, mask=None, mask_type='keep', causal=False, align='bottom-right', ...)
        the whole contract (docs/semantics.md): q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]
    attn.attention_backward(dout, q, k, v, out, lse, **same options)  ->  (dq, dk, dv[, dmask])
    attn.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                      scale=None, enable_gqa=False)   PyTorch's semantics exactly
    attn.torch     autograd Functions and a drop-in torch.nn.MultiheadAttention (needs torch)
    attn.nn        the C++ Transformer layers (MultiheadAttention, TransformerEncoderLayer, ...)
    attn.viz       attention heatmaps (PNG / SVG)

Alignment rule: with align='bottom-right' (default) query i sits at key position i + Lk - Lq, so causal
attention lets the last query see every key (FlashAttention); align='top-left' puts it at i (PyTorch's
is_causal, which scaled_dot_product_attention uses).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _sdpa
from ._core import attention, attention_backward, get_num_threads, resolve_backend, set_num_threads

__version__ = "0.1.0"
__all__ = [
    "attention",
    "attention_backward",
    "get_num_threads",
    "resolve_backend",
    "scaled_dot_product_attention",
    "set_num_threads",
]


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """torch.nn.functional.scaled_dot_product_attention's semantics, computed by attn (no gradients here;
    attn.torch.scaled_dot_product_attention is the autograd version).

    Shapes: query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev];
    3-D [N, L, E] and 2-D [L, E] inputs are accepted; leading dims broadcast as in torch.
    attn_mask: broadcastable to [..., Hq, L, S]; bool True = may attend, a float mask is added to the scores.
    is_causal: query i attends to keys j <= i (top-left alignment, torch's rule; attn_mask must then be None).
    scale: defaults to 1/sqrt(E). enable_gqa: Hq may be a multiple of Hkv (query head h reads key/value head
    h // (Hq // Hkv)); without it Hq != Hkv is a ValueError (Hkv == 1 broadcasts, as in torch).
    dropout_p: drops weights with probability p (always, as torch's function does), the seed drawn from
    torch's RNG for torch inputs and NumPy's global RNG otherwise.
    A query that may attend to no key gets zeros. Returns the caller's array type and dtype.
    """
    q, k, v, options, squeeze = _sdpa.prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    out = attention(q, k, v, **options)
    return out[0] if squeeze else out


def __getattr__(name: str) -> Any:
    # attn.torch, attn.nn and attn.viz load on first use: torch stays optional for `import attn`.
    if name in ("torch", "nn", "viz"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attn' has no attribute {name!r}")
