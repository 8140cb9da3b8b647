"""attn.nn against PyTorch: modules loaded from torch modules' state dicts give the same outputs, weights, input
gradients and parameter gradients (float64). Skipped, with the reason, where torch is missing."""

import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
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
