"""torch.nn.attention.varlen.varlen_attn on CPU tensors through attn.torch.enable() (attn._torch_varlen_provider):
forward and gradients against a float64 composition of each sequence (bottom-right alignment and FlashAttention's
window written out by hand), seqused_k and block_table (forward only, as torch allows), the dense form of the aten
op, varlen_attn_out, dropout's seed travelling in rng_state, disable() restoring torch, and the refused arguments."""

import math

import pytest

torch = pytest.importorskip("torch")
varlen = pytest.importorskip("torch.nn.attention.varlen")

from attn import _core  # noqa: E402
from attn import _torch_varlen_provider as torch_varlen_provider  # noqa: E402

varlen_attn, AuxRequest = varlen.varlen_attn, varlen.AuxRequest
OPS = (
    "_flash_attention_forward",
    "_flash_attention_forward_no_dropout_inplace",
    "_flash_attention_backward",
)

HQ, HKV, D, DV = 4, 2, 13, 11  # GQA; odd head dims
# (Lq_b, Lk_b): an empty sequence, one with no keys, more queries than keys, a single query, nothing at all.
LENGTHS = [(5, 9), (0, 3), (7, 7), (3, 0), (6, 4), (1, 10), (0, 0)]
USED = [6, 0, 7, 0, 2, 10, 0]  # seqused_k: <= Lk_b, some below it


def _offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


CU_Q = _offsets([lq for lq, _ in LENGTHS])
CU_K = _offsets([lk for _, lk in LENGTHS])
MAX_Q, MAX_K = max(lq for lq, _ in LENGTHS), max(lk for _, lk in LENGTHS)
TOTAL_Q, TOTAL_K = int(CU_Q[-1]), int(CU_K[-1])


@pytest.fixture
def provider():
    with torch_varlen_provider.enable() as handle:
        yield handle
    assert not torch_varlen_provider.is_enabled()


def _inputs(seed, dtype, hkv=HKV, total_q=TOTAL_Q, total_k=TOTAL_K, grad=True):
    g = torch.Generator().manual_seed(seed)
    shapes = ((total_q, HQ, D), (total_k, hkv, D), (total_k, hkv, DV))
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(grad) for s in shapes]


def _reference(q, k, v, cu_q, cu_k, window, scale=None, used=None):
    """float64 (out [total_q, Hq, Dv], lse [Hq, total_q]), differentiable in q, k, v: sequence b's queries against
    its first used[b] keys (all Lk_b without used), query i at key position p(i) = i + Lk_b - Lq_b, key j allowed
    when p(i) - left <= j <= p(i) + right (-1: that side unbounded); no allowed key: out 0, lse -inf."""
    q, k, v = (x.double() for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qb = q[cu_q[b] : cu_q[b + 1]]
        lk = int(cu_k[b + 1] - cu_k[b]) if used is None else int(used[b])
        kb, vb = (x[cu_k[b] : cu_k[b] + lk].repeat_interleave(group, dim=1) for x in (k, v))
        if lk == 0:  # no key at all: out 0, lse -inf
            outs.append(qb.new_zeros(qb.shape[0], q.shape[1], v.shape[-1]))
            lses.append(qb.new_full((q.shape[1], qb.shape[0]), -math.inf))
            continue
        s = torch.einsum("ihd,jhd->hij", qb, kb) * scale
        pos = torch.arange(qb.shape[0])[:, None] + lk - qb.shape[0]
        j = torch.arange(lk)[None]
        allowed = torch.ones(qb.shape[0], lk, dtype=torch.bool)
        if window[0] >= 0:
            allowed &= j >= pos - window[0]
        if window[1] >= 0:
            allowed &= j <= pos + window[1]
        m = torch.where(allowed, s, -math.inf).amax(-1, keepdim=True)
        m = torch.where(
            torch.isfinite(m), m, 0
        ).detach()  # a row with no allowed key: p is 0, m any finite value
        p = torch.exp(torch.where(allowed, s - m, -math.inf))
        total = p.sum(-1, keepdim=True)
        outs.append(torch.einsum("hij,jhd->ihd", p / torch.where(total > 0, total, 1), vb))
        lses.append((m + torch.log(total)).squeeze(-1))
    return torch.cat(outs), torch.cat(lses, dim=1)


def _assert_close(actual, expected, dtype, what):
    """f32: max error <= 1e-5 of the reference's largest magnitude; bf16 and f16: 2^-7 of it (DESIGN.md's rule)."""
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    err = (actual.double() - expected).abs().max().item() if expected.numel() else 0.0
    bound = tol * expected.abs().max().item() if expected.numel() else 0.0
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


CASES = {
    "full": {"window_size": (-1, -1)},
    "causal": {"window_size": (-1, 0)},
    "window (2, 1)": {"window_size": (2, 1)},
    "sliding causal (3, 0)": {"window_size": (3, 0)},
    "right only (-1, 2)": {"window_size": (-1, 2)},
    "scale 0.3, causal": {"window_size": (-1, 0), "scale": 0.3},
    "no GQA, causal": {"window_size": (-1, 0), "hkv": HQ},
}
BF16_CASES = ["causal", "window (2, 1)"]


@pytest.mark.parametrize(
    "case, dtype",
    [(c, torch.float32) for c in CASES]
    + [(c, torch.bfloat16) for c in BF16_CASES]
    + [("causal", torch.float16)],
)
def test_forward_and_gradients_match_per_sequence_reference(provider, case, dtype):
    options = dict(CASES[case])
    hkv = options.pop("hkv", HKV)
    q, k, v = _inputs(1, dtype, hkv)
    out, lse = varlen_attn(
        q,
        k,
        v,
        CU_Q,
        CU_K,
        MAX_Q,
        MAX_K,
        enable_gqa=hkv != HQ,
        return_aux=AuxRequest(lse=True),
        **options,
    )
    assert out.shape == (TOTAL_Q, HQ, DV) and out.dtype == dtype and lse.shape == (HQ, TOTAL_Q)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref, ref_lse = _reference(
        q64, k64, v64, CU_Q, CU_K, options["window_size"], options.get("scale")
    )
    _assert_close(out, ref, dtype, "out")
    if dtype == torch.float32:  # -inf where a row has no allowed key, at the same places
        torch.testing.assert_close(lse, ref_lse.float(), rtol=1e-5, atol=1e-5)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    out.backward(dout)
    ref.backward(dout.double())
    for name, x, x64 in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        assert x.grad.dtype == dtype and x.grad.shape == x.shape
        _assert_close(x.grad, x64.grad, dtype, name)


def test_expanded_grad_out(provider):
    """out.sum().backward() hands the backward an expanded grad_out (stride 0 everywhere)."""
    q, k, v = _inputs(3, torch.float32)
    varlen_attn(
        q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, window_size=(-1, 0), enable_gqa=True
    ).sum().backward()
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    _reference(q64, k64, v64, CU_Q, CU_K, (-1, 0))[0].sum().backward()
    for name, x, x64 in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        _assert_close(x.grad, x64.grad, torch.float32, name)


def test_float64_gradcheck(provider):
    """The backward is the forward's derivative: finite differences in float64, causal with a window and GQA."""
    cu_q, cu_k = _offsets([3, 0, 2]), _offsets([4, 2, 2])
    g = torch.Generator().manual_seed(4)
    q = torch.randn(5, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (
        torch.randn(8, 1, 3, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2)
    )

    def fn(q, k, v):
        return varlen_attn(q, k, v, cu_q, cu_k, 3, 4, window_size=(2, 0), enable_gqa=True)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1)])
def test_seqused_k_aligns_against_the_used_keys(provider, window):
    """FlashAttention's seqused_k: sequence b is attention over its first seqused_k[b] keys, the queries the last of
    those (a bounded window takes the one-key-block route: attn's varlen aligns against Lk_b)."""
    q, k, v = _inputs(5, torch.float32, grad=False)
    used = torch.tensor(USED, dtype=torch.int32)
    out = varlen_attn(
        q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, window_size=window, enable_gqa=True, seqused_k=used
    )
    _assert_close(out, _reference(q, k, v, CU_Q, CU_K, window, used=used)[0], torch.float32, "out")
    with pytest.raises(RuntimeError, match="seqused_k is an inference-only"):  # torch's own refusal
        varlen_attn(
            q.requires_grad_(), k, v, CU_Q, CU_K, MAX_Q, MAX_K, enable_gqa=True, seqused_k=used
        )


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (3, 0)])
def test_block_table_reads_the_pages(provider, window):
    """key/value as pools [num_blocks, block_size, Hkv, D] with a shuffled block table: the keys gathered."""
    block, pages = 4, [3, 1, 3, 0, 1, 3, 0]  # pages per sequence: ceil(seqused_k / block) or more
    used = torch.tensor(USED, dtype=torch.int32)
    g = torch.Generator().manual_seed(6)
    order = torch.randperm(sum(pages) + 2, generator=g).to(torch.int32)  # two blocks nobody uses
    table = torch.zeros(len(pages), max(pages), dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[start : start + n]
        start += n
    q = torch.randn(TOTAL_Q, HQ, D, generator=g)
    k_pool, v_pool = (torch.randn(len(order), block, HKV, x, generator=g) for x in (D, DV))
    paged = {"enable_gqa": True, "seqused_k": used, "block_table": table}
    out = varlen_attn(q, k_pool, v_pool, CU_Q, None, MAX_Q, MAX_K, window_size=window, **paged)
    rows = [
        table[b].repeat_interleave(block)[: USED[b]] * block + torch.arange(USED[b]) % block
        for b in range(7)
    ]
    rows = torch.cat(rows).long()
    k, v = (x.reshape(-1, HKV, x.shape[-1])[rows] for x in (k_pool, v_pool))
    ref = _reference(q, k, v, CU_Q, _offsets(USED), window)[0]
    _assert_close(out, ref, torch.float32, "out")
    # without seqused_k, cum_seq_k's differences are the lengths (FlashAttention's rule)
    by_offsets = {"enable_gqa": True, "block_table": table}
    cu_used = _offsets(USED)
    same = varlen_attn(
        q, k_pool, v_pool, CU_Q, cu_used, MAX_Q, MAX_K, window_size=window, **by_offsets
    )
    assert torch.equal(same, out)
    with pytest.raises(RuntimeError, match="block_table is an inference-only"):  # torch's refusal
        varlen_attn(q.requires_grad_(), k_pool, v_pool, CU_Q, cu_used, MAX_Q, MAX_K, **by_offsets)


def test_dense_form_of_the_aten_op(provider):
    """cum_seq_q None: query [B, Lq, Hq, D], logsumexp [B, Hq, Lq], causal bottom-right; torch's autograd formula of
    the aten op calls the backward with that logsumexp."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 5, HQ, D, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 8, HKV, x, generator=g, requires_grad=True) for x in (D, DV))
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, 0, 0, 0.0, True, False
    )
    assert out.shape == (2, 5, HQ, DV) and lse.shape == (2, HQ, 5)
    flat = [x.detach().double().reshape(-1, *x.shape[2:]).requires_grad_() for x in (q, k, v)]
    ref, ref_lse = _reference(*flat, _offsets([5, 5]), _offsets([8, 8]), (-1, 0))
    _assert_close(out.reshape(10, HQ, DV), ref, torch.float32, "out")
    torch.testing.assert_close(lse, ref_lse.float().reshape(HQ, 2, 5).transpose(0, 1))
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    ref.backward(dout.double().reshape(10, HQ, DV))
    for name, x, x64 in zip(("dq", "dk", "dv"), (q, k, v), flat):
        _assert_close(x.grad.reshape(x64.shape), x64.grad, torch.float32, name)


def test_varlen_attn_out_writes_into_out(provider):
    q, k, v = _inputs(8, torch.float32, grad=False)
    out = torch.full((TOTAL_Q, HQ, DV), math.nan)
    result, lse = varlen.varlen_attn_out(
        out,
        q,
        k,
        v,
        CU_Q,
        CU_K,
        MAX_Q,
        MAX_K,
        window_size=(-1, 0),
        enable_gqa=True,
        return_aux=AuxRequest(lse=True),
    )
    expected, expected_lse = varlen_attn(
        q,
        k,
        v,
        CU_Q,
        CU_K,
        MAX_Q,
        MAX_K,
        window_size=(-1, 0),
        enable_gqa=True,
        return_aux=AuxRequest(lse=True),
    )
    assert result is out
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(lse, expected_lse, rtol=0, atol=0)


def test_a_sequence_is_the_same_bits_alone(provider):
    """num_splits=1 asks for batch invariance; attn's result for a sequence does not depend on the batch anyway."""
    q, k, v = _inputs(9, torch.float32, grad=False)
    out = varlen_attn(
        q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, window_size=(-1, 0), enable_gqa=True, num_splits=1
    )
    b = 5  # (1, 10)
    qb, kb, vb = q[CU_Q[b] : CU_Q[b + 1]], k[CU_K[b] : CU_K[b + 1]], v[CU_K[b] : CU_K[b + 1]]
    alone = varlen_attn(
        qb, kb, vb, _offsets([1]), _offsets([10]), 1, 10, window_size=(-1, 0), enable_gqa=True
    )
    assert torch.equal(out[CU_Q[b] : CU_Q[b + 1]], alone)


def test_strided_last_dim(provider):
    q, k, v = _inputs(10, torch.float32, grad=False)
    wide = torch.zeros(*q.shape[:-1], 2 * D)
    wide[..., ::2] = q
    args = (CU_Q, CU_K, MAX_Q, MAX_K)
    out = varlen_attn(wide[..., ::2], k, v, *args, window_size=(-1, 0), enable_gqa=True)
    assert torch.equal(out, varlen_attn(q, k, v, *args, window_size=(-1, 0), enable_gqa=True))


def test_dropout_seed_travels_in_rng_state(provider):
    """A direct call with dropout_p > 0: attn's dropout, its seed in rng_state[0], the backward's keep-pattern the
    forward's (the gradients are attn's for that seed)."""
    q, k, v = _inputs(11, torch.float32)
    out, _, rng_state, _, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, 0.5, True, False
    )
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    seed = int(rng_state[0].item())
    options = {"causal": True, "dropout_p": 0.5, "seed": seed}
    expected, lse = _core.attention_varlen(
        q.detach(), k.detach(), v.detach(), CU_Q, CU_K, **options
    )
    assert torch.equal(out, expected)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(12))
    out.backward(dout)
    grads = _core.attention_varlen_backward(
        dout, q.detach(), k.detach(), v.detach(), out, lse, CU_Q, CU_K, **options
    )
    for name, x, g in zip(("dq", "dk", "dv"), (q, k, v), grads):
        assert torch.equal(x.grad, g), name


def test_torch_compile_fullgraph(provider):
    """torch.compile(fullgraph=True) keeps varlen_attn as torch's custom op (its fake kernel for tracing), which
    calls attn's kernels when the graph runs, forward and backward. aot_eager: the same graph capture and autograd
    as inductor without its C++ build."""
    q, k, v = _inputs(15, torch.float32)

    def fn(q, k, v):
        out = varlen_attn(
            2 * q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, window_size=(2, 0), enable_gqa=True
        )
        return out.sin()

    expected = fn(q, k, v)
    grads = torch.autograd.grad(expected.sum(), (q, k, v))
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
        compiled_grads = torch.autograd.grad(out.sum(), (q, k, v))
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for name, a, b in zip(("dq", "dk", "dv"), compiled_grads, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_refused_arguments(provider):
    q, k, v = _inputs(13, torch.float32, grad=False)
    args = (q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, 0.0, False)
    fwd = torch.ops.aten._flash_attention_forward
    with pytest.raises(NotImplementedError, match="alibi_slopes is not supported"):
        fwd(*args, False, alibi_slopes=torch.ones(HQ))
    with pytest.raises(NotImplementedError, match="return_debug_mask=True is not supported"):
        fwd(*args, True)
    with pytest.raises(ValueError, match="cum_seq_k is required"):
        fwd(q, k, v, CU_Q, None, MAX_Q, MAX_K, 0.0, False, False)
    with pytest.raises(ValueError, match=r"seqused_k\[2\] = 8 is outside \[0, 7\]"):
        used = torch.tensor(USED, dtype=torch.int32)
        used[2] = 8
        fwd(*args[:-1], True, False, seqused_k=used)
    with pytest.raises(ValueError, match=r"cum_seq_k\[3\] = 2 is below cum_seq_k\[2\] = 12"):
        cu_k = CU_K.clone()
        cu_k[3] = 2
        fwd(*args[:4], cu_k, *args[5:-1], True, False, seqused_k=torch.zeros(7, dtype=torch.int32))
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        torch.ops.aten._flash_attention_forward_no_dropout_inplace(
            torch.empty(0), q, k, v, *args[3:7], 0.5, False, False
        )
    with pytest.raises(
        ValueError, match="max_seqlen_k"
    ):  # attn checks the bounds FlashAttention trusts
        fwd(q, k, v, CU_Q, CU_K, MAX_Q, 5, 0.0, False, False)
    table, used = (
        torch.zeros(7, 3, dtype=torch.int32),
        torch.tensor(USED, dtype=torch.int32).clamp(max=8),
    )
    pool = torch.zeros(2, 4, HKV, D, requires_grad=True)
    with pytest.raises(
        RuntimeError, match="block_table is forward only"
    ):  # a direct call under autograd
        fwd(
            q,
            pool,
            pool,
            CU_Q,
            None,
            MAX_Q,
            MAX_K,
            0.0,
            False,
            False,
            seqused_k=used,
            block_table=table,
        )


def test_disable_restores_torch():
    """No CPU kernel before enable() and after the last handle's disable(): the dispatcher's table is as it was and
    varlen_attn raises again on CPU tensors. Handles nest; disable() twice does nothing."""
    before = {op: torch._C._dispatch_dump(f"aten::{op}") for op in OPS}
    q, k, v = _inputs(14, torch.float32, grad=False)

    def call():
        return varlen_attn(q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, enable_gqa=True)

    with pytest.raises(NotImplementedError, match="CPU"):
        call()
    outer = torch_varlen_provider.enable()
    try:
        assert all("CPU:" in torch._C._dispatch_dump(f"aten::{op}") for op in OPS)
        with torch_varlen_provider.enable() as inner:
            call()
        assert not inner.enabled and torch_varlen_provider.is_enabled()
        call()  # outer still holds the kernels
    finally:
        outer.disable()
    outer.disable()
    assert not torch_varlen_provider.is_enabled()
    assert {op: torch._C._dispatch_dump(f"aten::{op}") for op in OPS} == before
    with pytest.raises(NotImplementedError, match="CPU"):
        call()
