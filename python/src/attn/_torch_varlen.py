"""attn.torch.attention_varlen: packed variable-length attention (attn._core.attention_varlen) under torch's autograd.

One torch.autograd.Function over the extension's two entry points: the forward keeps out and lse, the backward hands
them to attn._core.attention_varlen_backward, which gives dq, dk, dv packed like q, k and v and dsinks. The options are
attn._core's (parsed by the extension from the option table); this module only draws a dropout seed from torch's RNG,
applies CPU autocast and keeps the sinks apart, as the one option with a gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _core, _sdpa
from ._torch_ops import (
    _FORWARD_AD,
    _autocast_cast,
    _DoubleBackwardError,
    _no_graph,
)
from ._torch_options import _as_tensor, _seed_tensor

_FN = "attn.torch.attention_varlen"


def _tensor(x: Any, name: str) -> Tensor | None:
    return _as_tensor(x, name, _FN)


def _core_call(core_fn, arrays: tuple, batch: tuple, options: dict) -> tuple:
    """core_fn(*arrays, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=, max_seqlen_k=, seqused_k=, **options), with
    nanobind's "incompatible function arguments" as one line naming the argument. arrays: (q, k, v), or the
    backward's (dout, q, k, v, out, lse)."""
    cu_q, cu_k, max_q, max_k, used = batch
    try:
        return core_fn(
            *arrays,
            cu_q,
            cu_k,
            max_seqlen_q=max_q,
            max_seqlen_k=max_k,
            seqused_k=used,
            **options,
        )
    except TypeError as e:
        names = ("q", "k", "v") if len(arrays) == 3 else ("dout", "q", "k", "v", "out", "lse")
        arguments = {
            **dict(zip(names, arrays)),
            "cu_seqlens_q": cu_q,
            "cu_seqlens_k": cu_k,
            "max_seqlen_q": max_q,
            "max_seqlen_k": max_k,
            **options,
        }
        raise _sdpa.argument_error(e, core_fn, _FN, arguments) from None


class _VarlenFunction(torch.autograd.Function):
    """(out [total_q, Hq, Dv], lse [Hq, total_q]) = attn._core.attention_varlen(q, k, v, ..., sinks=sinks, **options);
    backward: dq, dk, dv and dsinks through attn._core.attention_varlen_backward (lse is not differentiable). batch:
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k); options: the others, the seed fixed."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, batch, options):
        out, lse = _core_call(_core.attention_varlen, (q, k, v), batch, {**options, "sinks": sinks})
        cu_q, cu_k, max_q, max_k, used = batch
        ctx.save_for_backward(q, k, v, sinks, out, lse, cu_q, cu_k, used)
        ctx.max_seqlen = (max_q, max_k)
        # return_weights is a forward-only keyword (and refused by the extension when True)
        ctx.options = {n: x for n, x in options.items() if n != "return_weights"}
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, sinks, out, lse, cu_q, cu_k, used = ctx.saved_tensors
        batch = (cu_q, cu_k, *ctx.max_seqlen, used)
        options = {**ctx.options, "sinks": sinks}
        grads = _core_call(
            _core.attention_varlen_backward, (dout, q, k, v, out, lse), batch, options
        )
        grads = list(grads)  # dq, dk, dv[, dsinks]
        if torch.is_grad_enabled():
            # create_graph=True: exact gradients, but not differentiable; a backward through them raises.
            deps = [t for t in (q, k, v, sinks, dout) if t is not None and t.requires_grad]
            if deps:
                grads = list(_DoubleBackwardError.apply(len(grads), *grads, *deps))
        dsinks = grads[3] if sinks is not None and ctx.needs_input_grad[3] else None
        return grads[0], grads[1], grads[2], dsinks, None, None

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(_FORWARD_AD)


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    seqused_k: Tensor | None = None,
    return_lse: bool = False,
    **options: Any,
) -> Any:
    """attn.attention_varlen with autograd: packed q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] with
    int32 cu_seqlens_q / cu_seqlens_k [B + 1] (FlashAttention's offsets) -> out [total_q, Hq, Dv], or (out, lse) with
    lse [Hq, total_q] (not differentiable) when return_lse=True, as attn.torch.attention returns them.

    Sequence b (rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v) is
    attention on its rows alone, aligned bottom-right by default (query i at key position i + Lk_b - Lq_b); seqused_k
    [B] (int32) is each sequence's key_lengths. The options are attn.attention's, per sequence (see
    attn._core.attention_varlen's docstring: alibi_slopes [Hq] or [B, Hq]; key_lengths, mask, block_layout and
    return_weights are refused). Gradients reach q, k, v and sinks [Hq]. With dropout and seed=None the seed is drawn
    from torch's RNG (seed may also be an int64 scalar tensor) and the backward regenerates the same keep-pattern.
    Under CPU autocast q, k and v are cast to the autocast dtype (float64 stays float64). No second derivative and no
    forward-mode AD: both raise a RuntimeError.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(
            f"{_FN}: return_lse must be a bool, got {type(return_lse).__name__} {return_lse!r}"
        )
    q, k, v = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
    batch = (
        _tensor(cu_seqlens_q, "cu_seqlens_q"),
        _tensor(cu_seqlens_k, "cu_seqlens_k"),
        max_seqlen_q,
        max_seqlen_k,
        _tensor(seqused_k, "seqused_k"),
    )
    sinks = _tensor(options.pop("sinks", None), "sinks")
    dropout_p = options.get("dropout_p", 0.0)
    if dropout_p or options.get("seed") is not None:
        seed = _seed_tensor(options.get("seed"), dropout_p, _FN)
        options["seed"] = None if seed is None else int(seed.item()) & (2**64 - 1)
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        q, k, v = (_autocast_cast(x, dtype) for x in (q, k, v))
    if _no_graph(q, k, v, sinks):
        out, lse = _core_call(_core.attention_varlen, (q, k, v), batch, {**options, "sinks": sinks})
    else:
        out, lse = _VarlenFunction.apply(q, k, v, sinks, batch, options)
    return (out, lse) if return_lse else out
