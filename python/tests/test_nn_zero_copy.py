"""attn.nn's modules read NumPy arrays and torch tensors in place (no copy where the layout allows) and hand outputs
back without a copy: an identity module's output is its input's memory and keeps it alive; a module's backward
reads the forward's input where the caller left it (so a torch tensor changed in place in between is refused, as
torch's autograd refuses it); inputs are never written; non-contiguous, reversed and other-dtype inputs give the
same answers as their contiguous copies of the module's dtype, and an integer input is refused naming it."""

import gc

import numpy as np
import pytest

ann = pytest.importorskip("attn.nn", reason="this build of attn has no nn module")

E, H, FF, B, L = 8, 2, 16, 2, 5


def _layer(dtype="float64", **kw):
    layer = ann.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True, dtype=dtype, **kw)
    return layer.eval()


def test_identity_output_is_the_input_memory():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 6))
    for drop in (ann.Dropout(0.5).eval(), ann.Dropout(0.0)):
        y = drop(x)
        assert np.shares_memory(y, x) and np.array_equal(y, x)
        dx = drop.backward(x)["input"]  # identity backward: the gradient is grad_output's memory
        assert np.shares_memory(dx, x)
    view = x[:, ::2]  # a strided view stays a view of the same memory
    y = ann.Dropout(0.0)(view)
    assert np.shares_memory(y, x) and np.array_equal(y, view)


def test_identity_output_keeps_the_input_alive():
    # 16 MB: freed arrays of this size go back to the OS, so reading one after its owner is gone would fault.
    x = np.random.default_rng(1).standard_normal(2 * 1024 * 1024)
    expected = x.copy()
    y = ann.Dropout(0.0)(x)
    del x
    gc.collect()
    junk = np.full(2 * 1024 * 1024, 7.0)  # would reuse the freed memory
    assert np.array_equal(y, expected)
    del junk


def test_read_only_input_gives_a_read_only_or_copied_output():
    x = np.broadcast_to(np.arange(4.0), (3, 4))  # read-only, stride 0
    y = ann.Dropout(0.0)(x)
    assert np.array_equal(y, x)
    if np.shares_memory(y, x):
        assert not y.flags.writeable
    else:
        y[0, 0] = 5.0  # a copy of its own
        assert x[0, 0] == 0.0


def test_linear_backward_reads_the_forward_input_in_place():
    # No copy on the way in: dW = dy^T x reads x where the caller keeps it (as torch.from_numpy under autograd).
    rng = np.random.default_rng(2)
    lin = ann.Linear(6, 4, dtype="float64")
    x, dy = rng.standard_normal((5, 6)), rng.standard_normal((5, 4))
    lin(x)
    np.testing.assert_allclose(lin.backward(dy)["weight"], dy.T @ x, rtol=1e-12)
    lin(x)
    x *= 2.0  # in place, between forward and backward
    np.testing.assert_allclose(lin.backward(dy)["weight"], dy.T @ x, rtol=1e-12)


MODULES = [
    "Linear",
    "LayerNorm",
    "GELU",
    "FeedForward",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "TransformerDecoderLayer",
]


def _module(name, dt):
    """(module, inputs, grad_output shape) of the module called name, in dtype dt."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, L, E)).astype(dt)
    dn = np.dtype(dt).name
    if name == "Linear":
        return ann.Linear(E, 3, dtype=dn), (x,), (B, L, 3)
    if name == "LayerNorm":
        return ann.LayerNorm(E, dtype=dn), (x,), (B, L, E)
    if name == "GELU":
        return ann.GELU(), (x,), (B, L, E)
    if name == "FeedForward":
        return ann.FeedForward(E, FF, "gelu", dtype=dn), (x,), (B, L, E)
    if name == "MultiheadAttention":
        return ann.MultiheadAttention(E, H, batch_first=True, dtype=dn), (x, x, x), (B, L, E)
    if name == "TransformerEncoderLayer":
        return _layer(dn), (x,), (B, L, E)
    if name == "TransformerEncoder":
        return ann.TransformerEncoder(_layer(dn), 2), (x,), (B, L, E)
    mem = rng.standard_normal((B, L + 2, E)).astype(dt)
    return (
        ann.TransformerDecoderLayer(E, H, FF, dropout=0.0, batch_first=True, dtype=dn),
        (x, mem),
        (B, L, E),
    )


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("name", MODULES)
def test_inputs_are_never_written(name, dt):
    module, inputs, dy_shape = _module(name, dt)
    before = [a.copy() for a in inputs]
    out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    dy = np.random.default_rng(4).standard_normal(dy_shape).astype(out.dtype)
    dy_before = dy.copy()
    module.backward(dy)
    for a, b in zip(inputs, before):
        assert np.array_equal(a, b)
    assert np.array_equal(dy, dy_before)


def test_noncontiguous_reversed_and_other_dtype_inputs():
    rng = np.random.default_rng(5)
    layer = _layer("float32")
    x = rng.standard_normal((B, L, E)).astype(np.float32)
    dy = rng.standard_normal((B, L, E)).astype(np.float32)
    ref = layer(x)
    ref_grads = layer.backward(dy)
    wide = np.zeros((B, L, 2 * E), np.float32)
    wide[:, :, ::2] = x
    rev = np.ascontiguousarray(x[::-1])[::-1]  # negative batch stride, same values
    fortran = np.asfortranarray(x)
    for xi in (wide[:, :, ::2], rev, fortran):
        y = layer(xi)
        # the module's contiguous copy: the same bits
        assert y.dtype == np.float32 and np.array_equal(y, ref)
        g = layer.backward(np.asfortranarray(dy))
        for k in ref_grads:
            assert np.array_equal(g[k], ref_grads[k]), k
    # Another floating dtype is converted on entry: the answer of the converted input, in the module's dtype.
    y64 = layer(x.astype(np.float64))
    assert y64.dtype == np.float32 and np.array_equal(y64, ref)
    x16 = x.astype(np.float16)
    np.testing.assert_array_equal(layer(x16), layer(x16.astype(np.float32)))
    with pytest.raises((TypeError, ValueError), match="src"):
        layer(x.astype(np.int32))
    with pytest.raises(TypeError, match="attn.nn.Linear.forward: input must be a floating"):
        ann.Linear(E, 3)(np.ones((2, E), np.int64))
    lin = ann.Linear(E, 3)
    lin(x)
    with pytest.raises(TypeError, match="attn.nn.Linear.backward: grad_output must be a floating"):
        lin.backward(np.ones((B, L, 3), np.int32))


torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the torch zero-copy tests are skipped"
)


def test_torch_identity_output_is_the_input_memory():
    x = torch.randn(3, 4, 6)
    y = ann.Dropout(0.0)(x)
    assert isinstance(y, torch.Tensor) and y.data_ptr() == x.data_ptr() and torch.equal(y, x)
    xt = x.transpose(0, 2)
    y = ann.Dropout(0.0)(xt)
    assert y.data_ptr() == xt.data_ptr() and y.stride() == xt.stride() and torch.equal(y, xt)


@pytest.mark.parametrize("change", ["add_", "resize_", "none"])
def test_torch_input_changed_in_place_is_refused(change):
    torch.manual_seed(0)
    layer = _layer("float32")
    x, dy = torch.randn(B, L, E), torch.randn(B, L, E)
    layer(x)
    if change == "add_":
        x.add_(1.0)
    elif change == "resize_":
        x.resize_(64, L, E)  # new, larger storage: the old memory is gone
    if change == "none":
        assert set(layer.backward(dy)) >= {"src", "self_attn.in_proj_weight"}
        return
    with pytest.raises(
        RuntimeError, match=r"TransformerEncoderLayer.backward: src was modified in place"
    ):
        layer.backward(dy)
    layer(x[:B])  # a new forward is fine again
    layer.backward(dy)


def test_torch_inference_tensors_and_requires_grad_inputs():
    lin = ann.Linear(E, 3, dtype="float64")
    with torch.inference_mode():
        x = torch.randn(4, E, dtype=torch.float64)  # an inference tensor: no version counter
        lin(x)
    dy = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(lin.backward(dy)["weight"], dy.T @ x, rtol=1e-12, atol=0)
    xg = torch.randn(4, E, dtype=torch.float64, requires_grad=True)
    lin(xg)
    torch.testing.assert_close(lin.backward(dy)["weight"], dy.T @ xg.detach(), rtol=1e-12, atol=0)


def test_torch_noncontiguous_and_other_dtype_inputs():
    torch.manual_seed(1)
    layer = _layer("float32")
    x = torch.randn(B, L, E)
    ref = layer(x)
    # [B, L, E] with L outermost in memory
    seq_first = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not seq_first.is_contiguous()
    assert torch.equal(layer(seq_first), ref)
    for dt in (torch.float64, torch.bfloat16):
        xi = x.to(dt)
        y = layer(xi)
        assert y.dtype == torch.float32 and torch.equal(y, layer(xi.float()))
    with pytest.raises((TypeError, ValueError), match="src"):
        layer(x.to(torch.int32))
