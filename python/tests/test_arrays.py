"""Arrays in and out: dtypes, strides, read-only and zero-size inputs, and bad input raising the documented
exception (TypeError for what is not a usable array, ValueError for bad shapes and options) -- never a crash."""

import sys

import numpy as np
import pytest
from conftest import qkv

import attn


def test_numpy_in_numpy_out_and_dtypes(rng):
    for dtype in (np.float64, np.float32, np.float16):
        q, k, v = qkv(rng, dtype=dtype)
        out, lse = attn.attention(q, k, v, return_lse=True)
        assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == (2, 3, 5, 8)
        assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == (
            2,
            3,
            5,
        )
        assert out.flags.writeable


def test_strided_readonly_and_reversed_views_give_the_same_result(rng):
    q, k, v = qkv(rng)
    ref = attn.attention(q, k, v)
    # Non-contiguous views: the head dim transposed from a [B, L, H, D] buffer, every other element of a
    # wider last dim, a reversed (negative-stride) copy, and read-only arrays.
    q_t = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    k_wide = np.zeros(k.shape[:-1] + (2 * k.shape[-1],))
    k_wide[..., ::2] = k
    v_rev = np.ascontiguousarray(v[..., ::-1, :])[..., ::-1, :]
    ro = q.copy()
    ro.setflags(write=False)
    np.testing.assert_array_equal(attn.attention(q_t, k_wide[..., ::2], v_rev), ref)
    np.testing.assert_array_equal(attn.attention(ro, k, v), ref)
    # Broadcast (stride 0) key/value.
    k0 = np.broadcast_to(k[:1], k.shape)
    v0 = np.broadcast_to(v[:1], v.shape)
    np.testing.assert_array_equal(
        attn.attention(q, k0, v0), attn.attention(q, k0.copy(), v0.copy())
    )


def test_big_endian_and_fortran_order(rng):
    q, k, v = qkv(rng)
    ref = attn.attention(q, k, v)
    np.testing.assert_array_equal(attn.attention(q.astype(">f8"), np.asfortranarray(k), v), ref)


def test_python_lists_are_accepted(rng):
    q, k, v = qkv(rng, batch=(), hq=1, hkv=1, lq=2, lk=3, d=2)
    np.testing.assert_array_equal(
        attn.attention(q.tolist(), k.tolist(), v.tolist()), attn.attention(q, k, v)
    )


def test_zero_size_inputs(rng):
    q, k, v = qkv(rng)
    out, lse = attn.attention(q, k[..., :0, :], v[..., :0, :], return_lse=True)
    assert out.shape == (2, 3, 5, 8) and not out.any() and np.all(np.isneginf(lse))
    out = attn.attention(q[:0], k[:0], v[:0])
    assert out.shape == (0, 3, 5, 8)
    out, lse = attn.attention(q[:, :, :0], k, v, return_lse=True)  # no queries
    assert out.shape == (2, 3, 0, 8) and lse.shape == (2, 3, 0)


@pytest.mark.parametrize(
    "make, exc",
    [
        (lambda q, k, v: (np.array([object()] * 3), k, v), TypeError),
        (lambda q, k, v: (q.astype(np.int8), k, v), TypeError),
        (lambda q, k, v: (q.astype(np.complex128), k, v), TypeError),
        (lambda q, k, v: ("q", k, v), TypeError),
        (lambda q, k, v: ({"a": 1}, k, v), TypeError),
        (lambda q, k, v: (np.float64(1.0), k, v), ValueError),  # 0-d
        (lambda q, k, v: (np.zeros((1,) * 12), k, v), ValueError),  # rank > 8
        (lambda q, k, v: (np.zeros((1,) * 32), k, v), ValueError),
        (lambda q, k, v: (q[0, 0], k, v), ValueError),  # rank 2
        (lambda q, k, v: (q, k.astype(np.float32), v), ValueError),  # mixed dtypes
        (lambda q, k, v: (q, k[..., :4], v), ValueError),  # head dims differ
        (lambda q, k, v: (q, k[:, :2], v[:, :2]), ValueError),  # 3 heads over 2 kv heads
        (lambda q, k, v: (q, k, v[:1]), ValueError),  # batch dims differ
    ],
)
def test_bad_arrays_raise(rng, make, exc):
    q, k, v = qkv(rng)
    with pytest.raises(exc, match=r"attn"):
        attn.attention(*make(q, k, v))


@pytest.mark.parametrize(
    "options, exc",
    [
        ({"mask_type": "sideways"}, ValueError),
        ({"align": "middle"}, ValueError),
        ({"backend": "gpu"}, ValueError),
        ({"scale": float("inf")}, ValueError),
        ({"scale": float("nan")}, ValueError),
        ({"softcap": -1.0}, ValueError),
        ({"dropout_p": 1.5}, ValueError),
        ({"dropout_p": -0.1}, ValueError),
        ({"window": 3}, TypeError),
        ({"window": (1, 2, 3)}, TypeError),
        ({"window": (-5, 0)}, ValueError),
        ({"window": ("a", 0)}, TypeError),
        (
            {"mask": np.ones((5, 7))},
            TypeError,
        ),  # float mask with mask_type keep: a dtype the option does not take
        ({"mask": np.ones((4, 7), dtype=bool)}, ValueError),  # does not broadcast
        ({"mask": np.ones((5, 7), dtype=bool), "mask_type": "add"}, TypeError),
        ({"mask": np.array([object()])}, TypeError),
        ({"key_lengths": np.array([1.5, 2.0])}, TypeError),
        ({"key_lengths": np.array([1, 99])}, ValueError),
        ({"key_lengths": np.array([1, 2, 3])}, ValueError),
        ({"alibi_slopes": np.ones(2)}, ValueError),
        ({"block_layout": np.ones((3, 3), dtype=bool)}, ValueError),  # no block_size
        ({"block_layout": np.ones((3, 4), dtype=bool), "block_size": (0, 2)}, ValueError),
        ({"block_layout": np.ones((3, 4), dtype=bool), "block_size": "big"}, TypeError),
        ({"block_size": 2}, ValueError),  # no block_layout
        ({"seed": -1}, ValueError),
        ({"seed": 2**64}, ValueError),
        ({"threads": "many"}, TypeError),
        ({"return_weights": True, "mask": np.zeros((5, 7), dtype=np.int8)}, TypeError),
    ],
)
def test_bad_options_raise(rng, options, exc):
    q, k, v = qkv(rng)
    with pytest.raises(exc):
        attn.attention(q, k, v, **options)


def test_backward_errors(rng):
    q, k, v = qkv(rng)
    out, lse = attn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="attn::attention_backward"):
        attn.attention_backward(out[..., :1, :], q, k, v, out, lse)
    with pytest.raises(ValueError, match="lse"):
        attn.attention_backward(out, q, k, v, out, lse[..., :1])
    with pytest.raises(ValueError, match="seed"):
        attn.attention_backward(out, q, k, v, out, lse, dropout_p=0.5)
    with pytest.raises(ValueError, match="mask_grad"):
        attn.attention_backward(out, q, k, v, out, lse, mask_grad=True)
    with pytest.raises(TypeError):
        attn.attention_backward(None, q, k, v, out, lse)


def test_error_messages_name_the_argument(rng):
    q, k, v = qkv(rng)
    with pytest.raises(TypeError, match=r"attn\.attention: k has an unsupported dtype"):
        attn.attention(q, k.astype(np.uint8), v)
    with pytest.raises(ValueError, match=r"attn::attention: q and k must have the same head dim"):
        attn.attention(q, k[..., :3], v)


def test_import_attn_does_not_import_torch():
    import subprocess

    code = "import sys, attn; assert 'torch' not in sys.modules, 'attn imported torch'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_threads_and_backend_helpers(rng):
    q, k, v = qkv(rng, dtype=np.float32)
    a = attn.attention(q, k, v, threads=1)
    b = attn.attention(q, k, v, threads=2)
    np.testing.assert_array_equal(a, b)  # results do not depend on the thread count
    assert attn.resolve_backend("reference", "float32") == "reference"
    assert attn.resolve_backend("auto", "float64") in ("reference", "cpu")
    old = attn.get_num_threads()
    try:
        attn.set_num_threads(3)
        assert attn.get_num_threads() == 3
        attn.set_num_threads(0)  # back to the default: ATTN_NUM_THREADS or all cores
        assert attn.get_num_threads() >= 1
    finally:
        attn.set_num_threads(old)


def test_type_stubs_match_the_bindings():
    """_core/__init__.pyi (nanobind stubgen, scripts/check_stubs.sh) carries the signatures the extension reports."""
    import pathlib

    import attn._core as core

    stub = (pathlib.Path(attn.__file__).parent / "_core" / "__init__.pyi").read_text()
    assert (pathlib.Path(attn.__file__).parent / "py.typed").exists()
    for fn in (
        core.attention,
        core.attention_backward,
        core.set_num_threads,
        core.get_num_threads,
        core.resolve_backend,
    ):
        signature = fn.__doc__.splitlines()[0]
        assert f"def {signature}:" in stub, signature
