"""Paged KV caches in Python (attn.attention_paged, attn._core.attention_paged, attn.torch.attention_paged,
attn.KVCache, attn.write_kv_slots): attention over a pool with shuffled block tables is attention_varlen on the same
keys gathered into packed rows (the same bits), a KVCache's appends, forks and frees against attn.attention on each
sequence's concatenated keys, pools written in place and kept alive, and the errors of hostile tables."""

import gc
import weakref

import numpy as np
import pytest

import attn
from attn import _core

HQ, HKV, D, DV = 4, 2, 13, 11  # GQA; odd head dims
BS, NUM_BLOCKS = 5, 40  # an odd block size
# (Lq_b, Lk_b): decode, speculative (3), a prefill chunk of 20, a decode with no keys, an exact number of blocks.
SEQS = [(1, 37), (3, 12), (20, 45), (1, 0), (1, 10)]
B = len(SEQS)


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


CU_Q = _offsets([lq for lq, _ in SEQS])
CU_K = _offsets([lk for _, lk in SEQS])


def _paged(rng, k, v, cu_k):
    """The packed keys and values k [total_k, Hkv, D], v [total_k, Hkv, Dv] scattered into pools of NUM_BLOCKS
    random blocks (noise wherever no sequence's keys are) in a shuffled order: (k_pages, v_pages, block_table,
    seqused_k). The table has a spare column, and its entries past a sequence's keys are out of range: not read."""
    k_pages = rng.standard_normal((NUM_BLOCKS, BS) + k.shape[1:]).astype(k.dtype)
    v_pages = rng.standard_normal((NUM_BLOCKS, BS) + v.shape[1:]).astype(v.dtype)
    lengths = np.diff(cu_k)
    table = np.full((len(lengths), -(-lengths.max() // BS) + 1), 10**6, np.int32)
    free = iter(rng.permutation(NUM_BLOCKS))
    for b, n in enumerate(lengths):
        for j0 in range(0, n, BS):
            block = next(free)
            rows = slice(cu_k[b] + j0, cu_k[b] + min(j0 + BS, n))
            k_pages[block, : rows.stop - rows.start] = k[rows]
            v_pages[block, : rows.stop - rows.start] = v[rows]
            table[b, j0 // BS] = block
    return k_pages, v_pages, table, lengths.astype(np.int32)


def _problem(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((CU_Q[-1], HQ, D)).astype(dtype)
    k = rng.standard_normal((CU_K[-1], HKV, D)).astype(dtype)
    v = rng.standard_normal((CU_K[-1], HKV, DV)).astype(dtype)
    return q, k, v, _paged(rng, k, v, CU_K)


def _cases():
    rng = np.random.default_rng(0)
    sinks = rng.standard_normal(HQ).astype(np.float32)
    return {
        "plain": {},
        "causal": {"causal": True},
        "sinks": {"sinks": sinks},
        "causal, sinks": {"causal": True, "sinks": sinks},
        "window, softcap": {"window": (6, 0), "softcap": 3.0},
        "alibi [B, Hq]": {"alibi_slopes": rng.uniform(0.1, 1, (B, HQ)).astype(np.float32)},
    }


CASES = list(_cases())


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("case", CASES)
def test_paged_is_varlen_on_the_gathered_keys(case, backend):
    """out and lse over the shuffled pool are attention_varlen's on the same keys packed, bit for bit."""
    options = {**_cases()[case], "backend": backend}
    q, k, v, kv = _problem(1)
    out, lse = attn.attention_paged(q, *kv, CU_Q, return_lse=True, **options)
    assert out.shape == (CU_Q[-1], HQ, DV) and out.dtype == np.float32
    assert lse.shape == (HQ, CU_Q[-1]) and lse.dtype == np.float32
    want_out, want_lse = attn.attention_varlen(q, k, v, CU_Q, CU_K, return_lse=True, **options)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)
    np.testing.assert_array_equal(out[CU_Q[3]], 0)  # the sequence with no keys
    core_out, core_lse = _core.attention_paged(q, *kv, cu_seqlens_q=CU_Q, **options)
    np.testing.assert_array_equal(core_out, out)
    np.testing.assert_array_equal(core_lse, lse)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_torch_tensors_in_torch_tensors_out(backend):
    torch = pytest.importorskip("torch")
    import attn.torch as at

    options = {"causal": True, "backend": backend}
    q, k, v, kv = _problem(2)
    want_out, want_lse = attn.attention_varlen(q, k, v, CU_Q, CU_K, return_lse=True, **options)
    tensors = [torch.from_numpy(x) for x in (q, *kv, CU_Q)]
    for fn in (attn.attention_paged, at.attention_paged):
        out, lse = fn(*tensors, return_lse=True, **options)
        assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
        np.testing.assert_array_equal(out.numpy(), want_out)
        np.testing.assert_array_equal(lse.numpy(), want_lse)
    # attn.torch makes tensors of arrays: NumPy in, torch out.
    out = at.attention_paged(q, *kv, CU_Q, **options)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), want_out)


def test_torch_is_forward_only():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    q, _, _, kv = _problem(3)
    tq = torch.from_numpy(q).requires_grad_()
    tensors = [torch.from_numpy(x) for x in (*kv, CU_Q)]
    for fn in (attn.attention_paged, at.attention_paged):
        with pytest.raises(RuntimeError, match="forward only .*q requires grad"):
            fn(tq, *tensors)
    with torch.no_grad():
        out = at.attention_paged(tq, *tensors)
    assert not out.requires_grad
    np.testing.assert_array_equal(out.numpy(), attn.attention_paged(q, *kv, CU_Q))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_one_query_per_sequence_without_offsets(backend):
    """q [B, Hq, D] and cu_seqlens_q None: a decode step, one query per sequence."""
    rng = np.random.default_rng(4)
    lengths = [37, 0, 5, 14, 1]
    cu_k = _offsets(lengths)
    k = rng.standard_normal((cu_k[-1], HKV, D)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], HKV, DV)).astype(np.float32)
    q = rng.standard_normal((len(lengths), HQ, D)).astype(np.float32)
    kv = _paged(rng, k, v, cu_k)
    options = {"causal": True, "backend": backend}
    out, lse = _core.attention_paged(q, *kv, **options)
    cu_q = np.arange(len(lengths) + 1, dtype=np.int32)
    want_out, want_lse = attn.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **options)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)


# ---- KVCache ----------------------------------------------------------------------------------------------------


def _alone(q, k, v, **options):
    """attn.attention of one sequence's q [Lq, Hq, D] on its keys k [Lk, Hkv, D]: (out [Lq, Hq, Dv], lse [Hq, Lq])."""
    out, lse = attn.attention(
        *(x.transpose(1, 0, 2)[None] for x in (q, k, v)), return_lse=True, **options
    )
    return out[0].transpose(1, 0, 2), lse[0]


def _rows(rng, n, dtype=np.float32):
    return rng.standard_normal((n, HKV, D)).astype(dtype), rng.standard_normal((n, HKV, DV)).astype(
        dtype
    )


def _fill(cache, rng, ids, keys, steps):
    """Appends `steps` rounds of random rows to the sequences `ids` (n_i rows each per round, 0 included), keeping
    each sequence's keys and values in keys[id] = [k, v]."""
    for counts in steps:
        k, v = _rows(rng, sum(counts))
        cache.append(ids, k, v, _offsets(counts))
        for i, (lo, hi) in zip(ids, zip(_offsets(counts)[:-1], _offsets(counts)[1:])):
            old = keys.setdefault(i, [k[:0], v[:0]])
            keys[i] = [np.concatenate([old[0], k[lo:hi]]), np.concatenate([old[1], v[lo:hi]])]


def _check_cache(cache, rng, ids, keys, lq=(1, 3, 2), **options):
    """cache.attention(q, ids) against attn.attention on each sequence's concatenated keys, bit for bit."""
    cu_q = _offsets(lq)
    q = rng.standard_normal((cu_q[-1], HQ, D)).astype(np.float32)
    out, lse = cache.attention(q, ids, cu_q, return_lse=True, **options)
    for b, i in enumerate(ids):
        assert cache.length(i) == len(keys[i][0])
        o, lse_b = _alone(q[cu_q[b] : cu_q[b + 1]], *keys[i], **options)
        np.testing.assert_array_equal(out[cu_q[b] : cu_q[b + 1]], o, f"out of sequence {i}")
        np.testing.assert_array_equal(lse[:, cu_q[b] : cu_q[b + 1]], lse_b, f"lse of sequence {i}")
    return q, out


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_cache_appends_then_attention(backend):
    rng = np.random.default_rng(5)
    cache = attn.KVCache(NUM_BLOCKS, BS, HKV, D, DV)
    assert (
        cache.free_blocks == NUM_BLOCKS
        and cache.block_size == BS
        and cache.num_blocks == NUM_BLOCKS
    )
    ids = [cache.add_sequence() for _ in range(3)]
    keys = {}
    _fill(cache, rng, ids, keys, [(7, 0, 12), (1, 4, 0), (3, 5, 1), (0, 1, 8)])
    assert [cache.length(i) for i in ids] == [11, 10, 21]
    assert cache.free_blocks == NUM_BLOCKS - (3 + 2 + 5)
    options = {"causal": True, "backend": backend}
    q, out = _check_cache(cache, rng, ids, keys, **options)
    _check_cache(cache, rng, [ids[2], ids[0]], keys, lq=(4, 1), **options)  # any order, any subset
    # The view is what attention_paged reads: the same call by hand.
    view = cache.view(ids)
    k_pages, v_pages, table, used = view
    assert view.block_table is table and len(view) == 4
    np.testing.assert_array_equal(used, [11, 10, 21])
    assert table.dtype == np.int32 and table.shape == (3, 5)
    np.testing.assert_array_equal(table[1, :2], cache.blocks(ids[1]))
    assert k_pages.shape == (NUM_BLOCKS, BS, HKV, D) and v_pages.shape == (NUM_BLOCKS, BS, HKV, DV)
    np.testing.assert_array_equal(
        k_pages[cache.blocks(ids[0])[1], :BS], keys[ids[0]][0][BS : 2 * BS]
    )
    np.testing.assert_array_equal(
        attn.attention_paged(q, *view, _offsets((1, 3, 2)), **options), out
    )


def test_cache_pools_are_views():
    cache = attn.KVCache(4, BS, HKV, D, dtype=np.float64)
    assert cache.k_pages.dtype == np.float64 and cache.v_pages.shape == (4, BS, HKV, D)
    k_pages = cache.k_pages
    i = cache.add_sequence()
    cache.append([i], np.ones((2, HKV, D)), np.ones((2, HKV, D)), np.array([0, 2], np.int32))
    np.testing.assert_array_equal(cache.v_pages[0, :2], 1)
    del cache  # k_pages, taken before the append, shows it: a view, not a copy
    gc.collect()
    np.testing.assert_array_equal(k_pages[0, :2], 1)  # the view keeps the pool alive
    np.testing.assert_array_equal(k_pages[0, 2:], 0)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_fork_shares_then_copies_the_partial_block(backend):
    rng = np.random.default_rng(7)
    cache = attn.KVCache(NUM_BLOCKS, BS, HKV, D, DV)
    parent = cache.add_sequence()
    keys = {}
    _fill(cache, rng, [parent], keys, [(8,), (4,)])  # 12 keys: blocks of 5, 5, 2
    options = {"causal": True, "backend": backend}
    _, before = _check_cache(cache, np.random.default_rng(8), [parent], keys, lq=(3,), **options)
    free = cache.free_blocks
    child = cache.fork(parent)
    shared = cache.blocks(parent)
    assert cache.blocks(child) == shared and cache.free_blocks == free
    assert [cache.holders(b) for b in shared] == [2, 2, 2]
    keys[child] = list(keys[parent])
    _fill(cache, rng, [child], keys, [(2,)])  # writes into the shared partial block: copied first
    assert cache.blocks(child)[:2] == shared[:2] and cache.blocks(child)[2] != shared[2]
    assert [cache.holders(b) for b in shared] == [2, 2, 1]
    assert cache.holders(cache.blocks(child)[2]) == 1 and cache.free_blocks == free - 1
    _, after = _check_cache(cache, np.random.default_rng(8), [parent], keys, lq=(3,), **options)
    np.testing.assert_array_equal(after, before)  # the parent's keys are untouched
    _check_cache(cache, rng, [child, parent], keys, lq=(2, 1), **options)
    _fill(cache, rng, [parent, child], keys, [(6, 9)])  # both grow into blocks of their own
    _check_cache(cache, rng, [parent, child], keys, lq=(1, 4), **options)
    # free_sequence: shared blocks go back only when their last holder is freed.
    free = cache.free_blocks
    own = [b for b in cache.blocks(child) if cache.holders(b) == 1]
    cache.free_sequence(child)
    assert cache.free_blocks == free + len(own)
    assert [cache.holders(b) for b in shared[:2]] == [1, 1]
    with pytest.raises(ValueError, match=f"sequence {child} is not in the cache"):
        cache.length(child)
    cache.free_sequence(parent)
    assert cache.free_blocks == NUM_BLOCKS
    assert [cache.holders(b) for b in range(NUM_BLOCKS)] == [0] * NUM_BLOCKS


def test_an_append_that_exhausts_the_pool_changes_nothing():
    rng = np.random.default_rng(9)
    cache = attn.KVCache(4, BS, HKV, D, DV)
    a, b = cache.add_sequence(), cache.add_sequence()
    keys = {}
    _fill(cache, rng, [a, b], keys, [(7, 3)])  # 3 of 4 blocks
    k_pages, v_pages = cache.k_pages.copy(), cache.v_pages.copy()
    k, v = _rows(rng, 7)
    with pytest.raises(
        ValueError, match="the pool has 1 free blocks of 5 keys, these appends need 2"
    ):
        cache.append([a, b], k, v, _offsets((4, 3)))  # a and b need one more block each
    assert (cache.length(a), cache.length(b), cache.free_blocks) == (7, 3, 1)
    np.testing.assert_array_equal(cache.k_pages, k_pages)
    np.testing.assert_array_equal(cache.v_pages, v_pages)
    _check_cache(cache, rng, [a, b], keys, lq=(1, 1), causal=True)
    _fill(cache, rng, [b], keys, [(7,)])  # what fits still goes in
    assert cache.free_blocks == 0
    _check_cache(cache, rng, [a, b], keys, lq=(2, 1), causal=True)


def test_over_torch_tensors_writes_in_place_and_keeps_them_alive():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    k_pages, v_pages = torch.zeros(NUM_BLOCKS, BS, HKV, D), torch.zeros(NUM_BLOCKS, BS, HKV, DV)
    cache = attn.KVCache.over(k_pages, v_pages)
    assert cache.k_pages is k_pages and cache.v_pages is v_pages
    a, b = cache.add_sequence(), cache.add_sequence()
    keys = {}
    _fill(cache, rng, [a, b], keys, [(6, 2), (3, 9)])
    block = cache.blocks(a)[1]
    np.testing.assert_array_equal(
        k_pages[block, :4].numpy(), keys[a][0][5:9]
    )  # the caller's tensor changed
    np.testing.assert_array_equal(v_pages[block, :4].numpy(), keys[a][1][5:9])
    view = cache.view([a, b])
    assert all(isinstance(x, torch.Tensor) for x in view)
    q = torch.from_numpy(rng.standard_normal((2, HQ, D)).astype(np.float32))
    want = cache.attention(q, [a, b], causal=True)
    assert isinstance(want, torch.Tensor)
    # The cache holds the only references now.
    alive = weakref.ref(k_pages)
    del k_pages, v_pages, view
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(cache.attention(q, [a, b], causal=True).numpy(), want.numpy())
    _fill(cache, rng, [a, b], keys, [(4, 4)])
    _check_cache(cache, rng, [a, b], keys, lq=(1, 2), causal=True)
    np.testing.assert_array_equal(cache.k_pages[block, :4].numpy(), keys[a][0][5:9])
    del cache
    gc.collect()
    assert alive() is None  # released with the cache


def test_over_a_tensor_whose_storage_moves_refuses():
    torch = pytest.importorskip("torch")
    k_pages, v_pages = torch.zeros(4, BS, HKV, D), torch.zeros(4, BS, HKV, DV)
    cache = attn.KVCache.over(k_pages, v_pages)
    a = cache.add_sequence()
    k, v = (torch.ones(2, HKV, x) for x in (D, DV))
    cache.append([a], k, v, torch.tensor([0, 2], dtype=torch.int32))
    v_pages.resize_(400, BS, HKV, DV)  # new memory; the cache's view of the old would dangle
    message = "the storage of v_pages, the tensor the cache was made over, moved"
    with pytest.raises(RuntimeError, match="KVCache.append: " + message):
        cache.append([a], k, v, torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="KVCache.attention: " + message):
        cache.attention(torch.zeros(1, HQ, D), [a])
    with pytest.raises(RuntimeError, match="KVCache.view: " + message):
        cache.view([a])
    assert cache.length(a) == 2
    with pytest.raises(ValueError, match="KVCache.over: the pools must not be empty"):
        attn.KVCache.over(torch.zeros(4, BS, HKV, 0), torch.zeros(4, BS, HKV, 0))


def test_over_numpy_arrays_and_refusals():
    rng = np.random.default_rng(11)
    k_pages, v_pages = np.zeros((8, BS, HKV, D), np.float32), np.zeros((8, BS, HKV, DV), np.float32)
    cache = attn.KVCache.over(k_pages, v_pages)
    a = cache.add_sequence()
    keys = {}
    _fill(cache, rng, [a], keys, [(7,)])
    np.testing.assert_array_equal(k_pages[cache.blocks(a)[0]], keys[a][0][:BS])
    assert cache.k_pages is k_pages
    read_only = np.zeros_like(k_pages)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="KVCache.over: k_pages is a read-only NumPy array"):
        attn.KVCache.over(read_only, v_pages)
    with pytest.raises(
        ValueError, match="v_pages must be a NumPy array .* got a list that would be copied"
    ):
        attn.KVCache.over(k_pages, v_pages.tolist())
    with pytest.raises(ValueError, match="the pools must be contiguous"):
        attn.KVCache.over(k_pages[:, ::2], v_pages[:, ::2])
    with pytest.raises(ValueError, match="one floating or int8 dtype"):
        attn.KVCache.over(k_pages, v_pages.astype(np.float64))
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"k_pages requires grad.*k_pages.detach\(\)"):
        attn.KVCache.over(
            torch.zeros(8, BS, HKV, D, requires_grad=True), torch.zeros(8, BS, HKV, DV)
        )


def test_bfloat16_cache_with_a_torch_dtype():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    cache = attn.KVCache(NUM_BLOCKS, BS, HKV, D, DV, dtype=torch.bfloat16)
    assert cache.k_pages.dtype == torch.bfloat16 and isinstance(
        cache.view([]).seqused_k, torch.Tensor
    )
    ids = [cache.add_sequence() for _ in range(2)]
    k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in _rows(rng, 19))
    cache.append(ids, k, v, torch.tensor([0, 12, 19], dtype=torch.int32))
    q = torch.from_numpy(rng.standard_normal((3, HQ, D)).astype(np.float32)).to(torch.bfloat16)
    out = cache.attention(q, ids, torch.tensor([0, 2, 3], dtype=torch.int32), causal=True)
    assert out.dtype == torch.bfloat16
    for b, (rows, queries) in enumerate(
        [(slice(0, 12), slice(0, 2)), (slice(12, 19), slice(2, 3))]
    ):
        want = attn.attention(
            *(x.transpose(0, 1)[None] for x in (q[queries], k[rows], v[rows])), causal=True
        )
        assert torch.equal(out[queries], want[0].transpose(0, 1)), b


def test_write_kv_slots_in_place():
    rng = np.random.default_rng(13)
    k_pages, v_pages = np.zeros((4, BS, HKV, D), np.float32), np.zeros((4, BS, HKV, DV), np.float32)
    k, v = _rows(rng, 4)
    attn.write_kv_slots(k_pages, v_pages, k, v, np.array([7, -1, 0, 19], np.int64))
    np.testing.assert_array_equal(k_pages[1, 2], k[0])  # slot 7 = block 1, row 2
    np.testing.assert_array_equal(v_pages[0, 0], v[2])
    np.testing.assert_array_equal(k_pages[3, 4], k[3])
    assert np.count_nonzero(k_pages.reshape(-1, HKV * D).any(axis=1)) == 3  # token 1 skipped
    before = k_pages.copy()
    with pytest.raises(
        ValueError, match=r"slot_mapping\[2\] = 20 is outside \[0, num_blocks x block_size = 20\)"
    ):
        attn.write_kv_slots(k_pages, v_pages, k, v, np.array([1, 2, 20, 3], np.int32))
    np.testing.assert_array_equal(k_pages, before)  # every slot is checked before any write
    read_only = np.zeros_like(v_pages)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="write_kv_slots: v_pages is a read-only NumPy array"):
        attn.write_kv_slots(k_pages, read_only, k, v, np.arange(4))
    with pytest.raises(ValueError, match="write_kv_slots: k_pages must be a NumPy array"):
        attn.write_kv_slots(
            k_pages[::-1], v_pages, k, v, np.arange(4)
        )  # a reversed view would be copied
    with pytest.raises(ValueError, match=r"slot_mapping must be int32 or int64 \[n = 4\]"):
        attn.write_kv_slots(k_pages, v_pages, k, v, np.arange(3))
    torch = pytest.importorskip("torch")
    tk, tv = torch.zeros(4, BS, HKV, D), torch.zeros(4, BS, HKV, DV)
    attn.write_kv_slots(
        tk, tv, torch.from_numpy(k), torch.from_numpy(v), torch.tensor([7, -1, 0, 19])
    )
    np.testing.assert_array_equal(tk.numpy(), k_pages)


# ---- hostile inputs -----------------------------------------------------------------------------------------------


def _i32(*values):
    return np.array(values, np.int32)


def _paged_errors():
    """(name, change to the valid call of _error_call, error, message)."""
    table = np.array([[3, 1, 0], [2, 0, 0]], np.int32)
    return [
        (
            "table entry",
            dict(block_table=np.where(table == 1, 40, table)),
            ValueError,
            r"block_table\[0, 1\] = 40 is outside \[0, num_blocks = 40\) \(sequence 0 has 7 keys\)",
        ),
        (
            "negative entry",
            dict(block_table=np.where(table == 2, -3, table)),
            ValueError,
            r"block_table\[1, 0\] = -3 is outside",
        ),
        (
            "seqused_k",
            dict(seqused_k=_i32(7, 16)),
            ValueError,
            r"seqused_k\[1\] = 16 is outside \[0, 15\]",
        ),
        (
            "negative seqused_k",
            dict(seqused_k=_i32(-1, 2)),
            ValueError,
            r"seqused_k\[0\] = -1 is outside",
        ),
        (
            "int64 table",
            dict(block_table=table.astype(np.int64)),
            TypeError,
            "block_table must be int32",
        ),
        (
            "int64 seqused_k",
            dict(seqused_k=_i32(7, 2).astype(np.int64)),
            TypeError,
            "seqused_k must be int32",
        ),
        (
            "float table",
            dict(block_table=table.astype(np.float32)),
            TypeError,
            "block_table must be int32",
        ),
        (
            "1-D table",
            dict(block_table=table[0]),
            ValueError,
            r"block_table must be int32 \[B = 2, max_blocks\]",
        ),
        (
            "table rows",
            dict(block_table=table[:1]),
            ValueError,
            r"block_table must be int32 \[B = 2",
        ),
        (
            "seqused_k shape",
            dict(seqused_k=_i32(7, 2, 1)),
            ValueError,
            r"seqused_k must be int32 \[B = 2\]",
        ),
        (
            "cu_seqlens_q",
            dict(cu_seqlens_q=_i32(0, 3, 2)),
            ValueError,
            r"cu_seqlens_q\[2\] = 2 is below",
        ),
        (
            "cu_seqlens_q dtype",
            dict(cu_seqlens_q=np.array([0, 1, 2])),
            TypeError,
            "cu_seqlens_q must be int32",
        ),
        (
            "pool dtype",
            dict(v_pages=np.zeros((40, BS, 1, 3))),
            ValueError,
            "must have q's dtype or be int8",
        ),
        (
            "pool shape",
            dict(k_pages=np.zeros((40, BS, 1, 4), np.float32)),
            ValueError,
            "one head dim",
        ),
        (
            "q rank",
            dict(q=np.zeros((2, 1, 2, 3), np.float32)),
            ValueError,
            r"q must be \[total_q, Hq, D\]",
        ),
        (
            "q dtype",
            dict(q=np.zeros((2, 2, 3), np.int32)),
            TypeError,
            "q must be f64, f32, bf16 or f16",
        ),
        ("key_lengths", dict(key_lengths=_i32(1, 1)), ValueError, "key_lengths.*seqused_k"),
        ("mask", dict(mask=np.ones((2, 2), bool)), ValueError, "dense masks"),
        (
            "return_weights",
            dict(return_weights=True),
            ValueError,
            "return_weights is not supported",
        ),
        (
            "alibi",
            dict(alibi_slopes=np.ones((3, 2))),
            ValueError,
            r"alibi_slopes must be floating \[Hq = 2\]",
        ),
        ("keyword", dict(causl=True), TypeError, "unexpected keyword argument 'causl'"),
        ("not an array", dict(block_table=None), TypeError, "block_table must be an array"),
    ]


ERRORS = _paged_errors()


def _error_call():
    """A valid call: B = 2 sequences (7 and 2 keys) with 1 and 2 queries, blocks of 5, 3 columns in the table."""
    rng = np.random.default_rng(14)
    return dict(
        q=rng.standard_normal((3, 2, 3)).astype(np.float32),
        k_pages=rng.standard_normal((40, BS, 1, 3)).astype(np.float32),
        v_pages=rng.standard_normal((40, BS, 1, 3)).astype(np.float32),
        block_table=np.array([[3, 1, 0], [2, 0, 0]], np.int32),
        seqused_k=_i32(7, 2),
        cu_seqlens_q=_i32(0, 1, 3),
    )


@pytest.mark.parametrize("name, change, error, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(name, change, error, message):
    call = {**_error_call(), **change}
    with pytest.raises(error, match=message):
        attn.attention_paged(**call)
    if name != "not an array":  # (nanobind's own message, which the wrapper above makes one line)
        with pytest.raises(error, match=message):
            _core.attention_paged(**call)


def test_errors_through_torch():
    torch = pytest.importorskip("torch")
    import attn.torch as at

    call = {n: torch.from_numpy(x) for n, x in _error_call().items()}
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 40 is outside"):
        at.attention_paged(
            **{**call, "block_table": torch.tensor([[3, 40, 0], [2, 0, 0]], dtype=torch.int32)}
        )
    with pytest.raises(TypeError, match="block_table must be int32"):
        at.attention_paged(**{**call, "block_table": call["block_table"].long()})
    with pytest.raises(
        TypeError, match="attn.torch.attention_paged: unexpected keyword argument 'causl'"
    ):
        at.attention_paged(**call, causl=True)
    with pytest.raises(
        TypeError, match="return_lse is not a keyword of attn._core.attention_paged"
    ):
        _core.attention_paged(**call, return_lse=True)


def test_cache_errors_change_nothing():
    rng = np.random.default_rng(15)
    cache = attn.KVCache(6, BS, HKV, D, DV)
    a, b = cache.add_sequence(), cache.add_sequence()
    keys = {}
    _fill(cache, rng, [a, b], keys, [(6, 2)])
    k, v = _rows(rng, 4)
    bad = [
        (([a, 9], k, v, _offsets((2, 2))), ValueError, "sequence 9 is not in the cache"),
        (([a, a], k, v, _offsets((2, 2))), ValueError, "sequence 0 appears twice in ids"),
        (
            ([a], k, v, _offsets((2, 2))),
            ValueError,
            r"cu_seqlens .* must be \[len\(ids\) \+ 1 = 2\]",
        ),
        (([a, b], k, v, _offsets((2, 3))), ValueError, "cu_seqlens"),
        (
            ([a, b], k.astype(np.float64), v, _offsets((2, 2))),
            ValueError,
            "of the cache's dtype f32",
        ),
        (
            ([a, b], k[:, :1], v, _offsets((2, 2))),
            ValueError,
            r"k and v must be \[n, Hkv = 2, D = 13\]",
        ),
        (([a, b], k, v, _offsets((2, 2)).astype(np.int64)), TypeError, "cu_seqlens must be int32"),
        (
            ([a, b], k.astype(np.int32), v, _offsets((2, 2))),
            TypeError,
            "k must be f64, f32, bf16 or f16",
        ),
        ((["x"], k, v, _offsets((4,))), TypeError, "incompatible function arguments"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            cache.append(*args)
    assert (cache.length(a), cache.length(b), cache.free_blocks) == (6, 2, 3)
    _check_cache(cache, rng, [a, b], keys, lq=(1, 1))
    for call, message in [
        (lambda: cache.fork(7), "fork: sequence 7 is not in the cache"),
        (lambda: cache.free_sequence(-1), "sequence -1 is not in the cache"),
        (lambda: cache.view([a, 5]), "view: sequence 5 is not in the cache"),
        (lambda: cache.blocks(5), "sequence 5 is not in the cache"),
        (lambda: cache.holders(6), r"block 6 is outside \[0, num_blocks = 6\)"),
        (
            lambda: cache.attention(
                np.zeros((2, HQ, D), np.float32), [a, b], key_lengths=_i32(1, 1)
            ),
            "seqused_k",
        ),
        (
            lambda: cache.attention(np.zeros((3, HQ, D), np.float32), [a, b]),
            r"block_table must be int32 \[B = 3",
        ),
        (lambda: attn.KVCache(0, BS, HKV, D), r"num_blocks \(0, < 2\^31\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(
        TypeError, match="dtype must be 'float32', 'bfloat16', 'float16', 'float64' or 'int8'"
    ):
        attn.KVCache(4, BS, HKV, D, dtype="int32")
    with pytest.raises(TypeError, match="dtype must be"):
        attn.KVCache(4, BS, HKV, D, dtype=np.int64)
    assert repr(attn.KVCache(4, BS, HKV, D, dtype="float16")).startswith(
        "attn.KVCache(num_blocks=4, block_size=5"
    )
