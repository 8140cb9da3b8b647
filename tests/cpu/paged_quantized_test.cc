// The decode kernel on int8 paged caches (attn::attention_paged with k_scales / v_scales), on every
// target this CPU runs: decode, GQA and speculative steps over a shuffled int8 pool agree with the
// reference backend in f64 over the dequantized keys and values (element x scale in f32, the
// definition in attn/paged.h) to the contract's tolerance for q's dtype, through both task shapes
// (every kv head per task, and one kv head per task), with the options the kernel takes in place and
// with a window (whose keys the entry gathers and dequantizes).
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "attn/kv_cache.h"
#include "attn/paged.h"
#include "contract/problem.h"
#include "cpu_test_util.h"

namespace attn::test {
namespace {

struct QuantizedPool {
  PagedKV int8;   // int8 pools and their scales
  PagedKV exact;  // the same keys and values dequantized, f64
  int64_t B = 0;
};

// Random f32 keys and values (channel 0 of each head `outlier` times larger, as real K caches have),
// quantized into int8 pools; sequences of `lens` keys over a shuffled block order.
QuantizedPool make_pool(const std::vector<int64_t>& lens, int64_t block, int64_t Hkv, int64_t D,
                        double outlier, uint64_t seed) {
  QuantizedPool p;
  p.B = static_cast<int64_t>(lens.size());
  const int64_t blocks = 160, max_blocks = 64;
  for (int which = 0; which < 2; ++which) {
    Tensor x = random_tensor({blocks * block, Hkv, D}, DType::f32, seed + which);
    for (int64_t h = 0; h < Hkv; ++h) {
      Tensor channel = x.select(1, h).slice(1, 0, 1);
      channel.copy_from(
          random_tensor({blocks * block, 1}, DType::f32, seed + 7, -outlier, outlier));
    }
    const QuantizedRows q = quantize_int8(x);
    const Tensor values = q.values.view({blocks, block, Hkv, D});
    const Tensor scales = q.scales.view({blocks, block, Hkv});
    Tensor exact = values.to(DType::f32);
    float* e = exact.data_as<float>();
    const float* s = scales.data_as<float>();
    for (int64_t i = 0; i < exact.numel(); ++i) e[i] *= s[i / D];  // the f32 product
    (which == 0 ? p.int8.k_pages : p.int8.v_pages) = values;
    (which == 0 ? p.int8.k_scales : p.int8.v_scales) = scales;
    (which == 0 ? p.exact.k_pages : p.exact.v_pages) = exact.to(DType::f64);
  }
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
  std::vector<double> table(static_cast<size_t>(p.B * max_blocks), 0.0), used;
  size_t next = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t i = 0; i * block < lens[b]; ++i) table[b * max_blocks + i] = order[next++];
    used.push_back(static_cast<double>(lens[b]));
  }
  p.int8.block_table = p.exact.block_table =
      Tensor::from_vector({p.B, max_blocks}, table, DType::i32);
  p.int8.seqused_k = p.exact.seqused_k = Tensor::from_vector({p.B}, used, DType::i32);
  return p;
}

// lq queries per sequence of q's dtype on the cpu backend against the reference in f64.
void expect_close_to_reference(const QuantizedPool& pool, int64_t Hq, int64_t lq, DType dtype,
                               AttentionOptions o) {
  const int64_t D = pool.int8.k_pages.size(3);
  const Tensor q = random_tensor({pool.B * lq, Hq, D}, dtype, 31);
  std::vector<double> cu;
  for (int64_t b = 0; b <= pool.B; ++b) cu.push_back(static_cast<double>(b * lq));
  const Tensor cu_q = Tensor::from_vector({pool.B + 1}, cu, DType::i32);
  o.backend = Backend::cpu;
  const AttentionResult got = attention_paged(q, cu_q, pool.int8, o);
  o.backend = Backend::reference;
  const AttentionResult want = attention_paged(q.to(DType::f64), cu_q, pool.exact, o);
  // f32: the contract's f32 forward bound; 16-bit q: the output's rounding (DESIGN.md).
  const double tol = dtype == DType::f32 ? kTolF32Forward : 2 * unit_roundoff(dtype);
  EXPECT_LE(rel_error(got.out, want.out), tol);
  EXPECT_LE(rel_error(got.lse, want.lse), kTolF32Forward);
}

TEST(PagedQuantized, EveryTargetAgreesWithTheReferenceOnTheDequantizedCache) {
  const QuantizedPool heads2 = make_pool({700, 33, 1024, 5, 300}, 16, 2, 64, 1.0, 41);
  const QuantizedPool heads1 = make_pool({129, 600, 16}, 32, 1, 64, 8.0, 43);
  for_each_isa([&](cpu::Isa isa) {
    SCOPED_TRACE(cpu::isa_name(isa));
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      AttentionOptions o;
      expect_close_to_reference(heads2, 8, 1, dtype, o);  // GQA decode, every kv head per task
      expect_close_to_reference(heads1, 1, 1, dtype, o);  // one head: (b, kv head) tasks
      o.causal = true, o.softcap = 5.0;
      o.sinks = random_tensor({8}, DType::f32, 44);
      expect_close_to_reference(heads2, 8, 3, dtype, o);  // speculative, softcap, sinks
      o.sinks = Tensor(), o.softcap.reset();
      o.alibi_slopes = random_tensor({4}, DType::f64, 45, 0.0, 0.1);
      expect_close_to_reference(heads1, 4, 2, dtype, o);  // MQA with ALiBi
      o.alibi_slopes = Tensor(), o.window = Window{100, 0};
      expect_close_to_reference(heads2, 8, 1, dtype, o);  // a window: gathered and dequantized
    }
  });
}

// int8 pools with scales are read in place as the floating ones are.
TEST(PagedQuantized, ReadsInt8PagesInPlace) {
  contract::ForwardProblem p;
  p.B = 1, p.Hq = 4, p.Hkv = 4, p.group = 1, p.Lq = 1, p.Lk = 64, p.D = 64, p.Dv = 64;
  const Tensor pool = Tensor::zeros({4, 4, 16, 64}, DType::i8);  // [blocks, Hkv, block, D]
  const Tensor scales = Tensor::full({4, 4, 16}, 1.0, DType::f32);
  const int32_t table[4] = {0, 1, 2, 3};
  p.q = Tensor::zeros({1, 4, 1, 64}, DType::f32), p.k = pool, p.v = pool;
  p.out = Tensor::zeros({1, 4, 1, 64}, DType::f32);
  p.pages.table = table, p.pages.block_size = 16;
  EXPECT_FALSE(cpu::reads_pages(p));  // int8 without scales: not a problem the kernel takes
  p.k_scale = scales, p.v_scale = scales;
  EXPECT_TRUE(cpu::reads_pages(p));
}

}  // namespace
}  // namespace attn::test
