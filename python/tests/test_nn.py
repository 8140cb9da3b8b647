"""attn.nn: the C++ modules with PyTorch's arguments. Finite differences in float64 (no torch needed), and
PyTorch parity (outputs, weights, input and parameter gradients from a torch module's state dict)."""

import numpy as np
import pytest

import attn

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
    assert set(g) == {"query", "key", "value", "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
    assert np.all(g["key"][3:, 0] == 0) and np.all(g["value"][3:, 0] == 0)  # padded keys get no gradient


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


torch = pytest.importorskip("torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped")
F64 = torch.float64
TOL = 1e-12


def _rel(a, b):
    a = torch.as_tensor(a).detach().double()
    b = torch.as_tensor(b).detach().double()
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def _check_grads(ours: dict, ref_module, named_inputs: dict):
    for name, x in named_inputs.items():
        assert _rel(ours[name], x.grad) <= TOL, f"grad {name}"
    for name, p in ref_module.named_parameters():
        assert _rel(ours[name], p.grad) <= 1e-11, f"grad {name}: {_rel(ours[name], p.grad)}"


@pytest.mark.parametrize("cfg", [{}, {"batch_first": True}, {"kdim": 5, "vdim": 7}, {"bias": False}])
@pytest.mark.parametrize("masks", ["none", "bool", "float"])
def test_mha_matches_torch(cfg, masks):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, dtype=F64, **cfg)
    ours = ann.MultiheadAttention(16, 4, dtype=F64, **cfg)
    ours.load_state_dict(ref.state_dict())
    bf = cfg.get("batch_first", False)
    L, S, N = 3, 5, 2
    shp = lambda n, d: (N, n, d) if bf else (n, N, d)  # noqa: E731
    q = torch.randn(shp(L, 16), dtype=F64, requires_grad=True)
    k = torch.randn(shp(S, cfg.get("kdim", 16)), dtype=F64, requires_grad=True)
    v = torch.randn(shp(S, cfg.get("vdim", 16)), dtype=F64, requires_grad=True)
    kw = {}
    if masks == "bool":
        kpm = torch.tensor([[False, False, True, False, True], [False] * 5])
        kw = dict(key_padding_mask=kpm, attn_mask=torch.triu(torch.ones(L, S, dtype=torch.bool), 3))
    elif masks == "float":
        kw = dict(attn_mask=torch.randn(N * 4, L, S, dtype=F64))
    r, rw = ref(q, k, v, average_attn_weights=False, **kw)
    o, ow = ours(q, k, v, average_attn_weights=False, **kw)
    assert isinstance(o, torch.Tensor)
    assert _rel(o, r) <= TOL and _rel(ow, rw) <= TOL
    dout = torch.randn_like(r)
    r.backward(dout)
    _check_grads(ours.backward(dout), ref, {"query": q, "key": k, "value": v})


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_torch(norm_first, activation, batch_first):
    torch.manual_seed(1)
    ref = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, norm_first=norm_first,
                                           batch_first=batch_first, dtype=F64)
    ours = ann.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, norm_first=norm_first,
                                       batch_first=batch_first, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    src = torch.randn((2, 5, 16) if batch_first else (5, 2, 16), dtype=F64, requires_grad=True)
    kpm = torch.tensor([[False, False, False, True, True], [False] * 5])
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=F64)
    r = ref(src, src_mask=mask, src_key_padding_mask=kpm)
    o = ours(src, src_mask=mask, src_key_padding_mask=kpm)
    assert _rel(o, r) <= TOL
    dout = torch.randn_like(r)
    r.backward(dout)
    _check_grads(ours.backward(dout), ref, {"src": src})


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first):
    torch.manual_seed(2)
    ref = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first, dtype=F64)
    ours = ann.TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    tgt = torch.randn(4, 2, 16, dtype=F64, requires_grad=True)
    memory = torch.randn(6, 2, 16, dtype=F64, requires_grad=True)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64)
    mkpm = torch.tensor([[False] * 5 + [True], [False] * 6])
    r = ref(tgt, memory, tgt_mask=tgt_mask, memory_key_padding_mask=mkpm)
    o = ours(tgt, memory, tgt_mask=tgt_mask, memory_key_padding_mask=mkpm)
    assert _rel(o, r) <= TOL
    dout = torch.randn_like(r)
    r.backward(dout)
    _check_grads(ours.backward(dout), ref, {"tgt": tgt, "memory": memory})
