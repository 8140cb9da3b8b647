// Sinks on the cpu backend: the kernels compute without them and contract::fold_sinks rescales out,
// lse and the weights (src/attention.cc); the backward's dsinks comes from dout, out and lse. Checked
// against the reference on the same values in f64, on every target this CPU runs, on the tiled
// forward, the decode kernel (one query row against a long cache, GQA) and bf16 inputs.
#include <gtest/gtest.h>

#include "cpu_test_util.h"

namespace attn::test {
namespace {

TEST(CpuSinks, TiledForwardAndBackwardMatchTheReference) {
  CaseSpec s;
  s.batch = {2}, s.Hq = 4, s.Hkv = 2, s.Lq = 70, s.Lk = 300, s.D = 32, s.Dv = 16;
  s.sinks = true;
  expect_matches_reference(s, 11);
  s.causal = true, s.alibi = true, s.key_lengths = true;
  expect_matches_reference(s, 12, 0.05);
}

TEST(CpuSinks, DecodeMatchesTheReference) {
  CaseSpec s;
  s.batch = {3}, s.Hq = 8, s.Hkv = 2, s.Lq = 1, s.Lk = 700, s.D = 64, s.Dv = 64;
  s.sinks = true;
  expect_matches_reference(s, 13);
  s.key_lengths = true;
  expect_matches_reference(s, 14);
}

TEST(CpuSinks, Bf16MatchesTheReference) {
  CaseSpec s;
  s.batch = {1}, s.Hq = 4, s.Hkv = 4, s.Lq = 40, s.Lk = 130, s.D = 64, s.Dv = 64;
  s.sinks = true;
  expect_bf16_matches_reference(s, 15);
  s.Lq = 1;
  expect_bf16_matches_reference(s, 16);
}

}  // namespace
}  // namespace attn::test
