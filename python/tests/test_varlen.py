"""Packed variable-length attention in Python (attn.attention_varlen, attn._core.attention_varlen[_backward],
attn.torch.attention_varlen): each sequence of the packed batch is attn.attention on its rows alone (the same bits),
gradients under torch's autograd against a pure-torch composition, and the errors of bad offsets."""

import numpy as np
import pytest

import attn
from attn import _core, _sdpa

HQ, HKV, D, DV = 4, 2, 13, 11  # GQA; odd head dims
# (Lq_b, Lk_b): an empty sequence, one with no keys, more queries than keys, a single query.
LENGTHS = [(5, 9), (0, 3), (7, 7), (3, 0), (6, 4), (1, 10), (0, 0)]
B = len(LENGTHS)
USED = np.array([6, 0, 7, 0, 2, 10, 0], np.int32)  # seqused_k: <= Lk_b, some below it


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


CU_Q = _offsets([lq for lq, _ in LENGTHS])
CU_K = _offsets([lk for _, lk in LENGTHS])


def _packed(rng, dtype, cu_q=CU_Q, cu_k=CU_K):
    q = rng.standard_normal((cu_q[-1], HQ, D)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], HKV, D)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], HKV, DV)).astype(dtype)
    return q, k, v


def _rows(x, cu, b):
    """Sequence b's rows of a packed [total, H, X] array as attn.attention's [1, H, L_b, X]."""
    return x[cu[b] : cu[b + 1]].transpose(1, 0, 2)[None]


def _alone(b, options):
    """attn.attention's options for sequence b alone: seqused_k as key_lengths, its ALiBi row."""
    options = dict(options)
    used = options.pop("seqused_k", None)
    if used is not None:
        options["key_lengths"] = used[b : b + 1]
    slopes = options.get("alibi_slopes")
    if slopes is not None and slopes.ndim == 2:
        options["alibi_slopes"] = slopes[b]
    return options


def _varlen(q, k, v, options, cu_q=CU_Q, cu_k=CU_K):
    options = dict(options)
    return _core.attention_varlen(
        q, k, v, cu_q, cu_k, seqused_k=options.pop("seqused_k", None), **options
    )


def _cases(rng):
    sinks = rng.standard_normal(HQ).astype(np.float32)
    return {
        "plain": {},
        "causal": {"causal": True},
        "causal top-left": {"causal": True, "align": "top-left"},
        "window, offset": {"window": (2, 1), "position_offset": 3},
        "scale, softcap": {"scale": 0.3, "softcap": 4.0},
        "sinks, causal": {"sinks": sinks, "causal": True},
        "alibi [Hq]": {"alibi_slopes": rng.uniform(0.1, 1, HQ)},
        "alibi [B, Hq]": {"alibi_slopes": rng.uniform(0.1, 1, (B, HQ))},
        "seqused_k": {"seqused_k": USED},
        "seqused_k, causal, sinks": {"seqused_k": USED, "causal": True, "sinks": sinks},
    }


CASES = list(_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("backend, dtype", [("cpu", np.float32), ("reference", np.float64)])
@pytest.mark.parametrize("case", CASES)
def test_packed_is_attention_on_each_sequence(case, backend, dtype):
    """out and lse of every sequence are attn.attention's on its rows alone, bit for bit."""
    rng = np.random.default_rng(1)
    options = {**_cases(np.random.default_rng(0))[case], "backend": backend}
    if "sinks" in options:
        options["sinks"] = options["sinks"].astype(dtype)
    q, k, v = _packed(rng, dtype)
    out, lse = _varlen(q, k, v, options)
    assert out.shape == (CU_Q[-1], HQ, DV) and out.dtype == dtype
    assert lse.shape == (HQ, CU_Q[-1]) and lse.dtype == (
        np.float64 if dtype == np.float64 else np.float32
    )
    for b in range(B):
        if CU_Q[b + 1] == CU_Q[b]:
            continue
        o, lse_b = attn.attention(
            _rows(q, CU_Q, b),
            _rows(k, CU_K, b),
            _rows(v, CU_K, b),
            return_lse=True,
            **_alone(b, options),
        )
        np.testing.assert_array_equal(
            out[CU_Q[b] : CU_Q[b + 1]], o[0].transpose(1, 0, 2), f"out of {b}"
        )
        np.testing.assert_array_equal(lse[:, CU_Q[b] : CU_Q[b + 1]], lse_b[0], f"lse of {b}")


def test_dropout_is_that_of_batch_entry_b():
    """Dropout's keep-pattern of sequence b is batch entry b's: sequence b alone as entry b of a batch of b + 1."""
    rng = np.random.default_rng(2)
    q, k, v = _packed(rng, np.float32)
    options = {"dropout_p": 0.4, "seed": 1234, "causal": True, "backend": "cpu"}
    out, _ = _varlen(q, k, v, options)
    for b in range(B):
        if CU_Q[b + 1] == CU_Q[b]:
            continue
        batch = [
            np.broadcast_to(_rows(x, cu, b), (b + 1,) + _rows(x, cu, b).shape[1:])
            for x, cu in ((q, CU_Q), (k, CU_K), (v, CU_K))
        ]
        o = attn.attention(*batch, **options)
        np.testing.assert_array_equal(
            out[CU_Q[b] : CU_Q[b + 1]], o[b].transpose(1, 0, 2), f"out of {b}"
        )


@pytest.mark.parametrize(
    "case", ["causal", "sinks, causal", "seqused_k, causal, sinks", "alibi [B, Hq]"]
)
def test_backward_is_attention_backward_on_each_sequence(case):
    """dq, dk, dv of every sequence are attn.attention_backward's on its rows alone (bit for bit; key rows past
    seqused_k get 0 as padding keys do), and dsinks is the sum of the sequences'."""
    rng = np.random.default_rng(3)
    options = {**_cases(np.random.default_rng(0))[case], "backend": "cpu"}
    q, k, v = _packed(rng, np.float32)
    out, lse = _varlen(q, k, v, options)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    used = options.pop("seqused_k", None)
    grads = _core.attention_varlen_backward(
        dout, q, k, v, out, lse, CU_Q, CU_K, seqused_k=used, **options
    )
    assert len(grads) == (4 if "sinks" in options else 3)
    dsinks = np.zeros(HQ)
    for b in range(B):
        if CU_Q[b + 1] == CU_Q[b]:  # no queries: its keys get no gradient
            np.testing.assert_array_equal(grads[1][CU_K[b] : CU_K[b + 1]], 0)
            continue
        alone = _alone(b, {**options, "seqused_k": used} if used is not None else options)
        o, lse_b = attn.attention(
            _rows(q, CU_Q, b), _rows(k, CU_K, b), _rows(v, CU_K, b), return_lse=True, **alone
        )
        g = attn.attention_backward(
            _rows(dout, CU_Q, b),
            _rows(q, CU_Q, b),
            _rows(k, CU_K, b),
            _rows(v, CU_K, b),
            o,
            lse_b,
            **alone,
        )
        for name, packed, single, cu in zip(("dq", "dk", "dv"), grads, g, (CU_Q, CU_K, CU_K)):
            np.testing.assert_array_equal(
                packed[cu[b] : cu[b + 1]], single[0].transpose(1, 0, 2), f"{name} of {b}"
            )
        if "sinks" in options:
            dsinks += g[3]
    if "sinks" in options:  # summed in double then rounded once, against a sum of rounded parts
        np.testing.assert_allclose(grads[3], dsinks, rtol=1e-6, atol=1e-6 * np.abs(dsinks).max())


def test_torch_tensors_in_torch_tensors_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    q, k, v = _packed(rng, np.float32)
    ref_out, ref_lse = _varlen(q, k, v, {"causal": True})
    t = [torch.from_numpy(x) for x in (q, k, v, CU_Q, CU_K)]
    out, lse = _core.attention_varlen(*t, causal=True)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), ref_out)
    np.testing.assert_array_equal(lse.numpy(), ref_lse)
    # attn.attention_varlen: out alone, or (out, lse) as attn.attention returns them
    np.testing.assert_array_equal(attn.attention_varlen(*t, causal=True).numpy(), ref_out)
    both = attn.attention_varlen(q, k, v, CU_Q, CU_K, causal=True, return_lse=True)
    np.testing.assert_array_equal(both[1], ref_lse)


def test_keywords_are_attentions_less_return_lse():
    """The options come from attention's keyword list (the option table), less return_lse (always returned)."""
    arrays = [
        "q",
        "k",
        "v",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
        "seqused_k",
    ]
    forward = [kw[0] for kw in _core.option_keywords("forward") if kw[0] != "return_lse"]
    backward = [kw[0] for kw in _core.option_keywords("backward")]
    assert list(_sdpa._parameters(_core.attention_varlen)) == arrays + forward
    assert (
        list(_sdpa._parameters(_core.attention_varlen_backward))
        == ["dout", *arrays[:3], "out", "lse"] + arrays[3:] + backward
    )
    assert "cu_seqlens_q[b]:cu_seqlens_q[b + 1]" in _core.attention_varlen.__doc__
    assert "i + Lk_b - Lq_b" in attn.attention_varlen.__doc__


# ---- torch autograd against a pure-torch composition ------------------------------------------------------------


def _torch_reference(torch, q, k, v, causal=False, sinks=None, used=None):
    """Sequence by sequence in torch: softmax(q k^T / sqrt(D)) v with GQA, causal bottom-right (query i of Lq sees
    keys j <= i + Lk - Lq), keys j >= used[b] removed, and the sink as one more softmax column without a value."""
    outs = []
    for b in range(B):
        lq, lk = int(CU_Q[b + 1] - CU_Q[b]), int(CU_K[b + 1] - CU_K[b])
        qb = q[CU_Q[b] : CU_Q[b + 1]].transpose(0, 1)  # [Hq, Lq, D]
        kb = k[CU_K[b] : CU_K[b + 1]].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        vb = v[CU_K[b] : CU_K[b + 1]].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        s = qb @ kb.transpose(-1, -2) / D**0.5
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        allowed = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            allowed &= j <= i + lk - lq
        if used is not None:
            allowed &= j < int(used[b])
        s = s.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.view(HQ, 1, 1).expand(HQ, lq, 1)], -1)
        p = torch.softmax(s, -1)
        outs.append((p[..., :lk] @ vb).transpose(0, 1))  # [Lq, Hq, Dv]
    return torch.cat(outs)


# (causal, sinks, seqused_k): without sinks, causal would leave rows of (6, 4) with no key, where the composition's
# softmax has no value (attn gives 0).
@pytest.mark.parametrize(
    "causal, with_sinks, with_used",
    [(False, False, False), (False, False, True), (True, True, False), (True, True, True)],
)
def test_torch_gradients_match_a_torch_composition(causal, with_sinks, with_used):
    torch = pytest.importorskip("torch")
    import attn.torch as at

    g = torch.Generator().manual_seed(5)
    shapes = ((CU_Q[-1], HQ, D), (CU_K[-1], HKV, D), (CU_K[-1], HKV, DV), (CU_Q[-1], HQ, DV))
    q, k, v, dout = (torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes)
    sinks = torch.randn(HQ, generator=g, dtype=torch.float64) if with_sinks else None
    inputs = [x.requires_grad_() for x in (q, k, v, sinks) if x is not None]
    # (a row whose keys are all past seqused_k has no value in the composition either: those sequences get 1 key)
    used = (
        torch.from_numpy(np.maximum(USED, 1).clip(max=CU_K[1:] - CU_K[:-1])) if with_used else None
    )
    ref = _torch_reference(torch, q, k, v, causal, sinks, used)
    cu = torch.from_numpy(CU_Q), torch.from_numpy(CU_K)
    got = at.attention_varlen(q, k, v, *cu, causal=causal, sinks=sinks, seqused_k=used)
    assert float((got - ref).detach().abs().max()) < 1e-10
    grads = torch.autograd.grad((got * dout).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * dout).sum(), inputs)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), grads, ref_grads):
        assert float((a - b).abs().max()) < 1e-10, name


def test_torch_gradcheck():
    """gradcheck on a small ragged batch with GQA, causal, sinks, ALiBi [B, Hq] and dropout (a fixed seed: the
    backward regenerates the forward's keep-pattern)."""
    torch = pytest.importorskip("torch")
    import attn.torch as at

    g = torch.Generator().manual_seed(6)
    cu_q, cu_k = (
        torch.tensor([0, 2, 2, 5], dtype=torch.int32),
        torch.tensor([0, 3, 4, 7], dtype=torch.int32),
    )
    q = torch.randn(5, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(7, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(7, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(3, 4, generator=g, dtype=torch.float64)
    options = dict(causal=True, alibi_slopes=slopes, dropout_p=0.3, seed=11)

    def f(q, k, v, sinks):
        return at.attention_varlen(q, k, v, cu_q, cu_k, sinks=sinks, **options)

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))


def test_torch_autograd_routing_seed_and_second_derivative():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    rng = np.random.default_rng(7)
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in _packed(rng, np.float64))
    cu = torch.from_numpy(CU_Q), torch.from_numpy(CU_K)
    # attn.attention_varlen hands tensors that require grad to attn.torch
    out = attn.attention_varlen(q, k, v, *cu, causal=True)
    assert out.grad_fn is not None
    out, lse = at.attention_varlen(q, k, v, *cu, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    # dropout without a seed: drawn from torch's RNG, the backward uses the same one
    torch.manual_seed(3)
    a = at.attention_varlen(q, k, v, *cu, dropout_p=0.5)
    torch.manual_seed(3)
    b = at.attention_varlen(q, k, v, *cu, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(
        a, at.attention_varlen(q, k, v, *cu, dropout_p=0.5)
    )
    (dq,) = torch.autograd.grad(a.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        dq.sum().backward()


def test_torch_autocast_casts_q_k_v():
    """Under CPU autocast q, k and v take the autocast dtype (the result equals a call on bfloat16 inputs)."""
    torch = pytest.importorskip("torch")
    import attn.torch as at

    rng = np.random.default_rng(9)
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in _packed(rng, np.float32))
    cu = torch.from_numpy(CU_Q), torch.from_numpy(CU_K)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = at.attention_varlen(q, k, v, *cu, causal=True)
    ref = at.attention_varlen(*(x.detach().bfloat16() for x in (q, k, v)), *cu, causal=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and float(q.grad.abs().sum()) > 0


# ---- errors -----------------------------------------------------------------------------------------------------


def _errors():
    i32 = lambda *x: np.array(x, np.int32)  # noqa: E731
    return [
        (
            "decreasing",
            dict(cu_seqlens_q=i32(0, 3, 1, 8)),
            ValueError,
            r"cu_seqlens_q\[2\] = 1 is below cu_seqlens_q\[1\] = 3",
        ),
        (
            "int64",
            dict(cu_seqlens_k=np.array([0, 4, 6, 11])),
            TypeError,
            "cu_seqlens_k must be int32",
        ),
        (
            "seqused_k",
            dict(seqused_k=i32(4, 9, 5)),
            ValueError,
            r"seqused_k\[1\] = 9 is outside \[0, 2\]",
        ),
        (
            "seqused_k int64",
            dict(seqused_k=np.array([1, 1, 1])),
            TypeError,
            "seqused_k must be int32",
        ),
        (
            "seqused_k shape",
            dict(seqused_k=i32(1, 1)),
            ValueError,
            r"seqused_k must be int32 \[B = 3\]",
        ),
        (
            "first",
            dict(cu_seqlens_q=i32(1, 3, 3, 8)),
            ValueError,
            r"cu_seqlens_q\[0\] = 1, must be 0",
        ),
        (
            "last",
            dict(cu_seqlens_k=i32(0, 4, 6, 10)),
            ValueError,
            r"cu_seqlens_k\[B = 3\] = 10 must equal",
        ),
        (
            "beyond",
            dict(cu_seqlens_q=i32(0, 2**31 - 1, 8, 8)),
            ValueError,
            r"cu_seqlens_q\[2\] = 8 is below",
        ),
        (
            "B",
            dict(cu_seqlens_k=i32(0, 11)),
            ValueError,
            r"cu_seqlens_q \[4\] and cu_seqlens_k \[2\]",
        ),
        (
            "2-D",
            dict(cu_seqlens_q=i32(0, 3, 3, 8)[None]),
            ValueError,
            r"cu_seqlens_q must be int32 \[B \+ 1\]",
        ),
        ("empty", dict(cu_seqlens_q=i32()), ValueError, r"cu_seqlens_q must be int32 \[B \+ 1\]"),
        ("not an array", dict(cu_seqlens_q=None), TypeError, "cu_seqlens_q must be an array"),
        (
            "max_seqlen_q",
            dict(max_seqlen_q=4),
            ValueError,
            "max_seqlen_q = 4 but sequence 2 has length 5",
        ),
        (
            "max_seqlen_k type",
            dict(max_seqlen_k="5"),
            TypeError,
            "max_seqlen_k must be an int or None",
        ),
        ("key_lengths", dict(key_lengths=i32(1, 1, 1)), ValueError, "key_lengths.*seqused_k"),
        ("mask", dict(mask=np.ones((4, 4), bool)), ValueError, "dense masks"),
        (
            "return_weights",
            dict(return_weights=True),
            ValueError,
            "return_weights is not supported",
        ),
        (
            "alibi",
            dict(alibi_slopes=np.ones((2, 4))),
            ValueError,
            r"alibi_slopes must be floating \[Hq = 4\]",
        ),
        (
            "sinks",
            dict(sinks=np.zeros(3, np.float32)),
            ValueError,
            r"sinks must be a floating vector \[Hq = 4\]",
        ),
        ("keyword", dict(causl=True), TypeError, "unexpected keyword argument 'causl'"),
        (
            "q dtype",
            dict(q=np.zeros((8, 4, 5), np.int32)),
            TypeError,
            "q must be f64, f32, bf16 or f16",
        ),
        (
            "q rank",
            dict(q=np.zeros((8, 4, 5, 1), np.float32)),
            ValueError,
            r"packed \[total, heads, dim\]",
        ),
    ]


ERRORS = _errors()


def _error_call():
    """A valid call (B = 3; sequence 1 has 2 keys, sequence 2 has 5 queries) for the error cases to spoil."""
    rng = np.random.default_rng(8)
    return dict(
        q=rng.standard_normal((8, 4, 5)).astype(np.float32),
        k=rng.standard_normal((11, 2, 5)).astype(np.float32),
        v=rng.standard_normal((11, 2, 5)).astype(np.float32),
        cu_seqlens_q=np.array([0, 3, 3, 8], np.int32),
        cu_seqlens_k=np.array([0, 4, 6, 11], np.int32),
    )


@pytest.mark.parametrize("name, change, error, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(name, change, error, message):
    call = {**_error_call(), **change}
    arrays = [call.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    with pytest.raises(error, match=message):
        attn.attention_varlen(*arrays, **call)
    out, lse = _core.attention_varlen(*_error_call().values())
    grads_call = {n: x for n, x in call.items() if n != "return_weights"}
    if name in ("return_weights", "not an array"):
        return
    with pytest.raises(error, match=message):  # the backward validates the same way
        attn.attention_varlen_backward(out, *arrays[:3], out, lse, *arrays[3:], **grads_call)


def test_errors_through_torch_autograd():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    call = {n: torch.from_numpy(x) for n, x in _error_call().items()}
    q = call.pop("q").requires_grad_()
    k, v, cu_q, cu_k = call.values()
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 1 is below cu_seqlens_q\[1\] = 3"):
        at.attention_varlen(q, k, v, torch.tensor([0, 3, 1, 8], dtype=torch.int32), cu_k)
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        at.attention_varlen(q, k, v, cu_q, cu_k.long())
    with pytest.raises(
        TypeError, match="attn.torch.attention_varlen: unexpected keyword argument 'causl'"
    ):
        at.attention_varlen(q, k, v, cu_q, cu_k, causl=True)


def test_return_lse_and_seeds_of_the_core_functions():
    call = _error_call()
    with pytest.raises(TypeError, match="return_lse is not a keyword of the packed forward"):
        _core.attention_varlen(*call.values(), return_lse=True)
    out, lse = _core.attention_varlen(*call.values(), dropout_p=0.5, seed=3)
    arrays = list(call.values())
    with pytest.raises(ValueError, match="dropout_p > 0 needs the forward's seed"):
        _core.attention_varlen_backward(out, *arrays[:3], out, lse, *arrays[3:], dropout_p=0.5)
    with pytest.raises(ValueError, match="mask_grad is not supported on a packed batch"):
        _core.attention_varlen_backward(out, *arrays[:3], out, lse, *arrays[3:], mask_grad=True)
    with pytest.raises(ValueError, match=r"lse must have shape \[4, 8\]"):
        _core.attention_varlen_backward(out, *arrays[:3], out, lse.T, *arrays[3:])
