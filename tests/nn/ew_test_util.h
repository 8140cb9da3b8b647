// The nn element-wise kernels' instruction sets for tests (elementwise_test.cc, dropout_kernel_test.cc).
#pragma once
#include <optional>
#include <vector>

#include "isa_test_util.h"
#include "nn/elementwise.h"

namespace attn::nn::testing {

// The copies of nn/elementwise.h's kernels this CPU runs: the plain-vector targets of core/isa.h.
inline std::vector<cpu::Isa> ew_isas() {
  std::vector<cpu::Isa> v;
  for (cpu::Isa i : {cpu::Isa::portable, cpu::Isa::avx2, cpu::Isa::avx512})
    if (cpu::isa_available(i)) v.push_back(i);
  return v;
}

// Runs body(isa) with the target forced to each of them in turn (cpu::force_isa: attention's kernels
// run on it too), then back to the default.
template <class F>
void for_each_ew_isa(F&& body) {
  test::for_each_isa(
      ew_isas(), [] { cpu::force_isa(std::nullopt); }, body);
}

}  // namespace attn::nn::testing
