// One forward (weights included) and backward of attn::attention, and the bitwise comparison of two
// of them: for the tests whose two ways of computing must give the same bits (thread counts, a mask
// and the key lengths it folds into).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "attn/attention.h"
#include "test_util.h"

namespace attn::test {

struct FwdBwd {
  AttentionResult fwd;
  AttentionGrads grads;
};

inline void expect_bitwise_equal(const FwdBwd& a, const FwdBwd& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.fwd.out, b.fwd.out)) << what << ": out";
  EXPECT_TRUE(bitwise_equal(a.fwd.lse, b.fwd.lse)) << what << ": lse";
  EXPECT_TRUE(bitwise_equal(a.fwd.weights, b.fwd.weights)) << what << ": weights";
  EXPECT_TRUE(bitwise_equal(a.grads.dq, b.grads.dq)) << what << ": dq";
  EXPECT_TRUE(bitwise_equal(a.grads.dk, b.grads.dk)) << what << ": dk";
  EXPECT_TRUE(bitwise_equal(a.grads.dv, b.grads.dv)) << what << ": dv";
}

}  // namespace attn::test
