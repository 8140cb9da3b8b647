// The conformance cases (tests/cases/attention_cases.txt) on the cpu backend, forward and backward,
// on every instruction set this machine has, against the reference in double: f32 cases within 1e-6
// (outputs, lse, weights) and 1e-5 (gradients), bf16 cases within the bf16 bounds of
// cpu_test_util.h. One test per case, named as in the file.
#include <gtest/gtest.h>

#include "cases/conformance_cases.h"
#include "cpu/cpu_test_util.h"

namespace attn::test {
namespace {

class CpuConformance : public ::testing::TestWithParam<NamedCase> {};

TEST_P(CpuConformance, MatchesReferenceOnEveryIsa) {
  const NamedCase& c = GetParam();
  SCOPED_TRACE("case " + c.name);
  if (c.spec.dtype == DType::bf16) {
    expect_bf16_matches_reference(c.spec, c.seed);
  } else {
    expect_matches_reference(c.spec, c.seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuConformance, ::testing::ValuesIn(conformance_cases()),
                         CaseName());

}  // namespace
}  // namespace attn::test
