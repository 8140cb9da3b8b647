"""attn against PyTorch: scaled_dot_product_attention forward and gradients, torch.autograd.gradcheck of the
autograd Functions, and the drop-in MultiheadAttention. Skipped, with the reason, where torch is missing."""

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch comparisons are skipped"
)
F = torch.nn.functional

import attn  # noqa: E402
import attn.torch as at  # noqa: E402

F64 = dict(dtype=torch.float64)
TOL = 1e-12  # float64 round-off


def _max_rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def _inputs(shape_q, shape_k, shape_v, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=g, **F64).requires_grad_(grad) for s in (shape_q, shape_k, shape_v)
    ]


def _compare_sdpa(q, k, v, **kw):
    """Forward and gradients (q, k, v and a float mask) of attn.torch's SDPA against torch's, in float64."""
    mask = kw.get("attn_mask")
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    out = at.scaled_dot_product_attention(q, k, v, **kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert _max_rel(out, ref) <= TOL
    # The array-level function (no autograd) agrees too.
    plain = attn.scaled_dot_product_attention(
        q.detach(),
        k.detach(),
        v.detach(),
        **{n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()},
    )
    assert isinstance(plain, torch.Tensor) and _max_rel(plain, ref) <= TOL
    dout = torch.randn_like(ref)
    wrt = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    g_ref = torch.autograd.grad(ref, wrt, dout)
    g = torch.autograd.grad(out, wrt, dout)
    for name, a, b in zip(("dq", "dk", "dv", "dmask"), g, g_ref):
        assert a.shape == b.shape, name
        assert _max_rel(a, b) <= TOL, f"{name}: {_max_rel(a, b)}"


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)),  # Lq != Lk, Dv != D
        ((4, 5, 8), (4, 7, 8), (4, 7, 8)),  # 3-D
        ((5, 8), (7, 8), (7, 4)),  # 2-D
        ((2, 2, 3, 5, 8), (2, 2, 3, 7, 8), (2, 2, 3, 7, 8)),  # two batch dims
    ],
)
def test_sdpa_plain_causal_scale(shapes):
    q, k, v = _inputs(*shapes)
    _compare_sdpa(q, k, v)
    _compare_sdpa(q, k, v, is_causal=True)
    _compare_sdpa(q, k, v, scale=0.3)
    _compare_sdpa(q, k, v, is_causal=True, scale=1.7)


def test_sdpa_zero_and_negative_scale_and_dropout_one():
    """torch accepts any finite scale (0: uniform weights; < 0: flipped scores) and dropout_p = 1 (zeros, zero
    gradients); attn used to refuse all three."""
    q, k, v = _inputs((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6))
    for scale in (0.0, -0.8):
        _compare_sdpa(q, k, v, scale=scale)
        _compare_sdpa(q, k, v, is_causal=True, scale=scale)
    out = at.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad, torch.zeros_like(t))
    assert torch.equal(
        attn.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), dropout_p=1.0),
        torch.zeros(2, 3, 5, 6, dtype=q.dtype),
    )


@pytest.mark.parametrize("mask_shape", [(5, 7), (3, 5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (1, 7)])
def test_sdpa_bool_and_float_masks(mask_shape):
    q, k, v = _inputs((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8))
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(mask_shape, generator=g) < 0.7
    keep[..., 0] = True  # torch's float path gives NaN on rows with no key; keep every row alive
    _compare_sdpa(q, k, v, attn_mask=keep)
    add = (
        torch.randn(mask_shape, generator=g, **F64)
        .masked_fill(~keep, float("-inf"))
        .requires_grad_(True)
    )
    _compare_sdpa(q, k, v, attn_mask=add)


def test_sdpa_gqa_and_broadcast():
    q, k, v = _inputs((2, 6, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8))
    _compare_sdpa(q, k, v, enable_gqa=True)
    _compare_sdpa(q, k, v, enable_gqa=True, is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        at.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="enable_gqa"):
        attn.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    q1, k1, v1 = _inputs((2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8))
    _compare_sdpa(q1, k1, v1)  # a single kv head broadcasts in torch (multi-query)
    q2, k2, v2 = _inputs((3, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8))
    _compare_sdpa(q2, k2, v2)  # leading dims broadcast


def test_sdpa_strided_inputs():
    g = torch.Generator().manual_seed(3)
    # [B, L, H, D] -> transposed view [B, H, L, D]
    base_q = torch.randn(2, 5, 3, 8, generator=g, **F64)
    base_k = torch.randn(2, 3, 7, 16, generator=g, **F64)
    base_v = torch.randn(2, 7, 3, 8, generator=g, **F64)
    q = base_q.transpose(1, 2).requires_grad_(False)
    k = base_k[..., ::2]  # last dim stride 2: copied
    v = base_v.transpose(1, 2)
    for x in (q, k, v):
        assert not x.is_contiguous()
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    _compare_sdpa(q, k, v, is_causal=True)


def test_sdpa_fully_masked_rows_are_zero_with_zero_gradients():
    q, k, v = _inputs((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8))
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[2] = False
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.all(out[:, :, 2] == 0) and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.all(q.grad[:, :, 2] == 0) and torch.isfinite(k.grad).all()


def test_sdpa_errors():
    q, k, v = _inputs((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), grad=False)
    with pytest.raises(ValueError, match="is_causal"):
        attn.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool), is_causal=True
        )
    # batch 3 against 2 does not broadcast (k[0] of another rank would: torch's rule)
    with pytest.raises(ValueError):
        attn.scaled_dot_product_attention(q, torch.cat([k, k[:1]]), torch.cat([v, v[:1]]))
    with pytest.raises(ValueError, match="CPU|meta"):
        attn.scaled_dot_product_attention(q.to("meta"), k, v)
    with pytest.raises(TypeError, match="must be f64, f32, bf16 or f16"):
        attn.scaled_dot_product_attention(q.to(torch.int32), k.to(torch.int32), v.to(torch.int32))


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)]
)
def test_low_precision_dtypes_come_back_as_torch(dtype, tol):
    q, k, v = _inputs((2, 3, 5, 16), (2, 3, 9, 16), (2, 3, 9, 16), grad=False)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = attn.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    # Inputs rounded to dtype; compute in fp32 or better; output rounded to dtype.
    assert _max_rel(out.double(), ref) <= tol


def test_dropout_follows_torch_rng_and_backward_replays_the_pattern():
    q, k, v = _inputs((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8))
    torch.manual_seed(5)
    a = at.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    b = at.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b)
    # The gradient of a dropout forward is the contract's with the same seed.
    seed = 11
    out = at.attention(q, k, v, dropout_p=0.5, seed=seed)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    o2, lse = attn.attention(
        q.detach(), k.detach(), v.detach(), dropout_p=0.5, seed=seed, return_lse=True
    )
    ref = attn.attention_backward(
        torch.ones_like(o2), q.detach(), k.detach(), v.detach(), o2, lse, dropout_p=0.5, seed=seed
    )
    for a_, b_ in zip((dq, dk, dv), ref):
        assert torch.equal(a_, b_)


GRADCHECK_OPTIONS = [
    {},
    {"causal": True},
    {"causal": True, "align": "top-left", "window": (2, None)},
    {"softcap": 2.0, "scale": 0.9},
    {"alibi_slopes": torch.tensor([0.3, 0.1, 0.7, 0.2], **F64)},
    {"key_lengths": torch.tensor([3, 5])},
    {"dropout_p": 0.3, "seed": 9},
    {"block_layout": torch.tensor([[True, False, True], [True, True, False]]), "block_size": 2},
]


@pytest.mark.parametrize("idx", range(len(GRADCHECK_OPTIONS)))
def test_gradcheck_attention(idx):
    opts = GRADCHECK_OPTIONS[idx]
    q, k, v = _inputs((2, 4, 3, 5), (2, 2, 5, 5), (2, 2, 5, 4))
    assert torch.autograd.gradcheck(lambda q_, k_, v_: at.attention(q_, k_, v_, **opts), (q, k, v))


def test_gradcheck_add_mask_and_sdpa():
    q, k, v = _inputs((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3))
    mask = torch.randn(2, 1, 3, 5, **F64).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda *a: at.attention(*a[:3], mask=a[3], mask_type="add"), (q, k, v, mask)
    )
    assert torch.autograd.gradcheck(
        lambda *a: at.scaled_dot_product_attention(*a[:3], attn_mask=a[3]), (q, k, v, mask)
    )
    assert torch.autograd.gradcheck(
        lambda *a: at.scaled_dot_product_attention(*a, is_causal=True), (q, k, v)
    )


def test_attention_lse_and_weights_are_returned_weights_differentiable():
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    out, lse, w = at.attention(q, k, v, return_lse=True, return_weights=True)
    # lse is not differentiable; the weights are, as torch's (test_torch_autograd.py checks their gradients).
    assert not lse.requires_grad and w.requires_grad and out.requires_grad
    ref_w = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
    assert _max_rel(w, ref_w) <= TOL
    assert _max_rel(lse, torch.logsumexp(q @ k.transpose(-1, -2) / 2.0, dim=-1)) <= TOL


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(causal=True, threads=2),
        dict(mask="bool"),
        dict(window=(2, 1), scale=0.3),
        dict(dropout_p=0.0),
    ],
)
def test_attention_without_graph_is_one_extension_call_with_the_graph_paths_bits(
    options, monkeypatch
):
    """Without autograd, autocast or dropout, attn.torch.attention calls the extension directly (its fixed cost is
    that of attn._core.attention); with a tensor that requires grad it runs the autograd op: the same bits."""
    q, k, v = (x.float() for x in _inputs((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), grad=False))
    if options.get("mask") == "bool":
        options = dict(mask=torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3)
    graph_out, graph_lse = at.attention(
        q.clone().requires_grad_(), k, v, return_lse=True, **options
    )

    def not_taken(*args, **kwargs):
        raise AssertionError("the checked path ran")

    with monkeypatch.context() as m:
        m.setattr(at, "_apply", not_taken)
        out, lse = at.attention(q, k, v, return_lse=True, **options)
        with torch.no_grad():
            out_no_grad = at.attention(q.clone().requires_grad_(), k, v, **options)
    assert torch.equal(out, graph_out.detach()) and torch.equal(lse, graph_lse)
    assert torch.equal(out_no_grad, out)
    # Dropout, a seed or a bad option take the checked path (its errors name attn.torch.attention).
    with pytest.raises(
        TypeError, match=r"attn.torch.attention: unexpected keyword argument 'casual'"
    ):
        at.attention(q, k, v, casual=True)
    drop = dict(dropout_p=0.5, seed=3)
    assert torch.equal(
        at.attention(q, k, v, **drop), at.attention(q.clone().requires_grad_(), k, v, **drop)
    )


# ---- MultiheadAttention drop-in ----------------------------------------------------------------------------

MHA_CONFIGS = [
    dict(),
    dict(batch_first=True),
    dict(bias=False),
    dict(add_bias_kv=True, add_zero_attn=True),
    dict(kdim=5, vdim=7),
    dict(kdim=5, vdim=7, batch_first=True, add_bias_kv=True),
]


def _mha_pair(cfg, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(16, 4, dtype=torch.float64, **cfg)
    ours = at.MultiheadAttention(16, 4, dtype=torch.float64, **cfg)
    ours.load_state_dict(ref.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict())
    return ref, ours


def _mha_compare(ref, ours, args, kwargs):
    r_out, r_w = ref(*args, **kwargs)
    o_out, o_w = ours(*args, **kwargs)
    assert o_out.shape == r_out.shape and _max_rel(o_out, r_out) <= TOL
    if r_w is None:
        assert o_w is None
    else:
        assert o_w.shape == r_w.shape and _max_rel(o_w, r_w) <= TOL
    dout = torch.randn_like(r_out)
    inputs = [a for a in args if a.requires_grad]
    r_g = torch.autograd.grad(r_out, inputs + list(ref.parameters()), dout)
    o_g = torch.autograd.grad(o_out, inputs + list(ours.parameters()), dout)
    names = [f"input{i}" for i in range(len(inputs))] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, o_g, r_g):
        assert _max_rel(a, b) <= TOL, f"grad {name}: {_max_rel(a, b)}"


@pytest.mark.parametrize("cfg_idx", range(len(MHA_CONFIGS)))
@pytest.mark.parametrize("masks", ["none", "bool", "float", "mixed"])
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_drop_in(cfg_idx, masks, need_weights, average):
    cfg = MHA_CONFIGS[cfg_idx]
    ref, ours = _mha_pair(cfg)
    L, S, N = 3, 5, 2
    bf = cfg.get("batch_first", False)
    shape = lambda length, dim: (N, length, dim) if bf else (length, N, dim)  # noqa: E731
    g = torch.Generator().manual_seed(2)
    query = torch.randn(shape(L, 16), generator=g, **F64).requires_grad_(True)
    key = torch.randn(shape(S, cfg.get("kdim", 16)), generator=g, **F64).requires_grad_(True)
    value = torch.randn(shape(S, cfg.get("vdim", 16)), generator=g, **F64).requires_grad_(True)
    kwargs = dict(need_weights=need_weights, average_attn_weights=average)
    kpm = torch.rand(N, S, generator=g) < 0.4
    kpm[:, 0] = False  # every query keeps a key: torch gives NaN where none is left
    am = torch.rand(L, S, generator=g) < 0.3
    am[:, 0] = False
    if masks == "bool":
        kwargs.update(key_padding_mask=kpm, attn_mask=am)
    elif masks == "float":
        kwargs.update(attn_mask=torch.randn(N * 4, L, S, generator=g, **F64))
    elif masks == "mixed":
        kwargs.update(key_padding_mask=kpm, attn_mask=torch.randn(L, S, generator=g, **F64))
    _mha_compare(ref, ours, (query, key, value), kwargs)


def test_multihead_self_attention_unbatched_and_causal_hint():
    ref, ours = _mha_pair({})
    x = torch.randn(4, 16, **F64).requires_grad_(True)
    _mha_compare(ref, ours, (x, x, x), {})
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    xb = torch.randn(4, 2, 16, **F64).requires_grad_(True)
    _mha_compare(
        ref, ours, (xb, xb, xb), dict(attn_mask=causal, is_causal=True, need_weights=False)
    )
    with pytest.raises(RuntimeError, match="attn_mask"):
        ours(xb, xb, xb, is_causal=True)


def test_multihead_attention_eval_and_dropout_training():
    ref, ours = _mha_pair(dict(dropout=0.5))
    x = torch.randn(3, 2, 16, **F64)
    ref.eval()
    ours.eval()
    _mha_compare(ref, ours, (x, x, x), {})  # eval: no dropout, same result
    ours.train()
    torch.manual_seed(0)
    a, _ = ours(x, x, x)
    torch.manual_seed(0)
    b, _ = ours(x, x, x)
    c, _ = ours(x, x, x)
    assert torch.equal(a, b) and not torch.equal(a, c)
