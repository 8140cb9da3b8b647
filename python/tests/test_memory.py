"""attn's cache of freed tensor buffers, seen from Python: a result handed to NumPy without a copy goes back
to the cache when NumPy drops it, the budget bounds what is held, and releasing gives it all back."""

import gc

import numpy as np
import pytest

import attn


@pytest.fixture
def budget():
    saved = attn.cached_memory_limit()
    attn.set_cached_memory_limit(64 << 20)
    attn.release_cached_memory()
    yield
    attn.set_cached_memory_limit(saved)


def big_result():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 512, 64), dtype=np.float32)  # the output: 512 KiB
    return attn.attention(q, q, q, backend="cpu")


def test_a_dropped_result_returns_to_the_cache(budget):
    out = big_result()
    held = attn.cached_memory_bytes()
    del out
    gc.collect()
    assert attn.cached_memory_bytes() >= held + (512 << 10)
    assert attn.release_cached_memory() >= 512 << 10
    assert attn.cached_memory_bytes() == 0


def test_a_zero_budget_holds_nothing(budget):
    attn.set_cached_memory_limit(0)
    assert attn.cached_memory_limit() == 0
    out = big_result()
    del out
    gc.collect()
    assert attn.cached_memory_bytes() == 0


def test_results_stay_right_when_buffers_are_reused(budget):
    first = big_result().copy()
    for _ in range(3):
        assert np.array_equal(big_result(), first)
