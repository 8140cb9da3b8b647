"""attn as PyTorch's CPU attention: attn.torch.enable() (and torch.nn.attention.activate_flash_attention_impl("attn"))
gives the operators every CPU call of torch.nn.functional.scaled_dot_product_attention reaches attn's kernels, and
those of torch.nn.attention.varlen.varlen_attn (attn._torch_varlen_provider: packed, paged, windows, seqused_k).

On the CPU, SDPA's fused path is aten::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p,
is_causal, *, attn_mask, scale) -> (output, logsumexp) and its _backward: f32, bf16, f16 and f64 inputs, causal
(top-left, PyTorch's is_causal), masks (a bool mask arrives turned additive), GQA with K/V not expanded, inputs that
require grad (torch's autograd calls the backward operator with the output and logsumexp the forward returned).
enable() registers CPU kernels for both operators with torch's dispatcher (torch.library, the dispatch key CPU);
they run attn._core.attention and attn._core.attention_backward with align='top-left', the mask as mask_type 'add'
(or 'keep' for a bool one) broadcast as torch broadcasts it, and torch's scale. The Library object holds the
registrations: disable() destroys it and torch's own kernels serve the operators again.

Not taken (torch's behaviour is unchanged or the call is refused): dropout_p > 0 never reaches these operators from
scaled_dot_product_attention (torch takes its math path for dropout on the CPU), and a direct call with dropout_p >
0 raises NotImplementedError (the backward operator has no seed to replay attn's dropout pattern); non-CPU tensors
keep their own kernels (the registration is for the CPU key only). The kernels are Python functions registered at
the dispatcher: each call costs a Python call (~10-20 us) beside torch's own C++ kernel; a C++ registration is the
next step (docs/transformers.md, "PyTorch").

The profiler shows each call as the record "attn::attention" (or "attn::attention_backward") inside the aten
operator, while a profiler is on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import _core, _torch_varlen_provider

_FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"
_profiler_enabled = torch.autograd._profiler_enabled


def _options(
    dropout_p: float, is_causal: bool, attn_mask: Tensor | None, scale: float | None, op: str
) -> dict:
    """attn's options for SDPA's arguments: top-left causality, the mask as torch gives it, torch's scale."""
    if dropout_p:
        raise NotImplementedError(
            f"attn.torch provider: aten::{op} with dropout_p={dropout_p} is not taken by attn (its backward has no "
            "seed to replay attn's dropout pattern); scaled_dot_product_attention with dropout runs torch's math "
            "path, which attn leaves alone"
        )
    options: dict[str, Any] = {"align": "top-left"}
    if is_causal:
        options["causal"] = True
    if scale is not None:
        options["scale"] = float(scale)
    if attn_mask is not None:
        options["mask"] = attn_mask
        options["mask_type"] = "keep" if attn_mask.dtype == torch.bool else "add"
    return options


def _forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] -> (output [B, Hq, L, Ev], logsumexp
    [B, Hq, L])."""
    options = _options(dropout_p, is_causal, attn_mask, scale, _FORWARD)
    if _profiler_enabled():
        with torch.profiler.record_function("attn::attention"):
            return _core.attention(query, key, value, return_lse=True, **options)
    return _core.attention(query, key, value, return_lse=True, **options)


def _backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_query, grad_key, grad_value) of _forward's call, from its output and logsumexp."""
    options = _options(dropout_p, is_causal, attn_mask, scale, _BACKWARD)
    if _profiler_enabled():
        with torch.profiler.record_function("attn::attention_backward"):
            grads = _core.attention_backward(grad_out, query, key, value, out, logsumexp, **options)
    else:
        grads = _core.attention_backward(grad_out, query, key, value, out, logsumexp, **options)
    return grads[0], grads[1], grads[2]


class Provider:
    """attn's kernels registered for SDPA's CPU operators while this object is enabled. disable() (or leaving the
    with-block) restores torch's kernels; so does remove(), the name torch's flash-attention registry calls."""

    def __init__(self) -> None:
        self._lib: torch.library.Library | None = torch.library.Library("aten", "IMPL")
        self._lib.impl(_FORWARD, _forward, "CPU")
        self._lib.impl(_BACKWARD, _backward, "CPU")
        # torch.nn.attention.varlen.varlen_attn's operators (aten::_flash_attention_forward / _backward)
        self._varlen = _torch_varlen_provider.enable()

    @property
    def enabled(self) -> bool:
        return self._lib is not None

    def disable(self) -> None:
        """Torch's own kernels again (idempotent)."""
        global _ACTIVE
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
            self._varlen.disable()
        if _ACTIVE is self:
            _ACTIVE = None

    remove = disable  # torch.nn.attention's FlashAttentionHandle protocol

    def __enter__(self) -> Provider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disable()

    def __repr__(self) -> str:
        return f"attn.torch provider ({'enabled' if self.enabled else 'disabled'})"


_ACTIVE: Provider | None = None


def enable() -> Provider:
    """Routes every CPU call of torch.nn.functional.scaled_dot_product_attention that reaches torch's fused CPU operator
    (see this module's docstring) to attn's kernels, forward and backward; returns the handle whose disable() restores
    torch (also a context manager). Enabling twice returns the active handle."""
    global _ACTIVE
    if _ACTIVE is None or not _ACTIVE.enabled:
        _ACTIVE = Provider()
    return _ACTIVE


def register_with_torch() -> None:
    """Makes attn one of torch.nn.attention's flash-attention implementations: activate_flash_attention_impl("attn")
    enables it, restore_flash_attention_impl() disables it. Registering activates nothing."""
    register = getattr(torch.nn.attention, "register_flash_attention_impl", None)
    if register is not None:
        register("attn", register_fn=enable)
