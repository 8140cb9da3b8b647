"""attn: exact scaled dot-product attention on the CPU.

NumPy and PyTorch bindings of the attn C++ library. Arrays are NumPy arrays or PyTorch CPU tensors (float64,
float32, float16, and bfloat16 for torch), read without a copy when their last dim is contiguous; results
come back as the caller's type (torch in, torch out).

    attn.attention(q, k, v, *, mask=None, mask_type='keep', causal=False, align='bottom-right', ...)
        the whole contract (docs/semantics.md): q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv];
        torch's is_causal= and attn_mask= are accepted with torch's meaning
    attn.attention_backward(dout, q, k, v, out, lse, *, dweights=None, **same options)  ->  (dq, dk, dv[, dmask])
        dweights: the returned weights' gradient [..., Hq, Lq, Lk], folded into dq, dk and dmask
    attn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
                          return_lse=False, **options)   packed sequences (FlashAttention's varlen form):
        q [total_q, Hq, D], int32 cu_seqlens [B + 1]; each sequence is attention on its own rows, bottom-right aligned
    attn.attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, ...)  ->  (dq, dk, dv[, dsinks])
    attn.attention_paged(q, k_pages, v_pages, block_table, seqused_k, cu_seqlens_q=None, *, return_lse=False,
                         **options)   a paged KV cache (vLLM's layout): keys in blocks of a pool, int32 block_table
        [B, max_blocks] and seqused_k [B]; forward only
    attn.KVCache(num_blocks, block_size, num_kv_heads, head_dim, ...), attn.KVCache.over(k_pages, v_pages)
        a paged KV cache's pool and sequences (append, fork, free_sequence, view, attention)
    attn.write_kv_slots(k_pages, v_pages, k, v, slot_mapping)   vLLM's reshape_and_cache, in place
    attn.quantize_int8(x)  ->  (values int8, scales)   an int8 KV cache's form (KVCache(..., dtype='int8'),
        attention_paged(..., k_scales=, v_scales=))
    attn.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                      scale=None, enable_gqa=False)   PyTorch's semantics exactly
    attn.linear_attention(q, k, v, *, causal=False, align='bottom-right', key_lengths=None, key_keep=None)
        linear attention, phi = elu + 1 (4-D, float32/float64); attn.linear_attention_backward(dout, q, k, v, ...)
        ->  (dq, dk, dv); plain arrays or tensors, outside torch's autograd
    attn.torch     autograd Functions and a drop-in torch.nn.MultiheadAttention (needs torch)
    attn.nn        the C++ Transformer layers (MultiheadAttention, TransformerEncoderLayer, ...)
    attn.viz       attention heatmaps (PNG / SVG)
    attn.build_info()  the version, and the instruction set each kernel family runs on (ATTN_CPU_ISA)

Alignment rule: with align='bottom-right' (default) query i sits at key position i + Lk - Lq, so causal
attention lets the last query see every key (FlashAttention); align='top-left' puts it at i (PyTorch's
is_causal, which scaled_dot_product_attention uses).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _core, _sdpa
from ._core import (
    KVCache,
    build_info,
    cached_memory_bytes,
    cached_memory_limit,
    get_num_threads,
    linear_attention,
    linear_attention_backward,
    quantize_int8,
    release_cached_memory,
    resolve_backend,
    set_cached_memory_limit,
    set_num_threads,
    write_kv_slots,
)

__version__ = "0.1.0"
__all__ = [
    "KVCache",
    "attention",
    "attention_backward",
    "attention_paged",
    "attention_varlen",
    "attention_varlen_backward",
    "build_info",
    "cached_memory_bytes",
    "cached_memory_limit",
    "get_num_threads",
    "linear_attention",
    "linear_attention_backward",
    "quantize_int8",
    "release_cached_memory",
    "resolve_backend",
    "scaled_dot_product_attention",
    "set_cached_memory_limit",
    "set_num_threads",
    "write_kv_slots",
]


def _attn_torch() -> Any:
    """attn.torch, imported on first use (torch is loaded already when a caller passes torch tensors)."""
    return importlib.import_module(".torch", __name__)


def attention(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """attn._core.attention (the whole contract; its docstring below), plus torch's names and autograd.

    torch's names, where they mean the same: is_causal=True is causal=True with align='top-left' (query i sees
    keys j <= i, torch's rule); attn_mask is mask with torch's polarity, read from its dtype (bool: True = may
    attend; float: added to the scores). Torch tensors that require grad (with grad mode on) go through
    attn.torch.attention, so the result is differentiable; otherwise the result is a plain array or tensor.
    A wrong argument type raises a one-line TypeError naming the argument.
    """
    if "is_causal" in options or "attn_mask" in options:
        options = _sdpa.torch_names(options, "attn.attention")
    if _sdpa.needs_torch((q, k, v, options.get("mask"))):
        return _attn_torch().attention(q, k, v, **options)
    try:
        return _core.attention(q, k, v, **options)
    except TypeError as e:
        raise _sdpa.argument_error(
            e, _core.attention, "attn.attention", {"q": q, "k": k, "v": v, **options}
        ) from None


def attention_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, **options: Any
) -> tuple:
    """attn._core.attention_backward (its docstring below), with torch's names as attn.attention takes them.

    The gradients come back as plain arrays or tensors, as torch.autograd.grad's do without create_graph: use
    attn.torch for gradients inside autograd.
    """
    if "is_causal" in options or "attn_mask" in options:
        options = _sdpa.torch_names(options, "attn.attention_backward")
    try:
        return _core.attention_backward(dout, q, k, v, out, lse, **options)
    except TypeError as e:
        arguments = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse, **options}
        raise _sdpa.argument_error(
            e, _core.attention_backward, "attn.attention_backward", arguments
        ) from None


attention.__doc__ = f"{attention.__doc__}\n{_core.attention.__doc__}"
attention_backward.__doc__ = f"{attention_backward.__doc__}\n{_core.attention_backward.__doc__}"


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    seqused_k: Any = None,
    return_lse: bool = False,
    **options: Any,
) -> Any:
    """attn._core.attention_varlen (packed sequences; its docstring below), returning out, or (out, lse) with
    return_lse=True, as attn.attention does (attn._core.attention_varlen always returns both).

    Torch tensors that require grad (with grad mode on; q, k, v or sinks) go through attn.torch.attention_varlen, so
    the result is differentiable; otherwise it is a plain array or tensor. A wrong argument type raises a one-line
    TypeError naming the argument.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(
            f"attn.attention_varlen: return_lse must be a bool, got {type(return_lse).__name__} {return_lse!r}"
        )
    batch = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k, "seqused_k": seqused_k}
    if _sdpa.needs_torch((q, k, v, options.get("sinks"))):
        return _attn_torch().attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, **batch, return_lse=return_lse, **options
        )
    try:
        out, lse = _core.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **batch, **options)
    except TypeError as e:
        arguments = {
            "q": q,
            "k": k,
            "v": v,
            "cu_seqlens_q": cu_seqlens_q,
            "cu_seqlens_k": cu_seqlens_k,
        }
        raise _sdpa.argument_error(
            e, _core.attention_varlen, "attn.attention_varlen", {**arguments, **batch, **options}
        ) from None
    return (out, lse) if return_lse else out


def attention_varlen_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    **options: Any,
) -> tuple:
    """attn._core.attention_varlen_backward (its docstring below): (dq, dk, dv[, dsinks]) as plain arrays or tensors,
    outside autograd (use attn.torch.attention_varlen for gradients inside it)."""
    try:
        return _core.attention_varlen_backward(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, **options
        )
    except TypeError as e:
        arrays = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        names = ("dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
        raise _sdpa.argument_error(
            e,
            _core.attention_varlen_backward,
            "attn.attention_varlen_backward",
            {**dict(zip(names, arrays)), **options},
        ) from None


attention_varlen.__doc__ = f"{attention_varlen.__doc__}\n{_core.attention_varlen.__doc__}"
attention_varlen_backward.__doc__ = (
    f"{attention_varlen_backward.__doc__}\n{_core.attention_varlen_backward.__doc__}"
)


def attention_paged(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    block_table: Any,
    seqused_k: Any,
    cu_seqlens_q: Any = None,
    *,
    return_lse: bool = False,
    **options: Any,
) -> Any:
    """attn._core.attention_paged (a paged KV cache; its docstring below), returning out, or (out, lse) with
    return_lse=True, as attn.attention does (attn._core.attention_paged always returns both).

    Forward only: torch tensors that require grad (with grad mode on) go to attn.torch.attention_paged, which
    refuses them rather than return a result without a gradient. A KVCache gives the pool's arrays: view(ids)
    unpacks into k_pages, v_pages, block_table, seqused_k. A wrong argument type raises a one-line TypeError naming
    the argument.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(
            f"attn.attention_paged: return_lse must be a bool, got {type(return_lse).__name__} {return_lse!r}"
        )
    arrays = {
        "q": q,
        "k_pages": k_pages,
        "v_pages": v_pages,
        "block_table": block_table,
        "seqused_k": seqused_k,
        "cu_seqlens_q": cu_seqlens_q,
    }
    if _sdpa.needs_torch((q, k_pages, v_pages, options.get("sinks"))):
        return _attn_torch().attention_paged(*arrays.values(), return_lse=return_lse, **options)
    try:
        out, lse = _core.attention_paged(*arrays.values(), **options)
    except TypeError as e:
        raise _sdpa.argument_error(
            e, _core.attention_paged, "attn.attention_paged", {**arrays, **options}
        ) from None
    return (out, lse) if return_lse else out


attention_paged.__doc__ = f"{attention_paged.__doc__}\n{_core.attention_paged.__doc__}"


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
    """torch.nn.functional.scaled_dot_product_attention's semantics, computed by attn. Torch tensors that require
    grad (with grad mode on) go through attn.torch.scaled_dot_product_attention, the autograd version.

    Shapes: query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev];
    3-D [N, L, E] and 2-D [L, E] inputs are accepted; the dims before [L, E] broadcast as in torch.matmul, across
    ranks too (query [N, H, L, E] with key/value [H, S, E] or [S, E]).
    attn_mask: broadcastable to [..., Hq, L, S]; bool True = may attend, a float mask is added to the scores.
    is_causal: query i attends to keys j <= i (top-left alignment, torch's rule; attn_mask must then be None).
    scale: defaults to 1/sqrt(E). enable_gqa: Hq may be a multiple of Hkv (query head h reads key/value head
    h // (Hq // Hkv)); without it Hq != Hkv is a ValueError (Hkv == 1 broadcasts, as in torch).
    dropout_p: drops weights with probability p (always, as torch's function does), the seed drawn from
    torch's RNG for torch inputs and NumPy's global RNG otherwise.
    A query that may attend to no key gets zeros. Returns the caller's array type and dtype.
    """
    if _sdpa.needs_torch((query, key, value, attn_mask)):
        return _attn_torch().scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    q, k, v, options, squeeze = _sdpa.prepare(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )
    try:
        out = _core.attention(q, k, v, **options)
    except TypeError as e:
        arguments = {"scale": scale, "dropout_p": dropout_p}
        raise _sdpa.argument_error(
            e, _core.attention, "attn.scaled_dot_product_attention", arguments
        ) from None
    return out[0] if squeeze else out


def __getattr__(name: str) -> Any:
    # attn.torch, attn.nn, attn.models and attn.viz load on first use: torch stays optional for `import attn`.
    if name in ("torch", "nn", "models", "viz"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attn' has no attribute {name!r}")
