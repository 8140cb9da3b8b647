"""attn.nn's reach into the rest of attn::nn: MultiheadAttention(kind='linear') and forward(position_offset=),
TransformerEncoderLayer / TransformerEncoder(checkpoint=) and TransformerEncoder(activation_dtype='bfloat16').

Linear attention and position_offset against compositions written here in torch (float64 references; attn's
float64 to 1e-10, float32 to 1e-5): outputs, input and parameter gradients. Checkpointing: bitwise the outputs
and gradients of the same layer without it, in training mode with dropout and a seed, and a recompute that really
happens (weights changed between forward and backward give the new weights' gradients). bf16 activations: exactly
the layers run one by one with their outputs rounded to bf16 in between, and within 1e-2 (outputs) / 2e-2
(gradients) of float32."""

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import rel as _rel  # noqa: E402  (this folder's; it imports torch)
from torch_refs import rope as _rope  # noqa: E402  (this folder's; it imports torch)

F = torch.nn.functional


def _reference(
    p, q_in, k_in, v_in, H, Hkv, kind, position="none", offset=0, is_causal=False, kpm=None
):
    """attn's MultiheadAttention composed in torch (batch-first inputs, p: tensors by state-dict name).
    linear: phi = elu + 1 on the rotated q and k; out_i = sum_j a_ij v_j / sum_j a_ij, a_ij = phi(q_i) . phi(k_j)
    over the visible keys (j <= i when causal, not padded), 0 where there is none."""
    N, Lq, E = q_in.shape
    Lk = k_in.shape[1]
    hd = E // H
    kvE = Hkv * hd
    w, b = p["in_proj_weight"], p["in_proj_bias"]
    q = F.linear(q_in, w[:E], b[:E]).view(N, Lq, H, hd).transpose(1, 2)
    k = F.linear(k_in, w[E : E + kvE], b[E : E + kvE]).view(N, Lk, Hkv, hd).transpose(1, 2)
    v = F.linear(v_in, w[E + kvE :], b[E + kvE :]).view(N, Lk, Hkv, hd).transpose(1, 2)
    if position != "none":
        q, k = (
            _rope(q, offset, position == "rope_interleaved"),
            _rope(k, offset, position == "rope_interleaved"),
        )
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    visible = torch.ones(N, 1, Lq, Lk, dtype=torch.bool)
    if is_causal:
        visible = visible & torch.ones(Lq, Lk, dtype=torch.bool).tril()
    if kpm is not None:
        visible = visible & ~kpm[:, None, None, :]
    if kind == "linear":
        a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2) * visible
        den = a.sum(-1, keepdim=True)
        out = torch.where(
            den > 0, (a @ v) / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros(())
        )
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    return F.linear(out.transpose(1, 2).reshape(N, Lq, E), p["out_proj.weight"], p["out_proj.bias"])


def _randomised(m, dtype, seed):
    """m's state random (biases included); returns float64 copies that require grad, for the reference."""
    g = torch.Generator().manual_seed(seed)
    p = {
        k: 0.5 * torch.randn(tuple(np.shape(v)), generator=g, dtype=torch.float64)
        for k, v in m.state_dict().items()
    }
    m.load_state_dict({k: v.to(dtype) for k, v in p.items()})
    return {k: v.to(dtype).double().requires_grad_() for k, v in p.items()}


def _check_mha(
    m,
    p,
    H,
    Hkv,
    dtype,
    tol,
    kind,
    position="none",
    offset=0,
    is_causal=False,
    kpm=None,
    Lq=5,
    Lk=7,
    N=2,
    E=16,
):
    g = torch.Generator().manual_seed(11)
    q, k, v = (
        torch.randn(N, L, E, generator=g, dtype=torch.float64).to(dtype) for L in (Lq, Lk, Lk)
    )
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _reference(p, *refs, H, Hkv, kind, position, offset, is_causal, kpm)
    out, weights = m(
        q,
        k,
        v,
        key_padding_mask=kpm,
        need_weights=False,
        is_causal=is_causal,
        position_offset=offset,
    )
    assert weights is None and out.dtype == dtype
    assert _rel(out, ref) <= tol
    dout = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(dtype)
    ref.backward(dout.double())
    grads = m.backward(dout)
    for name, x in zip(("query", "key", "value"), refs):
        assert _rel(grads[name], x.grad) <= tol, name
    for name, t in p.items():
        assert _rel(grads[name], t.grad) <= tol, name
    return out


TOLS = [(torch.float64, 1e-10), (torch.float32, 1e-5)]


# ---- linear attention ----


@pytest.mark.parametrize("dtype,tol", TOLS)
@pytest.mark.parametrize(
    "position,offset", [("none", 0), ("rope", 0), ("rope", 5), ("rope_interleaved", 3)]
)
@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_linear_attention_matches_composition(
    dtype, tol, position, offset, num_kv_heads, is_causal, padded
):
    E, H = 16, 4
    m = ann.MultiheadAttention(
        E,
        H,
        batch_first=True,
        dtype=dtype,
        num_kv_heads=num_kv_heads,
        position=position,
        kind="linear",
    )
    assert m.kind == "linear"
    p = _randomised(m, dtype, 3)
    # batch 1 pads keys 0 and 5: with is_causal its query 0 sees no key (an empty row: output 0 before out_proj)
    kpm = (
        torch.tensor([[False] * 7, [True, False, False, False, False, True, False]])
        if padded
        else None
    )
    _check_mha(m, p, H, num_kv_heads or H, dtype, tol, "linear", position, offset, is_causal, kpm)


def test_linear_attention_sequence_first_and_unbatched():
    E, H = 8, 2
    m = ann.MultiheadAttention(E, H, dtype=torch.float64, kind="linear")
    p = _randomised(m, torch.float64, 5)
    x = torch.randn(6, 3, E, dtype=torch.float64)  # [L, N, E]
    ref = _reference(
        p, x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), H, H, "linear"
    ).transpose(0, 1)
    out, _ = m(x, x, x, need_weights=False)
    assert _rel(out, ref) <= 1e-10
    out1, _ = m(x[:, 0], x[:, 0], x[:, 0], need_weights=False)
    assert _rel(out1, ref[:, 0]) <= 1e-10


def test_linear_attention_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="kind must be 'softmax' or 'linear', got 'performer'"):
        ann.MultiheadAttention(8, 2, kind="performer")
    for kw in (
        dict(dropout=0.1),
        dict(position="alibi"),
        dict(position="t5"),
        dict(backend="reference"),
    ):
        with pytest.raises(ValueError, match="kind='linear' takes dropout=0"):
            ann.MultiheadAttention(8, 2, kind="linear", **kw)
    m = ann.MultiheadAttention(8, 2, batch_first=True, kind="linear")
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    with pytest.raises(
        ValueError, match="kind='linear' computes no attention weights; pass need_weights=False"
    ):
        m(x, x, x)
    with pytest.raises(
        ValueError, match="linear attention takes a bool key_padding_mask and is_causal only"
    ):
        m(x, x, x, need_weights=False, attn_mask=np.zeros((4, 4), np.float32))
    with pytest.raises(
        ValueError, match="linear attention takes a bool key_padding_mask and is_causal only"
    ):
        m(x, x, x, need_weights=False, key_padding_mask=np.zeros((2, 4), np.float32))
    out, _ = m(x, x, x, need_weights=False, key_padding_mask=np.zeros((2, 4), bool), is_causal=True)
    assert out.shape == x.shape


# ---- position_offset ----


@pytest.mark.parametrize("dtype,tol", TOLS)
@pytest.mark.parametrize("position", ["rope", "rope_interleaved"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_position_offset_rotates_queries_and_keys_from_offset(dtype, tol, position, is_causal):
    """Softmax attention with RoPE at positions o .. o + L - 1 for queries and keys alike: the composition, and
    (q_i . k_j depends on i - j only) the output at offset 0."""
    E, H = 16, 4
    m = ann.MultiheadAttention(E, H, batch_first=True, dtype=dtype, position=position)
    p = _randomised(m, dtype, 7)
    out = _check_mha(m, p, H, H, dtype, tol, "softmax", position, 1000, is_causal)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, L, E, generator=g, dtype=torch.float64).to(dtype) for L in (5, 7, 7))
    out0, _ = m(q, k, v, need_weights=False, is_causal=is_causal)
    assert _rel(out, out0) <= tol


def test_position_offset_is_not_a_decode_offset():
    """Linear attention (where the offset is observable): offset o on a chunk is RoPE at o .. o + L - 1 for its
    queries and its keys, which differs from offset 0 and from the chunk's rows of the whole sequence."""
    E, H, o, L = 16, 4, 4, 6
    m = ann.MultiheadAttention(
        E, H, batch_first=True, dtype=torch.float64, position="rope", kind="linear"
    )
    p = _randomised(m, torch.float64, 9)
    x = torch.randn(1, o + L, E, dtype=torch.float64)
    chunk = x[:, o:].contiguous()
    got, _ = m(chunk, chunk, chunk, need_weights=False, is_causal=True, position_offset=o)
    assert _rel(got, _reference(p, chunk, chunk, chunk, H, H, "linear", "rope", o, True)) <= 1e-10
    at0, _ = m(chunk, chunk, chunk, need_weights=False, is_causal=True)
    assert _rel(got, at0) > 1e-3
    whole, _ = m(x, x, x, need_weights=False, is_causal=True)
    assert _rel(got, whole[:, o:]) > 1e-3


# ---- activation checkpointing ----


def _layer(checkpoint, dtype=torch.float32, norm_first=False):
    return ann.TransformerEncoderLayer(
        16,
        4,
        32,
        dropout=0.2,
        batch_first=True,
        norm_first=norm_first,
        dtype=dtype,
        checkpoint=checkpoint,
    )


def _run(m, x, dy, kpm, seed):
    m.train()
    m.manual_seed(seed)
    y = m(x, src_key_padding_mask=kpm)
    return y, m.backward(dy)


def _assert_bitwise(a, b):
    ya, ga = a
    yb, gb = b
    assert torch.equal(ya, yb)
    assert set(ga) == set(gb)
    for name in ga:
        assert torch.equal(torch.as_tensor(ga[name]), torch.as_tensor(gb[name])), name


@pytest.mark.parametrize("norm_first", [False, True])
def test_checkpointed_layer_is_bitwise_the_plain_one(norm_first):
    plain, ckpt = _layer(False, norm_first=norm_first), _layer(True, norm_first=norm_first)
    assert not plain.checkpoint and ckpt.checkpoint
    ckpt.load_state_dict(plain.state_dict())
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(3, 9, 16, generator=g), torch.randn(3, 9, 16, generator=g)
    kpm = torch.zeros(3, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    a, b = _run(plain, x, dy, kpm, 42), _run(ckpt, x, dy, kpm, 42)
    _assert_bitwise(a, b)
    assert not torch.equal(a[0], _run(plain, x, dy, kpm, 43)[0])  # the seed matters: dropout is on
    plain.checkpoint = True  # the setter
    _assert_bitwise(_run(plain, x, dy, kpm, 7), _run(ckpt, x, dy, kpm, 7))


def test_checkpointed_layer_recomputes_in_backward():
    """Weights changed between forward and backward: a checkpointed layer's backward recomputes with the new ones
    (the gradients of a fresh forward with them); the plain layer's cached activations are the old weights'."""
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    new = {k: torch.as_tensor(v) + 0.1 for k, v in _layer(False).state_dict().items()}
    fresh = _layer(False)
    fresh.load_state_dict(new)
    expect = _run(fresh, x, dy, None, 5)[1]
    for checkpoint in (True, False):
        m = _layer(checkpoint)
        m.train()
        m.manual_seed(5)
        m(x)
        m.load_state_dict(new)
        grads = m.backward(dy)
        same = all(
            torch.equal(torch.as_tensor(grads[n]), torch.as_tensor(expect[n])) for n in expect
        )
        assert same == checkpoint


def test_checkpointed_stack_is_bitwise_the_plain_one():
    layer = _layer(False)
    plain = ann.TransformerEncoder(layer, 3, norm=ann.LayerNorm(16))
    ckpt = ann.TransformerEncoder(layer, 3, norm=ann.LayerNorm(16), checkpoint=True)
    assert not plain.checkpoint and ckpt.checkpoint
    assert ann.TransformerEncoder(_layer(True), 2).checkpoint  # None: the layer's
    ckpt.load_state_dict(plain.state_dict())
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    _assert_bitwise(_run(plain, x, dy, None, 9), _run(ckpt, x, dy, None, 9))
    ckpt.checkpoint = False
    assert not ckpt.checkpoint
    _assert_bitwise(_run(plain, x, dy, None, 10), _run(ckpt, x, dy, None, 10))


# ---- bf16 activations between layers ----


def _fro(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


def test_bf16_activations_are_the_layers_with_rounded_outputs():
    """Tolerances: outputs max |diff| / max(1, max |f32|) <= 1e-2, gradients ||diff|| / ||f32|| <= 2e-2 (measured
    on a Zen 5 over 8 seeds: <= 2.5e-3 and <= 6.8e-3; GELU, since a ReLU kink crossed by a rounding can move one
    small gradient by 10%)."""
    layer = ann.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=True)
    f32 = ann.TransformerEncoder(layer, 3, norm=ann.LayerNorm(16))
    bf16 = ann.TransformerEncoder(layer, 3, norm=ann.LayerNorm(16), activation_dtype="bfloat16")
    assert bf16.activation_dtype == "bfloat16" and f32.activation_dtype is None
    g = torch.Generator().manual_seed(4)
    state = {
        k: 0.3 * torch.randn(tuple(np.shape(v)), generator=g) for k, v in f32.state_dict().items()
    }
    f32.load_state_dict(state)
    bf16.load_state_dict(state)
    x, dy = torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g)
    y, y32 = bf16(x), f32(x)
    assert y.dtype == torch.float32
    # the same layers run one by one, each output rounded to bf16 (the last one before the final norm too)
    h = x
    for i in range(3):
        one = ann.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, activation="gelu", batch_first=True
        )
        one.load_state_dict(
            {k[len(f"layers.{i}.") :]: v for k, v in state.items() if k.startswith(f"layers.{i}.")}
        )
        h = one(h).to(torch.bfloat16).float()
    norm = ann.LayerNorm(16)
    norm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("norm.")})
    assert _rel(y, norm(h)) <= 1e-6
    assert 1e-4 < _rel(y, y32) <= 1e-2  # rounded, and within bf16's error of float32
    g_bf16, g_f32 = bf16.backward(dy), f32.backward(dy)
    assert g_bf16["src"].dtype == torch.float32
    for name in g_f32:
        assert _fro(g_bf16[name], g_f32[name]) <= 2e-2, name
    # without a final norm the output is the last layer's, in bf16 (NumPy, which has no bf16: float32)
    bare = ann.TransformerEncoder(layer, 2, activation_dtype=torch.bfloat16)
    assert bare(x).dtype == torch.bfloat16
    assert bare(x.numpy()).dtype == np.float32


def test_activation_dtype_refuses_other_dtypes():
    layer = ann.TransformerEncoderLayer(16, 4, 32, dtype="float64")
    for bad in ("float16", "float32", "int8"):
        with pytest.raises(
            ValueError,
            match=r"activation_dtype must be None, the layer's dtype \(float64\) or "
            r"'bfloat16', got '" + bad,
        ):
            ann.TransformerEncoder(layer, 2, activation_dtype=bad)
    ann.TransformerEncoder(layer, 2, activation_dtype="float64")
    ann.TransformerEncoder(layer, 2, activation_dtype="bfloat16")
