// Helpers of the cpu backend's tests: every instruction set in turn, a case in another dtype.
#pragma once
#include <gtest/gtest.h>

#include <optional>

#include "attention/attention_cases.h"
#include "backends/cpu/attention_cpu.h"
#include "isa_test_util.h"

namespace attn::test {

// Runs the body once per available ISA with that ISA forced (amx-emulated included where the CPU
// has AVX2, amx where it has usable tiles); restores the default afterwards.
template <class Fn>
void for_each_isa(Fn&& body) {
  for_each_isa(
      cpu::available_isas(), [] { cpu::force_isa(std::nullopt); }, body);
}

// The case with q, k and v converted to dtype (masks and options as they are).
inline Case to_dtype(const Case& c, DType dtype) {
  Case r = c;
  r.q = c.q.to(dtype), r.k = c.k.to(dtype), r.v = c.v.to(dtype);
  return r;
}

}  // namespace attn::test
