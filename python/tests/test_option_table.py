"""The attention options come from one table (include/attn/options.h): attn._core's keywords, their signature text,
the torch ops' schemas and attn.torch.attention's signature are all read from it (attn._core.option_keywords)."""

import inspect
import itertools
import re

import numpy as np
import pytest

import attn
from attn import _core, _sdpa

FORWARD = [
    "mask",
    "mask_type",
    "causal",
    "align",
    "position_offset",
    "window",
    "scale",
    "softcap",
    "alibi_slopes",
    "key_lengths",
    "block_layout",
    "block_size",
    "dropout_p",
    "seed",
    "sinks",
    "return_lse",
    "return_weights",
    "backend",
    "threads",
]


def _signature_names(fn):
    return list(_sdpa._parameters(fn))  # parsed from the signature line that opens the docstring


def test_keywords_are_the_signature():
    forward = [kw[0] for kw in _core.option_keywords("forward")]
    backward = [kw[0] for kw in _core.option_keywords("backward")]
    assert forward == FORWARD
    assert backward == [n for n in FORWARD if n not in ("return_lse", "return_weights")][:-2] + [
        "mask_grad",
        "backend",
        "threads",
    ]
    assert _signature_names(_core.attention) == ["q", "k", "v"] + forward
    # dweights: an array of the backward (keyword-only, not an option), ahead of the options
    assert (
        _signature_names(_core.attention_backward)
        == ["dout", "q", "k", "v", "out", "lse", "dweights"] + backward
    )
    defaults = {kw[0]: kw[3] for kw in _core.option_keywords("forward")}
    assert (
        defaults["mask_type"] == "keep"
        and defaults["align"] == "bottom-right"
        and defaults["backend"] == "auto"
    )
    assert (
        defaults["dropout_p"] == 0.0 and defaults["causal"] is False and defaults["scale"] is None
    )
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward'"):
        _core.option_keywords("sideways")


def test_every_keyword_reaches_the_options():
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((1, 2, 4, 8)),
        rng.standard_normal((1, 2, 6, 8)),
        rng.standard_normal((1, 2, 6, 8)),
    )
    base = _core.attention(q, k, v)
    causal = _core.attention(q, k, v, causal=True)
    changed = dict(
        mask=np.tri(4, 6, dtype=bool),
        window=(1, 0),
        scale=0.3,
        softcap=0.5,
        alibi_slopes=np.array([0.5, 0.25]),
        key_lengths=np.array([2]),
        dropout_p=0.5,
        block_layout=np.array([[True, False]]),
        sinks=np.array([0.5, -1.0]),
    )
    extras = {"dropout_p": {"seed": 1}, "block_layout": {"block_size": (4, 3)}}
    for name, value in changed.items():
        assert not np.allclose(
            _core.attention(q, k, v, **{name: value}, **extras.get(name, {})), base
        ), name
    assert not np.allclose(causal, base)
    # where the causal bound sits
    for name, value in dict(align="top-left", position_offset=-1).items():
        assert not np.allclose(_core.attention(q, k, v, causal=True, **{name: value}), causal), name
    out, lse, w = _core.attention(q, k, v, return_lse=True, return_weights=True)
    assert w.shape == (1, 2, 4, 6) and lse.shape == (1, 2, 4)
    dout = np.ones_like(out)
    grads = _core.attention_backward(
        dout, q, k, v, out, lse, mask=np.zeros((4, 6)), mask_type="add", mask_grad=True
    )
    assert len(grads) == 4 and grads[3].shape == (4, 6)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_every_keyword_reaches_torch_calls(requires_grad):
    # attn.torch passes attn._core only the options that differ from the table's defaults: each option, given alone
    # or at its default, must still give attn._core's result bit for bit, forward and backward.
    torch = pytest.importorskip("torch")
    import attn.torch as at

    rng = np.random.default_rng(4)
    q, k, v = (
        rng.standard_normal((1, 2, 4, 8)),
        rng.standard_normal((1, 2, 6, 8)),
        rng.standard_normal((1, 2, 6, 8)),
    )
    cases = [
        dict(mask=np.tri(4, 6, dtype=bool)),
        dict(mask=np.tri(4, 6) - 1.0, mask_type="add"),
        dict(causal=True),
        dict(causal=True, align="top-left"),
        dict(causal=True, position_offset=-1),
        dict(window=(1, 0)),
        dict(window=(None, 2)),
        dict(scale=0.3),
        dict(softcap=0.5),
        dict(alibi_slopes=np.array([0.5, 0.25])),
        dict(key_lengths=np.array([2])),
        dict(dropout_p=0.5, seed=1),
        dict(block_layout=np.array([[True, False]]), block_size=(4, 3)),
        dict(threads=1),
        dict(
            mask_type="keep",
            causal=False,
            align="bottom-right",
            window=(None, None),
            dropout_p=0.0,
            backend="auto",
            threads=None,
        ),
    ]
    dout = rng.standard_normal((1, 2, 4, 8))
    for case in cases:
        want, lse = _core.attention(q, k, v, return_lse=True, **case)
        want_grads = _core.attention_backward(dout, q, k, v, want, lse, **case)
        qt, kt, vt = (torch.from_numpy(x).requires_grad_(requires_grad) for x in (q, k, v))
        options = {
            n: torch.from_numpy(x) if isinstance(x, np.ndarray) else x for n, x in case.items()
        }
        out = at.attention(qt, kt, vt, **options)
        np.testing.assert_array_equal(out.detach().numpy(), want, err_msg=str(case))
        if requires_grad:
            out.backward(torch.from_numpy(dout))
            for t, g in zip((qt, kt, vt), want_grads):
                np.testing.assert_array_equal(t.grad.numpy(), g, err_msg=str(case))


def test_unknown_and_mistyped_keywords_are_type_errors():
    q = np.zeros((1, 2, 3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'casual'"):
        _core.attention(q, q, q, casual=True)
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'casual' \(did you mean 'causal'\?\)"
    ):
        attn.attention(q, q, q, casual=True)
    with pytest.raises(TypeError, match="mask_grad"):  # a backward keyword, not the forward's
        _core.attention(q, q, q, mask_grad=True)
    with pytest.raises(TypeError, match="incompatible function arguments: softcap='1'"):
        _core.attention(q, q, q, softcap="1")
    with pytest.raises(TypeError, match=r"softcap must be a float or None, got str '1'"):
        attn.attention(q, q, q, softcap="1")


# A bad value for each rule of the table (the reals' and the window's bounds), with its message.
RULE_CASES = [
    (dict(scale=float("inf")), "scale must be finite, got inf"),
    (dict(softcap=0.0), "softcap must be finite and > 0, got 0"),
    (dict(dropout_p=1.5, seed=1), "dropout_p must be in [0, 1], got 1.5"),
    (dict(window=(-2, 0)), "window bounds must be >= -1 (-1 = unbounded), got (-2, 0)"),
]


@pytest.mark.parametrize("options, message", RULE_CASES)
def test_every_rule_reaches_python(options, message):
    q = np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match=re.escape(f"attn::attention: {message}")):
        _core.attention(q, q, q, **options)


@pytest.mark.parametrize("options, message", RULE_CASES)
def test_every_rule_reaches_torch(options, message):
    torch = pytest.importorskip("torch")
    import attn.torch as at

    q = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match=re.escape(f"attn::attention: {message}")):
        at.attention(q, q, q, **options)


# The op schemas: the arrays, then the tensor options (positional: torch.library takes no keyword-only tensor),
# then every other option keyword-only with the table's default, so that a row added anywhere in the table moves no
# argument a caller (TorchScript, torch.ops users) passes by position. A new tensor option goes after seed.
# The backward's dweights (the returned weights' gradient, an array of the backward, not an option) comes after the
# tensor options, so that it moves none of them.
TENSOR_OPTIONS = (
    "Tensor? mask=None, Tensor? alibi_slopes=None, Tensor? key_lengths=None, Tensor? block_layout=None, "
    "Tensor? seed=None, Tensor? sinks=None"
)
KEYWORD_OPTIONS = (
    'str mask_type="keep", bool causal=False, str align="bottom-right", '
    "SymInt? position_offset=None, SymInt window_left=-1, SymInt window_right=-1, float? scale=None, "
    'float? softcap=None, SymInt? block_q=None, SymInt? block_k=None, float dropout_p=0., str backend="auto", '
    "SymInt? threads=None"
)
FORWARD_SCHEMA = (
    f"attn::attention(Tensor q, Tensor k, Tensor v, {TENSOR_OPTIONS}, *, {KEYWORD_OPTIONS}, "
    "bool return_weights=False) -> (Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "attn::attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"{TENSOR_OPTIONS}, Tensor? dweights=None, *, {KEYWORD_OPTIONS}, bool mask_grad=False) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def test_torch_op_schemas_come_from_the_table():
    torch = pytest.importorskip("torch")
    import attn.torch  # noqa: F401  (registers the ops)

    assert str(torch.ops.attn.attention.default._schema) == FORWARD_SCHEMA
    assert str(torch.ops.attn.attention_backward.default._schema) == BACKWARD_SCHEMA


@pytest.mark.parametrize("op, arrays", [("attention", 3), ("attention_backward", 6)])
def test_torch_op_options_are_keyword_only(op, arrays):
    torch = pytest.importorskip("torch")
    import attn.torch  # noqa: F401  (registers the ops)

    args = getattr(torch.ops.attn, op).default._schema.arguments
    positional = [a for a in args if not a.kwarg_only]
    assert all(str(a.type) == "Tensor" for a in positional[:arrays])
    # Past the arrays only tensor options are positional, each defaulting to None; every other option is
    # keyword-only, and the keyword-only ones are every option of the table but the tensors.
    assert all(
        str(a.type) == "Optional[Tensor]" and a.default_value is None for a in positional[arrays:]
    )
    keyword = {a.name for a in args if a.kwarg_only}
    kinds = {name: kind for name, _, kind, _ in _core.option_keywords("forward")}
    expected = {
        n
        for n, kind in kinds.items()
        if kind not in ("tensor", "block layout", "seed", "window", "block size")
    }
    expected = (expected - {"return_lse"}) | {"window_left", "window_right", "block_q", "block_k"}
    if op == "attention_backward":
        expected = expected - {"return_weights"} | {"mask_grad"}
    assert keyword == expected


def test_torch_op_refuses_positional_options():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    q = torch.randn(1, 2, 3, 4)
    ref = at.attention(q, q, q, causal=True, softcap=2.0)
    assert torch.equal(torch.ops.attn.attention(q, q, q, causal=True, softcap=2.0)[0], ref)
    # Every argument by position, in the schema's order: refused past the tensors.
    schema = torch.ops.attn.attention.default._schema
    values = {"q": q, "k": q, "v": q, "causal": True, "softcap": 2.0}
    every = [values.get(a.name, a.default_value) for a in schema.arguments]
    with pytest.raises(RuntimeError, match="positional argument"):
        torch.ops.attn.attention(*every)
    with pytest.raises(RuntimeError):  # attn 0.1's positional call
        torch.ops.attn.attention(
            q,
            q,
            q,
            None,
            "keep",
            True,
            "bottom-right",
            None,
            -1,
            -1,
            None,
            2.0,
            None,
            None,
            None,
            None,
            None,
            0.0,
            None,
            "auto",
            None,
            False,
        )

    @torch.jit.script
    def scripted(q: torch.Tensor) -> torch.Tensor:  # TorchScript passes them by name too
        return torch.ops.attn.attention(q, q, q, causal=True, softcap=2.0)[0]

    assert torch.equal(scripted(q), ref)


def test_torch_attention_signature_lists_every_keyword():
    pytest.importorskip("torch")
    import attn.torch as at

    params = inspect.signature(at.attention).parameters
    assert list(params) == ["q", "k", "v"] + FORWARD
    assert params["mask_type"].default == "keep" and params["dropout_p"].default == 0.0
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in FORWARD)
    q = at.torch.zeros(1, 2, 3)
    with pytest.raises(
        TypeError,
        match=r"attn.torch.attention: unexpected keyword argument 'casual' \(did you mean",
    ):
        at.attention(q, q, q, casual=True)


def _options_section(doc):
    """{keyword: its entry's text} of a docstring's options section, in order (the section ends at a blank line)."""
    lines = doc.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.strip().startswith("Options (keyword-only)")
    )
    section = list(itertools.takewhile(str.strip, lines[start + 1 :]))
    indent = min(len(line) - len(line.lstrip()) for line in section)
    entries = {}
    for line in section:
        if len(line) - len(line.lstrip()) == indent:
            name = line.split(":")[0].strip()
            assert name not in entries, f"{name} listed twice"
            entries[name] = line.strip()
        else:
            entries[name] += " " + line.strip()
    return entries


def _check_options_doc(doc, direction):
    entries = _options_section(doc)
    # every row, in the table's order
    assert list(entries) == [kw[0] for kw in _core.option_keywords(direction)]
    for name, _, _, default in _core.option_keywords(direction):
        assert f" = {default!r}" in entries[name]
    # The rows' text: help, flag, scalar rule, use.
    assert (
        "(attn sdpa --softcap)" in entries["softcap"]
        and "s = C * tanh(s / C)" in entries["softcap"]
    )
    assert "softcap must be finite and > 0" in entries["softcap"]
    assert "dropout_p must be in [0, 1]" in entries["dropout_p"]
    own = "return_weights" if direction == "forward" else "mask_grad"
    assert entries[own].endswith(
        f"{'attention' if direction == 'forward' else 'attention_backward'}'s output request"
    )


@pytest.mark.parametrize(
    "fn, direction",
    [
        (_core.attention, "forward"),
        (_core.attention_backward, "backward"),
        (attn.attention, "forward"),
        (attn.attention_backward, "backward"),
    ],
)
def test_docstring_options_come_from_the_table(fn, direction):
    _check_options_doc(fn.__doc__, direction)
    assert _core.options_doc(direction) in fn.__doc__


def test_torch_attention_docstring_options_come_from_the_table():
    pytest.importorskip("torch")
    import attn.torch as at

    _check_options_doc(inspect.getdoc(at.attention), "forward")
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward'"):
        _core.options_doc("sideways")
