// for_each_isa: a test body run once per instruction set of a layer that compiles its kernels per
// ISA (the cpu attention backend, the nn element-wise kernels). Each layer's tests bind it to their
// ISA list and default (cpu/cpu_test_util.h, nn/elementwise_test.cc).
#pragma once
#include <gtest/gtest.h>

#include <vector>

namespace attn::test {

// Runs body(isa) for each of `isas` with the layer's kernels forced to it (a SCOPED_TRACE names it),
// then restore() returns the layer to its default. force_isa(isa) and isa_name(isa) are the layer's
// own, found by argument-dependent lookup from the Isa type (attn::cpu::Isa, attn::nn::cpu::Isa), so
// this header depends on neither layer.
template <class Isa, class Restore, class Body>
void for_each_isa(const std::vector<Isa>& isas, Restore&& restore, Body&& body) {
  for (Isa isa : isas) {
    SCOPED_TRACE(isa_name(isa));
    force_isa(isa);
    body(isa);
  }
  restore();
}

}  // namespace attn::test
