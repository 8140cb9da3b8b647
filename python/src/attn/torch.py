"""attn for PyTorch: attention as torch.library custom ops with autograd, and a drop-in torch.nn.MultiheadAttention.

    attn.torch.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                            is_causal=False, scale=None, enable_gqa=False)
    attn.torch.attention(q, k, v, *, mask=None, mask_type='keep', causal=False, ...)   (attn.attention's options)
    attn.torch.MultiheadAttention(embed_dim, num_heads, ...)   (torch.nn.MultiheadAttention's arguments)

Gradients flow to q, k, v, to a float mask (mask_type='add', or a float attn_mask) and from the returned attention
weights, computed by attn's backward (pure Python over the extension: no build against PyTorch). Tensors must be on
the CPU.

The computation is two custom ops, torch.ops.attn.attention and torch.ops.attn.attention_backward (schemas with
typed, flattened options, keyword-only but for the tensors; fake implementations for shapes; vmap rules), so
torch.compile(fullgraph=True) sees one op per direction, torch.vmap and torch.func.grad work, and TorchScript can call
torch.ops.attn.attention(q, k, v, causal=True, ...) directly.
Under CPU autocast, q, k, v and a float mask are cast to the autocast dtype (float64 stays float64), as torch does
for scaled_dot_product_attention. Second derivatives (double backward, hessians, gradgradcheck) and forward-mode AD
raise a RuntimeError that names attn: attn's backward is not itself differentiable.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from typing import Any, Optional

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # attn itself works without torch; only this module needs it
    raise ImportError(f"attn.torch needs PyTorch (pip install torch): {e}") from e
from torch import Tensor

from . import _core, _sdpa
from ._torch_options import _OP_OPTIONS, _OP_TENSORS, _core_options, _flatten, _op_call, _op_flat, _schema

__all__ = ["MultiheadAttention", "attention", "scaled_dot_product_attention"]

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


def _plain(*tensors: Optional[Tensor]) -> bool:
    """Whether the op can run as a plain call to the extension, past torch's dispatcher (which costs ~0.1 ms): eager
    mode, plain CPU tensors, no functorch transform (vmap, grad) and no dispatch mode (FakeTensor, make_fx) active."""
    if _is_compiling() or _dispatch_depth() > 0:
        return False
    for t in tensors:
        if t is not None and (type(t) is not Tensor or _is_functorch_wrapped(t)):
            return False
    return True


def _needs_autograd(*tensors: Optional[Tensor]) -> bool:
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


def _no_graph(*tensors: Optional[Tensor]) -> bool:
    """Whether a call needs none of torch's machinery: no autograd (_needs_autograd), no autocast, and _plain
    (eager, plain tensors). Then it runs as one call to the extension (the fixed cost of a decode step)."""
    return not _needs_autograd(*tensors) and not _is_autocast_enabled("cpu") and _plain(*tensors)


# ---- the ops: torch.ops.attn.attention and torch.ops.attn.attention_backward ------------------------------
# (their schemas and flat arguments, from the option table: _torch_options)

def _attention_flat(flat: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """attn._core.attention from the op's flat arguments (q, k, v, the options, return_weights)."""
    return_weights = flat[-1]
    result = _core.attention(flat[0], flat[1], flat[2], return_lse=True, return_weights=return_weights,
                             **_core_options(*flat[3:-1]))
    return result[0], result[1], (result[2] if return_weights else flat[0].new_empty(0))


def _attention_impl(q: Tensor, k: Tensor, v: Tensor, *tensors: Optional[Tensor], return_weights: bool = False,
                    **keywords: Any) -> tuple[Tensor, Tensor, Tensor]:
    """torch.ops.attn.attention: tensors are the tensor options, keywords the other options (absent: default)."""
    return _attention_flat((q, k, v, *_op_flat(tensors, keywords, return_weights)))


_attention_op = torch.library.custom_op("attn::attention", _attention_impl, mutates_args=(),
                                        schema=_schema(("q", "k", "v"), "return_weights", 3))


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


def _attention_backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             *tensors: Optional[Tensor], mask_grad: bool = False,
                             **keywords: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch.ops.attn.attention_backward: tensors are the tensor options, keywords the other options."""
    return _attention_backward_flat((dout, q, k, v, out, lse, *_op_flat(tensors, keywords, mask_grad)))


_attention_backward_op = torch.library.custom_op(
    "attn::attention_backward", _attention_backward_impl, mutates_args=(),
    schema=_schema(("dout", "q", "k", "v", "out", "lse"), "mask_grad", 4))


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
_MASK, _MASK_TYPE, _SCALE, _SOFTCAP = (3 + [n for n, _, _ in _OP_OPTIONS].index(name)
                                       for name in ("mask", "mask_type", "scale", "softcap"))
_RETURN_WEIGHTS = 3 + len(_OP_OPTIONS)
_N_INPUTS = _RETURN_WEIGHTS + 1
_N_POSITIONAL = 3 + len(_OP_TENSORS)  # of the forward op
# The autograd Function saves the mask apart from the other options: it comes first among them.
assert _MASK == 3, "attn.torch: the option table must start with mask"


def _autocast_kernel(keyset, *args, **keywords):
    # Direct calls of torch.ops.attn.attention under CPU autocast (TorchScript, users of the op): q, k, v and a
    # float mask take the autocast dtype, as torch's scaled_dot_product_attention does; float64 stays float64.
    # (Inside this kernel torch.is_autocast_enabled reports False: the dispatcher is past the autocast key.)
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
        return _attention_op._opoverload(*_autocast_args(args, True), **keywords)


_lib = torch.library.Library("attn", "FRAGMENT")
_lib.impl("attention", _autocast_kernel, "AutocastCPU", with_keyset=True)


def _autocast_cast(x: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    eligible = x is not None and x.is_floating_point() and x.device.type == "cpu" and x.dtype != torch.float64
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


def _weights_grad(ctx, dweights: Tensor, q: Tensor, k: Tensor, weights: Tensor, mask: Optional[Tensor]):
    """(dq, dk, d(mask) or None) from the gradient of the returned weights P [..., Hq, Lq, Lk] (before dropout):
    dS = P * (dW - rowsum(dW * P)), then back through the score s = softcap(scale * q.k) (+ alibi + mask)."""
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    p, dw = weights.to(ct), dweights.to(ct)
    ds = p * (dw - (dw * p).sum(-1, keepdim=True))
    dmask = None
    if ctx.mask_grad:
        dmask = ds.sum_to_size(mask.shape).to(mask.dtype)  # s = ... + mask: the mask's gradient is dS, reduced
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
        ds = torch.where(allowed, ds * (1 - t * t), 0)  # d raw = dS * (1 - tanh^2); removed keys stay 0
    dq = scale * (ds @ kc)
    dk = scale * (ds.transpose(-1, -2) @ qc)
    if groups > 1:  # GQA: a kv head's gradient is the sum over the query heads of its group
        dk = dk.unflatten(-3, (hkv, groups)).sum(-3)
    return dq, dk, dmask


def _backward_grads(ctx, flat: tuple, dweights: Optional[Tensor], weights: Tensor) -> tuple:
    """(dq, dk, dv, dmask) from dout (flat[0], None when only the weights were used) through the op (or its
    implementation for plain tensors) and from the weights' gradient: the backward's general case, run with grad
    mode and autocast off."""
    dout, q, k, v, mask = flat[0], flat[1], flat[2], flat[3], flat[6]
    if dout is not None:
        plain = _plain(dout, q, k, v, mask)
        dq, dk, dv, dmask = _attention_backward_flat(flat) if plain else _op_call(_attention_backward_op, flat)
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
        ctx.tensor_options = [n for n in range(_MASK + 1, _RETURN_WEIGHTS) if isinstance(inputs[n], Tensor)]
        ctx.options = [None if n in ctx.tensor_options else inputs[n] for n in range(_MASK + 1, _RETURN_WEIGHTS)]
        ctx.scale, ctx.softcap = inputs[_SCALE], inputs[_SOFTCAP]
        ctx.return_weights = inputs[_RETURN_WEIGHTS]
        ctx.mask_grad = mask is not None and mask.requires_grad and inputs[_MASK_TYPE] == "add"
        ctx.save_for_backward(q, k, v, mask, out, lse, weights, *(inputs[n] for n in ctx.tensor_options))
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
        if dout is not None and _plain(dout, q, k, v, mask) and not (ctx.return_weights and dweights is not None):
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
            deps = [t for t in (q, k, v, mask, out, dout, dweights) if t is not None and t.requires_grad]
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
    flat = _op_flat(inputs[_MASK:], keyword_only_inputs, keyword_only_inputs.get("return_weights", False))
    _AttentionFunction.setup_context(ctx, (*inputs[:_MASK], *flat), output)


def _op_backward(ctx, dout, dlse, dweights):
    """backward of the op's own autograd: one gradient per positional argument."""
    return _AttentionFunction.backward(ctx, dout, dlse, dweights)[:_N_POSITIONAL]


torch.library.register_autograd(_attention_op, _op_backward, setup_context=_op_setup_context)


def _as_tensor(x: Any, name: str) -> Optional[Tensor]:
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:
        raise TypeError(f"attn.torch: {name} must be a tensor, got {type(x).__name__}: {e}") from None


def _options_as_given(options: dict) -> bool:
    """Whether attention's options mean the same to attn._core.attention as they are: no dropout (whose seed
    attn.torch draws from torch's RNG when none is given) and no seed (attn.torch also takes it as a tensor)."""
    dropout_p = options.get("dropout_p", 0.0)
    return "seed" not in options and type(dropout_p) in (int, float) and dropout_p == 0


def _apply(q: Tensor, k: Tensor, v: Tensor, fn: str, return_weights: bool = False,
           **options: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Validates and flattens attn.attention's options, applies CPU autocast, runs the op with autograd ->
    (out [..., Hq, Lq, Dv], lse [..., Hq, Lq], weights [..., Hq, Lq, Lk] or [0] without return_weights)."""
    args = (q, k, v, *_flatten(options, fn), bool(return_weights))
    args = _autocast_args(args, torch.is_autocast_enabled("cpu"))
    if torch.compiler.is_compiling():  # dynamo traces no custom jvp; forward-mode AD is eager-only anyway
        return _AttentionFunction.apply(*args)
    plain = _plain(*args[_Q:_MASK + 1])
    if plain and not _needs_autograd(*args[_Q:_MASK + 1]):
        return _attention_flat(args)
    return (_AttentionFunctionPlain if plain else _AttentionFunctionEager).apply(*args)


def attention(q: Tensor, k: Tensor, v: Tensor, *, return_lse: bool = False, return_weights: bool = False,
              **options: Any) -> Any:
    """attn.attention with autograd: q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv] ->
    out [..., Hq, Lq, Dv] (and lse [..., Hq, Lq], not differentiable, and weights [..., Hq, Lq, Lk], the
    probabilities before dropout, differentiable, when asked).

    The options are attn.attention's (see its docstring for the masks and the alignment rule: bottom-right
    by default, query i at key position i + Lk - Lq; top-left puts it at i). Gradients reach q, k, v and a
    mask of type 'add' that requires grad (reduced to the mask's shape), from out and from the weights. With
    dropout and seed=None the seed is drawn from torch's RNG (seed may also be an int64 scalar tensor), and the
    backward regenerates the same keep-pattern. Under CPU autocast q, k, v and a float mask are cast to the
    autocast dtype (float64 stays float64). No second derivative: double backward raises a RuntimeError.
    """
    fn = "attn.torch.attention"
    q, k, v = _as_tensor(q, "q"), _as_tensor(k, "k"), _as_tensor(v, "v")
    if "mask" in options:
        options["mask"] = _as_tensor(options["mask"], "mask")
    if not return_weights and _options_as_given(options) and _no_graph(q, k, v, options.get("mask")):
        try:  # nothing for autograd, autocast or compile to see: one call to the extension (~8 us less)
            return _core.attention(q, k, v, return_lse=return_lse, **options)
        except (TypeError, ValueError):
            pass  # the checked path below raises the error again, naming attn.torch.attention
    out, lse, weights = _apply(q, k, v, fn, return_weights, **options)
    if not return_lse and not return_weights:
        return out
    return (out,) + ((lse,) if return_lse else ()) + ((weights,) if return_weights else ())


# The annotation attention's signature shows for an option, by its kind (the op's arguments say how it is passed).
_ANNOTATIONS = {"optional real": "Optional[float]", "real": "float", "bool": "bool", "optional int": "Optional[int]",
                "int": "Optional[int]", "seed": "Any", "enum": "str", "window": "Optional[tuple]",
                "tensor": "Optional[Tensor]", "block layout": "Optional[Tensor]", "block size": "Any"}


def _signature() -> inspect.Signature:
    """attention's signature as help() and inspect show it: every keyword of attn._core.attention, by name."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Tensor") for n in "qkv"]
    for name, _, kind, default in _core.option_keywords("forward"):
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=_ANNOTATIONS[kind]))
    return inspect.Signature(params, return_annotation="Any")


attention.__signature__ = _signature()
# The options section, from the option table as attn.attention's (indented as the docstring is, for help()).
attention.__doc__ = (attention.__doc__ or "") + "\n" + textwrap.indent(_core.options_doc("forward"), "    ")


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention, with gradients (q, k, v and a float
    attn_mask). Same shapes and semantics as attn.scaled_dot_product_attention: query [..., Hq, L, E],
    key [..., Hkv, S, E], value [..., Hkv, S, Ev] -> [..., Hq, L, Ev]; bool mask True = may attend, float mask
    added; is_causal is top-left (query i sees keys j <= i); rows with no allowed key give zeros. Under CPU
    autocast the result has the autocast dtype, as torch's (float64 inputs stay float64).
    """
    fn = "attn.torch.scaled_dot_product_attention"
    query, key, value = _as_tensor(query, "query"), _as_tensor(key, "key"), _as_tensor(value, "value")
    attn_mask = _as_tensor(attn_mask, "attn_mask")
    q, k, v, options, squeeze = _sdpa.prepare(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
    if dropout_p == 0.0 and _no_graph(q, k, v, options.get("mask")):
        try:  # nothing for autograd, autocast or compile to see: one call to the extension
            out = _core.attention(q, k, v, **options)
        except TypeError as e:
            raise _sdpa.argument_error(e, _core.attention, fn, {"scale": scale}) from None
        return out[0] if squeeze else out
    # The dropout seed is drawn by _apply as a tensor (not by prepare, as an int), so that torch.compile keeps it
    # in the graph.
    options.pop("seed", None)
    options["dropout_p"] = dropout_p
    out, _, _ = _apply(q, k, v, fn, **options)
    return out[0] if squeeze else out


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """torch's canonical mask: bool True (= masked) becomes -inf, floats are cast to the compute dtype."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """Drop-in for torch.nn.MultiheadAttention: the same constructor, parameters, state_dict names and forward,
    with the attention itself computed by attn (projections stay in torch).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) -> (attn_output, attn_output_weights or None)
    Shapes (batch_first=False): query [L, N, E], key [S, N, kdim], value [S, N, vdim] (or [L, E] unbatched);
    key_padding_mask [N, S] and attn_mask [L, S] or [N * num_heads, L, S], bool True = masked, or float
    added. Differences from torch: a query whose keys are all masked gives zeros (torch: NaN), and under
    training-mode dropout the returned weights are those before dropout (torch returns them after).
    """

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        fn = "attn.torch.MultiheadAttention"
        if query.dim() not in (2, 3):
            raise ValueError(f"{fn}: query must be [L, E] or a batch of them (3-D), got {tuple(query.shape)}")
        is_batched = query.dim() == 3
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(
                f"{fn}: query, key and value must have one rank, got {tuple(query.shape)}, {tuple(key.shape)}, "
                f"{tuple(value.shape)}"
            )
        if is_causal and attn_mask is None:
            raise RuntimeError(f"{fn}: is_causal is a hint and needs attn_mask (as in torch)")
        if self.batch_first and is_batched:
            # Keep `query is key is value` true for self-attention: it selects the projection grouping below.
            same_kv, same_qk = key is value, query is key
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, embed_dim = query.shape
        if embed_dim != self.embed_dim:
            raise ValueError(f"{fn}: expected embedding dim {self.embed_dim}, got query {tuple(query.shape)}")
        H, hd = self.num_heads, self.head_dim

        # Projections, grouped as torch groups them (one GEMM for self-attention) so the round-off matches.
        if self._qkv_same_embed_dim:
            w, b = self.in_proj_weight, self.in_proj_bias
            if key is value:
                if query is key:
                    q, k, v = F.linear(query, w, b).unflatten(-1, (3, embed_dim)).unsqueeze(0).transpose(0, -2)
                    q, k, v = q.squeeze(-2), k.squeeze(-2), v.squeeze(-2)
                else:
                    w_q, w_kv = w.split([embed_dim, embed_dim * 2])
                    b_q, b_kv = (None, None) if b is None else b.split([embed_dim, embed_dim * 2])
                    q = F.linear(query, w_q, b_q)
                    k, v = F.linear(key, w_kv, b_kv).unflatten(-1, (2, embed_dim)).unsqueeze(0).transpose(0, -2)
                    k, v = k.squeeze(-2), v.squeeze(-2)
            else:
                w_q, w_k, w_v = w.chunk(3)
                b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
                q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        else:
            b_q, b_k, b_v = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            q = F.linear(query, self.q_proj_weight, b_q)
            k = F.linear(key, self.k_proj_weight, b_k)
            v = F.linear(value, self.v_proj_weight, b_v)

        # Masks over [N * H, L, S] as torch builds them; bool stays bool (drop) unless a float mask joins.
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if tuple(attn_mask.shape) != (tgt_len, key.shape[0]):
                    raise RuntimeError(f"{fn}: 2-D attn_mask must be {(tgt_len, key.shape[0])}, got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.dim() == 3:
                if tuple(attn_mask.shape) != (bsz * H, tgt_len, key.shape[0]):
                    raise RuntimeError(
                        f"{fn}: 3-D attn_mask must be {(bsz * H, tgt_len, key.shape[0])}, got {tuple(attn_mask.shape)}"
                    )
            else:
                raise RuntimeError(f"{fn}: attn_mask of rank {attn_mask.dim()} is not supported")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (bsz, key.shape[0]):
            raise RuntimeError(f"{fn}: key_padding_mask must be {(bsz, key.shape[0])}, got {tuple(key_padding_mask.shape)}")

        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, bsz, 1)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))

        # [L, N, E] -> [N, H, L, hd]
        q = q.reshape(tgt_len, bsz, H, hd).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
        v = v.reshape(v.shape[0], bsz, H, hd).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(bsz, H, 1, hd)], dim=2)
            v = torch.cat([v, v.new_zeros(bsz, H, 1, hd)], dim=2)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.shape[2]

        mask, mask_type = None, "drop"
        masks = []
        if attn_mask is not None:
            masks.append(attn_mask.reshape(-1, H, tgt_len, src_len) if attn_mask.shape[0] > 1 else attn_mask)
        if key_padding_mask is not None:
            masks.append(key_padding_mask.view(bsz, 1, 1, src_len))
        if masks:
            if all(m.dtype == torch.bool for m in masks):
                mask = masks[0] if len(masks) == 1 else masks[0] | masks[1]
            else:
                mask_type = "add"
                # In the input's dtype, as torch's _canonical_mask (under autocast the op then casts the sum).
                mask = _float_mask(masks[0], query.dtype)
                if len(masks) == 2:
                    mask = mask + _float_mask(masks[1], query.dtype)

        dropout_p = self.dropout if self.training else 0.0
        result = attention(
            q, k, v, mask=mask, mask_type=mask_type, scale=1.0 / math.sqrt(hd), dropout_p=dropout_p,
            return_weights=need_weights,
        )
        out, weights = result if need_weights else (result, None)
        # [N, H, L, hd] -> [L * N, E]: the heads side by side, as torch concatenates them.
        out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).view(tgt_len, bsz, -1)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            out = out.squeeze(1)
            if weights is not None:
                weights = weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
