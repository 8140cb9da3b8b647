"""attn.nn's thread modes seen from Python: the gradient mode (attn::nn::NoGradGuard: no_grad, set_grad_enabled,
is_grad_enabled) and mixed precision (attn::nn::Autocast: autocast, is_autocast_enabled)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from . import _core

_nn = _core.nn


def is_grad_enabled() -> bool:
    """Whether attn.nn forwards on this thread keep what backward() needs (True unless turned off)."""
    return _nn.is_grad_enabled()


def set_grad_enabled(mode: bool) -> None:
    """Turns gradient mode on or off for this thread (see no_grad)."""
    _nn.set_grad_enabled(bool(mode))


class no_grad:
    """Inference without gradients, as torch.no_grad, for attn.nn modules: inside a `with attn.nn.no_grad():`
    block, or a function decorated with `@attn.nn.no_grad()`, forwards keep nothing for backward(): each module
    drops its activations as its forward returns, so a stack of layers holds one layer's at a time instead of
    all of them, and backward() then raises. Outputs are the same bits. Per thread, as torch's; dropout still
    follows train() / eval(). torch.no_grad() itself does not reach attn.nn (attn.nn has no autograd)."""

    def __init__(self) -> None:
        self._prev: list = []

    def __enter__(self) -> None:
        self._prev.append(_nn.is_grad_enabled())
        _nn.set_grad_enabled(False)

    def __exit__(self, *exc: Any) -> bool:
        _nn.set_grad_enabled(self._prev.pop())
        return False

    def __call__(self, fn):
        if inspect.isgeneratorfunction(fn):
            return _generator_without_grad(fn)

        @functools.wraps(fn)
        def without_grad(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        return without_grad


def _generator_without_grad(fn):
    """A generator function whose body runs under no_grad at every resumption (as torch.no_grad decorates one), while
    the caller's code between two items keeps its own mode."""

    @functools.wraps(fn)
    def without_grad(*args, **kwargs):
        gen = fn(*args, **kwargs)
        try:
            with no_grad():
                item = gen.send(None)
            while True:
                try:
                    sent = yield item
                except GeneratorExit:
                    with no_grad():
                        gen.close()
                    raise
                except BaseException as e:  # thrown into this generator: into fn's body
                    with no_grad():
                        item = gen.throw(e)
                else:
                    with no_grad():
                        item = gen.send(sent)
        except StopIteration as stop:
            return stop.value

    return without_grad


def is_autocast_enabled() -> bool:
    """Whether attn.nn forwards on this thread run under autocast (see autocast)."""
    return _nn.is_autocast_enabled()


_BF16_NAMES = ("bfloat16", "bf16", "torch.bfloat16")


class autocast:
    """Mixed precision for attn.nn, as torch.autocast(device_type="cpu", dtype=torch.bfloat16): inside a
    `with attn.nn.autocast():` block (or a function decorated with `@attn.nn.autocast()`), float32 modules compute
    as their bfloat16 versions do -- products on bfloat16 copies of the weights with float32 accumulation, LayerNorm
    and softmax statistics in float32, outputs bfloat16 -- while parameters, gradients and optimizer state stay
    float32 (master weights). backward() (called inside the block or after it, as torch's) follows what the forward
    did: its products run in bfloat16 too, parameter gradients accumulate in float32, each input's gradient comes
    back in that input's dtype. Linear, LayerNorm, FeedForward, MultiheadAttention (softmax attention without a
    position scheme; the others stay float32, as torch keeps ops off its autocast list in float32) and the
    Transformer layers take part; Embedding, Dropout and the activations keep their input's dtype. Per thread, as
    torch's; torch.autocast itself does not reach attn.nn. Only dtype bfloat16 is supported."""

    def __init__(self, dtype: Any = "bfloat16", enabled: bool = True) -> None:
        if str(dtype) not in _BF16_NAMES and getattr(dtype, "__name__", None) != "bfloat16":
            raise ValueError(f"attn.nn.autocast: dtype must be bfloat16, got {dtype!r}")
        self._enabled = bool(enabled)
        self._prev: list = []

    def __enter__(self) -> None:
        self._prev.append(_nn.is_autocast_enabled())
        _nn.set_autocast_enabled(self._enabled)

    def __exit__(self, *exc: Any) -> bool:
        _nn.set_autocast_enabled(self._prev.pop())
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def autocasted(*args, **kwargs):
            with autocast(enabled=self._enabled):
                return fn(*args, **kwargs)

        return autocasted
