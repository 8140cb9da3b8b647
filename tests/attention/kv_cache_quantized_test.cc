// int8 KV caches: attn::quantize_int8's rule (one scale per row and head, nearest int8, each value
// within scale / 2); KVCache(DType::i8) and write_kv_slots quantize what they are given and keep the
// scales beside the blocks (copied with a shared block); attention_paged over them gives, on both
// backends and for f32 / bf16 / f16 queries, attention() over the dequantized values; and every
// scale or pool that does not fit is refused by name before any read or write.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_cases.h"
#include "attn/kv_cache.h"
#include "expect_error.h"

namespace attn::test {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 40;

Tensor offsets(std::initializer_list<int64_t> lens) {
  std::vector<double> cu{0.0};
  for (int64_t n : lens) cu.push_back(cu.back() + static_cast<double>(n));
  return Tensor::from_vector({static_cast<int64_t>(cu.size())}, cu, DType::i32);
}

// values x scales as f32 [n, H, X], the keys an int8 cache stands for.
Tensor dequantize(const QuantizedRows& q) {
  Tensor x = q.values.to(DType::f32);
  float* e = x.data_as<float>();
  const float* s = q.scales.contiguous().data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) e[i] *= s[i / x.size(2)];
  return x;
}

Tensor head_major(const Tensor& t) {  // [L, H, X] -> [1, H, L, X]
  return t.permute({1, 0, 2}).unsqueeze(0).contiguous();
}

TEST(QuantizeInt8, OneScalePerRowAndHeadEachValueWithinHalfAScale) {
  Tensor x = random_tensor({5, 3, 33}, DType::f32, 1, -4.0, 4.0);
  x.select(0, 2).select(0, 1).fill(0.0);  // a head of zeros: scale 1, values 0
  x.set({4, 0, 7}, 1000.0);               // an outlier sets its row's scale alone
  const QuantizedRows q = quantize_int8(x);
  ASSERT_EQ(q.values.dtype(), DType::i8);
  ASSERT_EQ(q.scales.shape(), (Shape{5, 3}));
  EXPECT_EQ(q.scales.at({2, 1}), 1.0);
  EXPECT_EQ(q.values.at({4, 0, 7}), 127.0);
  EXPECT_FLOAT_EQ(static_cast<float>(q.scales.at({4, 0})), 1000.0f / 127.0f);
  const Tensor back = dequantize(q);
  for (int64_t n = 0; n < 5; ++n) {
    for (int64_t h = 0; h < 3; ++h) {
      double amax = 0.0;
      for (int64_t d = 0; d < 33; ++d) amax = std::max(amax, std::abs(x.at({n, h, d})));
      const double scale = q.scales.at({n, h});
      if (amax > 0.0) {
        EXPECT_FLOAT_EQ(static_cast<float>(scale), static_cast<float>(amax / 127));
      }
      for (int64_t d = 0; d < 33; ++d)
        EXPECT_LE(std::abs(back.at({n, h, d}) - x.at({n, h, d})), scale * (0.5 + 1e-6));
    }
  }
  Tensor bad = x.clone();
  bad.set({1, 2, 3}, std::nan(""));
  expect_error([&] { (void)quantize_int8(bad); }, "attn::quantize_int8",
               {"x[1, 2, 3] = nan is not finite"});
  expect_error([&] { (void)quantize_int8(x.to(DType::f64)); }, "attn::quantize_int8",
               {"x must be f32, bf16 or f16 [n, H, X], got f64 [5, 3, 33]"});
}

// Appends to an int8 cache (a fork writing into a shared block among them) attend like attention()
// on the dequantized rows, for each backend and query dtype.
TEST(KVCacheInt8, AppendsQuantizeAndAttendLikeTheDequantizedKeys) {
  KVCache cache(12, 8, kHkv, kD, kD, DType::i8);
  const int64_t a = cache.add_sequence();
  const Tensor k = random_tensor({21, kHkv, kD}, DType::f32, 2);
  const Tensor v = random_tensor({21, kHkv, kD}, DType::bf16, 3);
  const std::vector<int64_t> ids = {a};
  cache.append(ids, k.slice(0, 0, 13), v.slice(0, 0, 13).to(DType::f32), offsets({13}));
  const int64_t child = cache.fork(a);
  const std::vector<int64_t> c_ids = {child};
  cache.append(c_ids, k.slice(0, 13, 21), v.slice(0, 13, 21).to(DType::f32), offsets({8}));
  EXPECT_NE(cache.blocks(child)[1], cache.blocks(a)[1]);  // the shared partial block was copied
  const Tensor kd = dequantize(quantize_int8(k)), vd = dequantize(quantize_int8(v));
  const std::vector<int64_t> both = {a, child};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), backend_name(backend)));
      const Tensor q = random_tensor({2, kHq, kD}, dtype, 4);
      AttentionOptions o;
      o.backend = backend, o.causal = true;
      const AttentionResult r = attention_paged(q, Tensor(), cache.view(both), o);
      o.backend = Backend::reference;
      for (int64_t i = 0; i < 2; ++i) {
        const int64_t n = i == 0 ? 13 : 21;
        const AttentionResult e = attention(head_major(q.slice(0, i, i + 1).to(DType::f64)),
                                            head_major(kd.slice(0, 0, n).to(DType::f64)),
                                            head_major(vd.slice(0, 0, n).to(DType::f64)), o);
        const double tol = dtype == DType::f32 ? kTolF32Forward : 2 * unit_roundoff(dtype);
        EXPECT_LE(rel_error(head_major(r.out.slice(0, i, i + 1)), e.out), tol) << "sequence " << i;
      }
    }
  }
}

TEST(KVCacheInt8, WriteSlotsQuantizesIntoThePoolsAndScales) {
  const Tensor kp = Tensor::zeros({2, 4, kHkv, kD}, DType::i8), vp = kp.clone();
  const Tensor ks = Tensor::full({2, 4, kHkv}, 1.0, DType::f32), vs = ks.clone();
  const Tensor k = random_tensor({3, kHkv, kD}, DType::f32, 5);
  write_kv_slots(kp, vp, k, k, Tensor::from_vector({3}, {5, -1, 0}, DType::i32), ks, vs);
  const QuantizedRows q = quantize_int8(k);
  EXPECT_EQ(kp.at({1, 1, 1, 3}), q.values.at({0, 1, 3}));  // slot 5 = block 1, row 1
  EXPECT_EQ(ks.at({1, 1, 1}), q.scales.at({0, 1}));
  EXPECT_EQ(vs.at({0, 0, 0}), q.scales.at({2, 0}));
  EXPECT_EQ(ks.at({0, 1, 0}), 1.0);  // not written
  expect_error(
      [&] {
        write_kv_slots(kp, vp, k, k, Tensor::from_vector({3}, {0, 1, 2}, DType::i32));
      },
      "attn::write_kv_slots", {"int8 pools need k_scales f32 [num_blocks, block_size, Hkv]"});
  expect_error(
      [&] {
        write_kv_slots(kp.to(DType::f32), vp.to(DType::f32), k, k,
                       Tensor::from_vector({3}, {0, 1, 2}, DType::i32), ks, vs);
      },
      "attn::write_kv_slots", {"k_scales belongs to int8 pools; these are f32"});
}

// A pool of int8 keys for one sequence of 20 keys (blocks 2, 0), scales of `scale`.
PagedKV int8_pool(double scale) {
  PagedKV kv;
  kv.k_pages = Tensor::zeros({3, 16, kHkv, kD}, DType::i8);
  kv.v_pages = kv.k_pages.clone();
  kv.k_scales = Tensor::full({3, 16, kHkv}, scale, DType::f32);
  kv.v_scales = kv.k_scales.clone();
  kv.block_table = Tensor::from_vector({1, 2}, {2, 0}, DType::i32);
  kv.seqused_k = Tensor::from_vector({1}, {20}, DType::i32);
  return kv;
}

TEST(PagedInt8, BadScalesAndPoolsAreRefusedByName) {
  const Tensor q = random_tensor({1, kHq, kD}, DType::f32, 6);
  constexpr const char* fn = "attn::attention_paged";
  PagedKV kv = int8_pool(0.5);
  kv.k_scales.set({1, 0, 0}, 0.0);  // block 1 is no sequence's: not read, not checked
  (void)attention_paged(q, Tensor(), kv);
  kv.k_scales.set({0, 3, 1}, 0.0);
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn,
               {"k_scales[0, 3, 1] = 0 (key 19 of sequence 0) must be finite and > 0"});
  kv = int8_pool(0.5);
  kv.v_scales.set({2, 15, 0}, -1.0);
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn, {"v_scales[2, 15, 0] = -1"});
  kv.v_scales.set({2, 15, 0}, std::numeric_limits<double>::infinity());
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn, {"v_scales[2, 15, 0] = inf"});
  kv.v_scales.set({2, 15, 0}, std::nan(""));
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn, {"v_scales[2, 15, 0] = nan"});
  kv = int8_pool(0.5);
  kv.v_scales = Tensor();
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn,
               {"int8 pools need v_scales f32 [num_blocks, block_size, Hkv] = [3, 16, 2], got "
                "nothing"});
  kv.v_scales = Tensor::full({3, 16, 1}, 1.0, DType::f32);
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn, {"got f32 [3, 16, 1]"});
  kv = int8_pool(0.5);
  kv.v_pages = kv.v_pages.to(DType::f32);
  expect_error(
      [&] { (void)attention_paged(q, Tensor(), kv); }, fn,
      {"must have q's dtype or be int8 (with k_scales and v_scales), got q f32, k_pages i8 "
       "and v_pages f32"});
  kv = int8_pool(0.5);
  kv.k_pages = kv.k_pages.to(DType::f32), kv.v_pages = kv.v_pages.to(DType::f32);
  expect_error([&] { (void)attention_paged(q, Tensor(), kv); }, fn,
               {"k_scales belongs to int8 pools; these are f32"});
}

TEST(KVCacheInt8, OverChecksTheScalePools) {
  const Tensor kp = Tensor::zeros({2, 4, kHkv, kD}, DType::i8);
  expect_error([&] { (void)KVCache::over(kp, kp.clone()); }, "attn::KVCache::over",
               {"int8 pools need k_scales"});
  const Tensor s = Tensor::full({2, 4, kHkv}, 1.0, DType::f32);
  KVCache cache = KVCache::over(kp, kp.clone(), s, s.clone());
  const int64_t a = cache.add_sequence();
  const std::vector<int64_t> ids = {a};
  const Tensor k = Tensor::full({3, kHkv, kD}, 2.54, DType::bf16);
  cache.append(ids, k, k, offsets({3}));
  EXPECT_EQ(kp.at({0, 2, 1, 0}), 127.0);
  EXPECT_FLOAT_EQ(static_cast<float>(s.at({0, 2, 1})), bf16_to_f32(f32_to_bf16(2.54f)) / 127.0f);
  expect_error([&] { cache.append(ids, k.to(DType::f64), k.to(DType::f64), offsets({3})); },
               "attn::KVCache::append", {"one of f32, bf16, f16 (quantized to int8)"});
}

}  // namespace
}  // namespace attn::test
