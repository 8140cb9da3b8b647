// Finite differences (double, central, tests/test_util.h) against the reference backward, one test
// per option of the contract; L = <G, out> for a fixed random G, gradients w.r.t. q, k, v and the
// add mask.
#include <gtest/gtest.h>

#include "attention_cases.h"

namespace attn::test {
namespace {

CaseSpec small_spec() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 2, s.Hkv = 1, s.Lq = 4, s.Lk = 5, s.D = 3, s.Dv = 2;
  return s;
}

void expect_gradcheck(const CaseSpec& s, uint64_t seed = 3) {
  const GradcheckReport rep = gradcheck_reference(make_case(s, seed), seed);
  EXPECT_GT(rep.checked, 0);
  EXPECT_GT(rep.max_abs_grad, 0.0) << s.describe();
  EXPECT_LE(rep.relative(), kGradcheckTol) << s.describe() << "\nworst: " << rep.worst;
}

TEST(ReferenceGradcheck, Plain) {
  expect_gradcheck(small_spec());
}

TEST(ReferenceGradcheck, DvDiffersFromD) {
  CaseSpec s = small_spec();
  s.D = 2, s.Dv = 5;
  expect_gradcheck(s);
}

}  // namespace
}  // namespace attn::test
