"""attn.attention / attn.attention_backward against the NumPy float64 contract, for every option."""

import numpy as np
import pytest

import attn
from conftest import qkv

F64_TOL = 1e-12  # float64 round-off (DESIGN.md)


def _close(a, b, tol, what=""):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    scale = max(1.0, float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0)))
    np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b), err_msg=f"{what}: non-finite entries differ")
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


CASES = {
    "plain": {},
    "scale": {"scale": 0.37},
    "softcap": {"softcap": 1.5, "scale": 2.0},
    "causal_bottom_right": {"causal": True},
    "causal_top_left": {"causal": True, "align": "top-left"},
    "position_offset": {"causal": True, "position_offset": 1},
    "window": {"window": (2, 1)},
    "window_open_left": {"window": (None, 0)},
    "window_causal": {"window": (3, None), "causal": True},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.125])},
    "key_lengths": {"key_lengths": np.array([4, 0])},
    "block_layout": {"block_layout": np.array([[True, False, True, True], [False, True, False, True],
                                               [True, True, False, False]]), "block_size": (2, 2)},
    "dropout": {"dropout_p": 0.3, "seed": 42},
    "everything": {"causal": True, "window": (4, None), "softcap": 3.0, "alibi_slopes": np.array([0.1, 0.2, 0.3]),
                   "key_lengths": np.array([6, 7]), "dropout_p": 0.2, "seed": 7},
}


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_backward_match_contract(rng, contract, case, backend):
    q, k, v = qkv(rng, lq=5, lk=7)
    opts = CASES[case]
    out, lse, w = attn.attention(q, k, v, return_lse=True, return_weights=True, backend=backend, **opts)
    ref = contract.attention(q, k, v, **_contract_options(opts))
    _close(out, ref.out, F64_TOL, f"{case} out")
    _close(lse, ref.lse, F64_TOL, f"{case} lse")
    _close(w, ref.weights, F64_TOL, f"{case} weights")
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = attn.attention_backward(dout, q, k, v, out, lse, backend=backend, **opts)
    g = contract.attention_backward(dout, q, k, v, **_contract_options(opts))
    _close(dq, g.dq, F64_TOL, f"{case} dq")
    _close(dk, g.dk, F64_TOL, f"{case} dk")
    _close(dv, g.dv, F64_TOL, f"{case} dv")


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
    grads = attn.attention_backward(dout, q, k, v, out, lse, mask=mask, mask_type=kind, mask_grad=kind == "add")
    g = contract.attention_backward(dout, q, k, v, mask=mask, mask_type=kind)
    for name, a, b in zip(("dq", "dk", "dv"), grads, g):
        _close(a, b, F64_TOL, name)
    if kind == "add":
        assert grads[3].shape == mask_shape
        _close(grads[3], g.dmask, F64_TOL, "dmask")


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (3, 3)])
def test_gqa_and_odd_shapes(rng, contract, hq, hkv):
    q, k, v = qkv(rng, batch=(2, 1), hq=hq, hkv=hkv, lq=9, lk=4, d=5, dv=3)
    out, lse = attn.attention(q, k, v, causal=True, return_lse=True)
    ref = contract.attention(q, k, v, causal=True)
    _close(out, ref.out, F64_TOL, "out")
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = attn.attention_backward(dout, q, k, v, out, lse, causal=True)
    g = contract.attention_backward(dout, q, k, v, causal=True)
    _close(dq, g.dq, F64_TOL, "dq")
    _close(dk, g.dk, F64_TOL, "dk")
    _close(dv, g.dv, F64_TOL, "dv")


def test_fully_masked_rows_give_zeros_and_no_nan(rng, contract):
    q, k, v = qkv(rng)
    k[..., 0, :] = np.nan  # a removed key never touches the output
    mask = np.ones((5, 7), dtype=bool)
    mask[1] = False
    mask[:, 0] = False
    out, lse, w = attn.attention(q, k, v, mask=mask, return_lse=True, return_weights=True)
    assert np.all(out[..., 1, :] == 0) and np.all(w[..., 1, :] == 0) and np.all(lse[..., 1] == -np.inf)
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
    assert not np.array_equal(d, e)  # seed=None draws a fresh pattern (2^-64 chance of a false failure)
