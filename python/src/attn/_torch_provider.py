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
keep their own kernels (the registration is for the CPU key only). The kernels are C++ functions registered
with the dispatcher (attn._torch_kernels, python/csrc_torch/sdpa_kernels.cc, built against the installed torch),
or, where that library was not built or does not load into this torch, Python functions (a Python call more per
call).

The profiler shows each call as the record "attn::attention" (or "attn::attention_backward") inside the aten
operator, while a profiler is on.
"""

from __future__ import annotations

import warnings
from pathlib import Path
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


_CPP_LIBRARY = Path(__file__).with_name("_torch_kernels.so")
_cpp_loaded: bool | None = None  # None: not tried yet


def cpp_kernels_available() -> bool:
    """Whether attn._torch_kernels (the C++ registration, built when PyTorch was importable at build time) loads into
    this torch; a library built against another torch fails to load, and the Python kernels serve instead."""
    global _cpp_loaded
    if _cpp_loaded is None:
        _cpp_loaded = False
        if _CPP_LIBRARY.exists():
            try:
                torch.ops.load_library(str(_CPP_LIBRARY))
                _cpp_loaded = True
            except (OSError, RuntimeError) as e:
                warnings.warn(
                    f"attn.torch: {_CPP_LIBRARY.name} does not load into this torch ({e}); attn.torch.enable() "
                    "registers Python kernels instead (rebuild attn against this torch for the C++ ones)",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _cpp_loaded


class Provider:
    """attn's kernels registered for SDPA's CPU operators while this object is enabled: the C++ ones of
    attn._torch_kernels when they load (kernels == "C++"), else Python functions (kernels == "Python"). disable() (or
    leaving the with-block) restores torch's kernels; so does remove(), the name torch's flash-attention registry
    calls."""

    def __init__(self, kernels: str = "auto") -> None:
        if kernels not in ("auto", "C++", "Python"):
            raise ValueError(
                f"attn.torch.enable: kernels must be 'auto', 'C++' or 'Python', got {kernels!r}"
            )
        use_cpp = kernels != "Python" and cpp_kernels_available()
        if kernels == "C++" and not use_cpp:
            raise RuntimeError(
                f"attn.torch.enable: kernels='C++' but {_CPP_LIBRARY.name} is not built or not loaded"
            )
        self.kernels = "C++" if use_cpp else "Python"
        self._lib: torch.library.Library | None = None
        if use_cpp:
            torch.ops.attn_kernels.enable()
        else:
            self._lib = torch.library.Library("aten", "IMPL")
            self._lib.impl(_FORWARD, _forward, "CPU")
            self._lib.impl(_BACKWARD, _backward, "CPU")
        self._enabled = True
        # torch.nn.attention.varlen.varlen_attn's operators (aten::_flash_attention_forward / _backward)
        self._varlen = _torch_varlen_provider.enable()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def disable(self) -> None:
        """Torch's own kernels again (idempotent)."""
        global _ACTIVE
        if self._enabled:
            if self._lib is not None:
                self._lib._destroy()
                self._lib = None
            else:
                torch.ops.attn_kernels.disable()
            self._varlen.disable()
            self._enabled = False
        if _ACTIVE is self:
            _ACTIVE = None

    remove = disable  # torch.nn.attention's FlashAttentionHandle protocol

    def __enter__(self) -> Provider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disable()

    def __repr__(self) -> str:
        return f"attn.torch provider ({self.kernels} kernels, {'enabled' if self.enabled else 'disabled'})"


_ACTIVE: Provider | None = None


def enable(kernels: str = "auto") -> Provider:
    """Routes every CPU call of torch.nn.functional.scaled_dot_product_attention that reaches torch's fused CPU operator
    (see this module's docstring), and of torch.nn.attention.varlen.varlen_attn, to attn's kernels, forward and
    backward; returns the handle whose disable() restores torch (also a context manager). kernels: 'auto' (the C++
    registration when attn._torch_kernels loads, else Python), 'C++' or 'Python'. Enabling again while enabled returns
    the active handle."""
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE.enabled:
        if kernels not in ("auto", _ACTIVE.kernels):
            raise RuntimeError(
                f"attn.torch.enable: enabled with {_ACTIVE.kernels} kernels; disable() first"
            )
        return _ACTIVE
    _ACTIVE = Provider(kernels)
    return _ACTIVE


def register_with_torch() -> None:
    """Makes attn one of torch.nn.attention's flash-attention implementations: activate_flash_attention_impl("attn")
    enables it, restore_flash_attention_impl() disables it. Registering activates nothing."""
    register = getattr(torch.nn.attention, "register_flash_attention_impl", None)
    if register is not None:
        register("attn", register_fn=lambda: enable())
