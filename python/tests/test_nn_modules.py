"""attn.nn's building blocks (Linear, LayerNorm, Embedding, ReLU/GELU/SiLU, Dropout), TransformerEncoder/Decoder and
save/load of safetensors, against their torch counterparts: outputs, input gradients and parameter gradients
(float64 to 1e-12, float32 to 1e-5) from modules loaded with the torch modules' state dicts. Skipped, with the
reason, where torch is missing."""

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import rel as _rel  # noqa: E402  (this folder's; it imports torch)

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
DTYPES = [torch.float64, torch.float32]


def _check(ours_out, ref_out, ours_grads, ref_module, inputs, tol):
    assert isinstance(ours_out, torch.Tensor)
    assert _rel(ours_out, ref_out) <= tol, "output"
    for name, x in inputs.items():
        assert _rel(ours_grads[name], x.grad) <= tol, (
            f"grad {name}: {_rel(ours_grads[name], x.grad)}"
        )
    names = {n for n, _ in ref_module.named_parameters()}
    assert set(ours_grads) == names | set(inputs)
    for name, p in ref_module.named_parameters():
        assert _rel(ours_grads[name], p.grad) <= tol, (
            f"grad {name}: {_rel(ours_grads[name], p.grad)}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(dtype, bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 5, bias=bias, dtype=dtype)
    ours = ann.Linear(6, 5, bias=bias, dtype=dtype)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 6, dtype=dtype, requires_grad=True)
    r = ref(x)
    o = ours(x)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(o, r, ours.backward(dout), ref, {"input": x}, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [{}, {"bias": False}, {"elementwise_affine": False}, {"eps": 1e-3}])
def test_layer_norm_matches_torch(dtype, cfg):
    torch.manual_seed(1)
    ref = torch.nn.LayerNorm(8, dtype=dtype, **cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p))
    ours = ann.LayerNorm(8, dtype=dtype, **cfg)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = (3 * torch.randn(4, 2, 8, dtype=dtype) + 1).requires_grad_()
    r = ref(x)
    o = ours(x)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(o, r, ours.backward(dout), ref, {"input": x}, TOL[dtype])


def test_layer_norm_normalized_shape_argument():
    assert ann.LayerNorm((8,)).normalized_shape == (8,)
    with pytest.raises(ValueError, match="normalized_shape"):
        ann.LayerNorm((2, 8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_matches_torch(dtype, padding_idx):
    torch.manual_seed(2)
    ref = torch.nn.Embedding(10, 4, padding_idx=padding_idx, dtype=dtype)
    ours = ann.Embedding(10, 4, padding_idx=padding_idx, dtype=dtype)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    ids = torch.tensor([[1, 2, 3, 2], [9, 0, 1, 1]])
    r = ref(ids)
    o = ours(ids)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(o, r, ours.backward(dout), ref, {}, TOL[dtype])
    # NumPy ids give NumPy outputs.
    assert isinstance(ours(ids.numpy()), np.ndarray)


def test_embedding_padding_idx_argument():
    with pytest.raises(ValueError, match="padding_idx"):
        ann.Embedding(10, 4, padding_idx=10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activations_match_torch(dtype, kind):
    ours, ref = {
        "relu": (ann.ReLU(), torch.nn.ReLU()),
        "gelu": (ann.GELU(), torch.nn.GELU()),
        "gelu_tanh": (ann.GELU("tanh"), torch.nn.GELU("tanh")),
        "silu": (ann.SiLU(), torch.nn.SiLU()),
    }[kind]
    torch.manual_seed(7)
    x = (2 * torch.randn(3, 4, 5, dtype=dtype)).requires_grad_()
    r = ref(x)
    o = ours(x)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(o, r, ours.backward(dout), ref, {"input": x}, TOL[dtype])
    with pytest.raises(ValueError, match="approximate"):
        ann.GELU("erf")


def test_dropout():
    x = torch.randn(200, 50, dtype=torch.float64) + 3.0
    d = ann.Dropout(0.25)
    d.manual_seed(1)
    y = d(x)
    keep = y != 0
    assert abs(float(keep.double().mean()) - 0.75) < 0.02
    assert _rel(y[keep], x[keep] / 0.75) <= 1e-12
    g = torch.randn_like(x)
    assert _rel(d.backward(g)["input"], torch.where(keep, g / 0.75, 0.0)) <= 1e-12
    d.manual_seed(1)
    assert torch.equal(d(x), y)
    assert torch.equal(d.eval()(x), x) and not d.training
    with pytest.raises(ValueError, match="p must be"):
        ann.Dropout(1.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("from_torch", [False, True])
def test_transformer_encoder_matches_torch(dtype, final_norm, from_torch):
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", dtype=dtype)
    norm = torch.nn.LayerNorm(16, dtype=dtype) if final_norm else None
    ref = torch.nn.TransformerEncoder(layer, 2, norm=norm, enable_nested_tensor=False)
    with torch.no_grad():  # distinct layers, non-trivial norms
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if from_torch:
        ours = ann.TransformerEncoder(layer, 2, norm=norm)
    else:
        ours = ann.TransformerEncoder(
            ann.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", dtype=dtype),
            2,
            norm=ann.LayerNorm(16, dtype=dtype) if final_norm else None,
        )
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 2, 16, dtype=dtype, requires_grad=True)
    kpm = torch.tensor([[False, False, False, True, True], [False] * 5])
    r = ref(x, src_key_padding_mask=kpm)
    o = ours(x, src_key_padding_mask=kpm)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(
        o,
        r,
        ours.backward(dout),
        ref,
        {"src": x},
        TOL[dtype] * (10 if dtype == torch.float32 else 1),
    )


def test_transformer_encoder_copies_the_layer():
    torch.manual_seed(4)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, dtype=torch.float64)
    ref = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    ours = ann.TransformerEncoder(layer, 3)
    sd = ours.state_dict()
    for k, v in ref.state_dict().items():
        assert _rel(sd[k], v) == 0.0, k
    x = torch.randn(4, 1, 8, dtype=torch.float64)
    assert _rel(ours(x), ref(x)) <= 1e-12


def test_transformer_encoder_arguments():
    layer = ann.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    with pytest.raises(TypeError, match="encoder_layer"):
        ann.TransformerEncoder(object(), 2)
    with pytest.raises(ValueError, match="norm"):
        ann.TransformerEncoder(layer, 2, norm=ann.LayerNorm(8, eps=1e-3))


@pytest.mark.parametrize(
    "site",
    ["attention_dropout", "activation_dropout", "attention_output_dropout", "ffn_output_dropout"],
)
def test_dropout_sites_reach_layers_and_the_stacks_built_from_them(site):
    # dropout=0 elsewhere: training differs from eval only through the site, in the layer and in the stacks.
    x, mem = torch.randn(5, 2, 8), torch.randn(3, 2, 8)
    for cls, stack in (
        (ann.TransformerEncoderLayer, ann.TransformerEncoder),
        (ann.TransformerDecoderLayer, ann.TransformerDecoder),
    ):
        args = (x,) if cls is ann.TransformerEncoderLayer else (x, mem)
        for module in (layer := cls(8, 2, 16, dropout=0.0, **{site: 0.5}), stack(layer, 2)):
            ref = module.eval()(*args)
            assert not torch.equal(module.train()(*args), ref), (
                cls.__name__,
                type(module).__name__,
            )
        quiet = cls(8, 2, 16, dropout=0.0)
        assert torch.equal(quiet.train()(*args), quiet.eval()(*args))
    with pytest.raises(ValueError, match=f"{site} must be in \\[0, 1\\), got 1"):
        ann.TransformerEncoderLayer(8, 2, 16, **{site: 1.0})
    with pytest.raises(TypeError, match="unexpected keyword argument.*attention_drop"):
        ann.TransformerDecoderLayer(8, 2, 16, attention_drop=0.1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("from_torch", [False, True])
def test_transformer_decoder_matches_torch(dtype, final_norm, from_torch):
    torch.manual_seed(6)
    layer = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=True, dtype=dtype)
    norm = torch.nn.LayerNorm(16, dtype=dtype) if final_norm else None
    ref = torch.nn.TransformerDecoder(layer, 2, norm=norm)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if from_torch:
        ours = ann.TransformerDecoder(layer, 2, norm=norm)
    else:
        ours = ann.TransformerDecoder(
            ann.TransformerDecoderLayer(16, 4, 32, dropout=0.0, norm_first=True, dtype=dtype),
            2,
            norm=ann.LayerNorm(16, dtype=dtype) if final_norm else None,
        )
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    tgt = torch.randn(4, 2, 16, dtype=dtype, requires_grad=True)
    mem = torch.randn(5, 2, 16, dtype=dtype, requires_grad=True)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=dtype)
    mkpm = torch.tensor([[False, False, False, False, True], [False] * 5])
    r = ref(tgt, mem, tgt_mask=causal, memory_key_padding_mask=mkpm)
    o = ours(tgt, mem, tgt_mask=causal, memory_key_padding_mask=mkpm)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check(
        o,
        r,
        ours.backward(dout),
        ref,
        {"tgt": tgt, "memory": mem},
        TOL[dtype] * (10 if dtype == torch.float32 else 1),
    )


def test_transformer_decoder_arguments():
    with pytest.raises(TypeError, match="decoder_layer"):
        ann.TransformerDecoder(ann.TransformerEncoderLayer(8, 2, 16), 2)


def _modules(dtype):
    return {
        "linear": lambda: ann.Linear(6, 5, dtype=dtype),
        "layer_norm": lambda: ann.LayerNorm(6, dtype=dtype),
        "embedding": lambda: ann.Embedding(10, 6, dtype=dtype),
        "encoder": lambda: ann.TransformerEncoder(
            ann.TransformerEncoderLayer(8, 2, 16, dtype=dtype),
            2,
            norm=ann.LayerNorm(8, dtype=dtype),
        ),
        "decoder": lambda: ann.TransformerDecoder(
            ann.TransformerDecoderLayer(8, 2, 16, dtype=dtype), 2
        ),
        "mha": lambda: ann.MultiheadAttention(8, 2, dtype=dtype),
    }


@pytest.mark.parametrize("name", ["linear", "layer_norm", "embedding", "encoder", "decoder", "mha"])
def test_save_load_round_trip(tmp_path, name):
    safetensors_torch = pytest.importorskip(
        "safetensors.torch", reason="safetensors is not installed"
    )
    make = _modules("float64")[name]
    torch.manual_seed(5)
    a = make()
    with torch.no_grad():
        a.load_state_dict(
            {k: torch.randn(np.shape(v), dtype=torch.float64) for k, v in a.state_dict().items()}
        )
    path = tmp_path / f"{name}.safetensors"
    a.save(path, metadata={"name": name})
    b = make()
    b.load(path)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])), k
    # The file is torch's: safetensors reads it as the state dict, and a file written by torch loads.
    loaded = safetensors_torch.load_file(str(path))
    assert set(loaded) == set(sa)
    for k in sa:
        assert np.array_equal(loaded[k].numpy(), np.asarray(sa[k])), k
    other = {k: torch.randn(np.shape(v), dtype=torch.float64) for k, v in sa.items()}
    safetensors_torch.save_file(other, str(tmp_path / "other.safetensors"))
    b.load(tmp_path / "other.safetensors")
    for k, v in b.state_dict().items():
        assert np.array_equal(np.asarray(v), other[k].numpy()), k


def test_load_strict(tmp_path):
    safetensors_torch = pytest.importorskip(
        "safetensors.torch", reason="safetensors is not installed"
    )
    path = tmp_path / "partial.safetensors"
    safetensors_torch.save_file({"weight": torch.zeros(5, 6)}, str(path))
    lin = ann.Linear(6, 5)
    with pytest.raises(ValueError, match="bias"):
        lin.load(path)
    lin.load(path, strict=False)
    assert np.all(np.asarray(lin.state_dict()["weight"]) == 0)
