"""The custom ops behind attn.torch: torch.ops.attn.attention and torch.ops.attn.attention_backward (their
implementations over attn._core, fake implementations for shapes, vmap rules, the CPU autocast kernel) and the
autograd Functions that differentiate them. attn.torch's public functions call _apply; importing this module
registers the ops.
"""

from __future__ import annotations

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
_tracing_state = torch._C._get_tracing_state
_dispatch_depth = torch._C._len_torch_dispatch_stack
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_grad_enabled = torch.is_grad_enabled
_is_autocast_enabled = torch.is_autocast_enabled
_forward_ad = torch.autograd.forward_ad


def _plain(*tensors: Tensor | None) -> bool:
    """Whether the op can run as a plain call to the extension, past torch's dispatcher (which costs ~0.1 ms): eager
    mode, plain CPU tensors, no functorch transform (vmap, grad) and no dispatch mode (FakeTensor, make_fx) active."""
    if _is_compiling() or _dispatch_depth() > 0 or _tracing_state() is not None:
        return False  # torch.jit.trace records ops: a plain call would be kept as a constant
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


# dweights' position in the backward op's flat arguments: after dout, q, k, v, out, lse and the tensor options.
_DWEIGHTS = 6 + len(_OP_TENSORS)


# The sinks' position among the forward's flat inputs (q, k, v, the options in the op's order, return_weights) and in
# the backward op's (dout, q, k, v, out, lse, the tensor options, ...).
_SINKS = 3 + [n for n, _, _ in _OP_OPTIONS].index("sinks")
_BACKWARD_SINKS = _SINKS + 3


def _attention_backward_flat(flat: tuple) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """attn._core.attention_backward from the op's flat arguments (dout, q, k, v, out, lse, the tensor options,
    dweights or None, the other options, mask_grad): dq, dk, dv, dmask (empty unless mask_grad) and dsinks (empty
    without sinks)."""
    mask_grad, dweights = flat[-1], flat[_DWEIGHTS]
    options = _core_options(*flat[6:_DWEIGHTS], *flat[_DWEIGHTS + 1 : -1])
    if dweights is not None:  # the weights' gradient, folded into dq, dk and dmask by the extension
        options["dweights"] = dweights
    grads = list(_core.attention_backward(*flat[:6], mask_grad=mask_grad, **options))
    # (two empties: an op's outputs must not alias each other)
    dmask = grads.pop(3) if mask_grad else flat[1].new_empty(0)
    dsinks = grads.pop(3) if flat[_BACKWARD_SINKS] is not None else flat[1].new_empty(0)
    return grads[0], grads[1], grads[2], dmask, dsinks


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
    """torch.ops.attn.attention_backward: tensors are the tensor options then dweights (the returned weights'
    gradient, None: unused), keywords the other options."""
    flat = _op_flat(tensors, keywords, mask_grad, len(_OP_TENSORS) + 1)
    return _attention_backward_flat((dout, q, k, v, out, lse, *flat))


_attention_backward_op = torch.library.custom_op(
    "attn::attention_backward",
    _attention_backward_impl,
    mutates_args=(),
    schema=_schema(("dout", "q", "k", "v", "out", "lse"), "mask_grad", 5, ("dweights",)),
)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask=None, *tensors, mask_grad=False, **keywords):
    dmask = mask.new_empty(mask.shape) if mask_grad else q.new_empty(0)
    sinks = tensors[_BACKWARD_SINKS - 7] if len(tensors) > _BACKWARD_SINKS - 7 else None
    dsinks = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dmask, dsinks


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
_MASK, _MASK_TYPE = (
    3 + [n for n, _, _ in _OP_OPTIONS].index(name) for name in ("mask", "mask_type")
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


class _AttentionFunction(torch.autograd.Function):
    """(out, lse, weights) = torch.ops.attn.attention(*op arguments); backward: dq, dk, dv and d(mask) for a float
    mask that requires grad, from dout and from the weights' gradient when they were returned (both through
    torch.ops.attn.attention_backward, which folds the weights' part in). lse is not differentiable. setup_context and
    backward are also the op's own autograd (torch.library.register_autograd)."""

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
        ctx.return_weights = inputs[_RETURN_WEIGHTS]
        ctx.mask_grad = mask is not None and mask.requires_grad and inputs[_MASK_TYPE] == "add"
        # (not the weights: the backward recomputes them from lse)
        ctx.save_for_backward(q, k, v, mask, out, lse, *(inputs[n] for n in ctx.tensor_options))
        ctx.mark_non_differentiable(lse)
        if not ctx.return_weights:
            ctx.mark_non_differentiable(weights)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, dout, _dlse, dweights):
        q, k, v, mask, out, lse, *tensor_options = ctx.saved_tensors
        options = list(ctx.options)
        for n, t in zip(ctx.tensor_options, tensor_options):
            options[n - _MASK - 1] = t
        if not ctx.return_weights:
            dweights = None
        if dout is None:  # only the weights were used: out's gradient is zero
            dout = torch.zeros_like(out)
        n = len(_OP_TENSORS) - 1  # the tensor options after the mask, then dweights
        flat = (dout, q, k, v, out, lse, mask, *options[:n], dweights, *options[n:], ctx.mask_grad)
        if _plain(dout, q, k, v, mask, dweights):
            # One call to the extension: no torch op runs, so grad mode and autocast have nothing to act on (setting
            # them costs ~17 us of a small call).
            dq, dk, dv, dmask, dsinks = _attention_backward_flat(flat)
        else:
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                dq, dk, dv, dmask, dsinks = _op_call(_attention_backward_op, flat)
        sinks = options[_SINKS - _MASK - 1]
        sinks_grad = sinks is not None and sinks.requires_grad
        grads = [dq, dk, dv] + ([dmask] if ctx.mask_grad else []) + ([dsinks] if sinks_grad else [])
        if torch.is_grad_enabled():
            # create_graph=True: these gradients are exact but not differentiable; tie them to what they depend on
            # so that any backward through them raises instead of silently dropping the second-order term.
            deps = [
                t for t in (q, k, v, mask, out, dout, dweights) if t is not None and t.requires_grad
            ]
            if deps:
                grads = list(_DoubleBackwardError.apply(len(grads), *grads, *deps))
        result = [*grads[:3], grads[3] if ctx.mask_grad else None] + [None] * (_N_INPUTS - 4)
        if sinks_grad:
            result[_SINKS] = grads[-1]
        return tuple(result)


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
    # the sinks too: when only they require grad (training the sinks alone), autograd must still see the call
    inputs = (*args[_Q : _MASK + 1], args[_SINKS])
    plain = _plain(*inputs)
    if plain and not _needs_autograd(*inputs):
        return _attention_flat(args)
    return (_AttentionFunctionPlain if plain else _AttentionFunctionEager).apply(*args)
