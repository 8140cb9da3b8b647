"""PyTorch's scaled_dot_product_attention arguments mapped onto attn's contract (shared by attn and attn.torch), torch's
argument names in attn.attention, and one-line messages for arguments of the wrong type. It imports no other module of
the package but _torch_ops (lazily, once torch is loaded); attn and attn.torch import it."""

from __future__ import annotations

import ast
import difflib
import functools
import sys
from typing import Any, Callable

import numpy as np

_FN = "attn.scaled_dot_product_attention"


def is_torch_tensor(x: Any) -> bool:
    """Whether x is a torch.Tensor, without importing torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def needs_torch(arrays: tuple) -> bool:
    """Whether attn's plain functions must hand the call to attn.torch instead of reading the arrays themselves:
    torch tensors among `arrays` that autograd must see (one requires grad with grad mode on, or a forward-mode AD
    level is open, where a dual tensor's tangent would otherwise be dropped without a word), or that the extension
    cannot read as they are (functorch's wrappers under vmap / grad / jvp, subclasses, a dispatch mode, torch.compile
    tracing, autocast). attn.torch then runs autograd, the transform, or refuses with its clear message."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor = torch.Tensor
    # NumPy arrays and absent masks first: isinstance against torch.Tensor goes through torch's metaclass hook,
    # ~0.7 us per array on a 2.4 GHz core, most of what the wrapper added to a NumPy call.
    tensors = None
    for x in arrays:
        if x is not None and type(x) is not np.ndarray and isinstance(x, tensor):
            tensors = (tensors or []) + [x]
    if tensors is None:
        return False
    # attn's torch ops (imported on first use: torch is loaded already when a caller passes torch tensors).
    # Not attn.torch, which imports this module: the package's imports form no circle.
    from . import _torch_ops

    return not _torch_ops._no_graph(*tensors)


def _float_dtype(x: Any) -> bool:
    dtype = x.dtype
    if is_torch_tensor(x):
        return dtype.is_floating_point
    return np.issubdtype(dtype, np.floating)


def torch_names(options: dict, fn: str) -> dict:
    """attn.attention's options with torch's names translated: is_causal=True is causal=True with align='top-left'
    (torch's rule: query i sees keys j <= i); attn_mask is mask with torch's polarity, taken from its dtype
    (bool: True = may attend, mask_type 'keep'; floating: added to the scores, mask_type 'add')."""
    options = dict(options)
    if "is_causal" in options:
        is_causal = options.pop("is_causal")
        if not isinstance(is_causal, (bool, np.bool_)):
            raise TypeError(
                f"{fn}: is_causal must be a bool, got {type(is_causal).__name__} {is_causal!r}"
            )
        if "causal" in options:
            raise ValueError(
                f"{fn}: pass causal (attn's, with align) or is_causal (torch's, top-left), not both"
            )
        if is_causal:
            align = options.get("align", "top-left")
            if align != "top-left":
                raise ValueError(
                    f"{fn}: is_causal=True is torch's top-left causal mask, which contradicts "
                    f"align={align!r}; pass causal=True with align={align!r} instead"
                )
            options["causal"] = True
            options["align"] = "top-left"
    if "attn_mask" in options:
        attn_mask = options.pop("attn_mask")
        if "mask" in options:
            raise ValueError(
                f"{fn}: pass mask (attn's, with mask_type) or attn_mask (torch's), not both"
            )
        if attn_mask is not None:
            if "mask_type" in options:
                raise ValueError(
                    f"{fn}: attn_mask takes torch's polarity from its dtype (bool: True = may attend; "
                    f"float: added); pass mask= to choose mask_type={options['mask_type']!r}"
                )
            attn_mask = _as_array(attn_mask, "attn_mask", fn)
            if _is_bool(attn_mask):
                options["mask_type"] = "keep"
            elif _float_dtype(attn_mask):
                options["mask_type"] = "add"
            else:
                raise TypeError(
                    f"{fn}: attn_mask must be bool (True = may attend) or floating (added to the scores), "
                    f"got {attn_mask.dtype} with shape {tuple(attn_mask.shape)}"
                )
            options["mask"] = attn_mask
    return options


@functools.cache
def _parameters(core_fn: Callable) -> dict:
    """{name: annotation} of a nanobind function, read from the signature that opens its docstring."""
    line = (core_fn.__doc__ or "").lstrip().splitlines()[0] if core_fn.__doc__ else ""
    try:
        tree = ast.parse("def " + line[line.index(core_fn.__name__) :].rstrip(":") + ": ...")
        args = tree.body[0].args
        return {
            a.arg: ast.unparse(a.annotation) if a.annotation else ""
            for a in args.args + args.kwonlyargs
        }
    except (ValueError, SyntaxError, IndexError, AttributeError):
        return {}


_KINDS = {
    "ArrayLike": "an array (NumPy array or PyTorch CPU tensor)",
    "bool": "a bool",
    "str": "a str",
    "float": "a float",
    "int": "an int",
}


def _fits(kind: str, value: Any) -> bool:
    """Whether nanobind converts `value` for a parameter annotated `kind` (a sketch of its casters)."""
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    if kind == "str":
        return isinstance(value, str)
    if kind == "float":
        return not isinstance(value, (str, bytes)) and (
            hasattr(type(value), "__float__") or hasattr(type(value), "__index__")
        )
    if kind == "int":
        return hasattr(type(value), "__index__")
    return True


def _mismatch(annotation: str, value: Any) -> str | None:
    """What `value` should have been when it does not fit `annotation` ('float | None', ...), else None. Only
    simple annotations are checked; arrays and composite options are the extension's to judge."""
    kinds = [a.strip() for a in annotation.split("|")]
    optional = kinds[-1] == "None"
    kind = kinds[0] if len(kinds) == 1 + optional and kinds[0] in _KINDS else None
    if kind is None or (value is None and optional):
        return None
    if value is not None and _fits(kind, value):
        return None
    return _KINDS[kind] + (" or None" if optional else "")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def argument_error(error: TypeError, core_fn: Callable, fn: str, arguments: dict) -> TypeError:
    """A one-line TypeError naming the argument for nanobind's "incompatible function arguments" (which lists the
    whole signature); other TypeErrors (attn's own, already naming the argument) come back unchanged."""
    if "incompatible function arguments" not in str(error):
        return error
    parameters = _parameters(core_fn)
    for name, value in arguments.items():
        if name not in parameters:
            close = difflib.get_close_matches(name, list(parameters), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return TypeError(f"{fn}: unexpected keyword argument {name!r}{hint}")
        expected = _mismatch(parameters[name], value)
        if expected is not None:
            return TypeError(f"{fn}: {name} must be {expected}, got {_describe(value)}")
    return TypeError(f"{fn}: invalid arguments ({str(error).strip().splitlines()[-1]})")


def _as_array(x: Any, name: str, fn: str = _FN) -> Any:
    if is_torch_tensor(x) or isinstance(x, np.ndarray):
        return x
    if x is None:
        raise TypeError(f"{fn}: {name} must be an array, got None")
    try:
        return np.asarray(x)
    except Exception as e:  # ragged lists and the like
        raise TypeError(f"{fn}: {name} must be an array, got {type(x).__name__}: {e}") from None


def _is_bool(mask: Any) -> bool:
    dtype = mask.dtype
    if is_torch_tensor(mask):
        return dtype == sys.modules["torch"].bool
    return dtype == np.bool_


def _expand(x: Any, shape: tuple) -> Any:
    if tuple(x.shape) == shape:
        return x
    return x.expand(*shape) if is_torch_tensor(x) else np.broadcast_to(x, shape)


def random_seed(torch_rng: bool) -> int:
    """A fresh dropout seed from the caller's framework RNG (torch.manual_seed / np.random.seed reproduce it)."""
    if torch_rng:
        torch = sys.modules["torch"]
        return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())
    return int(np.random.randint(0, 2**62, dtype=np.int64))


def _with_rank(x: Any, nd: int) -> Any:
    """x viewed with leading dims of size 1 up to rank nd (matmul's rule for operands of fewer dims)."""
    return x if x.ndim == nd else x.reshape((1,) * (nd - x.ndim) + tuple(x.shape))


def _repeat_heads(x: Any, repeats: int) -> Any:
    """x [..., H, S, E] -> [..., H * repeats, S, E], each head repeated (torch's enable_gqa: head h reads h // r)."""
    if repeats == 1:
        return x
    return (
        x.repeat_interleave(repeats, dim=-3)
        if is_torch_tensor(x)
        else np.repeat(x, repeats, axis=-3)
    )


def _shapes(query: Any, key: Any, value: Any) -> str:
    return f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"


def _prepare_common(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """prepare()'s result for the common case, in a few attribute reads (a decode step pays this on every call):
    torch tensors or NumPy arrays of one rank >= 3 with equal leading dims, equal query and key/value heads (or
    GQA asked for and dividing), no mask, no dropout, plain bool flags. None: take the general path."""
    if (
        attn_mask is not None
        or dropout_p != 0.0
        or type(is_causal) is not bool
        or type(enable_gqa) is not bool
    ):
        return None
    if type(dropout_p) not in (float, int):
        return None
    torch = sys.modules.get("torch")
    kinds = (np.ndarray,) if torch is None else (np.ndarray, torch.Tensor)
    if not (isinstance(query, kinds) and isinstance(key, kinds) and isinstance(value, kinds)):
        return None
    qs, ks, vs = query.shape, key.shape, value.shape
    nd = len(qs)
    if nd < 3 or len(ks) != nd or len(vs) != nd or qs[:-3] != ks[:-3] or ks[:-2] != vs[:-2]:
        return None
    hq, hk = qs[-3], ks[-3]
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return None
    options: dict[str, Any] = {"scale": scale, "dropout_p": float(dropout_p)}
    if is_causal:
        options["causal"] = True
        options["align"] = "top-left"  # torch's is_causal: query i sees keys j <= i
    return query, key, value, options, False


def prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Returns (q, k, v, options for attn.attention, squeeze) for PyTorch's SDPA semantics.

    PyTorch's shapes are query [..., Hq, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev], each of rank >= 2.
    The dims before [L, E] broadcast as in torch.matmul, across ranks too (query [N, H, L, E] with key/value
    [H, S, E] or [S, E]); without enable_gqa the head dim is one of them (a single query head meets several key
    heads), with it key and value head counts must divide the query's. When every input is 2-D [L, E] they get a
    leading dim of 1 (squeeze=True: drop it from the result). A 3-D problem [N, L, E] is N heads.
    """
    fast = _prepare_common(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if fast is not None:
        return fast
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{_FN}: {name} must be a bool, got {type(flag).__name__} {flag!r}")
    if isinstance(dropout_p, (str, bytes)) or not hasattr(type(dropout_p), "__float__"):
        raise TypeError(
            f"{_FN}: dropout_p must be a float, got {type(dropout_p).__name__} {dropout_p!r}"
        )
    q, k, v = _as_array(query, "query"), _as_array(key, "key"), _as_array(value, "value")
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(
            f"{_FN}: query, key and value must have rank >= 2 ([..., L, E]), got {_shapes(q, k, v)}"
        )
    rank = max(q.ndim, k.ndim, v.ndim)
    squeeze = rank == 2
    nd = max(rank, 3)
    if not (q.ndim == k.ndim == v.ndim == nd):
        q, k, v = _with_rank(q, nd), _with_rank(k, nd), _with_rank(v, nd)
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa:
        if hk == 0 or hv == 0 or hq % hk or hq % hv:
            raise ValueError(
                f"{_FN}: with enable_gqa the key and value head counts must divide the query's, got "
                f"{_shapes(query, key, value)}"
            )
    elif not (hq == hk == hv):
        try:
            # heads broadcast like any batch dim
            heads = np.broadcast_shapes((hq,), (hk,), (hv,))[0]
        except ValueError:
            raise ValueError(
                f"{_FN}: query has {hq} heads and key/value {hk}/{hv}; pass enable_gqa=True for grouped-query "
                f"attention ({_shapes(query, key, value)})"
            ) from None
        if hq != heads:  # one query head for several key/value heads
            q = _expand(q, tuple(q.shape[:-3]) + (heads,) + tuple(q.shape[-2:]))
            hq = heads
    # attn reads one kv head count: a single head is broadcast, other counts repeated (a copy)
    if hk != hv:
        if hk == 1 or hv == 1:
            hkv = max(hk, hv)
            k = _expand(k, tuple(k.shape[:-3]) + (hkv,) + tuple(k.shape[-2:]))
            v = _expand(v, tuple(v.shape[:-3]) + (hkv,) + tuple(v.shape[-2:]))
        else:
            k, v = _repeat_heads(k, hq // hk), _repeat_heads(v, hq // hv)
    batch_q, batch_k, batch_v = tuple(q.shape[:-3]), tuple(k.shape[:-3]), tuple(v.shape[:-3])
    if not (batch_q == batch_k == batch_v):
        try:
            batch = np.broadcast_shapes(batch_q, batch_k, batch_v)
        except ValueError:
            raise ValueError(
                f"{_FN}: the leading dims of {_shapes(query, key, value)} do not broadcast"
            ) from None
        q = _expand(q, batch + tuple(q.shape[-3:]))
        k = _expand(k, batch + tuple(k.shape[-3:]))
        v = _expand(v, batch + tuple(v.shape[-3:]))

    options: dict[str, Any] = {"scale": scale, "dropout_p": float(dropout_p)}
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"{_FN}: attn_mask must be None when is_causal=True (as in torch)")
        mask = _as_array(attn_mask, "attn_mask")
        options["mask"] = mask
        # torch: True = may attend; floats added
        options["mask_type"] = "keep" if _is_bool(mask) else "add"
    if is_causal:
        options["causal"] = True
        options["align"] = "top-left"  # torch's is_causal: query i sees keys j <= i
    if dropout_p > 0.0:
        options["seed"] = random_seed(any(is_torch_tensor(x) for x in (query, key, value)))
    return q, k, v, options, squeeze
