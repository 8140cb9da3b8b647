"""attn.nn against PyTorch: modules loaded from torch modules' state dicts give the same outputs, weights, input
gradients and parameter gradients (float64). Skipped, with the reason, where torch is missing."""

import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import rel as _rel  # noqa: E402  (this folder's; it imports torch)

F64 = torch.float64
TOL = 1e-12


def _check_grads(ours: dict, ref_module, named_inputs: dict):
    for name, x in named_inputs.items():
        assert _rel(ours[name], x.grad) <= TOL, f"grad {name}"
    for name, p in ref_module.named_parameters():
        assert _rel(ours[name], p.grad) <= 1e-11, f"grad {name}: {_rel(ours[name], p.grad)}"


@pytest.mark.parametrize(
    "cfg", [{}, {"batch_first": True}, {"kdim": 5, "vdim": 7}, {"bias": False}]
)
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
    ref = torch.nn.TransformerEncoderLayer(
        16,
        4,
        32,
        dropout=0.0,
        activation=activation,
        norm_first=norm_first,
        batch_first=batch_first,
        dtype=F64,
    )
    ours = ann.TransformerEncoderLayer(
        16,
        4,
        32,
        dropout=0.0,
        activation=activation,
        norm_first=norm_first,
        batch_first=batch_first,
        dtype=F64,
    )
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


def _load_strict_and_compare(ref, ours, inputs: dict, call):
    """Loads ref's state dict into ours strictly (same names in the same order), then compares the output and every
    gradient (inputs and parameters) with torch's."""
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict(), strict=True)
    r, o = call(ref), call(ours)
    assert isinstance(o, torch.Tensor) and _rel(o, r) <= TOL, _rel(o, r)
    dout = torch.randn_like(r)
    r.backward(dout)
    _check_grads(ours.backward(dout), ref, inputs)


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_without_bias_load_torch_state_dict_strictly(norm_first):
    """bias=False: torch drops every bias (attention, linear1/linear2, the LayerNorms keep only weight)."""
    torch.manual_seed(3)
    kw = dict(dropout=0.0, bias=False, norm_first=norm_first, batch_first=True, dtype=F64)
    ref = torch.nn.TransformerEncoderLayer(16, 4, 32, **kw)
    # LayerNorm weights away from 1 so that a missing or extra term shows
    for p in ref.parameters():
        torch.nn.init.uniform_(p, -0.6, 0.6) if p.dim() == 2 else torch.nn.init.uniform_(
            p, 0.5, 1.5
        )
    assert not any("bias" in name for name in ref.state_dict())
    ours = ann.TransformerEncoderLayer(16, 4, 32, **kw)
    src = torch.randn(2, 5, 16, dtype=F64, requires_grad=True)
    _load_strict_and_compare(ref, ours, {"src": src}, lambda m: m(src, is_causal=False))

    ref = torch.nn.TransformerDecoderLayer(16, 4, 32, **kw)
    for p in ref.parameters():
        torch.nn.init.uniform_(p, -0.6, 0.6) if p.dim() == 2 else torch.nn.init.uniform_(
            p, 0.5, 1.5
        )
    ours = ann.TransformerDecoderLayer(16, 4, 32, **kw)
    tgt = torch.randn(2, 4, 16, dtype=F64, requires_grad=True)
    memory = torch.randn(2, 6, 16, dtype=F64, requires_grad=True)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64)
    _load_strict_and_compare(
        ref, ours, {"tgt": tgt, "memory": memory}, lambda m: m(tgt, memory, tgt_mask=tgt_mask)
    )


def _activations():
    import functools

    Fn = torch.nn.functional
    return [
        ("relu", "relu"),
        (Fn.relu, "relu"),
        (torch.relu, "relu"),
        (torch.nn.ReLU(), "relu"),
        (torch.nn.ReLU(inplace=True), "relu"),
        ("gelu", "gelu"),
        (Fn.gelu, "gelu"),
        (torch.nn.GELU(), "gelu"),
        (torch.nn.GELU(approximate="none"), "gelu"),
        (functools.partial(Fn.gelu, approximate="none"), "gelu"),
        ("gelu_tanh", "gelu_tanh"),
        (torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
        (functools.partial(Fn.gelu, approximate="tanh"), "gelu_tanh"),
        ("silu", "silu"),
        (Fn.silu, "silu"),
        (torch.nn.SiLU(), "silu"),
    ]


_TORCH_ACTIVATION = {
    "relu": lambda x: torch.nn.functional.relu(x),
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": lambda x: torch.nn.functional.silu(x),
}


@pytest.mark.parametrize("index", range(16))
@pytest.mark.parametrize("layer", ["encoder", "decoder"])
def test_activation_strings_functions_and_modules_map_exactly(index, layer):
    """Each accepted activation runs exactly torch's function: gelu's tanh approximation is not exact GELU."""
    activation, kind = _activations()[index]
    torch.manual_seed(4)
    ref_cls, our_cls = (
        (torch.nn.TransformerEncoderLayer, ann.TransformerEncoderLayer)
        if layer == "encoder"
        else (torch.nn.TransformerDecoderLayer, ann.TransformerDecoderLayer)
    )
    ref = ref_cls(8, 2, 16, dropout=0.0, activation=_TORCH_ACTIVATION[kind], dtype=F64)
    ours = our_cls(8, 2, 16, dropout=0.0, activation=activation, dtype=F64)
    x = torch.randn(5, 2, 8, dtype=F64, requires_grad=True)
    inputs = {"src": x} if layer == "encoder" else {"tgt": x}
    call = (lambda m: m(x)) if layer == "encoder" else (lambda m: m(x, x.detach() * 0.5))
    _load_strict_and_compare(ref, ours, inputs, call)


@pytest.mark.parametrize(
    "activation",
    [
        "swish",
        "Relu",
        "tanh",
        torch.tanh,
        torch.nn.Tanh(),
        torch.nn.functional.leaky_relu,
        lambda x: x,
        torch.nn.GELU(approximate="tanh").__class__,
        3,
        None,
    ],
)
def test_other_activations_are_refused_naming_the_argument(activation):
    for cls in (ann.TransformerEncoderLayer, ann.TransformerDecoderLayer):
        with pytest.raises(
            ValueError, match=rf"^attn\.nn\.{cls.__name__}: activation must be .*got "
        ):
            cls(8, 2, 16, activation=activation)


def test_activation_subclass_and_partial_with_other_arguments_are_refused():
    import functools

    class MyReLU(torch.nn.ReLU):
        def forward(self, x):
            return super().forward(x) * 2

    for activation in (
        MyReLU(),
        functools.partial(torch.nn.functional.gelu, approximate="sigmoid"),
        functools.partial(torch.nn.functional.gelu, torch.ones(1)),
    ):
        with pytest.raises(ValueError, match="activation"):
            ann.TransformerEncoderLayer(8, 2, 16, activation=activation)
