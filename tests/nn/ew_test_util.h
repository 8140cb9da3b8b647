// The nn element-wise kernels' instruction sets for tests (elementwise_test.cc, dropout_kernel_test.cc).
#pragma once
#include <vector>

#include "isa_test_util.h"
#include "nn/elementwise.h"

namespace attn::nn::testing {

// The instruction sets of nn/elementwise.h this CPU runs.
inline std::vector<ew::Isa> ew_isas() {
  std::vector<ew::Isa> v;
  for (ew::Isa i : {ew::Isa::portable, ew::Isa::avx2, ew::Isa::avx512})
    if (ew::isa_available(i)) v.push_back(i);
  return v;
}

// Runs body(isa) with the kernels forced to each of them in turn, then back to the default.
template <class F>
void for_each_ew_isa(F&& body) {
  test::for_each_isa(ew_isas(), ew::reset_isa, body);
}

}  // namespace attn::nn::testing
