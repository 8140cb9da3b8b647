"""Torch tensors in and out of the extension without DLPack (read off their attributes, returned through NumPy):
every layout the fast path takes or refuses gives the values torch itself sees."""

import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional


def _ref(q, k, v):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double())


@pytest.mark.parametrize(
    "dtype, tol",
    [(torch.float32, 1e-6), (torch.float64, 1e-12), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)],
)
def test_dtypes_come_back_as_the_callers(dtype, tol):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g).to(dtype) for _ in range(3))
    out = attn.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == (2, 3, 5, 8)
    assert torch.allclose(out.double(), _ref(q, k, v), atol=tol, rtol=0)


def test_strided_offset_and_broadcast_views_are_read_in_place():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 3, 9, 16, generator=g)
    q = base[1:3, :, ::2, :8]  # storage offset, strided rows, a slice of the last dim
    k = base.transpose(0, 1)[:, :2].transpose(0, 1)[:2, :, 1:, 8:]  # permuted strides
    v = torch.randn(1, 1, 8, 8, generator=g).expand(2, 3, 8, 8)  # zero strides
    out = attn.attention(q, k, v)
    assert torch.allclose(out.double(), _ref(q, k, v), atol=1e-6, rtol=0)


def test_lazily_negated_and_conjugate_views_are_read_as_values():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    # a view whose values are -k (the negation is a bit on the tensor, not in memory)
    neg = torch._neg_view(k)
    assert neg.is_neg()
    out = attn.attention(q, neg, v)
    assert torch.allclose(out.double(), _ref(q, -k, v), atol=1e-6, rtol=0)


def test_tensors_that_require_grad_and_zero_sized_ones():
    q, k, v = (torch.ones(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = attn.attention(q, k, v)
    assert not out.requires_grad and torch.allclose(out, torch.ones(1, 2, 3, 4))
    empty = attn.attention(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 0, 4), torch.ones(1, 2, 0, 4))
    assert torch.equal(empty, torch.zeros(1, 2, 3, 4))


def test_results_own_their_memory():
    q = torch.randn(1, 1, 2, 4)
    out = attn.attention(q, q, q)
    keep = out.clone()
    del q
    for _ in range(3):
        attn.attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    assert torch.equal(out, keep)
    out.add_(1.0)  # writable, as torch's own results
    assert torch.equal(out, keep + 1.0)


def test_other_devices_and_layouts_are_refused_by_name():
    q = torch.ones(1, 1, 2, 4)
    with pytest.raises(ValueError, match="CPU|meta"):
        attn.attention(q.to("meta"), q, q)
    with pytest.raises(TypeError, match="q"):
        attn.attention(q.to_sparse(), q, q)
    with pytest.raises(TypeError, match="q"):
        attn.attention(q.to(torch.complex64), q, q)


def test_numpy_and_torch_inputs_mixed_give_torch():
    q = torch.randn(1, 2, 3, 4)
    out = attn.attention(q, q.numpy(), np.ascontiguousarray(q.numpy()))
    assert isinstance(out, torch.Tensor)
    assert torch.allclose(out.double(), _ref(q, q, q), atol=1e-6, rtol=0)
