"""attn.nn.MultiheadAttention's extensions (GQA; positions rope, rope_interleaved, alibi, shaw, t5),
SinusoidalPositionalEncoding, LearnedPositionalEmbedding and FeedForward, against compositions written here in
torch: outputs, input gradients and parameter gradients (float64 to 1e-10 / 1e-12, float32 to 1e-5), the
relative tables' gradients by their C++ names. Skipped, with the reason, where torch is missing."""

import math

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch parity tests are skipped"
)
from torch_refs import rel as _rel  # noqa: E402  (this folder's; it imports torch)
from torch_refs import rope as _rope  # noqa: E402  (this folder's; it imports torch)

F = torch.nn.functional


def _alibi_slopes(n):
    """The ALiBi paper's slopes (its reference implementation, non-powers of two included)."""

    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return pow2(n)
    m = 2 ** math.floor(math.log2(n))
    return pow2(m) + pow2(2 * m)[0::2][: n - m]


def _t5_bucket(rel, num_buckets, max_distance):
    """Hugging Face T5's _relative_position_bucket, bidirectional, rel = key position - query position."""
    num_buckets //= 2
    ret = (rel > 0).long() * num_buckets
    n = rel.abs()
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = (
        max_exact
        + (
            torch.log(n.double() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return ret + torch.where(is_small, n, large)


def _reference_mha(
    p,
    q_in,
    k_in,
    v_in,
    num_heads,
    num_kv_heads,
    position,
    max_distance=16,
    num_buckets=32,
    is_causal=False,
):
    """attn's MultiheadAttention composed in torch: projections, positions, F.scaled_dot_product_attention with
    the position bias as a float mask, out_proj. Inputs batch first [N, L, E]; p: torch tensors by state-dict
    name."""
    N, Lq, E = q_in.shape
    Lk = k_in.shape[1]
    hd = E // num_heads
    kvE = num_kv_heads * hd
    w, b = p["in_proj_weight"], p["in_proj_bias"]
    q = F.linear(q_in, w[:E], b[:E]).view(N, Lq, num_heads, hd).transpose(1, 2)
    k = F.linear(k_in, w[E : E + kvE], b[E : E + kvE]).view(N, Lk, num_kv_heads, hd).transpose(1, 2)
    v = F.linear(v_in, w[E + kvE :], b[E + kvE :]).view(N, Lk, num_kv_heads, hd).transpose(1, 2)
    if position in ("rope", "rope_interleaved"):
        q, k = (
            _rope(q, interleaved=position == "rope_interleaved"),
            _rope(k, interleaved=position == "rope_interleaved"),
        )
    group = num_heads // num_kv_heads
    # head h reads kv head h // group
    k, v = (
        k.repeat_interleave(group, dim=1),
        v.repeat_interleave(group, dim=1),
    )
    rel = torch.arange(Lk)[None, :] - torch.arange(Lq)[:, None]  # j - i
    bias = torch.zeros(1, num_heads, Lq, Lk, dtype=q.dtype)
    if position == "alibi":
        slopes = torch.tensor(_alibi_slopes(num_heads), dtype=q.dtype)
        bias = -slopes[:, None, None] * rel.abs().to(q.dtype)
    elif position == "shaw":
        # [Lq, Lk, hd]
        a = p["relative_key.weight"][rel.clamp(-max_distance, max_distance) + max_distance]
        bias = torch.einsum("nhid,ijd->nhij", q, a) / math.sqrt(hd)
    elif position == "t5":
        bias = p["relative_attention_bias.weight"][
            _t5_bucket(rel, num_buckets, max_distance)
        ].permute(2, 0, 1)
    if is_causal:
        bias = bias.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(N, num_heads, Lq, Lk))
    return F.linear(out.transpose(1, 2).reshape(N, Lq, E), p["out_proj.weight"], p["out_proj.bias"])


def _randomised(m, dtype, seed):
    """m's state with every tensor random (biases and tables included), as torch tensors that require grad."""
    g = torch.Generator().manual_seed(seed)
    p = {
        k: (0.5 * torch.randn(tuple(np.shape(v)), generator=g, dtype=dtype)).requires_grad_()
        for k, v in m.state_dict().items()
    }
    m.load_state_dict(p)
    return p


POSITIONS = ["none", "rope", "rope_interleaved", "alibi", "shaw", "t5"]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_positions_match_composition(dtype, tol, position, num_kv_heads, batch_first):
    E, H, N, Lq, Lk = 16, 4, 2, 5, 7
    kw = (
        dict(max_distance=3)
        if position == "shaw"
        else dict(max_distance=8, num_buckets=8)
        if position == "t5"
        else {}
    )
    m = ann.MultiheadAttention(
        E,
        H,
        batch_first=batch_first,
        dtype=dtype,
        num_kv_heads=num_kv_heads,
        position=position,
        **kw,
    )
    p = _randomised(m, dtype, 3)
    extra = {"shaw": {"relative_key.weight"}, "t5": {"relative_attention_bias.weight"}}.get(
        position, set()
    )
    assert set(p) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"} | extra
    g = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(N, L, E, generator=g, dtype=dtype).requires_grad_() for L in (Lq, Lk, Lk)
    )
    ref = _reference_mha(p, q, k, v, H, num_kv_heads or H, position, **kw)
    layout = (lambda t: t) if batch_first else (lambda t: t.detach().transpose(0, 1).contiguous())
    out, _ = m(layout(q), layout(k), layout(v), need_weights=False)
    assert _rel(layout(out) if not batch_first else out, ref) <= tol
    dout = torch.randn(ref.shape, generator=g, dtype=dtype)
    ref.backward(dout)
    grads = m.backward(layout(dout))
    for name, x in (("query", q), ("key", k), ("value", v)):
        got = grads[name] if batch_first else grads[name].transpose(0, 1)
        assert _rel(got, x.grad) <= tol, name
    assert set(grads) == set(p) | {"query", "key", "value"}
    for name, t in p.items():
        assert _rel(grads[name], t.grad) <= tol, name
    # parameters() carries the same names, so an optimizer sees the relative tables.
    assert set(m.parameters().names()) == set(p)


@pytest.mark.parametrize(
    "position,table", [("shaw", "relative_key.weight"), ("t5", "relative_attention_bias.weight")]
)
def test_mha_relative_table_trained_by_optimizer(position, table):
    m = ann.MultiheadAttention(8, 2, batch_first=True, dtype="float64", position=position)
    before = np.array(m.state_dict()[table])
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    m(x, x, x)
    grad = m.backward(np.ones((2, 5, 8)))[table]
    assert np.abs(grad).max() > 0
    ann.SGD(m.parameters(), lr=0.5).step()
    assert np.abs(np.array(m.state_dict()[table]) - (before - 0.5 * grad)).max() <= 1e-15


@pytest.mark.parametrize("position", ["alibi", "shaw", "t5", "rope"])
def test_mha_positions_causal_self_attention(position):
    E, H, N, L = 8, 2, 2, 6
    m = ann.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64, position=position)
    p = _randomised(m, torch.float64, 5)
    x = torch.randn(N, L, E, dtype=torch.float64, requires_grad=True)
    kw = dict(max_distance=128, num_buckets=32) if position == "t5" else {}
    ref = _reference_mha(p, x, x, x, H, H, position, is_causal=True, **kw)
    out, _ = m(x, x, x, need_weights=False, is_causal=True)
    assert _rel(out, ref) <= 1e-12
    ref.sum().backward()
    grads = m.backward(torch.ones_like(ref))
    assert _rel(grads["query"] + grads["key"] + grads["value"], x.grad) <= 1e-12


@pytest.mark.parametrize("position", ["shaw", "t5"])
def test_mha_relative_tables_finite_differences(position):
    """Central differences (float64) on a few entries of the relative table, in_proj_weight and the query."""
    E, H, N, L = 8, 2, 1, 5
    m = ann.MultiheadAttention(
        E, H, batch_first=True, dtype="float64", position=position, max_distance=4, num_buckets=4
    )
    p = {k: v.detach().clone() for k, v in _randomised(m, torch.float64, 7).items()}
    rng = np.random.default_rng(8)
    x = rng.standard_normal((N, L, E))
    dout = rng.standard_normal((N, L, E))

    def loss():
        return float((m(x, x, x, need_weights=False)[0] * dout).sum())

    loss()
    grads = m.backward(dout)
    table = "relative_key.weight" if position == "shaw" else "relative_attention_bias.weight"
    h = 1e-6
    for name in (table, "in_proj_weight"):
        for idx in [(0, 0), (1, 1), (2, 0)]:
            for sign, store in ((1, "plus"), (-1, "minus")):
                t = p[name].clone()
                t[idx] += sign * h
                m.load_state_dict({**p, name: t})
                if store == "plus":
                    plus = loss()
                else:
                    minus = loss()
            m.load_state_dict(p)
            assert abs((plus - minus) / (2 * h) - float(grads[name][idx])) <= 1e-6, (name, idx)
    loss()
    dx = m.backward(dout)
    dx = dx["query"] + dx["key"] + dx["value"]
    for idx in [(0, 0, 0), (0, 3, 5)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        fp = float((m(xp, xp, xp, need_weights=False)[0] * dout).sum())
        fm = float((m(xm, xm, xm, need_weights=False)[0] * dout).sum())
        assert abs((fp - fm) / (2 * h) - dx[idx]) <= 1e-6, idx


def test_mha_gqa_equals_repeated_kv_heads():
    """A GQA module equals a full-head module whose k/v projections repeat each kv head's rows."""
    E, H, Hkv, N, L = 16, 4, 2, 2, 5
    hd, group = E // H, H // Hkv
    gqa = ann.MultiheadAttention(E, H, batch_first=True, dtype="float64", num_kv_heads=Hkv)
    full = ann.MultiheadAttention(E, H, batch_first=True, dtype="float64")
    p = {k: v.detach() for k, v in _randomised(gqa, torch.float64, 9).items()}

    def rep(t):  # [Hkv * hd, ...] -> [H * hd, ...], kv head h // group for query head h
        return (
            t.reshape(Hkv, hd, *t.shape[1:])
            .repeat_interleave(group, dim=0)
            .reshape(H * hd, *t.shape[1:])
        )

    w, b = p["in_proj_weight"], p["in_proj_bias"]
    kvE = Hkv * hd
    full.load_state_dict(
        {
            **p,
            "in_proj_weight": torch.cat([w[:E], rep(w[E : E + kvE]), rep(w[E + kvE :])]),
            "in_proj_bias": torch.cat([b[:E], rep(b[E : E + kvE]), rep(b[E + kvE :])]),
        }
    )
    x = torch.randn(N, L, E, dtype=torch.float64)
    assert _rel(gqa(x, x, x)[0], full(x, x, x)[0]) <= 1e-12
    dout = torch.randn(N, L, E, dtype=torch.float64)
    ga, gf = gqa.backward(dout), full.backward(dout)
    for name in ("query", "key", "value", "out_proj.weight"):
        assert _rel(ga[name], gf[name]) <= 1e-12, name
    # The kv rows' gradient is the sum over the query heads that read them.
    gk = gf["in_proj_weight"][E : E + E].reshape(Hkv, group, hd, E).sum(1).reshape(kvE, E)
    assert _rel(ga["in_proj_weight"][E : E + kvE], gk) <= 1e-12


def test_mha_position_arguments_refused_by_name():
    with pytest.raises(
        ValueError, match="position must be one of 'none', 'rope'.*got 'sinusoidal'"
    ):
        ann.MultiheadAttention(8, 2, position="sinusoidal")
    with pytest.raises(ValueError, match="position must be a str"):
        ann.MultiheadAttention(8, 2, position=None)
    with pytest.raises(ValueError, match="max_distance"):
        ann.MultiheadAttention(8, 2, position="shaw", max_distance=0)
    with pytest.raises(ValueError, match="num_buckets"):
        ann.MultiheadAttention(8, 2, position="t5", num_buckets=64, max_distance=32)
    with pytest.raises(ValueError, match="even head_dim"):
        ann.MultiheadAttention(6, 2, position="rope")
    m = ann.MultiheadAttention(8, 2, position="t5")  # max_distance None -> 128 for t5
    assert m.state_dict()["relative_attention_bias.weight"].shape == (32, 2)


def test_mha_rope_base():
    E, H, L = 8, 2, 6
    m = ann.MultiheadAttention(
        E, H, batch_first=True, dtype="float64", position="rope", rope_base=500.0
    )
    p = _randomised(m, torch.float64, 11)
    x = torch.randn(1, L, E, dtype=torch.float64)
    hd = E // H
    w, b = p["in_proj_weight"].detach(), p["in_proj_bias"].detach()
    q, k, v = (
        F.linear(x, w[i * E : (i + 1) * E], b[i * E : (i + 1) * E])
        .view(1, L, H, hd)
        .transpose(1, 2)
        for i in range(3)
    )
    out = F.scaled_dot_product_attention(_rope(q, base=500.0), _rope(k, base=500.0), v)
    ref = F.linear(
        out.transpose(1, 2).reshape(1, L, E),
        p["out_proj.weight"].detach(),
        p["out_proj.bias"].detach(),
    )
    assert _rel(m(x, x, x)[0], ref) <= 1e-12


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("scale", [1.0, 4.0])
@pytest.mark.parametrize("d_model", [8, 7])
def test_sinusoidal_matches_formula(batch_first, scale, d_model):
    L, N, offset = 5, 3, 4
    pe_mod = ann.SinusoidalPositionalEncoding(
        d_model, max_len=16, batch_first=batch_first, scale=scale
    )
    assert pe_mod.state_dict() == {}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, L, d_model) if batch_first else (L, N, d_model))
    pos = np.arange(offset, offset + L)[:, None]
    i = np.arange(0, d_model, 2)[None, :]
    pe = np.zeros((L, d_model))
    pe[:, 0::2] = np.sin(pos / 10000 ** (i / d_model))
    pe[:, 1::2] = np.cos(pos / 10000 ** (i / d_model))[:, : d_model // 2]
    expect = x * scale + (pe[None] if batch_first else pe[:, None])
    y = pe_mod(x, offset=offset)
    assert np.abs(y - expect).max() <= 1e-12
    dy = rng.standard_normal(x.shape)
    assert np.abs(pe_mod.backward(dy)["input"] - dy * scale).max() <= 1e-12
    with pytest.raises(ValueError, match="exceed max_len"):
        pe_mod(x, offset=12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
@pytest.mark.parametrize("batch_first", [True, False])
def test_learned_positions_match_torch_embedding(dtype, tol, batch_first):
    max_len, d, L, N, offset, scale = 12, 6, 5, 3, 2, 2.0
    ours = ann.LearnedPositionalEmbedding(
        max_len, d, batch_first=batch_first, scale=scale, dtype=dtype
    )
    ref = torch.nn.Embedding(max_len, d, dtype=dtype)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn((N, L, d) if batch_first else (L, N, d), dtype=dtype, requires_grad=True)
    e = ref(torch.arange(offset, offset + L))
    r = x * scale + (e[None] if batch_first else e[:, None])
    o = ours(x, offset=offset)
    assert isinstance(o, torch.Tensor) and _rel(o, r) <= tol
    dout = torch.randn_like(r)
    r.backward(dout)
    g = ours.backward(dout)
    assert set(g) == {"input", "weight"}
    assert _rel(g["input"], x.grad) <= tol
    assert _rel(g["weight"], ref.weight.grad) <= tol


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize(
    "activation,torch_act",
    [
        ("relu", torch.nn.ReLU()),
        ("gelu", torch.nn.GELU()),
        ("gelu_tanh", torch.nn.GELU(approximate="tanh")),
        ("silu", torch.nn.SiLU()),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_matches_torch_sequential(dtype, tol, activation, torch_act, bias):
    torch.manual_seed(2)
    ref = torch.nn.Sequential(
        torch.nn.Linear(6, 10, bias=bias, dtype=dtype),
        torch_act,
        torch.nn.Dropout(0.0),
        torch.nn.Linear(10, 6, bias=bias, dtype=dtype),
    )
    ours = ann.FeedForward(6, 10, activation=torch_act, bias=bias, dtype=dtype)
    rename = {
        "0.weight": "linear1.weight",
        "0.bias": "linear1.bias",
        "3.weight": "linear2.weight",
        "3.bias": "linear2.bias",
    }
    sd = {rename[k]: v for k, v in ref.state_dict().items()}
    assert set(ours.state_dict()) == set(sd)
    ours.load_state_dict(sd)
    x = torch.randn(2, 3, 6, dtype=dtype, requires_grad=True)
    r = ref(x)
    o = ours(x)
    assert _rel(o, r) <= tol
    dout = torch.randn_like(r)
    r.backward(dout)
    g = ours.backward(dout)
    assert set(g) == {"input"} | set(sd)
    assert _rel(g["input"], x.grad) <= tol
    for k, name in rename.items():
        if name in sd:
            assert _rel(g[name], dict(ref.named_parameters())[k].grad) <= tol, name
    assert ann.FeedForward(6, 10, activation).state_dict()["linear1.weight"].shape == (10, 6)
