"""attn.torch's view of the option table (attn/options.h, read through attn._core.option_keywords): the custom ops'
schemas, their flat arguments, and attn.attention's keyword options checked and flattened into them."""

from __future__ import annotations

import difflib
import numbers
from typing import Any

import torch
from torch import Tensor

from . import _core

# ---- the ops: torch.ops.attn.attention and torch.ops.attn.attention_backward ------------------------------
#
# Options are flattened into typed arguments (custom-op schemas take no dicts), one per keyword of attn._core's
# functions, in their order (attn/options.h's table, read through attn._core.option_keywords): window=(left, right)
# becomes window_left, window_right with -1 = unbounded; block_size becomes block_q, block_k; the dropout seed is an
# int64 scalar tensor holding the seed's 64 bits (a tensor so that torch.compile draws it inside the graph).
# Every option that is not a tensor is keyword-only, with the table's default, so that a new row can go anywhere in
# the table without moving an argument a caller passes. The tensor options follow the arrays as positional
# arguments that default to None (pass them by name): torch.library refuses keyword-only tensors (custom_op,
# register_vmap) and would not differentiate them (register_autograd), and the mask takes a gradient.
# torch.ops.attn.attention(q, k, v, mask=None, alibi_slopes=None, key_lengths=None, block_layout=None, seed=None, *,
#     mask_type="keep", causal=False, align="bottom-right", position_offset=None, window_left=-1, window_right=-1,
#     scale=None, softcap=None, block_q=None, block_k=None, dropout_p=0., backend="auto", threads=None,
#     return_weights=False)
#   -> (out [..., Hq, Lq, Dv], lse [..., Hq, Lq], weights [..., Hq, Lq, Lk], or [0] when not asked)
# torch.ops.attn.attention_backward(dout, q, k, v, out, lse, mask=None, ..., seed=None, dweights=None, *, mask_type=...,
#     mask_grad=False) -> (dq, dk, dv, dmask or [0] without mask_grad)
#   dweights [..., Hq, Lq, Lk]: the returned weights' gradient (None: unused), an array of the backward rather than
#   an option; a tensor, so positional (torch.library takes no keyword-only tensor), after the tensor options so that
#   it moves none of them.
# Inside this module the op's arguments travel as one flat list in the op's order (the arrays, the tensor options,
# the backward's dweights, the keyword-only options, the output request); _op_call splits it, _op_flat joins a call's
# arguments back.

# The schema type of an option's op argument(s), by its kind; window and block size are two arguments each.
_SCHEMA_TYPES = {
    "optional real": "float?",
    "real": "float",
    "bool": "bool",
    "optional int": "SymInt?",
    "int": "SymInt?",
    "seed": "Tensor?",
    "enum": "str",
    "tensor": "Tensor?",
    "block layout": "Tensor?",
}
_PAIRS = {
    "window": (("window_left", "window_right"), "SymInt"),
    "block size": (("block_q", "block_k"), "SymInt?"),
}
# The op's default of each argument of a pair (the option's None): -1 = unbounded window, None = no block size.
_PAIR_DEFAULTS = {"window": -1, "block size": None}
_TENSOR_KINDS = ("tensor", "block layout", "seed")


def _keywords() -> list:
    """The options both directions take as [(name, kind, default)], in attn._core's order. Each direction's own
    keywords are its output requests, which the ops take apart (return_lse: always computed; return_weights, mask_grad:
    the ops' last argument)."""
    forward, backward = _core.option_keywords("forward"), _core.option_keywords("backward")
    in_backward = {kw[0] for kw in backward}
    both = [(name, kind, default) for name, _, kind, default in forward if name in in_backward]
    names = {kw[0] for kw in both}
    own = (
        [kw[0] for kw in forward if kw[0] not in names],
        [kw[0] for kw in backward if kw[0] not in names],
    )
    assert own == (["return_lse", "return_weights"], ["mask_grad"]), (
        f"attn.torch: a new output request {own}"
    )
    return both


_OPTIONS = _keywords()


def _op_arguments() -> tuple:
    """([(op argument, schema type, default)] of the tensor options, the same of the keyword-only ones), each in the
    table's order."""
    tensors, keywords = [], []
    for name, kind, default in _OPTIONS:
        if kind in _PAIRS:
            keywords += [(n, _PAIRS[kind][1], _PAIR_DEFAULTS[kind]) for n in _PAIRS[kind][0]]
        else:
            (tensors if kind in _TENSOR_KINDS else keywords).append(
                (name, _SCHEMA_TYPES[kind], default)
            )
    assert all(d is None for _, _, d in tensors), "attn.torch: a tensor option must default to None"
    return tensors, keywords


_OP_TENSORS, _OP_KEYWORDS = _op_arguments()
_OP_OPTIONS = _OP_TENSORS + _OP_KEYWORDS  # the flat list's order
_OP_DEFAULTS = {n: d for n, _, d in _OP_KEYWORDS}


def _schema_default(x: Any) -> str:
    """A default as torch's schema parser reads it."""
    if x is None or isinstance(x, bool):
        return str(x)
    if isinstance(x, str):
        return '"' + x + '"'
    assert isinstance(x, (int, float)), f"attn.torch: no schema form for the default {x!r}"
    return repr(x)


def _schema(arrays: tuple, own: str, returns: int, optional: tuple = ()) -> str:
    """The op's schema: the arrays, the tensor options, the optional arrays (None: not given), then keyword-only: the
    other options and the direction's output request (a bool)."""
    args = (
        [f"Tensor {a}" for a in arrays]
        + [f"{t} {n}=None" for n, t, _ in _OP_TENSORS]
        + [f"Tensor? {a}=None" for a in optional]
        + ["*"]
        + [f"{t} {n}={_schema_default(d)}" for n, t, d in _OP_KEYWORDS]
        + [f"bool {own}=False"]
    )
    return f"({', '.join(args)}) -> ({', '.join(['Tensor'] * returns)})"


_OP_KEYWORD_NAMES = tuple(n for n, _, _ in _OP_KEYWORDS)
_OP_OPTION_NAMES = tuple(n for n, _, _ in _OP_OPTIONS)


def _op_call(fn, flat: tuple):
    """fn (an op or its implementation) called with the flat arguments: the arrays and tensor options positional,
    the rest (the keyword-only options and the output request, last) by name."""
    n = len(flat) - len(_OP_KEYWORDS) - 1
    named = dict(zip(_OP_KEYWORD_NAMES, flat[n:-1]))
    own = "return_weights" if n == 3 + len(_OP_TENSORS) else "mask_grad"
    return fn(*flat[:n], **named, **{own: flat[-1]})


def _op_flat(tensors: tuple, keywords: dict, own: bool, n_tensors: int = len(_OP_TENSORS)) -> list:
    """The flat option arguments (no arrays) and the output request from a call of the op, whose dispatcher leaves
    out the arguments that equal their defaults. n_tensors: the op's optional tensors after the arrays (the backward
    has dweights after the tensor options)."""
    tensors = list(tensors) + [None] * (n_tensors - len(tensors))
    return tensors + [keywords.get(n, d) for n, d in _OP_DEFAULTS.items()] + [own]


# How _core_options reads each option back from the flat arguments, in the table's order: the plain ones as
# (option, position, attn._core's default), the pairs as (option, their two positions, the op's default of each), and
# the seed's position.
_CORE_PLAIN = tuple(
    (name, _OP_OPTION_NAMES.index(name), default)
    for name, kind, default in _OPTIONS
    if kind not in _PAIRS and kind != "seed"
)
_CORE_PAIRS = tuple(
    (name, tuple(_OP_OPTION_NAMES.index(n) for n in _PAIRS[kind][0]), _PAIR_DEFAULTS[kind])
    for name, kind, _ in _OPTIONS
    if kind in _PAIRS
)
_CORE_SEEDS = tuple(
    (name, _OP_OPTION_NAMES.index(name)) for name, kind, _ in _OPTIONS if kind == "seed"
)


def _core_options(*flat) -> dict:
    """The flattened option arguments (in the op's order) back as attn._core's keyword options. An option at
    attn._core's default is left out (the extension then takes that same default from the same table): each keyword
    the extension parses, and each step here, costs about a microsecond of a small call."""
    options = {}
    for name, at, default in _CORE_PLAIN:
        x = flat[at]
        # (a tensor is never a default, and is not compared by value; a bool is not its int)
        if x is not default and (
            isinstance(x, Tensor) or type(x) is not type(default) or x != default
        ):
            options[name] = x
    for name, at, default in _CORE_PAIRS:
        pair = (flat[at[0]], flat[at[1]])
        if pair[0] != default or pair[1] != default:
            options[name] = pair
    for name, at in _CORE_SEEDS:
        if flat[at] is not None:
            options[name] = int(flat[at].item()) & (2**64 - 1)
    return options


def _optional_float(x: Any, name: str, fn: str) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a float or None, got {type(x).__name__} {x!r}")
    return float(x)


def _window_bound(x: Any, fn: str) -> int:
    if x is None:
        return -1
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{fn}: window bounds must be int or None, got {x!r}")
    return int(x)


def _seed_tensor(seed: Any, dropout_p: float, fn: str) -> Tensor | None:
    """The seed's 64 bits as an int64 scalar tensor; None with dropout draws one from torch's RNG."""
    if seed is None:
        if dropout_p == 0.0:
            return None
        return torch.randint(0, 2**62, (), dtype=torch.int64)  # torch.manual_seed reproduces it
    if isinstance(seed, Tensor):
        if (
            seed.numel() != 1
            or seed.dtype.is_floating_point
            or seed.dtype.is_complex
            or seed.dtype == torch.bool
        ):
            raise ValueError(
                f"{fn}: a seed tensor must hold one integer, got {seed.dtype} {tuple(seed.shape)}"
            )
        return seed.reshape(()).to(torch.int64)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
        raise ValueError(f"{fn}: seed must be an int in [0, 2**64), got {seed!r}")
    seed = int(seed)
    return torch.tensor(seed - 2**64 if seed >= 2**63 else seed, dtype=torch.int64)


def _window(window: Any, fn: str) -> list:
    if window is None:
        return [-1, -1]
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{fn}: window must be a pair (left, right) of int or None, got {window!r}")
    return [_window_bound(window[0], fn), _window_bound(window[1], fn)]


def _block_size(block_size: Any, fn: str) -> list:
    if block_size is None:
        return [None, None]
    if isinstance(block_size, numbers.Integral) and not isinstance(block_size, bool):
        return [int(block_size)] * 2
    if (
        isinstance(block_size, (tuple, list))
        and len(block_size) == 2
        and all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in block_size)
    ):
        return [int(block_size[0]), int(block_size[1])]
    raise TypeError(f"{fn}: block_size must be an int or a pair of ints, got {block_size!r}")


def _converted(name: str, kind: str, x: Any, dropout_p: Any, fn: str) -> list:
    """One option checked and converted: [(op argument, value)] (two for a pair). dropout_p: the call's, for the
    seed."""
    if kind in _PAIRS:
        return list(zip(_PAIRS[kind][0], (_window if kind == "window" else _block_size)(x, fn)))
    if kind in ("optional real", "real"):
        return [(name, _optional_float(x, name, fn))]
    if kind == "bool":
        return [(name, bool(x))]
    if kind == "seed":
        return [(name, _seed_tensor(x, dropout_p, fn))]
    return [(name, x)]


_KNOWN = frozenset(name for name, _, _ in _OPTIONS)
_DROPOUT_DEFAULT = next(default for name, _, default in _OPTIONS if name == "dropout_p")
# Every option at its default, converted once (the seed: None, as there is no dropout by default).
_DEFAULT_ARGS = {
    a: x
    for name, kind, default in _OPTIONS
    for a, x in _converted(name, kind, default, _DROPOUT_DEFAULT, "attn.torch")
}


def _flatten(options: dict, fn: str) -> list:
    """attn.attention's keyword options, checked, as the op's flattened arguments (defaults: attn._core's). Only the
    options the call gives are converted (in the table's order: the seed after dropout_p), and the seed also when
    dropout is asked without one (it is drawn); the others take their converted defaults."""
    for name in options:
        if name not in _KNOWN:
            close = difflib.get_close_matches(name, sorted(_KNOWN), n=1)
            raise TypeError(
                f"{fn}: unexpected keyword argument {name!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
    args = dict(_DEFAULT_ARGS)
    if options:
        dropout_p = options.get("dropout_p", _DROPOUT_DEFAULT)
        for name, kind, default in _OPTIONS:
            if name in options or (kind == "seed" and dropout_p):
                args.update(_converted(name, kind, options.get(name, default), dropout_p, fn))
    return [args[n] for n in _OP_OPTION_NAMES]


def _as_tensor(x: Any, name: str, fn: str) -> Tensor | None:
    """x as a torch tensor (None stays None; NumPy arrays and lists convert), or a TypeError naming fn and the
    argument."""
    if x is None or isinstance(x, Tensor):
        return x
    try:
        return torch.as_tensor(x)
    except Exception as e:
        raise TypeError(f"{fn}: {name} must be a tensor, got {type(x).__name__}: {e}") from None
