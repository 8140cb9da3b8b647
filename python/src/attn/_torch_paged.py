"""attn.torch.attention_paged: attention over a paged KV cache (attn._core.attention_paged) for torch tensors.

Forward only, by design of the C++ entry point (a KV cache serves inference): there is no autograd Function here, and
a tensor that requires grad with grad mode on is refused rather than given a result without a gradient. What this
module adds to attn._core.attention_paged is torch's conventions: arrays become tensors (so results are tensors), a
dropout seed comes from torch's RNG, return_lse as attn.torch.attention takes it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _core, _sdpa
from ._torch_options import _as_tensor, _seed_tensor

_FN = "attn.torch.attention_paged"


def _tensor(x: Any, name: str) -> Tensor | None:
    return _as_tensor(x, name, _FN)


def attention_paged(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    seqused_k: Tensor,
    cu_seqlens_q: Tensor | None = None,
    *,
    return_lse: bool = False,
    **options: Any,
) -> Any:
    """attn.attention_paged for torch tensors: q [total_q, Hq, D] with int32 cu_seqlens_q [B + 1] (or q [B, Hq, D]
    and cu_seqlens_q None: one query per sequence), the pools k_pages [num_blocks, block_size, Hkv, D] and v_pages
    [num_blocks, block_size, Hkv, Dv], int32 block_table [B, max_blocks] and seqused_k [B] -> out [total_q, Hq, Dv],
    or (out, lse) with lse [Hq, total_q] when return_lse=True.

    Sequence b's queries attend to its seqused_k[b] keys as attn.attention does on those keys gathered into one
    tensor (the same bits), aligned bottom-right by default (the queries are the last keys: append a step's keys to
    the cache before the call). The options are attn.attention's, per sequence (see attn._core.attention_paged's
    docstring: alibi_slopes [Hq] or [B, Hq]; key_lengths, mask, block_layout and return_weights are refused). With
    dropout and seed=None the seed is drawn from torch's RNG.

    Not differentiable: a KV cache serves inference. q, the pools or sinks requiring grad with grad mode on raise a
    RuntimeError (run under torch.no_grad() or torch.inference_mode(), or pass detached tensors). No autocast: q
    must have the pools' dtype, or the pools are int8 with k_scales and v_scales (keywords, float32 [num_blocks,
    block_size, Hkv]).
    """
    if (
        torch.jit.is_tracing()
    ):  # no op to record: the trace would keep this call's result as a constant
        raise RuntimeError(
            f"{_FN} cannot be traced by torch.jit.trace (it is a plain call, not a torch op, and a trace would "
            "keep its result as a constant, wrong on new inputs); call it outside the traced function"
        )
    if not isinstance(return_lse, bool):
        raise TypeError(
            f"{_FN}: return_lse must be a bool, got {type(return_lse).__name__} {return_lse!r}"
        )
    names = ("q", "k_pages", "v_pages", "block_table", "seqused_k", "cu_seqlens_q")
    given = (q, k_pages, v_pages, block_table, seqused_k, cu_seqlens_q)
    arrays = {n: _tensor(x, n) for n, x in zip(names, given)}
    sinks = _tensor(options.get("sinks"), "sinks")
    if sinks is not None:
        options["sinks"] = sinks
    for name in ("k_scales", "v_scales"):  # an int8 pool's scales
        if options.get(name) is not None:
            options[name] = _tensor(options[name], name)
    if torch.is_grad_enabled():
        for name, x in (*arrays.items(), ("sinks", sinks)):
            if x is not None and x.requires_grad:
                raise RuntimeError(
                    f"{_FN} is forward only (no gradient): {name} requires grad; call it under torch.no_grad() or "
                    f"torch.inference_mode(), or pass {name}.detach()"
                )
    dropout_p = options.get("dropout_p", 0.0)
    if dropout_p or options.get("seed") is not None:
        seed = _seed_tensor(options.get("seed"), dropout_p, _FN)
        options["seed"] = None if seed is None else int(seed.item()) & (2**64 - 1)
    try:
        out, lse = _core.attention_paged(*arrays.values(), **options)
    except TypeError as e:
        raise _sdpa.argument_error(e, _core.attention_paged, _FN, {**arrays, **options}) from None
    return (out, lse) if return_lse else out
