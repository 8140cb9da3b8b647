// The reference backend against the independent naive implementation (tests/naive_attention.h) on
// random problems that combine every option, forward and backward, at f64 (~1e-12).
#include <gtest/gtest.h>

#include "attention_cases.h"

namespace attn::test {
namespace {

void expect_matches_naive(const Case& c, const std::string& what) {
  const AttentionResult r = run_reference(c);
  const NaiveResult n = naive_attention(c.q, c.k, c.v, c.o);
  EXPECT_LE(rel_error(r.out, n.out), kTolF64) << what;
  EXPECT_LE(max_abs_error(r.lse, n.lse), kTolF64 * std::max(1.0, max_abs(n.lse))) << what;
  EXPECT_LE(max_abs_error(r.weights, n.weights), kTolF64) << what;

  const Tensor G = random_tensor(r.out.shape(), DType::f64, 99, -1.0, 1.0);
  AttentionOptions ob = c.o;
  ob.mask_grad = c.o.mask.defined() && c.o.mask_type == MaskType::add;
  const AttentionGrads g = attention_backward(G, c.q, c.k, c.v, r.out, r.lse, ob);
  const NaiveGrads ng = naive_attention_backward(G, c.q, c.k, c.v, c.o);
  EXPECT_LE(rel_error(g.dq, ng.dq), kTolF64) << what;
  EXPECT_LE(rel_error(g.dk, ng.dk), kTolF64) << what;
  EXPECT_LE(rel_error(g.dv, ng.dv), kTolF64) << what;
  if (ob.mask_grad) {
    EXPECT_LE(rel_error(g.dmask, ng.dmask), kTolF64) << what;
  }
}

TEST(ReferenceCrossCheck, RandomProblemsWithEveryOption) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const CaseSpec s = random_spec(seed);
    expect_matches_naive(make_case(s, seed), "seed " + std::to_string(seed) + ": " + s.describe());
    if (HasFailure()) break;
  }
}

// Longer rows and larger tiles, so that windows, block layouts and key lengths cut at many places.
TEST(ReferenceCrossCheck, RandomLongerProblems) {
  for (uint64_t seed = 1001; seed <= 1030; ++seed) {
    const CaseSpec s = random_spec(seed, 40);
    expect_matches_naive(make_case(s, seed), "seed " + std::to_string(seed) + ": " + s.describe());
    if (HasFailure()) break;
  }
}

TEST(ReferenceCrossCheck, EveryOptionAtOnce) {
  CaseSpec s;
  s.batch = {2, 1};
  s.Hq = 4, s.Hkv = 2, s.Lq = 6, s.Lk = 9, s.D = 5, s.Dv = 3;
  s.causal = true;
  s.window = {4, 1};
  s.mask = MaskType::add;
  s.mask_shape = {4, 1, 9};
  s.key_lengths = true;
  s.block_layout = true;
  s.alibi = true;
  s.softcap = 1.5;
  s.scale = 0.7;
  s.dropout = 0.3;
  s.layout = Layout::transposed;
  for (uint64_t seed = 1; seed <= 5; ++seed) expect_matches_naive(make_case(s, seed), s.describe());
}

}  // namespace
}  // namespace attn::test
