// The reference backend against the independent naive implementation (tests/naive_attention.h) on
// random problems that combine every option and on the named conformance cases, forward and
// backward, at f64 (~1e-12).
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "cases/conformance_cases.h"

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
  EXPECT_EQ(g.dsinks.defined(), c.o.sinks.defined()) << what;
  if (c.o.sinks.defined()) {
    EXPECT_LE(rel_error(g.dsinks, ng.dsinks), kTolF64) << what;
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

// The conformance cases (tests/cases/attention_cases.txt; its every_option was this file's EveryOptionAtOnce),
// at f64 whatever the case's dtype: one test per case, named as in the file.
class ReferenceConformance : public ::testing::TestWithParam<NamedCase> {};

TEST_P(ReferenceConformance, MatchesNaive) {
  const NamedCase& c = GetParam();
  CaseSpec s = c.spec;
  s.dtype = DType::f64;
  expect_matches_naive(make_case(s, c.seed), "case " + c.name + ": " + s.describe());
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceConformance, ::testing::ValuesIn(conformance_cases()),
                         CaseName());

}  // namespace
}  // namespace attn::test
