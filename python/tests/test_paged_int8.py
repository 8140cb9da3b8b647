"""int8 paged KV caches in Python (attn.quantize_int8, KVCache(dtype='int8'), attention_paged's k_scales / v_scales,
write_kv_slots into int8 pools, attn.torch.attention_paged): quantization's rule, and attention over an int8 cache
against attn.attention (float64) on the dequantized keys and values, to the contract's tolerance for q's dtype; bad
scales and pools refused by name."""

import numpy as np
import pytest

import attn

HQ, HKV, D = 8, 2, 64  # GQA: four query heads per kv head
BS = 16  # a multiple of the kernel's vector width: decode reads the int8 pages in place


def _dequantize(values, scales):
    return values.astype(np.float32) * scales[..., None]


def _head_major(x):
    return np.ascontiguousarray(np.swapaxes(x, 0, 1))[None]  # [L, H, X] -> [1, H, L, X]


def _rel(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_quantize_int8_rule():
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (6, 3, 20)).astype(np.float32)
    x[2, 1] = 0.0
    values, scales = attn.quantize_int8(x)
    assert values.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (6, 3)
    expected = np.abs(x).max(axis=-1) / np.float32(127)
    expected[2, 1] = 1.0
    np.testing.assert_array_equal(scales, expected)
    np.testing.assert_array_equal(values, np.clip(np.rint(x / scales[..., None]), -127, 127))
    assert np.all(np.abs(_dequantize(values, scales) - x) <= scales[..., None] * (0.5 + 1e-6))
    with pytest.raises(ValueError, match=r"x\[0, 0, 1\] = inf is not finite"):
        x[0, 0, 1] = np.inf
        attn.quantize_int8(x)


def _filled_cache(rng, lengths):
    cache = attn.KVCache(40, BS, HKV, D, dtype="int8")
    ids = [cache.add_sequence() for _ in lengths]
    k = rng.standard_normal((sum(lengths), HKV, D)).astype(np.float32)
    v = rng.standard_normal((sum(lengths), HKV, D)).astype(np.float32)
    k[:, :, 3] *= 10.0  # an outlier channel, as real K caches have
    cache.append(ids, k, v, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return cache, ids, k, v


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_int8_cache_attends_like_the_dequantized_keys(backend):
    rng = np.random.default_rng(1)
    lengths = [100, 37, 250]
    cache, ids, k, v = _filled_cache(rng, lengths)
    assert cache.k_pages.dtype == np.int8 and cache.k_scales.shape == (40, BS, HKV)
    q = rng.standard_normal((len(ids), HQ, D)).astype(np.float32)
    out = cache.attention(q, ids, causal=True, backend=backend)
    view = cache.view(ids)
    again = attn.attention_paged(
        q, *view, k_scales=view.k_scales, v_scales=view.v_scales, causal=True, backend=backend
    )
    np.testing.assert_array_equal(out, again)
    kd, vd = (_dequantize(*attn.quantize_int8(x)) for x in (k, v))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for b in range(len(ids)):
        rows = slice(starts[b], starts[b + 1])
        want = attn.attention(
            _head_major(q[b : b + 1].astype(np.float64)),
            _head_major(kd[rows].astype(np.float64)),
            _head_major(vd[rows].astype(np.float64)),
            causal=True,
        )
        assert _rel(_head_major(out[b : b + 1]), want) <= 1e-6, b


def test_int8_cache_with_torch_bf16_queries():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    cache, ids, k, v = _filled_cache(rng, [64, 300])
    q = torch.from_numpy(rng.standard_normal((2, HQ, D)).astype(np.float32)).to(torch.bfloat16)
    view = cache.view(ids)
    out = attn.torch.attention_paged(q, *view, k_scales=view.k_scales, v_scales=view.v_scales)
    assert out.dtype == torch.bfloat16
    ref = attn.attention_paged(
        q.float().numpy(), *view, k_scales=view.k_scales, v_scales=view.v_scales
    )
    assert _rel(out.float().numpy(), ref) <= 2 * 2**-8  # one bf16 rounding of the output


def test_write_slots_into_int8_pools_in_place():
    k_pages = np.zeros((3, 4, HKV, D), np.int8)
    v_pages = np.zeros_like(k_pages)
    k_scales = np.ones((3, 4, HKV), np.float32)
    v_scales = np.ones_like(k_scales)
    x = np.random.default_rng(3).standard_normal((2, HKV, D)).astype(np.float32)
    attn.write_kv_slots(
        k_pages, v_pages, x, x, np.array([6, -1], np.int32), k_scales=k_scales, v_scales=v_scales
    )
    values, scales = attn.quantize_int8(x)
    np.testing.assert_array_equal(k_pages[1, 2], values[0])  # slot 6 = block 1, row 2
    np.testing.assert_array_equal(v_scales[1, 2], scales[0])
    assert np.all(k_scales[0] == 1.0)
    cache = attn.KVCache.over(k_pages, v_pages, k_scales, v_scales)
    assert cache.k_scales is k_scales


def test_bad_scales_are_refused_by_name():
    rng = np.random.default_rng(4)
    cache, ids, _, _ = _filled_cache(rng, [20])
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    view = cache.view(ids)
    with pytest.raises(ValueError, match="int8 pools need k_scales"):
        attn.attention_paged(q, *view)
    scales = view.k_scales.copy()
    scales[view.block_table[0, 1], 3, 1] = -2.0  # key 19
    with pytest.raises(
        ValueError,
        match=r"k_scales\[\d+, 3, 1\] = -2 \(key 19 of sequence 0\) must be finite and > 0",
    ):
        attn.attention_paged(q, *view, k_scales=scales, v_scales=view.v_scales)
    with pytest.raises(
        TypeError, match="dtype must be 'float32', 'bfloat16', 'float16', 'float64' or 'int8'"
    ):
        attn.KVCache(4, BS, HKV, D, dtype="int16")
