// The decode kernel reading keys and values in their pages (attn::attention_paged on the cpu
// backend): on every target this CPU runs, decode and GQA / speculative steps over a shuffled pool
// give the bits of attention() on the same keys gathered into one tensor, and cpu::reads_pages says
// which problems take that path (the others are gathered by the entry).
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "attn/paged.h"
#include "contract/problem.h"
#include "cpu_test_util.h"

namespace attn::test {
namespace {

struct Pool {
  PagedKV kv;
  std::vector<Tensor> keys, values;  // per sequence, gathered: [1, Hkv, Lk, D]
};

Pool make_pool(const std::vector<int64_t>& lens, int64_t block, int64_t Hkv, int64_t D, DType dtype,
               uint64_t seed) {
  Pool p;
  const int64_t B = static_cast<int64_t>(lens.size()), max_blocks = 64, blocks = 200;
  p.kv.k_pages = random_tensor({blocks, block, Hkv, D}, dtype, seed);
  p.kv.v_pages = random_tensor({blocks, block, Hkv, D}, dtype, seed + 1);
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
  std::vector<double> table(static_cast<size_t>(B * max_blocks), 0.0), used;
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    Tensor k = Tensor::empty({lens[b], Hkv, D}, dtype), v = Tensor::empty({lens[b], Hkv, D}, dtype);
    for (int64_t i = 0; i * block < lens[b]; ++i) {
      const int64_t blk = order[next++], n = std::min(block, lens[b] - i * block);
      table[b * max_blocks + i] = static_cast<double>(blk);
      k.slice(0, i * block, i * block + n).copy_from(p.kv.k_pages.select(0, blk).slice(0, 0, n));
      v.slice(0, i * block, i * block + n).copy_from(p.kv.v_pages.select(0, blk).slice(0, 0, n));
    }
    p.keys.push_back(k.permute({1, 0, 2}).unsqueeze(0).contiguous());
    p.values.push_back(v.permute({1, 0, 2}).unsqueeze(0).contiguous());
    used.push_back(static_cast<double>(lens[b]));
  }
  p.kv.block_table = Tensor::from_vector({B, max_blocks}, table, DType::i32);
  p.kv.seqused_k = Tensor::from_vector({B}, used, DType::i32);
  return p;
}

// One decode step per sequence (lq queries each) against the pool, sequence by sequence against
// attention() on the gathered keys.
void expect_decode_matches(int64_t block, int64_t Hq, int64_t Hkv, int64_t lq, DType dtype,
                           const AttentionOptions& o) {
  const std::vector<int64_t> lens = {700, 33, 1024, 5, 300};
  const Pool pool = make_pool(lens, block, Hkv, 64, dtype, 21);
  const int64_t B = static_cast<int64_t>(lens.size());
  const Tensor q = random_tensor({B * lq, Hq, 64}, dtype, 22);
  std::vector<double> cu;
  for (int64_t b = 0; b <= B; ++b) cu.push_back(static_cast<double>(b * lq));
  const Tensor cu_q = Tensor::from_vector({B + 1}, cu, DType::i32);
  const AttentionResult r = attention_paged(q, cu_q, pool.kv, o);
  for (int64_t b = 0; b < B; ++b) {
    const Tensor qb = q.slice(0, b * lq, (b + 1) * lq).permute({1, 0, 2}).unsqueeze(0).contiguous();
    const AttentionResult e = attention(qb, pool.keys[b], pool.values[b], o);
    const Tensor got = r.out.slice(0, b * lq, (b + 1) * lq).permute({1, 0, 2}).unsqueeze(0);
    EXPECT_TRUE(bitwise_equal(got.contiguous(), e.out)) << "sequence " << b;
    EXPECT_TRUE(
        bitwise_equal(r.lse.slice(1, b * lq, (b + 1) * lq).unsqueeze(0).contiguous(), e.lse))
        << "sequence " << b;
  }
}

TEST(PagedDecode, EveryTargetGivesTheGatheredBits) {
  for_each_isa([&](cpu::Isa isa) {
    SCOPED_TRACE(cpu::isa_name(isa));
    for (DType dtype : {DType::f32, DType::bf16}) {
      AttentionOptions o;
      o.backend = Backend::cpu;
      expect_decode_matches(16, 8, 8, 1, dtype, o);  // multi-head decode
      o.causal = true, o.softcap = 5.0;
      expect_decode_matches(32, 8, 2, 3, dtype, o);  // GQA, speculative
    }
  });
}

// The kernel reads pages of a multiple of its vector width without a window's left bound.
TEST(PagedDecode, WhichProblemsReadPagesInPlace) {
  contract::ForwardProblem p;
  p.B = 1, p.Hq = 4, p.Hkv = 4, p.group = 1, p.Lq = 1, p.Lk = 64, p.D = 64, p.Dv = 64;
  const Tensor pool = Tensor::zeros({4, 4, 16, 64}, DType::f32);  // [blocks, Hkv, block, D]
  const int32_t table[4] = {0, 1, 2, 3};
  p.q = Tensor::zeros({1, 4, 1, 64}, DType::f32), p.k = pool, p.v = pool;
  p.out = Tensor::zeros({1, 4, 1, 64}, DType::f32);
  p.pages.table = table, p.pages.block_size = 16;
  EXPECT_TRUE(cpu::reads_pages(p));
  p.rule.left = 8;  // a window's left bound: blocks of keys would start off the pages' grid
  EXPECT_FALSE(cpu::reads_pages(p));
  p.rule.left = -1, p.pages.block_size = 12;
  EXPECT_FALSE(cpu::reads_pages(p));
  p.pages.block_size = 16, p.Lq = 200;  // not decode-shaped: the tiles, which need gathered keys
  EXPECT_FALSE(cpu::reads_pages(p));
}

}  // namespace
}  // namespace attn::test
