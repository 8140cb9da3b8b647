// attn::attention_varlen and its backward: a packed batch gives, sequence for sequence, the bits of
// attention() on that sequence alone (every option, forward and backward, reference and cpu, f64 /
// f32 / bf16), equal-length sequences give the bits of the batched call (dropout's batch index
// included), the cpu path stays within the f32 bounds of the reference, the result is the same for
// any thread count, and every hostile offset is refused by name before any read.
#include "attn/varlen.h"

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "expect_error.h"

namespace attn::test {
namespace {

// A packed batch of random sequences and its options.
struct PackedCase {
  Tensor q, k, v;  // [total_q, Hq, D], [total_k, Hkv, D], [total_k, Hkv, Dv]
  VarlenBatch batch;
  std::vector<int64_t> cu_q, cu_k, used;
  AttentionOptions o;
};

Tensor offsets(const std::vector<int64_t>& lens) {
  std::vector<double> cu{0.0};
  for (int64_t n : lens) cu.push_back(cu.back() + static_cast<double>(n));
  return Tensor::from_vector({static_cast<int64_t>(cu.size())}, cu, DType::i32);
}

std::vector<int64_t> as_ints(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  return {v.begin(), v.end()};
}

PackedCase make_packed(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk, int64_t Hq,
                       int64_t Hkv, int64_t D, int64_t Dv, DType dtype, uint64_t seed) {
  PackedCase c;
  c.batch.cu_seqlens_q = offsets(lq);
  c.batch.cu_seqlens_k = offsets(lk);
  c.cu_q = as_ints(c.batch.cu_seqlens_q), c.cu_k = as_ints(c.batch.cu_seqlens_k);
  c.q = random_tensor({c.cu_q.back(), Hq, D}, dtype, seed * 5 + 1);
  c.k = random_tensor({c.cu_k.back(), Hkv, D}, dtype, seed * 5 + 2);
  c.v = random_tensor({c.cu_k.back(), Hkv, Dv}, dtype, seed * 5 + 3);
  c.o.threads = 1;
  return c;
}

// Rows [r0, r1) of a packed tensor as an ordinary contiguous [1, H, L, X] tensor.
Tensor unpack(const Tensor& t, int64_t r0, int64_t r1) {
  return t.slice(0, r0, r1).permute({1, 0, 2}).unsqueeze(0).contiguous();
}

// The options of sequence b alone: its seqused_k as key_lengths, its row of per-sequence slopes.
AttentionOptions options_of(const PackedCase& c, int64_t b) {
  AttentionOptions o = c.o;
  if (!c.used.empty()) o.key_lengths = Tensor::from_vector({1}, {double(c.used[b])}, DType::i64);
  if (o.alibi_slopes.defined() && o.alibi_slopes.dim() == 2)
    o.alibi_slopes = o.alibi_slopes.select(0, b).contiguous();
  return o;
}

// Sequence by sequence, the packed call's out, lse and gradients are attention()'s bits.
void expect_sequences_match(const PackedCase& c) {
  const AttentionResult r = attention_varlen(c.q, c.k, c.v, c.batch, c.o);
  const Tensor dout = random_tensor(r.out.shape(), c.q.dtype(), 77);
  const AttentionGrads g =
      attention_varlen_backward(dout, c.q, c.k, c.v, r.out, r.lse, c.batch, c.o);
  std::vector<double> dsinks(c.q.size(1), 0.0);
  for (size_t b = 0; b + 1 < c.cu_q.size(); ++b) {
    SCOPED_TRACE(fmt::format("sequence {}", b));
    const int64_t q0 = c.cu_q[b], q1 = c.cu_q[b + 1], k0 = c.cu_k[b], k1 = c.cu_k[b + 1];
    const AttentionOptions o = options_of(c, static_cast<int64_t>(b));
    const Tensor qb = unpack(c.q, q0, q1), kb = unpack(c.k, k0, k1), vb = unpack(c.v, k0, k1);
    const AttentionResult e = attention(qb, kb, vb, o);
    EXPECT_TRUE(bitwise_equal(unpack(r.out, q0, q1), e.out));
    EXPECT_TRUE(bitwise_equal(r.lse.slice(1, q0, q1).unsqueeze(0).contiguous(), e.lse));
    const AttentionGrads eg = attention_backward(unpack(dout, q0, q1), qb, kb, vb, e.out, e.lse, o);
    EXPECT_TRUE(bitwise_equal(unpack(g.dq, q0, q1), eg.dq));
    EXPECT_TRUE(bitwise_equal(unpack(g.dk, k0, k1), eg.dk));
    EXPECT_TRUE(bitwise_equal(unpack(g.dv, k0, k1), eg.dv));
    if (eg.dsinks.defined()) {
      const std::vector<double> part = eg.dsinks.to_vector();
      for (size_t h = 0; h < part.size(); ++h) dsinks[h] += part[h];
    }
  }
  if (c.o.sinks.defined()) {
    EXPECT_LE(max_abs_error(g.dsinks, Tensor::from_vector(g.dsinks.shape(), dsinks, DType::f64)),
              1e-5 * std::max(1.0, max_abs(g.dsinks)));
  }
}

const std::vector<int64_t> kLq = {5, 0, 17, 1, 40, 9};
const std::vector<int64_t> kLk = {5, 3, 30, 64, 40, 0};

TEST(Varlen, EachSequenceIsItsOwnAttentionCall) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      if (backend == Backend::cpu && dtype == DType::f64) continue;
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), backend_name(backend)));
      PackedCase c = make_packed(kLq, kLk, 4, 2, 8, 6, dtype, 1);
      c.o.backend = backend;
      expect_sequences_match(c);
      c.o.causal = true, c.o.softcap = 2.0;
      expect_sequences_match(c);
      c.o.align = Align::top_left, c.o.window = Window{3, 2};
      c.o.sinks = random_tensor({4}, DType::f32, 9);
      expect_sequences_match(c);
    }
  }
}

TEST(Varlen, SequsedAndPerSequenceAlibi) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    PackedCase c = make_packed(kLq, kLk, 4, 4, 8, 8, DType::f32, 2);
    c.o.backend = backend;
    c.used = {5, 1, 12, 64, 0, 0};
    c.batch.seqused_k = Tensor::from_vector({6}, {5, 1, 12, 64, 0, 0}, DType::i32);
    c.o.alibi_slopes = random_tensor({6, 4}, DType::f64, 3, 0.0, 0.5);
    c.o.causal = true;
    expect_sequences_match(c);
  }
}

// Equal lengths: the batched call on [B, H, L, D] (the packed rows seen through a transpose), with
// dropout, whose keep-pattern takes the sequence's index as its batch index.
TEST(Varlen, EqualLengthsGiveTheBatchedCallWithDropout) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    PackedCase c = make_packed({7, 7, 7}, {9, 9, 9}, 4, 2, 8, 8, DType::f32, 4);
    c.o.backend = backend, c.o.dropout_p = 0.3, c.o.seed = 5, c.o.causal = true;
    const AttentionResult r = attention_varlen(c.q, c.k, c.v, c.batch, c.o);
    auto batched = [](const Tensor& t, int64_t L) {
      return t.view({3, L, t.size(1), t.size(2)}).transpose(1, 2);
    };
    const AttentionResult e = attention(batched(c.q, 7), batched(c.k, 9), batched(c.v, 9), c.o);
    EXPECT_TRUE(bitwise_equal(batched(r.out, 7).contiguous(), e.out));
  }
}

// The cpu path against the reference (the oracle) on the same values: f32 bounds.
TEST(Varlen, CpuWithinTheReferencesBounds) {
  PackedCase c = make_packed({33, 120, 1, 64}, {33, 300, 200, 64}, 8, 2, 32, 32, DType::f32, 6);
  c.o.causal = true, c.o.sinks = random_tensor({8}, DType::f32, 10);
  AttentionOptions ref = c.o, cpu = c.o;
  ref.backend = Backend::reference, cpu.backend = Backend::cpu;
  PackedCase c64 = c;
  c64.q = c.q.to(DType::f64), c64.k = c.k.to(DType::f64), c64.v = c.v.to(DType::f64);
  const AttentionResult e = attention_varlen(c64.q, c64.k, c64.v, c.batch, ref);
  const AttentionResult r = attention_varlen(c.q, c.k, c.v, c.batch, cpu);
  EXPECT_LE(rel_error(r.out, e.out), kTolF32Forward);
  EXPECT_LE(rel_error(r.lse, e.lse), kTolF32Forward);
  const Tensor dout = random_tensor(r.out.shape(), DType::f32, 8);
  const AttentionGrads g =
      attention_varlen_backward(dout, c.q, c.k, c.v, r.out, r.lse, c.batch, cpu);
  const AttentionGrads eg = attention_varlen_backward(dout.to(DType::f64), c64.q, c64.k, c64.v,
                                                      e.out, e.lse, c.batch, ref);
  for (auto [got, want] :
       {std::pair{g.dq, eg.dq}, {g.dk, eg.dk}, {g.dv, eg.dv}, {g.dsinks, eg.dsinks}})
    EXPECT_LE(rel_error(got, want), 1e-5);
}

TEST(Varlen, SameBitsForAnyThreadCount) {
  PackedCase c =
      make_packed({300, 7, 50, 1, 1, 90}, {300, 20, 50, 500, 30, 90}, 4, 1, 16, 16, DType::f32, 7);
  c.o.backend = Backend::cpu, c.o.causal = true;
  c.o.threads = 1;
  const AttentionResult one = attention_varlen(c.q, c.k, c.v, c.batch, c.o);
  const Tensor dout = random_tensor(one.out.shape(), DType::f32, 3);
  const AttentionGrads g1 =
      attention_varlen_backward(dout, c.q, c.k, c.v, one.out, one.lse, c.batch, c.o);
  for (int threads : {2, 3}) {
    c.o.threads = threads;
    const AttentionResult r = attention_varlen(c.q, c.k, c.v, c.batch, c.o);
    EXPECT_TRUE(bitwise_equal(r.out, one.out) && bitwise_equal(r.lse, one.lse)) << threads;
    const AttentionGrads g =
        attention_varlen_backward(dout, c.q, c.k, c.v, r.out, r.lse, c.batch, c.o);
    EXPECT_TRUE(bitwise_equal(g.dq, g1.dq) && bitwise_equal(g.dk, g1.dk) &&
                bitwise_equal(g.dv, g1.dv))
        << threads;
  }
}

// Rows whose last dim is not unit-stride (every other element of a wider tensor; an expanded dout
// with stride 0 everywhere, what autograd hands out.sum()'s backward) are read as their values: the
// bits of the same values contiguous, forward and backward, on both backends.
TEST(Varlen, StridedRowsAreReadAsTheirValues) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend_name(backend));
    PackedCase c = make_packed({5, 40, 1}, {9, 40, 30}, 4, 2, 16, 16, DType::f32, 8);
    c.o.backend = backend, c.o.causal = true;
    const Tensor wide = random_tensor({c.cu_q.back(), 4, 32}, DType::f32, 9);
    const Tensor q = wide.slice(2, 0, 32, 2);  // [total_q, 4, 16], last-dim stride 2
    const AttentionResult r = attention_varlen(q, c.k, c.v, c.batch, c.o);
    const AttentionResult e = attention_varlen(q.contiguous(), c.k, c.v, c.batch, c.o);
    EXPECT_TRUE(bitwise_equal(r.out, e.out) && bitwise_equal(r.lse, e.lse));
    const Tensor ones = Tensor::full({1, 1, 1}, 1.0, DType::f32).expand(e.out.shape());
    const AttentionGrads g =
        attention_varlen_backward(ones, q, c.k, c.v, e.out, e.lse, c.batch, c.o);
    const AttentionGrads h = attention_varlen_backward(ones.contiguous(), q.contiguous(), c.k, c.v,
                                                       e.out, e.lse, c.batch, c.o);
    EXPECT_TRUE(bitwise_equal(g.dq, h.dq) && bitwise_equal(g.dk, h.dk) &&
                bitwise_equal(g.dv, h.dv));
  }
}

}  // namespace
}  // namespace attn::test
