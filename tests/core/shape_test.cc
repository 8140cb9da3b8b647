// attn::Shape: std::vector's interface over inline storage of at most kMaxDims values.
#include "attn/shape.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attn/error.h"
#include "attn/tensor.h"

namespace attn {
namespace {

TEST(Shape, BuildsLikeAVector) {
  EXPECT_EQ(Shape().size(), 0u);
  EXPECT_TRUE(Shape().empty());
  const Shape listed{2, 3, 4};
  EXPECT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0], 2);
  EXPECT_EQ(listed.back(), 4);
  EXPECT_EQ(Shape(3, 7), (Shape{7, 7, 7}));
  EXPECT_EQ(Shape(2), (Shape{0, 0}));  // a count, as std::vector(2): not a one-dim shape {2}
  EXPECT_EQ(Shape{2}.size(), 1u);      // braces: the values
  const std::vector<int64_t> v{5, 6, 7, 8};
  const Shape from_vector = v;
  EXPECT_EQ(from_vector, (Shape{5, 6, 7, 8}));
  EXPECT_EQ(from_vector.to_vector(), v);
  EXPECT_EQ(Shape(v.begin() + 1, v.end() - 1), (Shape{6, 7}));
  EXPECT_EQ(Shape(listed.rbegin(), listed.rend()), (Shape{4, 3, 2}));
}

TEST(Shape, EditsLikeAVector) {
  Shape s{1, 2, 3};
  s.push_back(4);
  EXPECT_EQ(s, (Shape{1, 2, 3, 4}));
  s.insert(s.begin() + 1, 9);
  EXPECT_EQ(s, (Shape{1, 9, 2, 3, 4}));
  s.insert(s.end(), {5, 6});
  EXPECT_EQ(s, (Shape{1, 9, 2, 3, 4, 5, 6}));
  s.erase(s.begin());
  EXPECT_EQ(s, (Shape{9, 2, 3, 4, 5, 6}));
  s.erase(s.begin() + 1, s.begin() + 3);
  EXPECT_EQ(s, (Shape{9, 4, 5, 6}));
  s.pop_back();
  s.resize(5, 1);
  EXPECT_EQ(s, (Shape{9, 4, 5, 1, 1}));
  s.assign(s.rbegin(), s.rend());  // from its own values
  EXPECT_EQ(s, (Shape{1, 1, 5, 4, 9}));
  s.assign(2, 8);
  EXPECT_EQ(s, (Shape{8, 8}));
  EXPECT_NE(s, (Shape{8, 8, 8}));
  EXPECT_NE(s, (Shape{8, 7}));
  s.clear();
  EXPECT_TRUE(s.empty());
}

// Values live in the object: a copy owns its own, and nothing points outside it.
TEST(Shape, HoldsItsValuesInline) {
  static_assert(Shape::capacity() == kMaxDims);
  static_assert(std::is_trivially_copyable_v<Shape>);
  Shape a{1, 2, 3};
  const Shape b = a;
  a[0] = 5;
  EXPECT_EQ(b[0], 1);
  const auto* begin = reinterpret_cast<const char*>(&a);
  EXPECT_GE(reinterpret_cast<const char*>(a.data()), begin);
  EXPECT_LE(reinterpret_cast<const char*>(a.data() + kMaxDims), begin + sizeof(Shape));
}

// Past kMaxDims values: attn::Error naming the count, whichever way the values came, and the shape
// is left as it was.
TEST(Shape, RefusesMoreThanTheMaximumDims) {
  const std::vector<int64_t> twelve(12, 1);
  auto expect_refused = [](auto&& build, const char* count) {
    try {
      build();
      ADD_FAILURE() << "no error for " << count << " dims";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string(count) + " dims, more than the maximum of 8"),
          std::string::npos)
          << e.what();
    }
  };
  expect_refused([&] { return Shape(twelve); }, "12");
  expect_refused([&] { return Shape(twelve.begin(), twelve.end()); }, "12");
  expect_refused([] { return Shape(9, 1); }, "9");
  expect_refused([] { return Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}; }, "9");
  Shape full(8, 2);
  expect_refused([&] { full.push_back(3); }, "9");
  expect_refused([&] { full.insert(full.begin(), {1, 1}); }, "10");
  expect_refused([&] { full.resize(11); }, "11");
  EXPECT_EQ(full, Shape(8, 2));
  // A tensor of more dims is refused at its shape, with the same message.
  expect_refused([&] { return Tensor::zeros(twelve, DType::f32); }, "12");
}

}  // namespace
}  // namespace attn
