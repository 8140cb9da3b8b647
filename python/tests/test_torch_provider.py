"""attn.torch.enable(): torch.nn.functional.scaled_dot_product_attention on CPU tensors runs attn's kernels (the
profiler shows attn's records), forward and backward, with results equal to torch's own within the contract's
tolerances over masks, causality, GQA, scale and dtypes; disable(), the with-block and torch's flash-attention
registry restore torch's kernels exactly."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import attn.torch as at  # noqa: E402
from attn import _torch_provider  # noqa: E402

# The C++ registration (attn._torch_kernels) wherever the build made it, and the Python kernels always.
KERNELS = ["C++", "Python"] if _torch_provider.cpp_kernels_available() else ["Python"]


def _attn_records(fn) -> list[str]:
    with torch.profiler.profile() as prof:
        fn()
    return sorted({e.name for e in prof.events() if e.name.startswith("attn::")})


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _inputs(dtype, hq=8, hkv=8, lq=17, lk=23, e=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, lq, e, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, hkv, lk, e, generator=g).to(dtype).requires_grad_()
    v = torch.randn(2, hkv, lk, e, generator=g).to(dtype).requires_grad_()
    return q, k, v


def _run(q, k, v, **kw):
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    dout = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "causal, scale": {"is_causal": True, "scale": 0.3},
    "bool mask [Lq, Lk]": {"attn_mask": "bool"},
    "float mask [B, 1, Lq, Lk]": {"attn_mask": "float"},
}


def _case(name, lq, lk):
    kw = dict(CASES[name])
    g = torch.Generator().manual_seed(1)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(lq, lk, generator=g) > 0.3
    elif kw.get("attn_mask") == "float":
        kw["attn_mask"] = torch.randn(2, 1, lq, lk, generator=g)
    return kw


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("kernels", KERNELS)
def test_sdpa_on_attn_equals_torch(name, dtype, gqa, kernels):
    q, k, v = _inputs(dtype, hkv=2 if gqa else 8)
    kw = _case(name, 17, 23)
    if gqa:
        kw["enable_gqa"] = True
    if "attn_mask" in kw and kw["attn_mask"].dtype.is_floating_point:
        kw["attn_mask"] = kw["attn_mask"].to(dtype)
    want = _run(q, k, v, **kw)
    with at.enable(kernels) as provider:
        assert provider.kernels == kernels
        got = _run(q, k, v, **kw)
        records = _attn_records(lambda: _run(q, k, v, **kw))
    assert records == ["attn::attention", "attn::attention_backward"]
    # f32: 1e-5 relative (the bound, against torch's own kernel); bf16: a few roundings of the output
    tol = 1e-5 if dtype == torch.float32 else 2**-6
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert _rel(g, w) <= tol, (what, _rel(g, w))


@pytest.mark.parametrize("kernels", KERNELS)
def test_disable_restores_torch_exactly(kernels):
    q, k, v = _inputs(torch.float32)
    want = _run(q, k, v, is_causal=True)
    provider = at.enable(kernels)
    assert at.enable() is provider  # enabling twice: the same handle
    provider.disable()
    provider.disable()  # idempotent
    got = _run(q, k, v, is_causal=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert _attn_records(lambda: _run(q, k, v, is_causal=True)) == []
    with at.enable(kernels) as p:
        assert p.enabled
    assert not p.enabled
    assert _attn_records(lambda: F.scaled_dot_product_attention(q, k, v)) == []


def test_torch_flash_attention_registry():
    registry = pytest.importorskip("torch.nn.attention")
    if not hasattr(registry, "activate_flash_attention_impl"):
        pytest.skip("no flash-attention registry in this torch")
    assert "attn" in registry.list_flash_attention_impls()
    q, k, v = _inputs(torch.float32)
    registry.activate_flash_attention_impl("attn")
    try:
        assert registry.current_flash_attention_impl() == "attn"
        assert _attn_records(lambda: F.scaled_dot_product_attention(q, k, v)) == ["attn::attention"]
    finally:
        registry.restore_flash_attention_impl()
    assert _attn_records(lambda: F.scaled_dot_product_attention(q, k, v)) == []


@pytest.mark.parametrize("kernels", KERNELS)
def test_dropout_stays_on_torchs_path_and_direct_dropout_is_refused(kernels):
    q, k, v = _inputs(torch.float32)
    with at.enable(kernels):
        # SDPA with dropout takes torch's math path on the CPU: attn's kernel is not called
        assert _attn_records(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)) == []
        with pytest.raises(NotImplementedError, match="dropout_p=0.5 is not taken by attn"):
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q.detach(), k.detach(), v.detach(), 0.5
            )


@pytest.mark.parametrize("kernels", KERNELS)
def test_direct_operator_call_with_a_bool_mask(kernels):
    """scaled_dot_product_attention hands the operator an additive mask; a direct call may pass a bool one (True =
    attend), which attn takes as its keep mask."""
    q, k, v = (x.detach() for x in _inputs(torch.float32))
    mask = torch.rand(17, 23, generator=torch.Generator().manual_seed(2)) > 0.3
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with at.enable(kernels):
        got, _ = op(q, k, v, attn_mask=mask)
    assert _rel(got, want) <= 1e-5


def test_the_cpp_kernels_are_built_where_torch_was_there_at_build_time():
    """The package is built with PyTorch installed (scripts/test.sh installs it first): the C++ registration must be
    there and load, and enable() must choose it."""
    assert _torch_provider.cpp_kernels_available(), "attn._torch_kernels missing or not loading"
    with at.enable() as provider:
        assert provider.kernels == "C++"
    with pytest.raises(ValueError, match="kernels must be 'auto', 'C\\+\\+' or 'Python'"):
        at.enable("cuda")
