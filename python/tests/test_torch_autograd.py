"""attn.torch's autograd layer: differentiable attention weights, double backward refused with a clear error,
the torch.library ops under torch.compile / vmap / torch.func / TorchScript, and CPU autocast as torch does it."""

import math

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the PyTorch comparisons are skipped"
)
F = torch.nn.functional

import attn.torch as at  # noqa: E402

F64 = dict(dtype=torch.float64)
TOL = 1e-10  # float64, two summation orders
DOUBLE_BACKWARD = "attn.torch: attention has no second derivative"
FORWARD_AD = "attn.torch: attention has no forward-mode derivative"


def _max_rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def _randn(*shape, seed, grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, **F64).requires_grad_(grad)


def _qkv(hq=4, hkv=2, lq=3, lk=5, d=4, dv=3, batch=2, seed=0):
    """q [batch, hq, lq, d], k [batch, hkv, lk, d], v [batch, hkv, lk, dv] in float64, requiring grad."""
    return (
        _randn(batch, hq, lq, d, seed=seed),
        _randn(batch, hkv, lk, d, seed=seed + 1),
        _randn(batch, hkv, lk, dv, seed=seed + 2),
    )


def _composed(
    q,
    k,
    v,
    mask=None,
    causal=False,
    align="bottom-right",
    softcap=None,
    scale=None,
    key_lengths=None,
):
    """The contract as a plain torch composition: (out [..., Hq, Lq, Dv], weights [..., Hq, Lq, Lk]).
    mask is an 'add' mask; every row must keep a key (torch's softmax gives NaN where none is left)."""
    groups = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * (q @ k.transpose(-1, -2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + mask
    lq, lk = q.shape[-2], k.shape[-2]
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = j <= i + (lk - lq if align == "bottom-right" else 0)
    if key_lengths is not None:
        allowed = allowed & (j < key_lengths.view(-1, 1, 1, 1))
    w = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    return w @ v, w


# ---- item 2: differentiable weights -----------------------------------------------------------------------

WEIGHT_OPTIONS = [
    dict(),
    dict(softcap=1.5),
    dict(scale=0.7, causal=True),
    dict(causal=True, align="top-left", softcap=3.0),
    dict(key_lengths=torch.tensor([4, 2])),
    dict(add_mask=True),
    dict(add_mask=True, softcap=2.0, causal=True, key_lengths=torch.tensor([5, 3])),
]


@pytest.mark.parametrize("idx", range(len(WEIGHT_OPTIONS)))
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_weights_gradients_match_a_torch_composition(idx, hkv):
    opts = dict(WEIGHT_OPTIONS[idx])
    q, k, v = _qkv(hkv=hkv)
    wrt = [q, k, v]
    if opts.pop("add_mask", False):
        # broadcast over heads: its gradient is summed over them
        opts["mask"] = _randn(2, 1, 3, 5, seed=7)
        wrt.append(opts["mask"])
    ref_out, ref_w = _composed(q, k, v, **opts)
    attn_opts = dict(opts, mask_type="add") if "mask" in opts else opts
    out, w = at.attention(q, k, v, return_weights=True, **attn_opts)
    assert w.requires_grad and _max_rel(w, ref_w) <= TOL and _max_rel(out, ref_out) <= TOL
    r_out, r_w = _randn(*out.shape, seed=11, grad=False), _randn(*w.shape, seed=12, grad=False)
    for loss, ref_loss in [
        ((out * r_out).sum() + (w * r_w).sum(), (ref_out * r_out).sum() + (ref_w * r_w).sum()),
        ((w * r_w).sum(), (ref_w * r_w).sum()),  # the weights alone: out's gradient is never formed
        (
            (w[..., 1:, :] ** 2).sum(),
            (ref_w[..., 1:, :] ** 2).sum(),
        ),  # a loss that is not linear in the weights
    ]:
        got = torch.autograd.grad(loss, wrt, allow_unused=True, retain_graph=True)
        ref = torch.autograd.grad(ref_loss, wrt, allow_unused=True, retain_graph=True)
        for name, a, b in zip(("dq", "dk", "dv", "dmask"), got, ref):
            if b is None:  # the weights do not depend on v
                assert a is None or not a.any(), name
            else:
                assert a.shape == b.shape and _max_rel(a, b) <= TOL, f"{name}: {_max_rel(a, b)}"


@pytest.mark.parametrize(
    "opts",
    [
        dict(softcap=2.0, scale=0.9),
        dict(causal=True, align="top-left"),
        dict(key_lengths=torch.tensor([3, 5])),
        dict(dropout_p=0.3, seed=5),  # the weights are before dropout; out is after it
    ],
)
def test_gradcheck_with_weights(opts):
    q, k, v = _qkv(hq=2, hkv=1, lq=3, lk=5, d=3, dv=2)
    mask = _randn(1, 1, 3, 5, seed=3)
    # One output holding both (gradcheck skips outputs that do not require grad: weights without a gradient would
    # pass unnoticed).
    assert torch.autograd.gradcheck(
        lambda *a: torch.cat(
            at.attention(*a[:3], mask=a[3], mask_type="add", return_weights=True, **opts), -1
        ),
        (q, k, v, mask),
    )


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_out_and_weights_loss_through_attns_backward(softcap):
    """A loss of out and of the weights, <G, out> + <W, weights>, with causal, an add mask that takes a gradient
    (broadcast over heads) and GQA: attn.torch hands W to torch.ops.attn.attention_backward (dweights), which folds
    it into dq, dk and d(mask); against the torch composition in float64 and gradcheck, and through the op called
    directly."""
    q, k, v = _qkv(hq=4, hkv=2, lq=4, lk=6)
    mask = _randn(2, 1, 4, 6, seed=5)
    opts = dict(causal=True, softcap=softcap)
    ref_out, ref_w = _composed(q, k, v, mask=mask, **opts)
    g, w_grad = _randn(*ref_out.shape, seed=6, grad=False), _randn(*ref_w.shape, seed=7, grad=False)
    ref = torch.autograd.grad((ref_out * g).sum() + (ref_w * w_grad).sum(), (q, k, v, mask))

    def loss(q_, k_, v_, mask_):
        out_, w_ = at.attention(
            q_, k_, v_, mask=mask_, mask_type="add", return_weights=True, **opts
        )
        return (out_ * g).sum() + (w_ * w_grad).sum()

    got = torch.autograd.grad(loss(q, k, v, mask), (q, k, v, mask))
    for name, a, b in zip(("dq", "dk", "dv", "dmask"), got, ref):
        assert a.shape == b.shape and _max_rel(a, b) <= TOL, f"{name}: {_max_rel(a, b)}"
    assert torch.autograd.gradcheck(loss, (q, k, v, mask))
    # The op as its schema reads: dweights after the tensor options; without it, out's part alone.
    with torch.no_grad():
        out, lse, _ = torch.ops.attn.attention(q, k, v, mask, mask_type="add", **opts)
        by_op = torch.ops.attn.attention_backward(
            g, q, k, v, out, lse, mask, dweights=w_grad, mask_type="add", mask_grad=True, **opts
        )
        alone = torch.ops.attn.attention_backward(
            g, q, k, v, out, lse, mask, mask_type="add", mask_grad=True, **opts
        )
    for name, a, b in zip(("dq", "dk", "dv", "dmask"), by_op, ref):
        assert a.shape == b.shape and _max_rel(a, b) <= TOL, f"{name}: {_max_rel(a, b)}"
    assert _max_rel(alone[0], ref[0]) > 1e-3 and _max_rel(alone[3], ref[3]) > 1e-3


def test_sinks_gradient_matches_a_torch_composition():
    """Learned sinks (one logit per head joining every row's softmax, no value), with GQA, causal and the weights
    in the loss: dq, dk, dv and dsinks against the composition that appends the sink as a softmax column and drops
    it, and by gradcheck; through torch.ops.attn too (opcheck with sinks)."""
    q, k, v = _qkv(hq=4, hkv=2, lq=4, lk=6)
    sinks = _randn(4, seed=8)
    groups = 2
    kk, vv = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    s = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(4, 6, dtype=torch.bool).tril(2), float("-inf"))
    col = sinks.view(1, 4, 1, 1).expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    ref_out = p @ vv
    g, w_grad = _randn(*ref_out.shape, seed=6, grad=False), _randn(*p.shape, seed=7, grad=False)
    ref = torch.autograd.grad((ref_out * g).sum() + (p * w_grad).sum(), (q, k, v, sinks))

    def loss(q_, k_, v_, sinks_):
        out_, w_ = at.attention(q_, k_, v_, causal=True, sinks=sinks_, return_weights=True)
        return (out_ * g).sum() + (w_ * w_grad).sum()

    got = torch.autograd.grad(loss(q, k, v, sinks), (q, k, v, sinks))
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, ref):
        assert a.shape == b.shape and _max_rel(a, b) <= TOL, f"{name}: {_max_rel(a, b)}"
    assert torch.autograd.gradcheck(loss, (q, k, v, sinks))
    # the op's positional tensors: mask, alibi_slopes, key_lengths, block_layout, seed, sinks
    args = (q, k, v, None, None, None, None, None, sinks)
    torch.library.opcheck(torch.ops.attn.attention.default, args, dict(causal=True))


def test_weights_gradient_ignores_a_removed_key_holding_inf():
    q, k, v = _qkv(hq=1, hkv=1, lq=3, lk=5)
    k = k.detach().clone()
    k[..., 4, :] = float("inf")  # padding: never used, must not poison any gradient
    k.requires_grad_(True)
    lengths = torch.tensor([4, 4])
    out, w = at.attention(q, k, v, key_lengths=lengths, softcap=5.0, return_weights=True)
    dq, dk = torch.autograd.grad((w * _randn(*w.shape, seed=4, grad=False)).sum(), (q, k))
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all()
    assert not dk[..., 4, :].any()
    k_ref = k.detach().clone()
    k_ref[..., 4, :] = 0.0
    k_ref.requires_grad_(True)
    _, w_ref = _composed(q, k_ref, v, softcap=5.0, key_lengths=lengths)
    dq_ref, dk_ref = torch.autograd.grad(
        (w_ref * _randn(*w.shape, seed=4, grad=False)).sum(), (q, k_ref)
    )
    assert _max_rel(dq, dq_ref) <= TOL and _max_rel(dk, dk_ref) <= TOL


def _mha_pair(**cfg):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64, **cfg)
    ours = at.MultiheadAttention(8, 2, dtype=torch.float64, **cfg)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "float", "causal"])
@pytest.mark.parametrize("use_out", [False, True])
def test_multihead_attention_weights_gradients_match_torch(average, masks, use_out):
    ref, ours = _mha_pair()
    L, S, N = 3, 4, 2
    query, key = _randn(L, N, 8, seed=1), _randn(S, N, 8, seed=2)
    kwargs = dict(need_weights=True, average_attn_weights=average)
    if masks == "padding":
        kwargs["key_padding_mask"] = torch.tensor(
            [[False, False, True, True], [False, False, False, True]]
        )
    elif masks == "float":
        kwargs["attn_mask"] = _randn(L, S, seed=3, grad=False)
    elif masks == "causal":
        kwargs["attn_mask"] = torch.ones(L, S, dtype=torch.bool).triu(1)
    r_out, r_w = ref(query, key, key, **kwargs)
    o_out, o_w = ours(query, key, key, **kwargs)
    assert o_w.requires_grad and _max_rel(o_w, r_w) <= TOL
    dw = _randn(*r_w.shape, seed=5, grad=False)
    dout = _randn(*r_out.shape, seed=6, grad=False) if use_out else torch.zeros_like(r_out)
    wrt_r = [query, key] + list(ref.parameters())
    wrt_o = [query, key] + list(ours.parameters())
    r_g = torch.autograd.grad((r_w * dw).sum() + (r_out * dout).sum(), wrt_r, allow_unused=True)
    o_g = torch.autograd.grad((o_w * dw).sum() + (o_out * dout).sum(), wrt_o, allow_unused=True)
    names = ["query", "key"] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, o_g, r_g):
        if b is None:
            assert a is None or not a.any(), name
        else:
            assert a is not None and _max_rel(a, b) <= TOL, f"grad {name}: {_max_rel(a, b)}"


# ---- item 3: double backward is refused, never wrong -------------------------------------------------------


def _attn_sum(q, k, v):
    return at.attention(q, k, v, causal=True).sum()


def test_gradient_penalty_through_a_weight_raises():
    ref, ours = _mha_pair()
    x = _randn(3, 2, 8, seed=1)
    out, _ = ours(x, x, x, need_weights=False)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        g.pow(2).sum().backward()


def test_create_graph_on_qkv_gives_first_order_then_raises():
    q, k, v = _qkv()
    plain = torch.autograd.grad(_attn_sum(q, k, v), (q, k, v))
    g = torch.autograd.grad(_attn_sum(q, k, v), (q, k, v), create_graph=True)
    for a, b in zip(g, plain):
        assert torch.equal(a.detach(), b)  # the first-order gradients stay exact
    assert all(t.requires_grad for t in g)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(g[0].sum(), q)
    # Also when the incoming gradient itself requires grad (what once_differentiable covered).
    out = at.attention(q, k, v)
    dout = _randn(*out.shape, seed=8)
    (gq,) = torch.autograd.grad(out, q, dout, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(gq.sum(), dout)


def test_double_backward_through_weights_raises():
    q, k, v = _qkv()
    _, w = at.attention(q, k, v, return_weights=True, softcap=2.0)
    (g,) = torch.autograd.grad((w**2).sum(), k, create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        g.sum().backward()


def test_hessian_and_gradgradcheck_raise():
    q, k, v = _qkv(hq=1, hkv=1, lq=2, lk=3, d=2, dv=2, batch=1)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.functional.hessian(lambda q_: _attn_sum(q_, k, v), q)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.gradgradcheck(lambda *a: at.attention(*a), (q, k, v))
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.func.grad(lambda q_: torch.func.grad(lambda u: _attn_sum(u, k, v))(q_).sum())(q)
    with pytest.raises(RuntimeError, match=FORWARD_AD):
        torch.func.hessian(lambda q_: _attn_sum(q_, k, v))(q)
    with pytest.raises(RuntimeError, match=FORWARD_AD):
        torch.func.jvp(lambda q_: _attn_sum(q_, k, v), (q.detach(),), (torch.ones_like(q),))


def test_forward_ad_dual_tensors_raise_in_eager_calls():
    # torch.autograd.forward_ad outside torch.func: a tangent on q must not be dropped silently, with or without
    # requires_grad (a call that needs no autograd otherwise runs straight to the extension).
    import torch.autograd.forward_ad as fwad

    q, k, v = (t.detach() for t in _qkv(hq=1, hkv=1, lq=2, lk=3, d=2, dv=2, batch=1))
    want = at.attention(q, k, v)
    with fwad.dual_level():
        for requires_grad in (False, True):
            qd = fwad.make_dual(q.clone().requires_grad_(requires_grad), torch.ones_like(q))
            with pytest.raises(RuntimeError, match=FORWARD_AD):
                at.attention(qd, k, v)
            with pytest.raises(RuntimeError, match=FORWARD_AD):
                at.scaled_dot_product_attention(qd, k, v)
        # inside the level, a call without dual tensors is an ordinary one
        assert torch.equal(at.attention(q, k, v), want)


# ---- item 9: torch.library ops: compile, vmap, torch.func, TorchScript -------------------------------------


def _op_args(
    q,
    k,
    v,
    mask=None,
    mask_type="keep",
    return_weights=False,
    dropout_p=0.0,
    seed=None,
    softcap=None,
):
    """(args, kwargs) of torch.ops.attn.attention: the arrays and tensor options positional, the rest by name."""
    seed = None if seed is None else torch.tensor(seed, dtype=torch.int64)
    return (
        (q, k, v, mask, None, None, None, seed),
        dict(
            mask_type=mask_type, softcap=softcap, dropout_p=dropout_p, return_weights=return_weights
        ),
    )


def test_opcheck_both_ops():
    q, k, v = _qkv(hq=2, hkv=1)
    mask = _randn(1, 2, 3, 5, seed=4)
    for args, kwargs in [
        _op_args(q, k, v),
        _op_args(q, k, v, mask=mask, mask_type="add", return_weights=True, softcap=2.0),
        _op_args(q, k, v, dropout_p=0.25, seed=3),
    ]:
        torch.library.opcheck(torch.ops.attn.attention.default, args, kwargs)
    # defaults left out
    torch.library.opcheck(torch.ops.attn.attention.default, (q, k, v), dict(causal=True))
    args, kwargs = _op_args(q, k, v, mask=mask, mask_type="add")
    out, lse, _ = torch.ops.attn.attention(*args, **kwargs)
    del kwargs["return_weights"]
    bwd_args = (torch.ones_like(out), q, k, v, out, lse) + args[3:]
    for extra in [dict(), dict(dweights=torch.randn(2, 2, 3, 5, **F64))]:
        torch.library.opcheck(
            torch.ops.attn.attention_backward.default,
            bwd_args,
            dict(kwargs, mask_grad=True, **extra),
            test_utils=("test_schema", "test_faketensor"),
        )


class _GraphRecorder:
    """A torch.compile backend (AOTAutograd, then eager) that keeps the forward and backward graphs it compiles."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd

        self.forward, self.backward = [], []
        self.backend = aot_autograd(
            fw_compiler=self._keep(self.forward), bw_compiler=self._keep(self.backward)
        )

    @staticmethod
    def _keep(graphs):
        def compiler(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        return compiler

    @staticmethod
    def count(graphs, target):
        return sum(node.target == target for gm in graphs for node in gm.graph.nodes)

    def sees_one_op(self):
        """One forward and one backward graph, holding one attn op each and no other attention."""
        return (
            len(self.forward) == 1
            and len(self.backward) == 1
            and self.count(self.forward, torch.ops.attn.attention.default) == 1
            and self.count(self.backward, torch.ops.attn.attention_backward.default) == 1
        )


def _compile_and_compare(fn, inputs):
    torch._dynamo.reset()
    rec = _GraphRecorder()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got = compiled(*inputs)
    ref = fn(*inputs)
    g_got = torch.autograd.grad(got.sum(), inputs)
    g_ref = torch.autograd.grad(ref.sum(), inputs)
    assert _max_rel(got, ref) <= TOL
    for a, b in zip(g_got, g_ref):
        assert _max_rel(a, b) <= TOL
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend=rec.backend)(*inputs)
    torch.autograd.grad(out.sum(), inputs)
    return rec


def test_compile_fullgraph_sees_one_op():
    q, k, v = _qkv()
    rec = _compile_and_compare(
        lambda q_, k_, v_: at.attention(q_, k_, v_, causal=True, softcap=3.0), (q, k, v)
    )
    assert rec.sees_one_op()
    mask = _randn(3, 5, seed=2)
    rec = _compile_and_compare(
        lambda q_, k_, v_, m_: at.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_),
        (q[:, :2], k, v, mask),
    )
    assert rec.sees_one_op()


def test_compile_weights_and_dropout():
    q, k, v = _qkv()

    def fn(q_, k_, v_):
        out, w = at.attention(q_, k_, v_, return_weights=True, dropout_p=0.2, seed=123)
        return out.sum() + (w**2).sum()

    _compile_and_compare(fn, (q, k, v))
    # A seed drawn from torch's RNG inside the graph: no graph break, and the backward replays its pattern.
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q_, k_, v_: at.scaled_dot_product_attention(q_, k_, v_[:, :2], dropout_p=0.5),
        fullgraph=True,
        backend="aot_eager",
    )
    out = compiled(q[:, :2], k, v)
    assert out.shape == (2, 2, 3, 3) and torch.isfinite(out).all()
    torch.autograd.grad(out.sum(), (q, k, v))


def test_compile_inductor_multihead_attention():
    _, ours = _mha_pair()
    x = _randn(3, 2, 8, seed=1)
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True)
    out, w = compiled(x, x, x)
    r_out, r_w = ours(x, x, x)
    assert _max_rel(out, r_out) <= TOL and _max_rel(w, r_w) <= TOL
    g = torch.autograd.grad(out.sum() + w.sum(), x)[0]
    g_ref = torch.autograd.grad(r_out.sum() + r_w.sum(), x)[0]
    assert _max_rel(g, g_ref) <= TOL


def test_vmap_and_func_grad():
    q, k, v = _qkv(hq=2, hkv=1, batch=3)
    # vmap over the batch dim gives the batched call; a fixed seed gives each example its own batch index 0.
    fn = lambda q_, k_, v_: at.attention(q_, k_, v_, causal=True, softcap=2.0)  # noqa: E731
    assert _max_rel(torch.vmap(fn)(q, k, v), fn(q, k, v)) <= TOL
    assert (
        _max_rel(
            torch.vmap(fn, in_dims=(0, None, None))(q, k[0], v[0]),
            torch.stack([fn(q[i], k[0], v[0]) for i in range(3)]),
        )
        <= TOL
    )
    drop = lambda q_: at.attention(q_, k[0], v[0], dropout_p=0.5, seed=4)  # noqa: E731
    assert torch.equal(torch.vmap(drop)(q), torch.stack([drop(q[i]) for i in range(3)]))
    # torch.func.grad, and per-example gradients with vmap(grad).
    loss = lambda q_, k_, v_: (fn(q_, k_, v_) ** 2).sum()  # noqa: E731
    g = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    g_ref = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for a, b in zip(g, g_ref):
        assert _max_rel(a, b) <= TOL
    per_example = torch.vmap(torch.func.grad(loss, argnums=1))(q, k, v)
    for i in range(3):
        ref_i = torch.autograd.grad(loss(q[i], k[i], v[i]), k)[0][i]
        assert _max_rel(per_example[i], ref_i) <= TOL
    # Weights under torch.func.grad.
    wloss = lambda k_: (at.attention(q, k_, v, return_weights=True)[1] ** 2).sum()  # noqa: E731
    assert _max_rel(torch.func.grad(wloss)(k), torch.autograd.grad(wloss(k), k)[0]) <= TOL


def test_torchscript_calls_the_op():
    @torch.jit.script
    def scripted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse, w = torch.ops.attn.attention(q, k, v, causal=True)
        return out

    q, k, v = _qkv()
    got = scripted(q, k, v)
    ref = at.attention(q, k, v, causal=True)
    assert _max_rel(got, ref) <= TOL
    for a, b in zip(
        torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
    ):
        assert _max_rel(a, b) <= TOL


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:.*jit.trace.*:FutureWarning")
def test_jit_trace_records_the_op_not_a_constant():
    """A traced function calling attn gives the right answer on new inputs (the op is in the graph); the paged
    entry, which has no op, refuses to be traced."""

    def sdpa(q, k, v):
        return at.scaled_dot_product_attention(q, k, v, is_causal=True)

    def attention(q, k, v):
        return at.attention(q, k, v, causal=True, softcap=3.0)

    q = torch.randn(1, 2, 5, 8)
    fresh = torch.randn(1, 2, 5, 8)
    for fn in (sdpa, attention):
        traced = torch.jit.trace(fn, (q, q, q), check_trace=False)
        assert _max_rel(traced(fresh, fresh, fresh), fn(fresh, fresh, fresh)) <= TOL, fn.__name__
    pages = torch.zeros(2, 4, 1, 8)
    table, used = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cannot be traced by torch.jit.trace"):
        torch.jit.trace(
            lambda x: at.attention_paged(x, pages, pages, table, used), (torch.zeros(1, 2, 8),)
        )


# ---- item 10: CPU autocast ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_sdpa_and_attention_follow_torch(dtype):
    q, k, v = (t.float().detach().requires_grad_(True) for t in _qkv(hq=2, hkv=2))
    fmask = torch.randn(3, 5)
    bmask = torch.rand(3, 5) > 0.3
    bmask[:, 0] = True
    for kw in [dict(), dict(attn_mask=fmask), dict(attn_mask=bmask), dict(is_causal=True)]:
        with torch.autocast("cpu", dtype=dtype):
            ref = F.scaled_dot_product_attention(q, k, v, **kw)
            out = at.scaled_dot_product_attention(q, k, v, **kw)
        assert ref.dtype == dtype and out.dtype == ref.dtype
        # Both compute from the inputs (and the float mask) rounded to dtype.
        exact = F.scaled_dot_product_attention(
            *(t.detach().to(dtype).double() for t in (q, k, v)),
            **{
                n: (m.to(dtype).double() if m.is_floating_point() else m)
                if isinstance(m, torch.Tensor)
                else m
                for n, m in kw.items()
            },
        )
        assert _max_rel(out, exact) <= 1e-2
        g = torch.autograd.grad(out.float().sum(), (q, k, v))
        g_ref = torch.autograd.grad(ref.float().sum(), (q, k, v))
        for a, b in zip(g, g_ref):
            assert a.dtype == b.dtype == torch.float32 and _max_rel(a, b) <= 5e-2
    with torch.autocast("cpu", dtype=dtype):
        out, w = at.attention(q, k, v, mask=fmask, mask_type="add", return_weights=True)
        op_out = torch.ops.attn.attention(q, k, v)[0]
        q64, k64, v64 = (t.double() for t in (q, k, v))
        # float64 is not cast
        assert at.scaled_dot_product_attention(q64, k64, v64).dtype == torch.float64
        assert F.scaled_dot_product_attention(q64, k64, v64).dtype == torch.float64
    assert out.dtype == w.dtype == op_out.dtype == dtype


def test_sinks_alone_get_their_gradient():
    """Training the sinks alone (q, k, v frozen): autograd still sees the call and dsinks matches a composition."""
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    out = at.attention(q, q, q, sinks=sinks)
    assert out.grad_fn is not None
    out.square().sum().backward()
    ref_sinks = sinks.detach().clone().requires_grad_(True)
    scores = q @ q.transpose(-1, -2) / 2.0  # 1 / sqrt(D)
    logits = torch.cat([scores, ref_sinks.view(1, 2, 1, 1).expand(1, 2, 3, 1)], dim=-1)
    ref = logits.softmax(-1)[..., :3] @ q
    ref.square().sum().backward()
    torch.testing.assert_close(sinks.grad, ref_sinks.grad)
