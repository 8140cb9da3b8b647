"""What a PyTorch user types, against attn's plain functions: torch's argument names (is_causal, attn_mask) in
attn.attention and attn.attention_backward, one-line messages for wrong argument types, TypeError for arrays of a
dtype an argument does not take, autograd for torch tensors that require grad (never a silently detached result),
and scaled_dot_product_attention's broadcasting across ranks, accepted and refused exactly where torch does."""

import re
import sys

import numpy as np
import pytest

import attn


def _torch():
    return pytest.importorskip(
        "torch", reason="PyTorch is not installed: the PyTorch comparisons are skipped"
    )


@pytest.fixture
def qkv64():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 5, 8))
    k = rng.standard_normal((2, 3, 7, 8))
    v = rng.standard_normal((2, 3, 7, 6))
    return q, k, v


# ---- torch's names in attn.attention / attn.attention_backward ---------------------------------------------


def test_is_causal_is_top_left_causal(qkv64):
    q, k, v = qkv64
    ours = attn.attention(q, k, v, is_causal=True)
    np.testing.assert_array_equal(ours, attn.attention(q, k, v, causal=True, align="top-left"))
    # bottom-right differs when Lq != Lk
    assert not np.array_equal(ours, attn.attention(q, k, v, causal=True))
    np.testing.assert_array_equal(attn.attention(q, k, v, is_causal=False), attn.attention(q, k, v))
    np.testing.assert_array_equal(attn.attention(q, k, v, is_causal=True, align="top-left"), ours)


def test_attn_mask_has_torchs_polarity(qkv64):
    q, k, v = qkv64
    keep = np.random.default_rng(8).random((5, 7)) > 0.4
    np.testing.assert_array_equal(
        attn.attention(q, k, v, attn_mask=keep),
        attn.attention(q, k, v, mask=keep, mask_type="keep"),
    )
    add = np.random.default_rng(9).standard_normal((3, 5, 7))
    np.testing.assert_array_equal(
        attn.attention(q, k, v, attn_mask=add), attn.attention(q, k, v, mask=add, mask_type="add")
    )
    np.testing.assert_array_equal(attn.attention(q, k, v, attn_mask=None), attn.attention(q, k, v))


def test_torch_names_match_torch():
    torch = _torch()
    F = torch.nn.functional
    g = torch.Generator().manual_seed(10)
    q, k, v = (
        torch.randn(s, generator=g, dtype=torch.float64)
        for s in ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8))
    )
    keep = torch.rand(5, 7, generator=g) > 0.3
    add = torch.randn(2, 1, 5, 7, generator=g, dtype=torch.float64)
    for kw in (dict(is_causal=True), dict(attn_mask=keep), dict(attn_mask=add)):
        ref = F.scaled_dot_product_attention(q, k, v, **kw)
        assert float((attn.attention(q, k, v, **kw) - ref).abs().max()) <= 1e-12, kw


def test_attention_backward_takes_torch_names(qkv64):
    q, k, v = qkv64
    add = np.random.default_rng(11).standard_normal((5, 7))
    dout = np.ones((2, 3, 5, 6))
    out, lse = attn.attention(q, k, v, is_causal=True, attn_mask=None, return_lse=True)
    ours = attn.attention_backward(dout, q, k, v, out, lse, is_causal=True)
    ref = attn.attention_backward(dout, q, k, v, out, lse, causal=True, align="top-left")
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)
    out, lse = attn.attention(q, k, v, attn_mask=add, return_lse=True)
    ours = attn.attention_backward(dout, q, k, v, out, lse, attn_mask=add, mask_grad=True)
    ref = attn.attention_backward(
        dout, q, k, v, out, lse, mask=add, mask_type="add", mask_grad=True
    )
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "options, exc, message",
    [
        (dict(is_causal=True, causal=True), ValueError, "pass causal .* or is_causal .*, not both"),
        (
            dict(is_causal=True, align="bottom-right"),
            ValueError,
            "is_causal=True is torch's top-left",
        ),
        (dict(is_causal="yes"), TypeError, "is_causal must be a bool"),
        (
            dict(attn_mask=np.ones((5, 7), bool), mask=np.ones((5, 7), bool)),
            ValueError,
            "pass mask .* not both",
        ),
        (
            dict(attn_mask=np.ones((5, 7), bool), mask_type="drop"),
            ValueError,
            "attn_mask takes torch.s polarity",
        ),
        (
            dict(attn_mask=np.ones((5, 7), np.int64)),
            TypeError,
            "attn_mask must be bool .* or floating",
        ),
    ],
)
def test_torch_names_refuse_contradictions(qkv64, options, exc, message):
    q, k, v = qkv64
    with pytest.raises(exc, match=r"^attn\.attention: " + message):
        attn.attention(q, k, v, **options)


# ---- messages: one line naming the argument ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: attn.attention(None, k, v), r"q must be an array .*got None"),
        (lambda q, k, v: attn.attention(q, k, None), r"v must be an array .*got None"),
        (
            lambda q, k, v: attn.attention(q, k, v, scale="a"),
            r"scale must be a float or None, got str 'a'",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, causal="yes"),
            r"causal must be a bool, got str 'yes'",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, mask_type=1),
            r"mask_type must be a str, got int 1",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, threads=1.5),
            r"threads must be an int or None, got float 1.5",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, dropout_p="x"),
            r"dropout_p must be a float, got str 'x'",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, casual=True),
            r"unexpected keyword argument 'casual' "
            r"\(did you mean 'causal'\?\)",
        ),
        (
            lambda q, k, v: attn.attention(q, k, v, return_lse=None),
            r"return_lse must be a bool, got NoneType None",
        ),
        (
            lambda q, k, v: attn.attention_backward(q, q, k, v, q, None),
            r"lse must be an array .*got None",
        ),
        (
            lambda q, k, v: attn.attention_backward(q, q, k, v, q, q, softcap="1"),
            r"softcap must be a float or None",
        ),
        (
            lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, scale="a"),
            r"scale must be a float or None",
        ),
        (
            lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, is_causal="yes"),
            r"is_causal must be a bool",
        ),
        (
            lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, enable_gqa=None),
            r"enable_gqa must be a bool",
        ),
        (
            lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, dropout_p="x"),
            r"dropout_p must be a float",
        ),
    ],
)
def test_wrong_argument_types_give_one_line_naming_the_argument(qkv64, call, message):
    q, k, v = qkv64
    with pytest.raises(TypeError) as info:
        call(q, k, v)
    text = str(info.value)
    assert "\n" not in text and len(text) < 300, text
    assert text.startswith("attn."), text
    assert re.search(message, text), text


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.uint8])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_integer_and_bool_arrays_raise_type_error(qkv64, dtype, which):
    """python/README.md: bad input raises TypeError (not an array, unsupported dtype)."""
    arrays = dict(zip("qkv", qkv64))
    arrays[which] = arrays[which].astype(dtype)
    with pytest.raises(
        TypeError, match=rf"^attn\.attention: {which} (must be f64, f32, bf16 or f16|has an unsupp)"
    ):
        attn.attention(**arrays)


def test_option_arrays_of_the_wrong_dtype_raise_type_error(qkv64):
    q, k, v = qkv64
    out, lse = attn.attention(q, k, v, return_lse=True)
    cases = [
        (dict(mask=np.ones((5, 7))), r"mask \(mask_type 'keep'\) must be bool"),
        (
            dict(mask=np.ones((5, 7), np.int32), mask_type="drop"),
            r"mask \(mask_type 'drop'\) must be bool",
        ),
        (
            dict(mask=np.ones((5, 7), bool), mask_type="add"),
            r"mask \(mask_type 'add'\) must be f64",
        ),
        (dict(key_lengths=np.array([1.5, 2.0])), r"key_lengths must be an integer array"),
        (dict(alibi_slopes=np.ones(3, np.int64)), r"alibi_slopes must be f64"),
        (
            dict(block_layout=np.ones((3, 5, 1, 1), np.int32), block_size=8),
            r"block_layout must be bool",
        ),
    ]
    for options, message in cases:
        with pytest.raises(TypeError, match=r"^attn\.attention: " + message):
            attn.attention(q, k, v, **options)
        with pytest.raises(TypeError, match=r"^attn\.attention_backward: " + message):
            attn.attention_backward(out, q, k, v, out, lse, **options)
    with pytest.raises(TypeError, match=r"^attn\.attention_backward: lse must be f64"):
        attn.attention_backward(out, q, k, v, out, lse.astype(np.int64))


def test_wrapper_adds_little_per_call(qkv64):
    """attn.attention is a Python function over the extension: on its success path with NumPy arrays it makes a few
    calls of its own and hands the arrays on. Counted with sys.setprofile, not timed (benchmarks are programs, and
    the microseconds of an earlier timed version held on one CPU only: on a 2.4 GHz Zen 1 core the same code took
    4.8 us, 2.7 of them in torch's isinstance hook, ~0.7 us per array, now skipped for NumPy arrays)."""
    import torch  # noqa: F401  loaded, as in a process that uses both: needs_torch then looks at each array

    q, k, v = (x[:1, :1, :1] for x in qkv64)
    calls = []

    def hook(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)
        elif event == "c_call":
            calls.append(getattr(arg, "__qualname__", repr(arg)))

    sys.setprofile(hook)
    try:
        out = attn.attention(q, k, v, causal=True, threads=1)
    finally:
        sys.setprofile(None)
    calls.remove("setprofile")
    assert isinstance(out, np.ndarray) and out.shape == (1, 1, 1, v.shape[-1])
    # attention, needs_torch and a dict lookup in each: no per-array isinstance against torch.Tensor, no helper.
    assert len(calls) <= 4, f"attn.attention's success path makes {len(calls)} calls: {calls}"


# ---- torch tensors that require grad: autograd, never a detached result ------------------------------------


def test_plain_functions_route_tensors_that_require_grad_through_autograd():
    torch = _torch()
    F = torch.nn.functional
    g = torch.Generator().manual_seed(12)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    q, k, v = make(2, 3, 5, 8), make(2, 3, 7, 8), make(2, 3, 7, 8)
    mask = make(5, 7)
    for call, ref in [
        (
            lambda: attn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        ),
        (
            lambda: attn.attention(q, k, v, is_causal=True),
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        (
            lambda: attn.attention(q, k, v, mask=mask, mask_type="add"),
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        ),
        (
            lambda: attn.attention(q, k, v, return_lse=True)[0],
            lambda: F.scaled_dot_product_attention(q, k, v),
        ),
    ]:
        out = call()
        assert out.requires_grad and out.grad_fn is not None
        expected = ref()
        assert float((out - expected).detach().abs().max()) <= 1e-12
        ours = torch.autograd.grad(out.sum(), (q, k, v, mask), allow_unused=True)
        theirs = torch.autograd.grad(expected.sum(), (q, k, v, mask), allow_unused=True)
        for a, b in zip(ours, theirs):
            assert (a is None) == (b is None)
            assert a is None or float((a - b).abs().max()) <= 1e-11
    # Only one input requiring grad is enough.
    assert attn.attention(q.detach(), k.detach(), v).requires_grad
    # Grad mode off, or nothing requiring grad: a plain tensor.
    with torch.no_grad():
        assert not attn.attention(q, k, v).requires_grad
        assert not attn.scaled_dot_product_attention(q, k, v).requires_grad
    assert not attn.attention(q.detach(), k.detach(), v.detach()).requires_grad


def test_plain_functions_hand_torch_transforms_to_attn_torch():
    """Dual tensors (forward-mode AD) and functorch's wrappers reach attn.torch, never the extension directly: a
    tangent is refused with attn.torch's message (it was dropped without a word: the JVP of sum(2 attn(q) + q) came
    out as that of sum(q)), vmap runs per batch element, and jvp is refused instead of failing inside torch."""
    torch = _torch()
    fwAD = torch.autograd.forward_ad
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(3, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for fn in (attn.attention, attn.scaled_dot_product_attention):
        with fwAD.dual_level():
            with pytest.raises(RuntimeError, match="no forward-mode derivative"):
                fn(fwAD.make_dual(q, torch.ones_like(q)), k, v)
        with pytest.raises(RuntimeError, match="no forward-mode derivative"):
            torch.func.jvp(lambda x, fn=fn: fn(x, k, v), (q,), (torch.ones_like(q),))
        batched = torch.vmap(fn)(q, k, v)
        one_by_one = torch.stack([fn(q[i], k[i], v[i]) for i in range(3)])
        assert torch.equal(batched, one_by_one)


# ---- scaled_dot_product_attention: batch dims broadcast across ranks as in torch --------------------------

_ACCEPTED = [
    ((2, 3, 5, 8), (3, 7, 8), (3, 7, 8), False),
    ((2, 3, 5, 8), (7, 8), (7, 8), False),
    ((3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False),
    ((5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False),
    ((2, 3, 5, 8), (2, 3, 7, 8), (3, 7, 6), False),
    ((2, 3, 5, 8), (3, 7, 8), (2, 3, 7, 8), False),
    ((2, 3, 5, 8), (1, 7, 8), (1, 7, 8), False),
    ((4, 2, 3, 5, 8), (3, 7, 8), (3, 7, 8), False),
    ((2, 2, 2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False),
    ((2, 3, 5, 8), (3, 7, 8), (7, 8), False),
    ((3, 5, 8), (7, 8), (7, 8), False),
    ((5, 8), (3, 7, 8), (3, 7, 8), False),
    ((1, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False),
    ((2, 1, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), False),  # one query head, three key heads: broadcast
    ((2, 3, 5, 8), (2, 1, 7, 8), (2, 3, 7, 8), False),  # one key head, three value heads
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 1, 7, 8), True),
    ((2, 4, 5, 8), (2, 7, 8), (2, 7, 8), True),
    ((2, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), True),
    ((1, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), True),
    ((4, 5, 8), (2, 7, 8), (2, 7, 8), True),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 1, 7, 8), True),
    (
        (2, 6, 5, 8),
        (2, 2, 7, 8),
        (2, 3, 7, 8),
        True,
    ),  # key heads 2 and value heads 3, both dividing 6
]

_REFUSED = [
    ((2, 3, 5, 8), (3, 3, 7, 8), (3, 3, 7, 8), False),  # batch 2 vs 3
    ((2, 3, 5, 8), (2, 7, 8), (2, 7, 8), False),  # heads 3 vs 2
    ((8,), (7, 8), (7, 8), False),  # rank 1
    ((5, 8), (8,), (8,), False),
    ((2, 4, 5, 8), (2, 7, 8), (2, 7, 8), False),  # GQA shapes without enable_gqa
    (
        (2, 1, 5, 8),
        (2, 3, 7, 8),
        (2, 3, 7, 8),
        True,
    ),  # enable_gqa: key heads must divide the query's
    ((2, 4, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), True),
    ((2, 3, 5, 8), (2, 3, 7, 4), (2, 3, 7, 8), False),  # head dims differ
]


@pytest.mark.parametrize("shapes", _ACCEPTED, ids=str)
def test_sdpa_broadcasts_across_ranks_as_torch(shapes):
    torch = _torch()
    F = torch.nn.functional
    *shape, gqa = shapes
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in shape)
    for kw in (dict(), dict(is_causal=True), dict(attn_mask=torch.rand(5, 7, generator=g) > 0.3)):
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **kw)
        ours = attn.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **kw)
        assert ours.shape == ref.shape
        assert float((ours - ref).abs().max()) <= 1e-12, kw
        # NumPy in, the same numbers out.
        ours_np = attn.scaled_dot_product_attention(
            *(x.numpy() for x in (q, k, v)),
            enable_gqa=gqa,
            **{n: m.numpy() for n, m in kw.items() if n == "attn_mask"},
            is_causal=kw.get("is_causal", False),
        )
        np.testing.assert_allclose(ours_np, ref.numpy(), rtol=0, atol=1e-12)
    # And with gradients, through attn.torch.
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    ours = attn.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    for a, b in zip(
        torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
    ):
        assert a.shape == b.shape and float((a - b).abs().max()) <= 1e-11


@pytest.mark.parametrize("shapes", _REFUSED, ids=str)
def test_sdpa_refuses_what_torch_refuses(shapes):
    torch = _torch()
    *shape, gqa = shapes
    q, k, v = (torch.randn(s, dtype=torch.float64) for s in shape)
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    with pytest.raises(ValueError, match=r"^attn(\.|::)"):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)


def test_sdpa_mask_of_higher_rank_than_the_output_is_refused_as_torch():
    torch = _torch()
    q, k, v = torch.randn(5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 8)
    mask = torch.rand(2, 3, 5, 7) > 0.3
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
