"""attn.nn: the C++ modules with PyTorch's arguments. Finite differences in float64 (no torch needed), and
PyTorch parity (outputs, weights, input and parameter gradients from a torch module's state dict)."""

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")


def _fd_check(module, forward, inputs, name, rng, n=6, eps=1e-6):
    """d(sum(out * dout))/d(inputs[name]) from module.backward against central differences."""
    out = forward(**inputs)
    dout = rng.standard_normal(out.shape)
    grads = module.backward(dout)
    x = inputs[name]
    flat = x.reshape(-1)
    for idx in rng.choice(flat.size, size=min(n, flat.size), replace=False):
        old = flat[idx]
        flat[idx] = old + eps
        up = float(np.sum(forward(**inputs) * dout))
        flat[idx] = old - eps
        down = float(np.sum(forward(**inputs) * dout))
        flat[idx] = old
        fd = (up - down) / (2 * eps)
        got = grads[name].reshape(-1)[idx]
        assert abs(got - fd) <= 1e-6 * max(1.0, abs(fd)), f"{name}[{idx}]: {got} vs {fd}"


def test_mha_gradients_by_finite_differences(rng):
    mha = ann.MultiheadAttention(8, 2, dtype="float64")
    q = rng.standard_normal((3, 2, 8))
    kv = rng.standard_normal((5, 2, 8))
    kpm = np.array([[False, False, False, True, True], [False] * 5])
    fwd = lambda query, key: mha(query, key, key, key_padding_mask=kpm)[0]  # noqa: E731
    _fd_check(mha, fwd, {"query": q, "key": kv}, "query", rng)
    g = mha.backward(np.ones((3, 2, 8)))
    assert set(g) == {
        "query",
        "key",
        "value",
        "in_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    }
    # padded keys get no gradient
    assert np.all(g["key"][3:, 0] == 0) and np.all(g["value"][3:, 0] == 0)


def test_mha_state_dict_round_trip_and_modes(rng):
    a = ann.MultiheadAttention(8, 2, dtype=np.float64, batch_first=True)
    b = ann.MultiheadAttention(8, 2, dtype="float64", batch_first=True)
    b.load_state_dict({k: np.array(v) for k, v in a.state_dict().items()})
    x = rng.standard_normal((2, 4, 8))
    np.testing.assert_array_equal(a(x, x, x)[0], b(x, x, x)[0])
    assert a.training and not a.eval().training and a.train().training
    with pytest.raises(ValueError):
        b.load_state_dict({"in_proj_weight": np.zeros((3, 3))})
    with pytest.raises(ValueError):
        a(x[..., :5], x, x)  # wrong embedding dim
    with pytest.raises(TypeError):
        a("x", x, x)
    out, w = a(x[0], x[0], x[0])  # unbatched
    assert out.shape == (4, 8) and w.shape == (4, 4)


def test_encoder_layer_gradients_by_finite_differences(rng):
    layer = ann.TransformerEncoderLayer(8, 2, 16, dropout=0.0, dtype="float64")
    src = rng.standard_normal((4, 2, 8))
    _fd_check(layer, lambda src: layer(src), {"src": src}, "src", rng)
