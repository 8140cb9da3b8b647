"""attn.linear_attention / linear_attention_backward: the formula in NumPy (float64), gradients against
torch.autograd through the same formula, the caller's array type, and errors naming the argument."""

import numpy as np
import pytest

import attn


def phi(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0))) + 1.0


def used_keys(B, Lq, Lk, causal, align, key_lengths, key_keep):
    """[B, Lq, Lk] bool: key j is in K(i) of batch b."""
    used = np.ones((B, Lq, Lk), bool)
    if key_lengths is not None:
        used &= (np.arange(Lk)[None, :] < np.asarray(key_lengths)[:, None])[:, None, :]
    if key_keep is not None:
        used &= np.asarray(key_keep, bool)[:, None, :]
    if causal:
        offset = Lk - Lq if align == "bottom-right" else 0
        used &= (np.arange(Lk)[None, :] <= np.arange(Lq)[:, None] + offset)[None]
    return used


def formula(q, k, v, causal=False, align="bottom-right", key_lengths=None, key_keep=None):
    B, Hq, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    w = np.einsum("bhid,bhjd->bhij", phi(q), phi(kk))
    w = w * used_keys(B, Lq, Lk, causal, align, key_lengths, key_keep)[:, None]
    den = w.sum(-1, keepdims=True)
    return np.where(den > 0, np.einsum("bhij,bhjc->bhic", w, vv) / np.where(den > 0, den, 1.0), 0.0)


def problem(B, Hq, Hkv, Lq, Lk, D, Dv, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.uniform(-2, 2, s).astype(dtype)
        for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv))
    ]


PADDING = [
    {},
    {"key_lengths": np.array([4, 0], np.int64)},
    {"key_keep": np.array([[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1]], bool)},
]


@pytest.mark.parametrize("Lq", [4, 6, 9])
@pytest.mark.parametrize(
    "causal,align", [(False, "bottom-right"), (True, "bottom-right"), (True, "top-left")]
)
@pytest.mark.parametrize("padding", PADDING)
def test_matches_the_formula(Lq, causal, align, padding):
    q, k, v = problem(2, 4, 2, Lq, 6, 3, 5)
    out = attn.linear_attention(q, k, v, causal=causal, align=align, **padding)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (2, 4, Lq, 5)
    expect = formula(q, k, v, causal, align, **padding)
    assert np.abs(out - expect).max() <= 1e-12 * np.abs(expect).max()
    if "key_lengths" in padding:  # batch 1 has no key: zeros
        assert not out[1].any()
    out32 = attn.linear_attention(
        *(t.astype(np.float32) for t in (q, k, v)), causal=causal, align=align, **padding
    )
    assert out32.dtype == np.float32
    assert np.abs(out32 - expect).max() <= 1e-6 * np.abs(expect).max()


@pytest.mark.parametrize(
    "causal,align", [(False, "bottom-right"), (True, "bottom-right"), (True, "top-left")]
)
@pytest.mark.parametrize("padding", PADDING)
def test_backward_matches_torch_autograd(causal, align, padding):
    torch = pytest.importorskip("torch")
    q, k, v = problem(2, 4, 2, 5, 6, 3, 4, seed=1)
    dout = np.random.default_rng(2).standard_normal((2, 4, 5, 4))
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))

    def tphi(x):
        return torch.where(x > 0, x, torch.expm1(torch.clamp(x, max=0))) + 1.0

    used = torch.tensor(
        used_keys(2, 5, 6, causal, align, padding.get("key_lengths"), padding.get("key_keep"))
    )
    w = torch.einsum("bhid,bhjd->bhij", tphi(tq), tphi(tk.repeat_interleave(2, 1))) * used[:, None]
    den = w.sum(-1, keepdim=True)
    out = torch.where(den > 0, w @ tv.repeat_interleave(2, 1) / torch.where(den > 0, den, 1.0), 0.0)
    out.backward(torch.tensor(dout))
    grads = attn.linear_attention_backward(dout, q, k, v, causal=causal, align=align, **padding)
    assert len(grads) == 3
    for g, t in zip(grads, (tq, tk, tv)):
        expect = t.grad.numpy()
        assert g.shape == expect.shape
        assert np.abs(g - expect).max() <= 1e-12 * np.abs(expect).max()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(t) for t in problem(1, 2, 1, 3, 4, 2, 2, np.float32))
    out = attn.linear_attention(
        q, k, v, causal=True, key_keep=torch.tensor([[True, False, True, True]])
    )
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    dq, dk, dv = attn.linear_attention_backward(torch.ones_like(out), q, k, v, causal=True)
    assert isinstance(dk, torch.Tensor) and dk.shape == k.shape


def test_errors_name_the_argument():
    q, k, v = problem(2, 4, 2, 3, 6, 5, 7)
    with pytest.raises(
        ValueError, match=r"attn::linear_attention: the query heads \(4\) must be a multiple"
    ):
        attn.linear_attention(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1))
    with pytest.raises(
        ValueError, match=r"key_keep must be bool \[B = 2, Lk = 6\], got bool with shape \[2, 5\]"
    ):
        attn.linear_attention(q, k, v, key_keep=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match=r"key_lengths\[1\] = 7 is outside \[0, Lk = 6\]"):
        attn.linear_attention(q, k, v, key_lengths=np.array([1, 7]))
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        attn.linear_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"q must be f32 or f64, got f16"):
        attn.linear_attention(q.astype(np.float16), k, v)
    with pytest.raises(
        ValueError, match=r"attn::linear_attention_backward: dout must be f64 \[2, 4, 3, 7\]"
    ):
        attn.linear_attention_backward(np.ones((2, 4, 3, 5)), q, k, v)
    with pytest.raises(ValueError, match="unknown alignment 'middle'"):
        attn.linear_attention(q, k, v, causal=True, align="middle")
    with pytest.raises(TypeError, match="attn.linear_attention: key_lengths must be"):
        attn.linear_attention(q, k, v, key_lengths="3")
