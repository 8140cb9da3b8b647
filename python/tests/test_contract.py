"""attn.attention / attn.attention_backward against the NumPy float64 contract, for every option: the conformance
cases of tests/cases/attention_cases.txt (conformance_cases.py) on the reference and cpu backends, and masks of
every broadcast shape, fully masked rows, dtypes and dropout seeds."""

import math

import conformance_cases
import numpy as np
import pytest
from conftest import qkv

import attn

F64_TOL = 1e-12  # float64 round-off (DESIGN.md)


def _close(a, b, tol, what="", floor=1.0):
    """max |a - b| / max(floor, max |b|) <= tol over the finite entries; the non-finite ones equal."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    scale = max(floor, float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0))) or 1.0
    np.testing.assert_array_equal(
        np.isfinite(a), np.isfinite(b), err_msg=f"{what}: non-finite entries differ"
    )
    fin = np.isfinite(b)
    np.testing.assert_array_equal(a[~fin], b[~fin], err_msg=what)
    err = float(np.max(np.abs(a[fin] - b[fin]), initial=0.0)) / scale
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


def _contract_options(opts):
    """attn.attention's keywords -> contract_numpy's (window pair with -1, block_q/block_k, seed 0 default)."""
    c = dict(opts)
    if c.get("window") is not None:
        c["window"] = tuple(-1 if w is None else w for w in c["window"])
    else:
        c.pop("window", None)
    if "block_size" in c:
        bs = c.pop("block_size")
        c["block_q"], c["block_k"] = (bs, bs) if isinstance(bs, int) else bs
    if c.get("seed") is None:
        c["seed"] = 0
    return c


def _mask(rng, shape, kind):
    if kind == "add":
        m = rng.standard_normal(shape)
        m[rng.random(shape) < 0.2] = -np.inf
        return m
    return rng.random(shape) < (0.7 if kind == "keep" else 0.3)


# attn's own option that the conformance cases (tests/cases/attention_cases.txt, below) do not hold: the naive C++
# implementation has no position_offset.
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_position_offset_matches_contract(rng, contract, backend):
    q, k, v = qkv(rng, lq=5, lk=7)
    opts = {"causal": True, "position_offset": 1}
    out, lse, w = attn.attention(
        q, k, v, return_lse=True, return_weights=True, backend=backend, **opts
    )
    ref = contract.attention(q, k, v, **opts)
    _close(out, ref.out, F64_TOL, "out")
    _close(lse, ref.lse, F64_TOL, "lse")
    _close(w, ref.weights, F64_TOL, "weights")
    dout = rng.standard_normal(out.shape)
    grads = attn.attention_backward(dout, q, k, v, out, lse, backend=backend, **opts)
    for name, a, b in zip(
        ("dq", "dk", "dv"), grads, contract.attention_backward(dout, q, k, v, **opts)
    ):
        _close(a, b, F64_TOL, name)


def _bf16(x):
    torch = pytest.importorskip(
        "torch", reason="bf16 cases run through torch.bfloat16, and PyTorch is not installed"
    )
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)


def _to64(x):
    return np.asarray(x.float() if hasattr(x, "float") else x, dtype=np.float64)


# (convert from float64 NumPy, forward bound, lse bound, gradient bound) per (backend, case dtype): the reference
# computes in double (f64 values, float64 round-off); the cpu backend at DESIGN.md's f32 bounds, and for bf16 at the
# bf16 output quantum 2^-7 (tests/cpu/cpu_test_util.h's forward bound) with gradients at 2^-6: they are rounded to
# bf16 (2^-9 relative) after products of P and dS that the avx512bf16 kernels also round to bf16.
_RUNS = {
    ("reference", "f32"): (lambda x: x, F64_TOL, F64_TOL, F64_TOL),
    ("reference", "bf16"): (lambda x: x, F64_TOL, F64_TOL, F64_TOL),
    ("cpu", "f32"): (lambda x: x.astype(np.float32), 1e-6, 1e-6, 1e-5),
    ("cpu", "bf16"): (_bf16, 2.0**-7, 1e-5, 2.0**-6),
}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", conformance_cases.CASES, ids=lambda c: c.name)
def test_conformance_case_matches_contract(contract, case, backend):
    """Each conformance case through attn.attention / attn.attention_backward against the NumPy contract on the same
    (rounded) values. Errors are relative to max |contract|, the gradients' to at least the size of the terms they
    sum (as tests/cpu/cpu_test_util.h's grad_error: rows with one key cancel exactly)."""
    convert, tol_fwd, tol_lse, tol_grad = _RUNS[(backend, case.spec["dtype"])]
    q, k, v, opts = case.inputs(convert)
    what = f"{case.name} ({case.describe()}) on {backend}"
    out, lse, w = attn.attention(
        q, k, v, return_lse=True, return_weights=True, backend=backend, **opts
    )
    q64, k64, v64 = _to64(q), _to64(k), _to64(v)
    ref = contract.attention(q64, k64, v64, **_contract_options(opts))
    _close(_to64(out), ref.out, tol_fwd, f"{what}: out", floor=0.0)
    _close(_to64(lse), ref.lse, tol_lse, f"{what}: lse", floor=0.0)
    _close(_to64(w), ref.weights, tol_fwd, f"{what}: weights", floor=0.0)

    dout = convert(np.random.default_rng(case.seed + 99).uniform(-1, 1, ref.out.shape))
    add = opts.get("mask_type") == "add"
    grads = attn.attention_backward(dout, q, k, v, out, lse, backend=backend, mask_grad=add, **opts)
    g = contract.attention_backward(_to64(dout), q64, k64, v64, **_contract_options(opts))
    terms = float(np.max(np.abs(_to64(dout)), initial=0.0)) * float(
        np.max(np.abs(v64), initial=0.0)
    )
    scale = opts.get("scale", 1.0 / math.sqrt(case.spec["d"]))
    floors = {
        "dq": abs(scale) * float(np.max(np.abs(k64), initial=0.0)) * terms,
        "dk": abs(scale) * float(np.max(np.abs(q64), initial=0.0)) * terms,
        "dv": 0.0,
        "dmask": terms,
    }
    for name, got, want in zip(("dq", "dk", "dv", "dmask"), grads, g):
        if name == "dmask" and not add:
            continue
        _close(_to64(got), want, tol_grad, f"{what}: {name}", floor=floors[name])


@pytest.mark.parametrize("kind", ["keep", "drop", "add"])
@pytest.mark.parametrize("mask_shape", [(7,), (5, 7), (3, 1, 7), (2, 3, 5, 7), (2, 1, 1, 7)])
def test_masks_match_contract(rng, contract, kind, mask_shape):
    q, k, v = qkv(rng, lq=5, lk=7)
    mask = _mask(rng, mask_shape, kind)
    out, lse = attn.attention(q, k, v, mask=mask, mask_type=kind, return_lse=True)
    ref = contract.attention(q, k, v, mask=mask, mask_type=kind)
    _close(out, ref.out, F64_TOL, "out")
    _close(lse, ref.lse, F64_TOL, "lse")
    dout = rng.standard_normal(out.shape)
    grads = attn.attention_backward(
        dout, q, k, v, out, lse, mask=mask, mask_type=kind, mask_grad=kind == "add"
    )
    g = contract.attention_backward(dout, q, k, v, mask=mask, mask_type=kind)
    for name, a, b in zip(("dq", "dk", "dv"), grads, g):
        _close(a, b, F64_TOL, name)
    if kind == "add":
        assert grads[3].shape == mask_shape
        _close(grads[3], g.dmask, F64_TOL, "dmask")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize(
    "opts",
    [
        dict(causal=True),
        dict(
            causal=True, softcap=3.0, scale=0.4, dropout_p=0.25, seed=9
        ),  # the weights are before dropout
        dict(
            window=(2, 1),
            alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0]),
            key_lengths=np.array([6, 4]),
        ),
        dict(dropout_p=1.0, seed=2),  # every weight dropped: only the weights' part remains
    ],
)
def test_weights_gradient_matches_contract(rng, contract, opts, backend):
    """dweights = dL/dweights folded into dq, dk and d(add mask) by attention_backward, with GQA and an add mask
    broadcast over heads that takes a gradient; backend='cpu' too (such a call runs on the reference)."""
    q, k, v = qkv(rng, hq=4, hkv=2, lq=5, lk=7)
    opts = dict(opts, mask=_mask(rng, (2, 1, 5, 7), "add"), mask_type="add")
    out, lse, w = attn.attention(q, k, v, return_lse=True, return_weights=True, **opts)
    dout, dw = rng.standard_normal(out.shape), rng.standard_normal(w.shape)
    grads = attn.attention_backward(
        dout, q, k, v, out, lse, dweights=dw, mask_grad=True, backend=backend, **opts
    )
    want = contract.attention_backward(dout, q, k, v, dweights=dw, **_contract_options(opts))
    for name, got, ref in zip(("dq", "dk", "dv", "dmask"), grads, want):
        _close(got, ref, F64_TOL, name)
    # The weights' part is there: without dweights dq is out's part alone.
    alone = contract.attention_backward(dout, q, k, v, **_contract_options(opts))
    assert np.abs(grads[0] - alone.dq).max() > 1e-3


def test_weights_gradient_is_checked(rng):
    q, k, v = qkv(rng)
    out, lse = attn.attention(q, k, v, return_lse=True)
    dout = np.ones_like(out)
    with pytest.raises(ValueError, match="dweights must be floating with the weights' shape"):
        attn.attention_backward(dout, q, k, v, out, lse, dweights=np.ones((2, 3, 5, 6)))
    with pytest.raises(TypeError, match="dweights"):
        attn.attention_backward(dout, q, k, v, out, lse, dweights=np.ones((2, 3, 5, 7), dtype=int))
    with pytest.raises(
        TypeError
    ):  # keyword-only: an array of the backward, after the positional ones
        attn._core.attention_backward(dout, q, k, v, out, lse, np.ones((2, 3, 5, 7)))
    # Not given (or None): out's gradient alone.
    plain = attn.attention_backward(dout, q, k, v, out, lse)
    for a, b in zip(plain, attn.attention_backward(dout, q, k, v, out, lse, dweights=None)):
        np.testing.assert_array_equal(a, b)


def test_fully_masked_rows_give_zeros_and_no_nan(rng, contract):
    q, k, v = qkv(rng)
    k[..., 0, :] = np.nan  # a removed key never touches the output
    mask = np.ones((5, 7), dtype=bool)
    mask[1] = False
    mask[:, 0] = False
    out, lse, w = attn.attention(q, k, v, mask=mask, return_lse=True, return_weights=True)
    assert (
        np.all(out[..., 1, :] == 0) and np.all(w[..., 1, :] == 0) and np.all(lse[..., 1] == -np.inf)
    )
    assert np.all(np.isfinite(out))
    dq, dk, dv = attn.attention_backward(np.ones_like(out), q, k, v, out, lse, mask=mask)
    assert np.all(dq[..., 1, :] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_weights_rows_sum_to_one_and_empty_keys(rng):
    q, k, v = qkv(rng)
    _, w = attn.attention(q, k, v, return_weights=True, causal=True)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-14)
    out, lse = attn.attention(q, k[..., :0, :], v[..., :0, :], return_lse=True)
    assert out.shape == (2, 3, 5, 8) and np.all(out == 0) and np.all(lse == -np.inf)


def test_float32_and_float16_against_float64_contract(rng, contract):
    q, k, v = qkv(rng, lq=6, lk=11)
    ref = contract.attention(q, k, v, causal=True)
    for dtype, tol in ((np.float32, 1e-6), (np.float16, 2e-3)):
        qd, kd, vd = (x.astype(dtype) for x in (q, k, v))
        out = attn.attention(qd, kd, vd, causal=True)
        assert out.dtype == dtype
        # Compare with the contract evaluated on the rounded inputs: only the compute precision differs.
        r = contract.attention(qd, kd, vd, causal=True).out
        _close(out, r, tol, f"{dtype.__name__} out")
    assert ref.out.dtype == np.float64


def test_dropout_seed_is_reproducible_and_fresh_without_seed(rng):
    q, k, v = qkv(rng)
    a = attn.attention(q, k, v, dropout_p=0.5, seed=3)
    b = attn.attention(q, k, v, dropout_p=0.5, seed=3)
    c = attn.attention(q, k, v, dropout_p=0.5, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    d = attn.attention(q, k, v, dropout_p=0.5)
    e = attn.attention(q, k, v, dropout_p=0.5)
    # seed=None draws a fresh pattern (2^-64 chance of a false failure)
    assert not np.array_equal(d, e)
