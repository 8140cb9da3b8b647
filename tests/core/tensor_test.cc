#include "attn/tensor.h"

#include <gtest/gtest.h>

namespace attn {
namespace {

TEST(Tensor, TransposeIsAViewAndContiguousCopies) {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5}, DType::f32);
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.data(), t.data());
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.at({2, 1}), 5.0);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

}  // namespace
}  // namespace attn
