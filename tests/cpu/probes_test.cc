// The read probe's loop (read_probe_sum, src/backends/cpu/probes-inl.h) on every target this CPU
// runs: the wrapping sum of the words it was given, whatever the length and alignment (vector
// chains, tail, an odd start). `attn bench` judges decode against this probe's bandwidth, so a loop
// that skipped words would overstate the ceiling.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/kernels.h"

namespace attn::test {
namespace {

TEST(Probes, ReadProbeSumsEveryWord) {
  std::vector<uint32_t> w(100003);
  uint32_t s = 1;
  for (uint32_t& x : w) x = s = s * 1664525u + 1013904223u;
  for (const cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    for (const int64_t start : {0, 1, 3}) {
      for (const int64_t n : {0, 1, 63, 64, 65, 1000, 100000}) {
        uint32_t want = 0;
        for (int64_t i = 0; i < n; ++i) want += w[start + i];
        EXPECT_EQ(cpu::kernels_of(isa).read_probe_sum(w.data() + start, n), want)
            << "start " << start << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace attn::test
