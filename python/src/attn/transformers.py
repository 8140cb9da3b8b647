"""attn as an attention implementation of Hugging Face transformers: import this module, then load a model with
attn_implementation="attn".

    import attn.transformers
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attn")

Importing it registers two functions under the name "attn" (transformers 5 and PyTorch; `import attn` alone loads
neither):

- attention_forward, with transformers.AttentionInterface: every attention layer calls it with query [B, Hq, Lq, D],
  key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] and the layer's mask, and gets (out [B, Lq, Hq, Dv] contiguous, the
  weights [B, Hq, Lq, Lk] when output_attentions is asked, else None). It runs attn.torch.attention (attn's CPU kernels,
  forward and backward) with transformers' arguments as attn's options: scaling -> scale, softcap -> softcap (Gemma 2),
  s_aux -> sinks [Hq] (GPT-OSS's learned sinks, with their gradient), dropout (transformers passes a nonzero one only in
  training) -> dropout_p with a seed from torch's RNG, and K/V with Hkv < Hq as they come (GQA/MQA: no repeat_kv).
- make_mask, with transformers.AttentionMaskInterface: transformers calls it once per forward for each kind of layer
  (full, sliding), with the pattern as a function of (batch, head, q_idx, kv_idx), the cache's offsets and the 2-D
  padding mask [B, >= kv_offset + Lk]. Where the pattern is one of attn's options it returns an AttnMask: causality,
  the window and where the queries sit among the keys as options, padding as a key mask [B, 1, 1, Lk] (None without
  padding), so no [B, 1, Lq, Lk] tensor is made and attn skips the tiles the rules remove.

The rules, exactly transformers' (masking_utils): query i sits at absolute position q_offset + i, key j at kv_offset + j
(kv_offset > 0 when a sliding-window cache dropped its oldest keys; a StaticCache's keys past the written ones are
zeros that causality removes). In attn's terms that is position_offset = q_offset - kv_offset: p(i) = i + offset.
  causal                     kv <= q                        causal=True
  causal sliding window W    q - W < kv <= q  (W keys)      causal=True, window=(W - 1, 0)
  bidirectional              every key                      (no rule)
  bidirectional window W     |q - kv| <= W                  window=(W, W)
  padding                    attention_mask[b, kv]          mask [B, 1, 1, Lk], mask_type 'keep'
Left padding stays a key mask (attn has no per-batch first key; a [B, 1, 1, Lk] mask costs B * Lk bools and is read
per key tile), right padding runs as key_lengths (attn finds the prefix in the mask). A query at a left-pad position
sees no key under causality: attn gives its row 0 (its output is padding: nothing reads it).

What make_mask leaves to transformers' own sdpa_mask (a dense bool [B, 1, Lq, Lk] mask, or None where sdpa would use
is_causal; attn still runs the attention, with the mask as mask_type 'keep', or causal top-left as sdpa): patterns it
does not know (custom or_mask_function / and_mask_function, packed sequences found from position_ids, block and
chunked attention), callers that may edit the mask tensor (they ask with both allow_*_skip flags False; generate()
does for a StaticCache's decode steps, where the mask is [B, 1, 1, Lk] anyway), masks for a device other than the
CPU, and a StaticCache's tensor q_offset under torch.compile (reading it would break the graph).

attention_forward falls back to transformers' sdpa_attention_forward, with a one-time warning, where attn's kernels
cannot run: tensors not on the CPU, dtypes other than float32 / bfloat16 / float16 / float64, torch.jit.trace (a
trace keeps attn's result as a constant, wrong on new inputs; sdpa's aten op it records), and a position_bias
argument (T5-style relative bias, which sdpa folds into its mask). There softcap and s_aux, which sdpa cannot take,
raise a ValueError instead of being dropped. The sliding_window argument some models pass is not read: as for sdpa
and eager, the mask carries the window. Dropout under attn uses attn's keep-pattern (Philox, keyed by seed, batch,
head, i, j), not torch's: the same probability and scaling, different bits. Weights returned for output_attentions
are those before dropout.

Continuous batching (transformers' paged KV cache, generate_batch) is not registered: transformers 5.25 accepts only
"paged|eager", "sdpa" and flash implementations there (docs/transformers.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

try:
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import (
        and_masks,
        bidirectional_mask_function,
        causal_mask_function,
        prepare_padding_mask,
        sdpa_mask,
        sliding_window_bidirectional_overlay,
        sliding_window_overlay,
    )
    from transformers.utils import logging
except ImportError as e:  # attn itself works without both; only this module needs them
    raise ImportError(
        f"attn.transformers needs PyTorch and transformers >= 5 (pip install torch transformers): {e}"
    ) from e
from torch import Tensor

from . import torch as _attn_torch

__all__ = ["AttnMask", "attention_forward", "make_mask", "register"]

_FN = "attn.transformers"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_logger = logging.get_logger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class AttnMask:
    """A layer's mask as attn's options: what make_mask returns and attention_forward reads.

    causal: key j allowed only at or before the query's position p(i) = i + position_offset.
    window: (left, right), attn's: p(i) - left <= j <= p(i) + right, -1 = unbounded on that side.
    position_offset: q_offset - kv_offset of transformers' mask (where query 0 sits among the keys).
    batch_size, q_length, kv_length: the mask's [B, 1, Lq, Lk]; the layer's key tensor must have kv_length keys.
    keep: bool [B, 1, 1, Lk], True = a real key (False = padding), or None when every key is real.

    ndim and shape are those of the dense mask it stands for ([B, 1, Lq, Lk]): generate() makes a StaticCache's
    masks before the forward and the model hands them back to transformers' mask functions, which pass a prepared
    mask on after reading its ndim (make_mask returns an AttnMask given as attention_mask as it is). Anything that
    treats it as a tensor beyond that fails loudly: it is not one.
    """

    causal: bool
    window: tuple[int, int]
    position_offset: int
    batch_size: int
    q_length: int
    kv_length: int
    keep: Tensor | None = None

    @property
    def ndim(self) -> int:
        return 4

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 1, self.q_length, self.kv_length)

    def options(self) -> dict:
        """attn.attention's keyword options for this mask (the window only when bounded, the mask only with padding)."""
        options: dict[str, Any] = {"causal": self.causal, "position_offset": self.position_offset}
        if self.window != (-1, -1):
            options["window"] = self.window
        if self.keep is not None:
            options["mask"], options["mask_type"] = self.keep, "keep"
        return options

    def dense(self, device: torch.device | str | None = None) -> Tensor:
        """The same rules as a bool mask [B or 1, 1, Lq, Lk] (True = may attend), as transformers' sdpa_mask makes
        it: for the sdpa fallback and for tests."""
        device = self.keep.device if device is None and self.keep is not None else device
        p = torch.arange(self.q_length, device=device)[:, None] + self.position_offset  # [Lq, 1]
        j = torch.arange(self.kv_length, device=device)[None, :]  # [1, Lk]
        allowed = torch.ones(self.q_length, self.kv_length, dtype=torch.bool, device=device)
        left, right = self.window
        if self.causal:
            allowed &= j <= p
        if left >= 0:
            allowed &= j >= p - left
        if right >= 0:
            allowed &= j <= p + right
        allowed = allowed[None, None]
        return allowed if self.keep is None else allowed & self.keep.to(device)


# ---- make_mask: transformers' mask request -> AttnMask ---------------------------------------------------------
#
# transformers hands the pattern over as a closure. The ones attn has as options are recognised by identity: the two
# base functions, and and_masks(<window overlay>, <base>) by the code objects of and_masks' and the overlays' inner
# functions (taken from transformers itself, so a change there makes them unrecognised: the dense fallback, never a
# wrong mask), reading the window from the overlay's closure.
_AND_CODE = and_masks(causal_mask_function).__code__
_SLIDING_CODE = sliding_window_overlay(1).__code__  # kv_idx > q_idx - sliding_window
_SLIDING_BIDIRECTIONAL_CODE = sliding_window_bidirectional_overlay(1).__code__  # |q - kv| <= w


def _closure(fn: Callable) -> dict:
    """A closure's free variables by name ({} for a plain function or a non-function)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def _pattern(mask_function: Callable) -> tuple[bool, tuple[int, int]] | None:
    """(causal, (left, right)) in attn's terms for a transformers mask pattern attn has as options, else None.
    transformers' sliding window W keeps q - W < kv <= q (W keys with the query's own): attn's window (W - 1, 0)."""
    if mask_function is causal_mask_function:
        return True, (-1, -1)
    if mask_function is bidirectional_mask_function:
        return False, (-1, -1)
    if getattr(mask_function, "__code__", None) is not _AND_CODE:
        return None
    parts = _closure(mask_function).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    overlay, base = parts
    code, width = getattr(overlay, "__code__", None), _closure(overlay).get("sliding_window")
    if type(width) is not int or width < 1:
        return None
    if code is _SLIDING_CODE and base is causal_mask_function:
        return True, (width - 1, 0)
    if code is _SLIDING_BIDIRECTIONAL_CODE and base is bidirectional_mask_function:
        return False, (width, width)
    return None


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _offset(q_offset: Any) -> int | None:
    """q_offset as an int: a StaticCache gives a 0-d tensor (its length), read here unless a trace is running
    (None: reading it would break the graph)."""
    if isinstance(q_offset, Tensor):
        return None if _tracing() else int(q_offset)
    return q_offset


def _key_mask(
    attention_mask: Tensor | None, batch_size: int, kv_length: int, kv_offset: int
) -> Tensor | None:
    """The padding of the layer's keys as bool [B, 1, 1, Lk] (True = real), None when there is none. attention_mask:
    transformers' 2-D mask over absolute positions [B, >= kv_offset + Lk] (missing positions at the end count as
    padding, as transformers pads it)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch_size:
        raise ValueError(
            f"{_FN}: attention_mask must be the 2-D padding mask [batch {batch_size}, keys], got "
            f"{tuple(attention_mask.shape)}"
        )
    padding = prepare_padding_mask(attention_mask.to(torch.bool), kv_length, kv_offset)
    keep = padding[:, kv_offset : kv_offset + kv_length]
    # (a trace keeps the mask: reading its values would break the graph)
    if not _tracing() and bool(keep.all()):
        return None
    return keep[:, None, None, :]


def make_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: Tensor | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> AttnMask | Tensor | None:
    """transformers' mask interface for "attn": the mask of one kind of layer (full or sliding) for queries
    [q_offset, q_offset + q_length) against keys [kv_offset, kv_offset + kv_length) of a batch of batch_size.

    Returns an AttnMask when mask_function is a pattern attn has as options (see the module's docstring) and the
    caller accepts a mask that is not a tensor (allow_is_causal_skip or allow_is_bidirectional_skip: it passes the
    mask straight to the attention layers); otherwise transformers' sdpa_mask with the same arguments: a dense bool
    [B, 1, Lq, Lk] mask (True = may attend) or None, which attention_forward runs as sdpa_attention_forward would.
    """
    if isinstance(attention_mask, AttnMask):  # made before the forward (generate, StaticCache)
        return attention_mask
    pattern = None
    skip_allowed = allow_is_causal_skip or allow_is_bidirectional_skip
    if skip_allowed and not use_vmap and torch.device(device).type == "cpu":
        pattern = _pattern(mask_function)
    offset = _offset(q_offset)
    if pattern is None or offset is None:
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            allow_is_causal_skip=allow_is_causal_skip,
            allow_is_bidirectional_skip=allow_is_bidirectional_skip,
            use_vmap=use_vmap,
            device=device,
            **kwargs,
        )
    causal, window = pattern
    keep = _key_mask(attention_mask, batch_size, kv_length, kv_offset)
    return AttnMask(causal, window, offset - kv_offset, batch_size, q_length, kv_length, keep)


# ---- attention_forward: one attention layer -------------------------------------------------------------------


def _shape_error(query: Tensor, key: Tensor, value: Tensor) -> str | None:
    """Why query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] do not fit together (None: they do)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "query, key and value must be 4-D"
    (b, hq, _, d), (bk, hkv, lk, dk) = query.shape, key.shape
    if bk != b or value.shape[0] != b:
        return "query, key and value must have one batch size"
    if tuple(value.shape[1:3]) != (hkv, lk):
        return "key and value must have the same heads and length"
    if dk != d:
        return "query and key must have the same head dim"
    if hkv == 0 or hq % hkv:
        return "query's heads must be a multiple of key's (GQA)"
    return None


def _check_shapes(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Raises a ValueError naming the shapes when query, key and value do not fit together."""
    if not all(isinstance(x, Tensor) for x in (query, key, value)):
        kinds = ", ".join(type(x).__name__ for x in (query, key, value))
        raise TypeError(f"{_FN}: query, key and value must be torch tensors, got {kinds}")
    error = _shape_error(query, key, value)
    if error is not None:
        raise ValueError(
            f"{_FN}: {error} (query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] with Hq % Hkv == 0); "
            f"got query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )


def _fallback_reason(query: Tensor, key: Tensor, value: Tensor, kwargs: dict) -> str | None:
    """Why attn's kernels cannot take this call (None: they can); transformers' sdpa takes it instead."""
    devices = {x.device.type for x in (query, key, value)}
    if devices != {"cpu"}:
        return f"tensors on {'/'.join(sorted(devices))} (attn's kernels run on the CPU)"
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype} (attn computes float32, bfloat16, float16 and float64)"
    if torch.jit.is_tracing():
        return "torch.jit.trace (a trace would keep attn's result as a constant)"
    if kwargs.get("position_bias") is not None:
        return "a position_bias (a relative position bias, which sdpa adds to its mask)"
    return None


def _mask_options(
    module: Any, query: Tensor, key: Tensor, attention_mask: Any, is_causal: bool | None
) -> dict:
    """attn's options for the layer's mask: an AttnMask's, a dense 4-D mask (bool True = may attend, or float added to
    the scores), or for None sdpa_attention_forward's rule: causal top-left when the layer is causal (is_causal, else
    the module's) and there is more than one query."""
    lq, lk = query.shape[2], key.shape[2]
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return {"causal": True, "align": "top-left"} if causal and lq > 1 else {}
    if isinstance(attention_mask, AttnMask):
        b, _, mask_lq, mask_lk = attention_mask.shape
        if (mask_lq, mask_lk) != (lq, lk) or b not in (1, query.shape[0]):
            raise ValueError(
                f"{_FN}: the mask was made for [B, 1, Lq, Lk] = {attention_mask.shape}, the layer has query "
                f"{tuple(query.shape)} and key {tuple(key.shape)}"
            )
        return attention_mask.options()
    if isinstance(attention_mask, Tensor):
        if attention_mask.dim() != 4:
            raise ValueError(
                f"{_FN}: a tensor attention_mask must be 4-D, broadcastable to [B, Hq, Lq, Lk] = "
                f"{(query.shape[0], query.shape[1], lq, lk)}, got {tuple(attention_mask.shape)}"
            )
        if attention_mask.dtype == torch.bool:
            return {"mask": attention_mask, "mask_type": "keep"}
        if attention_mask.is_floating_point():
            return {"mask": attention_mask.to(query.dtype), "mask_type": "add"}
        raise TypeError(
            f"{_FN}: a tensor attention_mask must be bool (True = may attend) or floating (added), got "
            f"{attention_mask.dtype}"
        )
    raise TypeError(
        f"{_FN}: attention_mask must be None, a tensor or an AttnMask, got {type(attention_mask).__name__}"
    )


def _sdpa_fallback(
    reason: str,
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    extras: dict,
    kwargs: dict,
) -> tuple[Tensor, Tensor | None]:
    """transformers' sdpa_attention_forward for a call attn cannot take (an AttnMask made dense for it). extras:
    dropout, scaling, is_causal, softcap and s_aux as the layer passed them."""
    unsupported = [name for name in ("softcap", "s_aux") if extras[name] is not None]
    if unsupported:
        raise ValueError(
            f"{_FN}: attn cannot run this call ({reason}) and transformers' sdpa, its fallback, has no "
            f"{' or '.join(unsupported)}: use attn_implementation='eager' for it"
        )
    _logger.warning_once(f"{_FN}: falling back to transformers' sdpa for {reason}")
    if isinstance(attention_mask, AttnMask):
        attention_mask = attention_mask.dense(device=query.device)
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and getattr(module, "num_key_value_groups", 1) != groups:
        # (sdpa repeats K/V by the module's num_key_value_groups, which a module outside transformers may lack)
        key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=extras["dropout"],
        scaling=extras["scaling"],
        is_causal=extras["is_causal"],
        **kwargs,
    )


def attention_forward(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: AttnMask | Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention interface for "attn": query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value
    [B, Hkv, Lk, Dv] (Hq % Hkv == 0) -> (out [B, Lq, Hq, Dv] contiguous, weights [B, Hq, Lq, Lk] or None).

    attention_mask: make_mask's AttnMask, a 4-D mask broadcastable to [B, Hq, Lq, Lk] (bool True = may attend, or
    float added to the scores) or None (causal top-left when the layer is causal and Lq > 1, as sdpa). scaling: the
    score scale (None: 1/sqrt(D)); softcap: s = softcap * tanh(s / softcap) after scaling; s_aux: learned sink logits
    [Hq]; dropout: the probability on the weights (transformers passes 0 outside training). kwargs: what the model
    passes besides (output_attentions=True returns the weights, before dropout; sliding_window is carried by the mask
    and not read). Calls attn cannot run go to transformers' sdpa_attention_forward (see the module's docstring).
    """
    _check_shapes(query, key, value)
    reason = _fallback_reason(query, key, value, kwargs)
    if reason is not None:
        extras = {
            "dropout": dropout,
            "scaling": scaling,
            "is_causal": is_causal,
            "softcap": softcap,
            "s_aux": s_aux,
        }
        return _sdpa_fallback(reason, module, query, key, value, attention_mask, extras, kwargs)
    options = _mask_options(module, query, key, attention_mask, is_causal)
    if scaling is not None:
        options["scale"] = float(scaling)
    if softcap is not None:
        options["softcap"] = float(softcap)
    if s_aux is not None:
        if tuple(s_aux.shape) != (query.shape[1],):
            raise ValueError(
                f"{_FN}: s_aux (the sink logits) must be [Hq] = [{query.shape[1]}], got {tuple(s_aux.shape)}"
            )
        options["sinks"] = s_aux
    if dropout:
        options["dropout_p"] = float(dropout)
    weights = None
    if kwargs.get("output_attentions", False):
        out, weights = _attn_torch.attention(query, key, value, return_weights=True, **options)
    else:
        out = _attn_torch.attention(query, key, value, **options)
    return out.transpose(1, 2).contiguous(), weights


def register(name: str = "attn") -> None:
    """Registers attention_forward and make_mask with transformers under `name` (importing this module registers
    "attn"): from_pretrained(..., attn_implementation=name) and model.set_attn_implementation(name) then use them."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, make_mask)


register()
