"""The custom ops behind attn.torch: torch.ops.attn.attention and torch.ops.attn.attention_backward (their
implementations over attn._core, fake implementations for shapes, vmap rules, the CPU autocast kernel) and the
autograd Functions that differentiate them. attn.torch's public functions call _apply; importing this module
registers the ops.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from . import _core
from ._torch_options import (
    _OP_OPTIONS,
    _OP_TENSORS,
    _core_options,
    _flatten,
    _op_call,
    _op_flat,
    _schema,
)

_DOUBLE_BACKWARD = (
    "attn.torch: attention has no second derivative: attn's backward is not itself differentiable, so "
    "double backward (create_graph=True followed by a backward through the gradient: gradient penalties, "
    "torch.autograd.functional.hessian, gradgradcheck, torch.func.grad of torch.func.grad) is refused rather than "
    "computed wrongly. Use torch.nn.functional.scaled_dot_product_attention (or a composition in torch) for the part "
    "of the model that needs second derivatives."
)
_FORWARD_AD = (
    "attn.torch: attention has no forward-mode derivative (torch.func.jvp, jacfwd, torch.func.hessian, "
    "torch.autograd.forward_ad); use reverse mode (backward, torch.func.grad, jacrev) or torch's "
    "scaled_dot_product_attention."
)


# torch's checks, looked up once: they run on every call (the fixed cost of a decode step).
_is_compiling = torch.compiler.is_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
_forward_ad = torch.autograd.forward_ad


def _plain(*tensors: Tensor | None) -> bool:
    """Whether the op can run as a plain call to the extension, past torch's dispatcher (which costs ~0.1 ms): eager
    mode, plain CPU tensors, no functorch transform (vmap, grad) and no dispatch mode (FakeTensor, make_fx) active."""
    if _is_compiling() or _dispatch_depth() > 0:
        return False
    for t in tensors:
        if t is not None and (type(t) is not Tensor or _is_functorch_wrapped(t)):
            return False
    return True


def _needs_autograd(*tensors: Tensor | None) -> bool:
    """Whether autograd must see the call: a tensor that requires grad (with grad mode on), or a forward-mode AD
    level open (torch.autograd.forward_ad.dual_level), where a dual tensor's tangent would otherwise be dropped
    without a word instead of refused."""
    if getattr(_forward_ad, "_current_level", -1) >= 0:  # torch's own record of open levels
        return True
    if _is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _no_graph(*tensors: Tensor | None) -> bool:
    """Whether a call needs none of torch's machinery: no autograd (_needs_autograd), no autocast, and _plain
    (eager, plain tensors). Then it runs as one call to the extension (the fixed cost of a decode step)."""
    return not _needs_autograd(*tensors) and not _is_autocast_enabled("cpu") and _plain(*tensors)


# ---- the ops: torch.ops.attn.attention and torch.ops.attn.attention_backward ------------------------------
# (their schemas and flat arguments, from the option table: _torch_options)


def _attention_flat(flat: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """attn._core.attention from the op's flat arguments (q, k, v, the options, return_weights)."""
    return_weights = flat[-1]
    result = _core.attention(
        flat[0],
        flat[1],
        flat[2],
        return_lse=True,
        return_weights=return_weights,
        **_core_options(*flat[3:-1]),
    )
    return result[0], result[1], (result[2] if return_weights else flat[0].new_empty(0))


def _attention_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *tensors: Tensor | None,
    return_weights: bool = False,
    **keywords: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """torch.ops.attn.attention: tensors are the tensor options, keywords the other options (absent: default)."""
    return _attention_flat((q, k, v, *_op_flat(tensors, keywords, return_weights)))


_attention_op = torch.library.custom_op(
    "attn::attention",
    _attention_impl,
    mutates_args=(),
    schema=_schema(("q", "k", "v"), "return_weights", 3),
)


@_attention_op.register_fake
def _(q, k, v, *tensors, return_weights=False, **keywords):
    rows = tuple(q.shape[:-1])  # [..., Hq, Lq]
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    weights = q.new_empty(rows + (k.shape[-2],)) if return_weights else q.new_empty(0)
    return q.new_empty(rows + (v.shape[-1],)), q.new_empty(rows, dtype=lse_dtype), weights


def _attention_backward_flat(flat: tuple) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """attn._core.attention_backward from the op's flat arguments (dout, q, k, v, out, lse, the options,
    mask_grad)."""
    mask_grad = flat[-1]
    grads = _core.attention_backward(*flat[:6], mask_grad=mask_grad, **_core_options(*flat[6:-1]))
    return grads[0], grads[1], grads[2], (grads[3] if mask_grad else flat[1].new_empty(0))


def _attention_backward_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *tensors: Tensor | None,
    mask_grad: bool = False,
    **keywords: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch.ops.attn.attention_backward: tensors are the tensor options, keywords the other options."""
    return _attention_backward_flat(
        (dout, q, k, v, out, lse, *_op_flat(tensors, keywords, mask_grad))
    )


_attention_backward_op = torch.library.custom_op(
    "attn::attention_backward",
    _attention_backward_impl,
    mutates_args=(),
    schema=_schema(("dout", "q", "k", "v", "out", "lse"), "mask_grad", 4),
)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask=None, *tensors, mask_grad=False, **keywords):
    dmask = mask.new_empty(mask.shape) if mask_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dmask


def _loop_vmap(op):
    """A vmap rule that runs op once per index of the vmapped dim and stacks the results: exact for every option
    (each example keeps its own batch indices, so a fixed seed gives every example the same keep-pattern)."""

    def rule(info, in_dims, *args, **keywords):
        results = []
        for i in range(info.batch_size):
            sliced = [a if d is None else a.select(d, i) for a, d in zip(args, in_dims)]
            results.append(op(*sliced, **keywords))
        outputs = tuple(torch.stack([r[n] for r in results]) for n in range(len(results[0])))
        return outputs, (0,) * len(outputs)

    return rule


torch.library.register_vmap(_attention_op, _loop_vmap(_attention_op))
torch.library.register_vmap(_attention_backward_op, _loop_vmap(_attention_backward_op))

# Positions in the flat arguments: q, k, v, then the flattened options (tensors first), then return_weights.
_Q, _K, _V = 0, 1, 2
_MASK, _MASK_TYPE, _SCALE, _SOFTCAP = (
    3 + [n for n, _, _ in _OP_OPTIONS].index(name)
    for name in ("mask", "mask_type", "scale", "softcap")
)
_RETURN_WEIGHTS = 3 + len(_OP_OPTIONS)
_N_INPUTS = _RETURN_WEIGHTS + 1
_N_POSITIONAL = 3 + len(_OP_TENSORS)  # of the forward op
# The autograd Function saves the mask apart from the other options: it comes first among them.
assert _MASK == 3, "attn.torch: the option table must start with mask"


def _autocast_kernel(keyset, *args, **keywords):
    # Direct calls of torch.ops.attn.attention under CPU autocast (TorchScript, users of the op): q, k, v and a
    # float mask take the autocast dtype, as torch's scaled_dot_product_attention does; float64 stays float64.
    # (Inside this kernel torch.is_autocast_enabled reports False: the dispatcher is past the autocast key.)
    with torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    ):
        return _attention_op._opoverload(*_autocast_args(args, True), **keywords)


_lib = torch.library.Library("attn", "FRAGMENT")
_lib.impl("attention", _autocast_kernel, "AutocastCPU", with_keyset=True)


def _autocast_cast(x: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    eligible = (
        x is not None
        and x.is_floating_point()
        and x.device.type == "cpu"
        and x.dtype != torch.float64
    )
    return x.to(dtype) if eligible else x


def _autocast_args(args: tuple, enabled: bool) -> tuple:
    """args of the attention op with q, k, v and the mask cast as CPU autocast casts them (when it is on)."""
    if not enabled:
        return args
    dtype = torch.get_autocast_dtype("cpu")
    args = list(args)
    for n in (_Q, _K, _V, _MASK):
        if n < len(args):  # a call of the op may leave out the mask
            args[n] = _autocast_cast(args[n], dtype)
    return tuple(args)


class _DoubleBackwardError(torch.autograd.Function):
    """Identity on the first-order gradients, tied to every tensor they depend on; differentiating it raises.
    Installed whenever attn's backward runs with grad mode on (create_graph=True), whatever requires grad."""

    generate_vmap_rule = True

    @staticmethod
    def forward(n_grads: int, *tensors: Tensor) -> tuple:
        return tuple(t.clone() for t in tensors[:n_grads])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_DOUBLE_BACKWARD)


def _weights_grad(
    ctx, dweights: Tensor, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor | None
):
    """(dq, dk, d(mask) or None) from the gradient of the returned weights P [..., Hq, Lq, Lk] (before dropout):
    dS = P * (dW - rowsum(dW * P)), then back through the score s = softcap(scale * q.k) (+ alibi + mask)."""
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    p, dw = weights.to(ct), dweights.to(ct)
    ds = p * (dw - (dw * p).sum(-1, keepdim=True))
    dmask = None
    if ctx.mask_grad:
        # s = ... + mask: the mask's gradient is dS, reduced
        dmask = ds.sum_to_size(mask.shape).to(mask.dtype)
    hq, hkv, d = q.shape[-3], k.shape[-3], q.shape[-1]
    groups = hq // hkv if hkv else 1
    qc = q.to(ct)
    kc = k.to(ct).repeat_interleave(groups, dim=-3)  # query head h reads kv head h // groups
    allowed = p != 0
    # A removed key (or a query with no key) never touches a gradient, even when it holds inf or NaN: zero the rows
    # that no weight uses, so that 0 * inf makes no NaN.
    kc = torch.where(allowed.any(-2).unsqueeze(-1) | torch.isfinite(kc), kc, 0)
    qc = torch.where(allowed.any(-1).unsqueeze(-1) | torch.isfinite(qc), qc, 0)
    scale = ctx.scale if ctx.scale is not None else (1.0 / math.sqrt(d) if d > 0 else 1.0)
    if ctx.softcap is not None:
        t = torch.tanh(scale * (qc @ kc.transpose(-1, -2)) / ctx.softcap)  # s = c * tanh(raw / c)
        # d raw = dS * (1 - tanh^2); removed keys stay 0
        ds = torch.where(allowed, ds * (1 - t * t), 0)
    dq = scale * (ds @ kc)
    dk = scale * (ds.transpose(-1, -2) @ qc)
    if groups > 1:  # GQA: a kv head's gradient is the sum over the query heads of its group
        dk = dk.unflatten(-3, (hkv, groups)).sum(-3)
    return dq, dk, dmask


def _backward_grads(ctx, flat: tuple, dweights: Tensor | None, weights: Tensor) -> tuple:
    """(dq, dk, dv, dmask) from dout (flat[0], None when only the weights were used) through the op (or its
    implementation for plain tensors) and from the weights' gradient: the backward's general case, run with grad
    mode and autocast off."""
    dout, q, k, v, mask = flat[0], flat[1], flat[2], flat[3], flat[6]
    if dout is not None:
        plain = _plain(dout, q, k, v, mask)
        dq, dk, dv, dmask = (
            _attention_backward_flat(flat) if plain else _op_call(_attention_backward_op, flat)
        )
    else:  # only the weights were used
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dmask = torch.zeros_like(mask) if ctx.mask_grad else None
    if ctx.return_weights and dweights is not None:
        wq, wk, wmask = _weights_grad(ctx, dweights, q, k, weights, mask)
        dq, dk = (dq + wq).to(q.dtype), (dk + wk).to(k.dtype)
        if ctx.mask_grad:
            dmask = (dmask + wmask).to(mask.dtype)
    return dq, dk, dv, dmask


class _AttentionFunction(torch.autograd.Function):
    """(out, lse, weights) = torch.ops.attn.attention(*op arguments); backward: dq, dk, dv and d(mask) for a float
    mask that requires grad, from dout and from the weights' gradient when they were returned. lse is not
    differentiable. setup_context and backward are also the op's own autograd (torch.library.register_autograd)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        plain = _plain(*(args[n] for n in (_Q, _K, _V, _MASK)))
        return _attention_flat(args) if plain else _op_call(_attention_op, args)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        q, k, v, mask = inputs[_Q], inputs[_K], inputs[_V], inputs[_MASK]
        out, lse, weights = output
        # mask_type ... threads: the non-tensor options on ctx, the tensor ones (alibi slopes, key lengths, block
        # layout, seed) saved.
        ctx.tensor_options = [
            n for n in range(_MASK + 1, _RETURN_WEIGHTS) if isinstance(inputs[n], Tensor)
        ]
        ctx.options = [
            None if n in ctx.tensor_options else inputs[n]
            for n in range(_MASK + 1, _RETURN_WEIGHTS)
        ]
        ctx.scale, ctx.softcap = inputs[_SCALE], inputs[_SOFTCAP]
        ctx.return_weights = inputs[_RETURN_WEIGHTS]
        ctx.mask_grad = mask is not None and mask.requires_grad and inputs[_MASK_TYPE] == "add"
        ctx.save_for_backward(
            q, k, v, mask, out, lse, weights, *(inputs[n] for n in ctx.tensor_options)
        )
        ctx.mark_non_differentiable(lse)
        if not ctx.return_weights:
            ctx.mark_non_differentiable(weights)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, dout, _dlse, dweights):
        q, k, v, mask, out, lse, weights, *tensor_options = ctx.saved_tensors
        options = list(ctx.options)
        for n, t in zip(ctx.tensor_options, tensor_options):
            options[n - _MASK - 1] = t
        flat = (dout, q, k, v, out, lse, mask, *options, ctx.mask_grad)
        if (
            dout is not None
            and _plain(dout, q, k, v, mask)
            and not (ctx.return_weights and dweights is not None)
        ):
            # One call to the extension: no torch op runs, so grad mode and autocast have nothing to act on (setting
            # them costs ~17 us of a small call).
            dq, dk, dv, dmask = _attention_backward_flat(flat)
        else:
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                dq, dk, dv, dmask = _backward_grads(ctx, flat, dweights, weights)
        grads = [dq, dk, dv] + ([dmask] if ctx.mask_grad else [])
        if torch.is_grad_enabled():
            # create_graph=True: these gradients are exact but not differentiable; tie them to what they depend on
            # so that any backward through them raises instead of silently dropping the second-order term.
            deps = [
                t for t in (q, k, v, mask, out, dout, dweights) if t is not None and t.requires_grad
            ]
            if deps:
                grads = list(_DoubleBackwardError.apply(len(grads), *grads, *deps))
        if not ctx.mask_grad:
            grads.append(None)
        return (*grads, *([None] * (_N_INPUTS - 4)))


class _AttentionFunctionEager(_AttentionFunction):
    """_AttentionFunction with a jvp that says forward-mode AD is not supported (torch's default message names
    neither attn nor a way out)."""

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(_FORWARD_AD)


class _AttentionFunctionPlain(torch.autograd.Function):
    """_AttentionFunction for the common call: eager, plain CPU tensors, no functorch transform or dispatch mode
    (_plain). The same forward, context and backward, in the ctx-first form: with a setup_context, torch's
    Function.apply binds every call's arguments through inspect.signature (~0.12 ms of a small call, a sixth of a
    small forward + backward), which this form skips. Transforms (vmap, torch.func) need the setup_context form:
    they get _AttentionFunctionEager."""

    @staticmethod
    def forward(ctx, *args):
        output = _attention_flat(args)
        _AttentionFunction.setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse, dweights):
        return _AttentionFunction.backward(ctx, dout, dlse, dweights)

    jvp = _AttentionFunctionEager.jvp


def _op_setup_context(ctx, inputs, keyword_only_inputs, output) -> None:
    """setup_context of the op's own autograd: inputs are its positional arguments, keyword_only_inputs the rest
    (both with their defaults)."""
    flat = _op_flat(
        inputs[_MASK:], keyword_only_inputs, keyword_only_inputs.get("return_weights", False)
    )
    _AttentionFunction.setup_context(ctx, (*inputs[:_MASK], *flat), output)


def _op_backward(ctx, dout, dlse, dweights):
    """backward of the op's own autograd: one gradient per positional argument."""
    return _AttentionFunction.backward(ctx, dout, dlse, dweights)[:_N_POSITIONAL]


torch.library.register_autograd(_attention_op, _op_backward, setup_context=_op_setup_context)


def _apply(
    q: Tensor, k: Tensor, v: Tensor, fn: str, return_weights: bool = False, **options: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """Validates and flattens attn.attention's options, applies CPU autocast, runs the op with autograd ->
    (out [..., Hq, Lq, Dv], lse [..., Hq, Lq], weights [..., Hq, Lq, Lk] or [0] without return_weights)."""
    args = (q, k, v, *_flatten(options, fn), bool(return_weights))
    args = _autocast_args(args, torch.is_autocast_enabled("cpu"))
    # dynamo traces no custom jvp; forward-mode AD is eager-only anyway
    if torch.compiler.is_compiling():
        return _AttentionFunction.apply(*args)
    plain = _plain(*args[_Q : _MASK + 1])
    if plain and not _needs_autograd(*args[_Q : _MASK + 1]):
        return _attention_flat(args)
    return (_AttentionFunctionPlain if plain else _AttentionFunctionEager).apply(*args)
