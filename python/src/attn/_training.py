"""attn.nn's training half: optimizers, clipping, the warm-up + cosine schedule and cross-entropy, with PyTorch's
names, over attn::nn's C++ (include/attn/nn/training.h). attn.nn re-exports everything here.

No autograd: the gradients an optimizer reads are those of each module's last backward() (which zeroes the module's
gradients first), so one step is

    out = model(x)
    loss, dlogits = attn.nn.cross_entropy(out, target)
    model.backward(dlogits)
    attn.nn.clip_grad_norm_(model.parameters(), 1.0)   # optional
    opt.step()
    sched.step()                                        # optional
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core

_nn = _core.nn


def _parameters(params: Any, fn: str) -> Any:
    """One _core.nn.ParameterList from module.parameters(), a sum of them, or an iterable of them (list(...),
    itertools.chain(...))."""
    if isinstance(params, _nn.ParameterList):
        return params
    what = type(params).__name__
    try:
        items = list(params)
    except TypeError:
        items = None
    if items is None or not all(isinstance(p, _nn.ParameterList) for p in items):
        bad = (
            what
            if items is None
            else next(type(p).__name__ for p in items if not isinstance(p, _nn.ParameterList))
        )
        raise TypeError(
            f"{fn}: params must be the parameters() of attn.nn modules (or a list or sum of them), "
            f"got {bad}"
        )
    return _nn.ParameterList.concat(items)


def _real(
    value: Any,
    name: str,
    fn: str,
    low: float = 0.0,
    high: float = math.inf,
    closed_high: bool = True,
) -> float:
    """value as a float in [low, high] (or [low, high) when not closed_high), else TypeError / ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__}")
    x = float(value)
    if not (low <= x and (x <= high if closed_high else x < high)):
        interval = (
            f"[{low:g}, {high:g}{']' if closed_high else ')'}"
            if high != math.inf
            else f">= {low:g}"
        )
        raise ValueError(
            f"{fn}: {name} must be {'in ' if high != math.inf else ''}{interval}, got {value!r}"
        )
    return x


class _Optimizer:
    """What SGD and AdamW share: step(), zero_grad(), the lr property, state_dict() / load_state_dict()."""

    _o: Any
    _fn: str

    def step(self, closure: Any = None) -> Any:
        """Updates the parameters in place from their gradients (each module's last backward). closure, as
        torch's: called first (it runs forward and backward), its result returned."""
        loss = closure() if closure is not None else None
        self._o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradients (attn's are arrays, never None; backward() zeroes its module's anyway)."""
        self._o.zero_grad()

    @property
    def lr(self) -> float:
        return self._o.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._o.lr = _real(value, "lr", self._fn)

    def state_dict(self) -> dict:
        """{"state": {name: NumPy array}, "lr": float}: copies (later steps leave them alone; torch returns
        references). State names: '<param>.momentum_buffer' (SGD with momentum, after its first step), 'step' and
        '<param>.exp_avg' / '<param>.exp_avg_sq' (AdamW). Resuming from it continues bitwise."""
        return {"state": self._o.state_dict(), "lr": self.lr}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a state_dict() (arrays or tensors); a missing name or a wrong shape raises ValueError and
        changes nothing."""
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"state", "lr"}:
            raise ValueError(
                f"{self._fn}.load_state_dict: state_dict must be a dict with the keys 'state' and 'lr' "
                f"(what state_dict() returns), got "
                f"{sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__}"
            )
        lr = _real(state_dict["lr"], "lr", self._fn)
        state = state_dict["state"]
        if not isinstance(state, Mapping):
            raise TypeError(
                f"{self._fn}.load_state_dict: state_dict['state'] must be a dict, "
                f"got {type(state).__name__}"
            )
        self._o.load_state_dict(
            {str(k): (v.detach() if hasattr(v, "detach") else v) for k, v in state.items()}
        )
        self._o.lr = lr


class SGD(_Optimizer):
    """torch.optim.SGD over attn::nn::SGD (one parameter group):
    g = grad + weight_decay * p; with momentum, b = g on the first step, then momentum * b + (1 - dampening) * g,
    and g = g + momentum * b (nesterov) or b; p -= lr * g. Computed in double, stored in the parameters' dtype.

    SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False)
    params: module.parameters() of attn.nn modules, a sum or a list of them (parameter names must differ: use
    parameters(prefix=...) for two modules with the same names).
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
    ):
        self._fn = "attn.nn.SGD"
        lr = _real(lr, "lr", self._fn)
        momentum = _real(momentum, "momentum", self._fn)
        dampening = _real(dampening, "dampening", self._fn, -math.inf)
        weight_decay = _real(weight_decay, "weight_decay", self._fn)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"{self._fn}: nesterov needs momentum > 0 and dampening 0, got momentum {momentum}, "
                f"dampening {dampening}"
            )
        self._params = _parameters(params, self._fn)
        if len(self._params) == 0:
            raise ValueError(f"{self._fn}: params is an empty parameter list")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = (
            momentum,
            dampening,
            weight_decay,
            nesterov,
        )
        self._o = _nn.SGD(self._params, lr, momentum, dampening, weight_decay, bool(nesterov))


class AdamW(_Optimizer):
    """torch.optim.AdamW over attn::nn::AdamW (one parameter group, amsgrad off):
    p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
    p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps). Computed in double, stored in the
    parameters' dtype; weight decay applies to every parameter given (biases and norms included, as torch).

    AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2); params as SGD's.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        self._fn = "attn.nn.AdamW"
        lr = _real(lr, "lr", self._fn)
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise TypeError(
                f"{self._fn}: betas must be a pair (beta1, beta2), got {betas!r}"
            ) from None
        beta1 = _real(beta1, "betas[0]", self._fn, 0.0, 1.0, closed_high=False)
        beta2 = _real(beta2, "betas[1]", self._fn, 0.0, 1.0, closed_high=False)
        eps = _real(eps, "eps", self._fn)
        if eps == 0:
            raise ValueError(f"{self._fn}: eps must be > 0, got {eps!r}")
        weight_decay = _real(weight_decay, "weight_decay", self._fn)
        self._params = _parameters(params, self._fn)
        if len(self._params) == 0:
            raise ValueError(f"{self._fn}: params is an empty parameter list")
        self.betas, self.eps, self.weight_decay = (beta1, beta2), eps, weight_decay
        self._o = _nn.AdamW(self._params, lr, beta1, beta2, eps, weight_decay)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0) -> float:
    """torch.nn.utils.clip_grad_norm_: the global L2 norm of the gradients (computed in double); when it exceeds
    max_norm, every gradient is scaled in place by max_norm / (norm + 1e-6). Returns the norm before clipping
    (a float; torch returns a tensor). parameters as SGD's params; only norm_type 2; max_norm > 0. A NaN
    norm (a NaN gradient) is returned and the gradients are left as they are (torch scales them all to NaN):
    check the norm before stepping."""
    fn = "attn.nn.clip_grad_norm_"
    params = _parameters(parameters, fn)
    if norm_type != 2 and norm_type != 2.0:
        raise ValueError(f"{fn}: only norm_type 2 is supported, got {norm_type!r}")
    max_norm = _real(max_norm, "max_norm", fn)
    if max_norm == 0:
        raise ValueError(f"{fn}: max_norm must be > 0, got {max_norm!r}")
    return _nn.clip_grad_norm(params, max_norm)


class WarmupCosine:
    """A learning-rate schedule with torch's LR-scheduler protocol: linear warm-up, then a cosine decay.

    WarmupCosine(optimizer, warmup_steps, total_steps, min_lr=0.0)
    With base_lr the optimizer's lr when the schedule is made and s the schedule's step (last_epoch, from 0),
    and t = (s - warmup_steps) / max(1, total_steps - warmup_steps) the fraction of the decay done:
        lr(s) = base_lr * (s + 1) / warmup_steps                          s < warmup_steps
              = min_lr + (base_lr - min_lr) * (1 + cos(pi * t)) / 2      warmup_steps <= s < total_steps
              = min_lr                                                    s >= total_steps
    As torch's schedulers, the constructor sets the optimizer's lr to lr(0) and each step() (after opt.step())
    advances s and sets lr(s); get_last_lr() -> [lr].
    """

    def __init__(self, optimizer: Any, warmup_steps: int, total_steps: int, min_lr: float = 0.0):
        fn = "attn.nn.WarmupCosine"
        if not isinstance(optimizer, _Optimizer):
            raise TypeError(
                f"{fn}: optimizer must be an attn.nn optimizer (SGD, AdamW), got "
                f"{type(optimizer).__name__}"
            )
        for name, value in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__}")
        if warmup_steps < 0 or total_steps < 1 or total_steps < warmup_steps:
            raise ValueError(
                f"{fn}: need 0 <= warmup_steps <= total_steps and total_steps >= 1, got warmup_steps "
                f"{warmup_steps}, total_steps {total_steps}"
            )
        self.optimizer = optimizer
        self.base_lr = optimizer.lr
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.min_lr = _real(min_lr, "min_lr", fn)
        self.last_epoch = 0
        optimizer.lr = self._lr(0)

    def _lr(self, step: int) -> float:
        return _nn.warmup_cosine(
            self.base_lr, self.warmup_steps, self.total_steps, self.min_lr, step
        )

    def step(self) -> None:
        self.last_epoch += 1
        self.optimizer.lr = self._lr(self.last_epoch)

    def get_last_lr(self) -> list:
        return [self.optimizer.lr]

    def state_dict(self) -> dict:
        return {
            "base_lr": self.base_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr": self.min_lr,
            "last_epoch": self.last_epoch,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores state_dict()'s values (the optimizer's lr comes back with the optimizer's own state dict)."""
        keys = set(self.state_dict())
        if not isinstance(state_dict, Mapping) or set(state_dict) != keys:
            raise ValueError(
                f"attn.nn.WarmupCosine.load_state_dict: state_dict must have the keys {sorted(keys)}"
            )
        for k in keys:
            setattr(self, k, state_dict[k])


def _moveaxis(x: Any, source: int, destination: int) -> Any:
    return (
        x.movedim(source, destination)
        if hasattr(x, "movedim")
        else np.moveaxis(x, source, destination)
    )


def cross_entropy(
    logits: Any, targets: Any, *, ignore_index: int = -100, label_smoothing: float = 0.0
) -> tuple:
    """torch.nn.functional.cross_entropy(logits, targets, ignore_index=..., label_smoothing=..., reduction='mean')
    with class-index targets, and its gradient: returns (loss, dlogits).

    logits [N, C], [C] or [N, C, d1, ...] (classes in dim 1, as torch); targets int32/int64 [N], [] or
    [N, d1, ...]. loss (a float) = mean over the rows whose target != ignore_index of
    (1 - label_smoothing) * (-log p[target]) + label_smoothing / C * sum_c (-log p[c]); 0.0 with dlogits all zero
    when every row is ignored (torch: nan). dlogits = d(loss)/d(logits), logits' shape, float64 for float64 logits
    else float32; a torch tensor when logits is one. Pass it to the model's backward().
    """
    fn = "attn.nn.cross_entropy"
    if not hasattr(logits, "ndim"):
        logits = np.asarray(logits)
    if not hasattr(targets, "ndim"):
        targets = np.asarray(targets)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{fn}: ignore_index must be an int, got {type(ignore_index).__name__}")
    label_smoothing = _real(label_smoothing, "label_smoothing", fn, 0.0, 1.0)
    if logits.ndim == 0:
        raise ValueError(f"{fn}: logits must be [N, C], [C] or [N, C, d1, ...], got a scalar")
    moved = logits.ndim >= 3
    if moved:
        logits = _moveaxis(logits, 1, -1)
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"{fn}: targets must have shape {tuple(logits.shape[:-1])} (logits' without the class dim), "
            f"got {tuple(targets.shape)}"
        )
    kind = str(targets.dtype)
    if "int" not in kind:
        raise TypeError(
            f"{fn}: targets must be class indices (an int32 or int64 array), got dtype {targets.dtype}"
        )
    loss, _count, dlogits = _nn.cross_entropy(logits, targets, int(ignore_index), label_smoothing)
    if moved:
        dlogits = _moveaxis(dlogits, -1, 1)
    return loss, dlogits
