// attn::attention_paged: queries against keys and values in a paged pool give the bits of
// attention_varlen on the same keys gathered into packed rows (decode, speculative and prefill-chunk
// query counts, every per-sequence option, reference and cpu, f64 / f32 / bf16); q [B, Hq, D] without
// cu_seqlens_q is one query per sequence; and every hostile index is refused by name before any read.
#include "attn/paged.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "attention_cases.h"
#include "attn/varlen.h"
#include "expect_error.h"

namespace attn::test {
namespace {

constexpr int64_t kBlock = 16, kBlocks = 40, kHq = 4, kHkv = 2, kD = 16;

Tensor i32(const std::vector<int64_t>& v) {
  return Tensor::from_vector({static_cast<int64_t>(v.size())},
                             std::vector<double>(v.begin(), v.end()), DType::i32);
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// A pool whose blocks are handed to the sequences in a shuffled order, and the same keys packed.
struct PagedCase {
  Tensor q;  // [total_q, Hq, D]
  PagedKV kv;
  Tensor cu_q;
  Tensor packed_k, packed_v, cu_k;  // the sequences' keys gathered: [total_k, Hkv, D]
};

PagedCase make_paged(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk, DType dtype,
                     uint64_t seed) {
  PagedCase c;
  const int64_t B = static_cast<int64_t>(lq.size());
  c.q = random_tensor({offsets_of(lq).back(), kHq, kD}, dtype, seed);
  c.kv.k_pages = random_tensor({kBlocks, kBlock, kHkv, kD}, dtype, seed + 1);
  c.kv.v_pages = random_tensor({kBlocks, kBlock, kHkv, kD}, dtype, seed + 2);
  std::vector<int64_t> order(kBlocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(seed)));
  const int64_t max_blocks = 6;
  std::vector<double> table(static_cast<size_t>(B * max_blocks), -1.0);  // unused entries: -1
  std::vector<Tensor> ks, vs;
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i * kBlock < lk[b]; ++i) table[b * max_blocks + i] = order[next++];
    Tensor kb = Tensor::empty({lk[b], kHkv, kD}, dtype),
           vb = Tensor::empty({lk[b], kHkv, kD}, dtype);
    for (int64_t j = 0; j < lk[b]; ++j) {
      const auto blk = static_cast<int64_t>(table[b * max_blocks + j / kBlock]);
      kb.slice(0, j, j + 1)
          .copy_from(c.kv.k_pages.select(0, blk).slice(0, j % kBlock, j % kBlock + 1));
      vb.slice(0, j, j + 1)
          .copy_from(c.kv.v_pages.select(0, blk).slice(0, j % kBlock, j % kBlock + 1));
    }
    ks.push_back(kb), vs.push_back(vb);
  }
  c.kv.block_table = Tensor::from_vector({B, max_blocks}, table, DType::i32);
  c.kv.seqused_k = i32(lk);
  c.cu_q = i32(offsets_of(lq));
  c.cu_k = i32(offsets_of(lk));
  const int64_t total_k = offsets_of(lk).back();
  c.packed_k = Tensor::empty({total_k, kHkv, kD}, dtype);
  c.packed_v = Tensor::empty({total_k, kHkv, kD}, dtype);
  for (int64_t b = 0, at = 0; b < B; at += lk[b], ++b) {
    c.packed_k.slice(0, at, at + lk[b]).copy_from(ks[b]);
    c.packed_v.slice(0, at, at + lk[b]).copy_from(vs[b]);
  }
  return c;
}

void expect_matches_varlen(const PagedCase& c, const AttentionOptions& o) {
  const AttentionResult r = attention_paged(c.q, c.cu_q, c.kv, o);
  VarlenBatch vb;
  vb.cu_seqlens_q = c.cu_q, vb.cu_seqlens_k = c.cu_k;
  const AttentionResult e = attention_varlen(c.q, c.packed_k, c.packed_v, vb, o);
  EXPECT_TRUE(bitwise_equal(r.out, e.out));
  EXPECT_TRUE(bitwise_equal(r.lse, e.lse));
}

// Decode (1 query), speculative (3), a prefill chunk (20), an empty cache and one of exactly a block.
const std::vector<int64_t> kLq = {1, 3, 20, 1, 1, 2};
const std::vector<int64_t> kLk = {70, 35, 90, 0, 16, 2};

TEST(Paged, MatchesVarlenOnTheGatheredKeys) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      if (backend == Backend::cpu && dtype == DType::f64) continue;
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), backend_name(backend)));
      const PagedCase c = make_paged(kLq, kLk, dtype, 3);
      AttentionOptions o;
      o.backend = backend;
      expect_matches_varlen(c, o);
      o.causal = true, o.sinks = random_tensor({kHq}, DType::f32, 4);
      expect_matches_varlen(c, o);
      o.window = Window{8, 0}, o.softcap = 3.0;
      o.alibi_slopes = random_tensor({6, kHq}, DType::f64, 5, 0.0, 0.3);
      expect_matches_varlen(c, o);
    }
  }
}

TEST(Paged, OneQueryPerSequenceWithoutOffsets) {
  const std::vector<int64_t> ones(4, 1);
  const PagedCase c = make_paged(ones, {70, 1, 33, 64}, DType::f32, 6);
  AttentionOptions o;
  o.causal = true;
  const AttentionResult with = attention_paged(c.q, c.cu_q, c.kv, o);
  const AttentionResult without = attention_paged(c.q, Tensor(), c.kv, o);
  EXPECT_TRUE(bitwise_equal(with.out, without.out));
  EXPECT_TRUE(bitwise_equal(with.lse, without.lse));
}

void expect_refused(const PagedCase& c, std::initializer_list<std::string> parts) {
  expect_error([&] { (void)attention_paged(c.q, c.cu_q, c.kv); }, "attn::attention_paged", parts);
}

TEST(Paged, HostileIndicesAreRefused) {
  PagedCase c = make_paged({1, 1}, {20, 5}, DType::f32, 7);
  PagedCase bad = c;
  bad.kv.block_table = c.kv.block_table.clone();
  bad.kv.block_table.set({0, 1}, 40.0);
  expect_refused(bad, {"block_table[0, 1] = 40 is outside [0, num_blocks = 40)", "20 keys"});
  bad.kv.block_table.set({0, 1}, -1.0);
  expect_refused(bad, {"block_table[0, 1] = -1 is outside"});
  bad = c;
  bad.kv.seqused_k = i32({97, 5});
  expect_refused(bad,
                 {"seqused_k[0] = 97 is outside [0, 96] (block_table row 0 holds 6 blocks of 16)"});
  bad = c;
  bad.kv.block_table = c.kv.block_table.to(DType::i64);
  expect_refused(bad, {"block_table must be int32 [B = 2, max_blocks], got i64 [2, 6]"});
  bad = c;
  bad.kv.seqused_k = Tensor();
  expect_refused(bad, {"seqused_k must be int32 [B = 2], got nothing"});
  bad = c;
  bad.kv.v_pages = c.kv.v_pages.slice(0, 0, 39);
  expect_refused(bad, {"need one num_blocks"});
  bad = c;
  bad.kv.k_pages = c.kv.k_pages.to(DType::bf16);
  expect_refused(bad, {"k_pages and v_pages must have q's dtype or be int8"});
  bad = c;
  bad.cu_q = i32({0, 2, 1});
  expect_refused(bad, {"cu_seqlens_q[2] = 1 is below cu_seqlens_q[1] = 2"});
}

}  // namespace
}  // namespace attn::test
