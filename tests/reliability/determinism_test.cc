// Determinism: the same inputs, options and seed give bitwise equal forward, backward and dropout
// results on every run and for every thread count (1, 2, 3, 7: fewer, equal and more threads than
// cores, and a count that does not divide the work); different seeds give different dropout
// patterns.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_run.h"
#include "attn/attention.h"
#include "test_util.h"

namespace attn {
namespace {

using test::bitwise_equal;
using test::random_bool;
using test::random_tensor;

using Outcome = test::FwdBwd;
using test::expect_bitwise_equal;

struct Problem {
  Tensor q, k, v, dout;
  AttentionOptions o;
};

// B = 2, Hq = 4 over Hkv = 2 (GQA), Lq = 37 and Lk = 53 (not multiples of any tile), D = 24, Dv =
// 20, a keep mask broadcast over heads, key lengths, ALiBi and dropout: every per-element path of a
// kernel.
Problem make_problem(DType dt, double dropout_p, uint64_t seed) {
  Problem p;
  p.q = random_tensor({2, 4, 37, 24}, dt, 11, -2, 2);
  p.k = random_tensor({2, 2, 53, 24}, dt, 12, -2, 2);
  p.v = random_tensor({2, 2, 53, 20}, dt, 13, -2, 2);
  p.dout = random_tensor({2, 4, 37, 20}, dt, 14, -1, 1);
  p.o.mask = random_bool({2, 1, 37, 53}, 0.8, 15);
  p.o.key_lengths = Tensor::from_vector({2}, {53, 40}, DType::i64);
  p.o.alibi_slopes = Tensor::from_vector({4}, {0.5, 0.25, 0.125, 0.0625}, DType::f32);
  p.o.dropout_p = dropout_p;
  p.o.seed = seed;
  p.o.return_weights = true;
  return p;
}

Outcome run(const Problem& p, Backend backend, int threads) {
  AttentionOptions o = p.o;
  o.backend = backend;
  o.threads = threads;
  Outcome r;
  r.fwd = attention(p.q, p.k, p.v, o);
  r.grads = attention_backward(p.dout, p.q, p.k, p.v, r.fwd.out, r.fwd.lse, o);
  return r;
}

struct Config {
  Backend backend;
  DType dtype;
  double dropout_p;
};

class Determinism : public ::testing::TestWithParam<Config> {};

TEST_P(Determinism, BitwiseEqualAcrossRunsAndThreadCounts) {
  const Config c = GetParam();
  const Problem p = make_problem(c.dtype, c.dropout_p, 0x5eed);
  const Outcome first = run(p, c.backend, 1);
  expect_bitwise_equal(first, run(p, c.backend, 1), "second run, 1 thread");
  for (int threads : {2, 3, 7}) {
    expect_bitwise_equal(first, run(p, c.backend, threads),
                         "1 vs " + std::to_string(threads) + " threads");
  }
  // threads = 0 follows attn::set_num_threads / ATTN_NUM_THREADS: the same answer again.
  expect_bitwise_equal(first, run(p, c.backend, 0), "1 thread vs the default thread count");
}

INSTANTIATE_TEST_SUITE_P(Reliability, Determinism,
                         ::testing::Values(Config{Backend::automatic, DType::f32, 0.0},
                                           Config{Backend::automatic, DType::f32, 0.3},
                                           Config{Backend::automatic, DType::bf16, 0.3},
                                           Config{Backend::automatic, DType::f16, 0.3},
                                           Config{Backend::reference, DType::f32, 0.3},
                                           Config{Backend::reference, DType::f64, 0.3}),
                         [](const auto& test_info) {
                           return std::string(backend_name(test_info.param.backend)) + "_" +
                                  dtype_name(test_info.param.dtype) +
                                  (test_info.param.dropout_p > 0 ? "_dropout" : "");
                         });

// Dropout: a different seed drops different weights (so the outputs differ), the same seed the same
// ones; the pattern is the one of the contract, on the fast backend as on the reference.
TEST(Determinism, DropoutSeedsGiveDifferentPatterns) {
  const Problem a = make_problem(DType::f32, 0.5, 1);
  Problem b = a;
  b.o.seed = 2;
  const Outcome ra = run(a, Backend::automatic, 2), rb = run(b, Backend::automatic, 2);
  EXPECT_FALSE(bitwise_equal(ra.fwd.out, rb.fwd.out))
      << "seeds 1 and 2 gave the same dropout output";
  EXPECT_FALSE(bitwise_equal(ra.grads.dv, rb.grads.dv)) << "seeds 1 and 2 gave the same dv";
  // The weights are the probabilities before dropout: independent of the seed.
  EXPECT_TRUE(bitwise_equal(ra.fwd.weights, rb.fwd.weights));

  // Seeds that differ only in their high 32 bits also give different patterns (the key uses all
  // 64).
  Problem c = a;
  c.o.seed = 1 + (uint64_t{1} << 32);
  EXPECT_FALSE(bitwise_equal(ra.fwd.out, run(c, Backend::automatic, 2).fwd.out));

  // With v = identity-like one-hot columns the output exposes the pattern itself: out[i][j] is
  // weights[i][j] * keep(i, j) / (1 - p). The two backends must drop the same entries.
  const int64_t L = 16;
  std::vector<double> eye(static_cast<size_t>(L * L), 0.0);
  for (int64_t j = 0; j < L; ++j) eye[static_cast<size_t>(j * L + j)] = 1.0;
  const Tensor q = random_tensor({1, 3, L, 8}, DType::f32, 21);
  const Tensor k = random_tensor({1, 3, L, 8}, DType::f32, 22);
  const Tensor v = Tensor::from_vector({1, 1, L, L}, eye, DType::f32).expand({1, 3, L, L});
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
    AttentionOptions o;
    o.dropout_p = 0.4;
    o.seed = seed;
    o.backend = Backend::reference;
    const std::vector<double> ref = attention(q, k, v, o).out.to_vector();
    o.backend = Backend::automatic;
    const std::vector<double> fast = attention(q, k, v, o).out.to_vector();
    int64_t dropped = 0;
    for (size_t e = 0; e < ref.size(); ++e) {
      ASSERT_EQ(ref[e] == 0.0, fast[e] == 0.0)
          << "seed " << seed << ": backends disagree on entry " << e;
      dropped += ref[e] == 0.0;
    }
    // About 40% of 768 entries: a pattern, not all or nothing.
    EXPECT_GT(dropped, 768 * 0.25) << "seed " << seed;
    EXPECT_LT(dropped, 768 * 0.55) << "seed " << seed;
  }
}

}  // namespace
}  // namespace attn
