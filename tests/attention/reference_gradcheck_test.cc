// Finite differences (double, central, tests/test_util.h) against the reference backward, one test per
// option of the contract; L = <G, out> for a fixed random G, gradients w.r.t. q, k, v and the add mask.
// Every element of every input is checked (the problems are small).
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
  expect_gradcheck_passes(s, seed);
}

TEST(ReferenceGradcheck, Plain) {
  expect_gradcheck(small_spec());
}

TEST(ReferenceGradcheck, DvDiffersFromD) {
  CaseSpec s = small_spec();
  s.D = 2, s.Dv = 5;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, Scale) {
  CaseSpec s = small_spec();
  s.scale = 0.37;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, Softcap) {
  CaseSpec s = small_spec();
  // small enough that tanh bends the scores a lot (values up to 2 * 2 * 3 / sqrt(3))
  s.softcap = 0.8;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, CausalBothAlignments) {
  for (Align a : {Align::bottom_right, Align::top_left}) {
    CaseSpec s = small_spec();
    s.causal = true, s.align = a;
    expect_gradcheck(s);
  }
}

TEST(ReferenceGradcheck, WindowsBothAlignments) {
  for (Align a : {Align::bottom_right, Align::top_left}) {
    for (Window w : {Window{1, 1}, Window{0, -1}, Window{2, 0}}) {
      CaseSpec s = small_spec();
      s.window = w, s.align = a;
      expect_gradcheck(s);
    }
  }
}

TEST(ReferenceGradcheck, KeepAndDropMasks) {
  for (MaskType m : {MaskType::keep, MaskType::drop}) {
    CaseSpec s = small_spec();
    s.mask = m;
    expect_gradcheck(s);
  }
}

// d(add mask) for a full mask and for a mask broadcast over batch and heads ([Lq, Lk]) and over rows
// ([Hq, 1, Lk]): the gradient is dS summed over the broadcast dims.
TEST(ReferenceGradcheck, AddMaskAndItsGradient) {
  for (Shape ms : {Shape{}, Shape{4, 5}, Shape{2, 1, 5}}) {
    CaseSpec s = small_spec();
    s.mask = MaskType::add, s.mask_shape = ms, s.softcap = 1.5;
    expect_gradcheck(s);
  }
}

TEST(ReferenceGradcheck, Alibi) {
  CaseSpec s = small_spec();
  s.alibi = true, s.causal = true;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, Gqa) {
  CaseSpec s = small_spec();
  s.Hq = 6, s.Hkv = 2;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, KeyLengths) {
  CaseSpec s = small_spec();
  s.batch = {3}, s.key_lengths = true;
  for (uint64_t seed : {3, 4, 5}) expect_gradcheck(s, seed);
}

TEST(ReferenceGradcheck, BlockLayout) {
  CaseSpec s = small_spec();
  s.block_layout = true, s.block_q = 2, s.block_k = 2;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, Dropout) {
  CaseSpec s = small_spec();
  s.dropout = 0.35;
  expect_gradcheck(s);
}

// Bottom-right causal with Lq > Lk: the first rows are fully masked, their gradients are 0 and the check
// still holds around them.
TEST(ReferenceGradcheck, FullyMaskedRows) {
  CaseSpec s = small_spec();
  s.Lq = 6, s.Lk = 3, s.causal = true;
  expect_gradcheck(s);
}

TEST(ReferenceGradcheck, EveryOptionAtOnce) {
  CaseSpec s = small_spec();
  s.batch = {2, 1};
  s.Hq = 4, s.Hkv = 2, s.Lq = 5, s.Lk = 7, s.D = 3, s.Dv = 4;
  s.causal = true, s.window = {4, -1}, s.mask = MaskType::add, s.mask_shape = {4, 1, 7};
  s.key_lengths = true, s.block_layout = true, s.alibi = true;
  s.softcap = 1.2, s.scale = 0.8, s.dropout = 0.2;
  expect_gradcheck(s, 8);
}

// Random specs: every option drawn at random (as in the cross-check), each checked on a random subset
// of 20 elements per input to keep the program fast.
TEST(ReferenceGradcheck, RandomSpecs) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    CaseSpec s = random_spec(seed);
    s.layout = Layout::contiguous;
    const GradcheckReport rep = gradcheck_reference(make_case(s, seed), seed, 20);
    EXPECT_LE(rep.relative(), kGradcheckTol)
        << "seed " << seed << ": " << s.describe() << "\nworst: " << rep.worst;
  }
}

}  // namespace
}  // namespace attn::test
