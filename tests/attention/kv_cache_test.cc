// attn::KVCache and attn::write_kv_slots: appends over several calls give attention_paged the bits
// of attention() over everything appended; forked sequences share whole blocks and copy a shared
// block only when one of them writes into it; freed blocks return to the pool; a refused append
// (exhausted pool, bad ids, wrong shapes) changes nothing; a cache over the caller's tensors writes
// into them; slot writes are checked before any write.
#include "attn/kv_cache.h"

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "expect_error.h"

namespace attn::test {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 8;

Tensor offsets(std::initializer_list<int64_t> lens) {
  std::vector<double> cu{0.0};
  for (int64_t n : lens) cu.push_back(cu.back() + static_cast<double>(n));
  return Tensor::from_vector({static_cast<int64_t>(cu.size())}, cu, DType::i32);
}

// What each sequence was given, kept contiguous: [L, Hkv, D].
struct Shadow {
  std::vector<Tensor> k, v;
  void append(size_t s, const Tensor& k_rows, const Tensor& v_rows) {
    if (s >= k.size()) k.resize(s + 1), v.resize(s + 1);
    k[s] = k[s].defined() ? concat(k[s], k_rows) : k_rows.clone();
    v[s] = v[s].defined() ? concat(v[s], v_rows) : v_rows.clone();
  }
  static Tensor concat(const Tensor& a, const Tensor& b) {
    Tensor r = Tensor::empty({a.size(0) + b.size(0), a.size(1), a.size(2)}, a.dtype());
    r.slice(0, 0, a.size(0)).copy_from(a);
    r.slice(0, a.size(0), r.size(0)).copy_from(b);
    return r;
  }
};

// One decode query per sequence against the cache: attention() over the shadow's keys, bitwise.
void expect_attends_like(const KVCache& cache, std::vector<int64_t> ids, const Shadow& sh,
                         const std::vector<size_t>& shadow_of, uint64_t seed) {
  const auto n = static_cast<int64_t>(ids.size());
  const Tensor q = random_tensor({n, kHq, kD}, DType::f32, seed);
  AttentionOptions o;
  o.backend = Backend::cpu;
  const AttentionResult r = attention_paged(q, Tensor(), cache.view(ids), o);
  for (int64_t i = 0; i < n; ++i) {
    const size_t s = shadow_of[i];
    auto head_major = [](const Tensor& t) {
      return t.permute({1, 0, 2}).unsqueeze(0).contiguous();
    };
    const AttentionResult e =
        attention(head_major(q.slice(0, i, i + 1)), head_major(sh.k[s]), head_major(sh.v[s]), o);
    EXPECT_TRUE(bitwise_equal(head_major(r.out.slice(0, i, i + 1)), e.out)) << "sequence " << i;
  }
}

TEST(KVCache, AppendsOverSeveralCallsAttendLikeTheWholeSequences) {
  KVCache cache(/*num_blocks=*/20, /*block_size=*/16, kHkv, kD, kD, DType::f32);
  const int64_t a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
  Shadow sh;
  uint64_t seed = 1;
  for (auto lens : {std::vector<int64_t>{20, 5, 0}, {1, 16, 33}, {1, 1, 1}}) {
    const int64_t total = lens[0] + lens[1] + lens[2];
    const Tensor k = random_tensor({total, kHkv, kD}, DType::f32, ++seed);
    const Tensor v = random_tensor({total, kHkv, kD}, DType::f32, ++seed);
    const std::vector<int64_t> ids = {a, b, c};
    cache.append(ids, k, v, offsets({lens[0], lens[1], lens[2]}));
    for (size_t i = 0, at = 0; i < 3; at += lens[i], ++i) {
      if (lens[i] > 0) sh.append(i, k.slice(0, at, at + lens[i]), v.slice(0, at, at + lens[i]));
    }
  }
  EXPECT_EQ(cache.length(a), 22);
  EXPECT_EQ(cache.length(c), 34);
  EXPECT_EQ(cache.free_blocks(), 20 - 2 - 2 - 3);
  expect_attends_like(cache, {c, a, b}, sh, {2, 0, 1}, 9);
}

TEST(KVCache, ForkSharesBlocksAndCopiesOnlyTheBlockItWrites) {
  KVCache cache(10, 4, kHkv, kD, kD, DType::f32);
  const int64_t parent = cache.add_sequence();
  Shadow sh;
  const Tensor k = random_tensor({10, kHkv, kD}, DType::f32, 3);
  const Tensor v = random_tensor({10, kHkv, kD}, DType::f32, 4);
  const std::vector<int64_t> p_ids = {parent};
  cache.append(p_ids, k, v, offsets({10}));  // blocks of 4, 4, 2 (the last one partial)
  sh.append(0, k, v);
  const int64_t child = cache.fork(parent);
  sh.append(1, k, v);
  EXPECT_EQ(cache.blocks(child), cache.blocks(parent));
  for (int32_t blk : cache.blocks(parent)) EXPECT_EQ(cache.holders(blk), 2);
  EXPECT_EQ(cache.free_blocks(), 7);
  const Tensor k2 = random_tensor({3, kHkv, kD}, DType::f32, 5);
  const Tensor v2 = random_tensor({3, kHkv, kD}, DType::f32, 6);
  const std::vector<int64_t> c_ids = {child};
  cache.append(c_ids, k2, v2, offsets({3}));  // copies the partial block, then one more block
  sh.append(1, k2, v2);
  const std::vector<int32_t>& pb = cache.blocks(parent);
  const std::vector<int32_t>& cb = cache.blocks(child);
  EXPECT_EQ(cb[0], pb[0]);
  EXPECT_EQ(cb[1], pb[1]);
  EXPECT_NE(cb[2], pb[2]);
  EXPECT_EQ(cache.holders(pb[0]), 2);
  EXPECT_EQ(cache.holders(pb[2]), 1);
  EXPECT_EQ(cache.free_blocks(), 5);
  expect_attends_like(cache, {parent, child}, sh, {0, 1}, 10);
  cache.free_sequence(parent);
  EXPECT_EQ(cache.holders(cb[0]), 1);
  EXPECT_EQ(cache.free_blocks(), 6);
  cache.free_sequence(child);
  EXPECT_EQ(cache.free_blocks(), 10);
}

TEST(KVCache, RefusedAppendsChangeNothing) {
  KVCache cache(3, 4, kHkv, kD, kD, DType::f32);
  const int64_t a = cache.add_sequence(), b = cache.add_sequence();
  const Tensor k = random_tensor({13, kHkv, kD}, DType::f32, 7);
  const std::vector<int64_t> ids = {a, b};
  expect_error(
      [&] {
        cache.append(ids, k, k, offsets({6, 7}));
      },
      "attn::KVCache::append",
      {"the pool has 3 free blocks of 4 keys, these appends need 4 (nothing was written)"});
  EXPECT_EQ(cache.length(a), 0);
  EXPECT_EQ(cache.free_blocks(), 3);
  const std::vector<int64_t> twice = {a, a};
  expect_error(
      [&] {
        cache.append(twice, k, k, offsets({6, 7}));
      },
      "attn::KVCache::append", {"sequence 0 appears twice in ids"});
  const std::vector<int64_t> unknown = {a, 7};
  expect_error(
      [&] {
        cache.append(unknown, k, k, offsets({6, 7}));
      },
      "attn::KVCache::append", {"sequence 7 is not in the cache"});
  expect_error(
      [&] {
        cache.append(ids, k, k, offsets({6, 6}));
      },
      "attn::KVCache::append",
      {"cu_seqlens[B = 2] = 12 must equal the packed length of k [13, 2, 8]"});
  expect_error(
      [&] {
        cache.append(ids, k.to(DType::bf16), k, offsets({6, 7}));
      },
      "attn::KVCache::append", {"of the cache's dtype f32"});
  cache.free_sequence(b);
  expect_error([&] { (void)cache.length(b); }, "attn::KVCache::length", {"sequence 1 is not in"});
  EXPECT_EQ(cache.free_blocks(), 3);
}

TEST(KVCache, OverTheCallersTensorsWritesIntoThem) {
  std::vector<float> k_mem(2 * 4 * kHkv * kD, 0.0f), v_mem(k_mem.size(), 0.0f);
  const Tensor kp = Tensor::from_blob(k_mem.data(), {2, 4, kHkv, kD}, DType::f32);
  const Tensor vp = Tensor::from_blob(v_mem.data(), {2, 4, kHkv, kD}, DType::f32);
  KVCache cache = KVCache::over(kp, vp);
  const int64_t a = cache.add_sequence();
  const Tensor k = Tensor::full({5, kHkv, kD}, 2.0, DType::f32);
  const std::vector<int64_t> ids = {a};
  cache.append(ids, k, k, offsets({5}));
  EXPECT_EQ(k_mem[0], 2.0f);              // block 0 taken first
  EXPECT_EQ(k_mem[4 * kHkv * kD], 2.0f);  // the fifth key: block 1, row 0
  EXPECT_EQ(k_mem[4 * kHkv * kD + kHkv * kD], 0.0f);
  expect_error(
      [] {
        (void)KVCache::over(Tensor::zeros({2, 4, 2, 8}, DType::f32),
                            Tensor::zeros({3, 4, 2, 8}, DType::f32));
      },
      "attn::KVCache::over", {"one floating or int8 dtype and geometry"});
}

TEST(KVCache, WriteSlotsChecksEverySlotFirst) {
  const Tensor kp = Tensor::zeros({2, 4, kHkv, kD}, DType::f32), vp = kp.clone();
  const Tensor k = Tensor::full({3, kHkv, kD}, 1.0, DType::f32);
  write_kv_slots(kp, vp, k, k, Tensor::from_vector({3}, {5, -1, 0}, DType::i64));
  EXPECT_EQ(kp.at({1, 1, 0, 0}), 1.0);  // slot 5 = block 1, row 1
  EXPECT_EQ(kp.at({0, 0, 0, 0}), 1.0);
  EXPECT_EQ(max_abs(kp.slice(0, 0, 1).slice(1, 1, 4)), 0.0);
  const Tensor fresh = Tensor::zeros({2, 4, kHkv, kD}, DType::f32);
  expect_error(
      [&] {
        write_kv_slots(fresh, fresh.clone(), k, k, Tensor::from_vector({3}, {0, 8, 1}, DType::i32));
      },
      "attn::write_kv_slots", {"slot_mapping[1] = 8 is outside [0, num_blocks x block_size = 8)"});
  EXPECT_EQ(max_abs(fresh), 0.0);  // slot 0 was not written before the bad slot was found
}

}  // namespace
}  // namespace attn::test
