// Every rejection of src/attention.cc: attn::Error whose message starts with the entry point's name
// and names the argument (and the shapes where there are any).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "attention/expect_error.h"
#include "attention_cases.h"

namespace attn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Inputs {
  Tensor q = random_tensor({2, 4, 3, 5}, DType::f32, 1);
  Tensor k = random_tensor({2, 2, 6, 5}, DType::f32, 2);
  Tensor v = random_tensor({2, 2, 6, 7}, DType::f32, 3);
};

// Forward and backward share the validation: every case is checked through both entry points.
void expect_both(const Inputs& in, const AttentionOptions& o,
                 std::initializer_list<std::string> parts) {
  expect_error([&] { attention(in.q, in.k, in.v, o); }, "attn::attention", parts);
  const Tensor dout = Tensor::zeros({2, 4, 3, 7}, DType::f32),
               lse = Tensor::zeros({2, 4, 3}, DType::f32);
  expect_error([&] { attention_backward(dout, in.q, in.k, in.v, dout, lse, o); },
               "attn::attention_backward", parts);
}

AttentionOptions ref() {
  AttentionOptions o;
  o.backend = Backend::reference;
  return o;
}

TEST(Validation, ValidInputsPass) {
  const Inputs in;
  EXPECT_NO_THROW(attention(in.q, in.k, in.v, ref()));
}

TEST(Validation, RanksShapesAndDtypes) {
  {
    Inputs in;
    in.q = Tensor();
    expect_both(in, ref(), {"q", "undefined"});
  }
  {
    Inputs in;
    in.q = Tensor::zeros({2, 4, 3, 5}, DType::i32);
    expect_both(in, ref(), {"q", "i32", "[2, 4, 3, 5]"});
  }
  {
    Inputs in;
    in.k = in.k.to(DType::f64);
    expect_both(in, ref(), {"dtype", "f64", "[2, 2, 6, 5]"});
  }
  {
    Inputs in;
    in.v = random_tensor({6, 7}, DType::f32, 4);
    expect_both(in, ref(), {"v", "rank", "[6, 7]"});
  }
  {
    Inputs in;
    in.k = in.k.select(0, 0);
    expect_both(in, ref(), {"rank", "[2, 6, 5]"});
  }
  {
    Inputs in;
    in.k = random_tensor({3, 2, 6, 5}, DType::f32, 4);
    in.v = random_tensor({3, 2, 6, 7}, DType::f32, 5);
    expect_both(in, ref(), {"batch", "[3, 2, 6, 5]"});
  }
  {
    Inputs in;
    in.k = random_tensor({2, 2, 6, 4}, DType::f32, 4);
    expect_both(in, ref(), {"head dim", "[2, 4, 3, 5]", "[2, 2, 6, 4]"});
  }
  {
    Inputs in;
    in.v = random_tensor({2, 2, 5, 7}, DType::f32, 4);
    expect_both(in, ref(), {"k and v", "[2, 2, 5, 7]"});
  }
  {
    Inputs in;
    in.k = random_tensor({2, 3, 6, 5}, DType::f32, 4);
    in.v = random_tensor({2, 3, 6, 7}, DType::f32, 5);
    expect_both(in, ref(), {"multiple", "(4)", "(3)"});
  }
  {
    Inputs in;  // Hkv = 0 with Hq > 0
    in.k = Tensor::zeros({2, 0, 6, 5}, DType::f32);
    in.v = Tensor::zeros({2, 0, 6, 7}, DType::f32);
    expect_both(in, ref(), {"multiple", "(0)"});
  }
}

TEST(Validation, ScaleAndSoftcap) {
  const Inputs in;
  for (double bad : {kNaN, kInf, -kInf, 0.0, -1.0}) {
    AttentionOptions o = ref();
    if (std::isnan(bad) || std::isinf(bad)) {  // scale: any finite value (torch's rule)
      o.scale = bad;
      expect_both(in, o, {"scale"});
      o = ref();
    }
    o.softcap = bad;
    expect_both(in, o, {"softcap"});
  }
}

// Options past float's range (legal: any finite scale, softcap, slope) are out of the cpu kernels'
// reach: backend auto runs them on the reference (finite, its results), an explicit cpu refuses
// naming the option. The cpu kernels narrowed them to inf and returned NaN everywhere.
TEST(Validation, OptionsPastFloatRangeRunOnTheReference) {
  const Inputs in;
  const Tensor dout = random_tensor({2, 4, 3, 7}, DType::f32, 4);
  auto past_range = [](int which) {
    AttentionOptions o;
    if (which == 0) o.scale = 1e39;
    if (which == 1) o.scale = 1e300, o.softcap = 1.0;
    if (which == 2) o.softcap = 1e300;
    if (which == 3) o.alibi_slopes = Tensor::from_vector({4}, {0.5, 1e39, 0.25, 0.125}, DType::f64);
    return o;
  };
  const char* names[] = {"scale", "scale", "softcap", "alibi_slopes[1]"};
  for (int which = 0; which < 4; ++which) {
    AttentionOptions o = past_range(which);
    const AttentionResult a = attention(in.q, in.k, in.v, o);
    const AttentionGrads ga = attention_backward(dout, in.q, in.k, in.v, a.out, a.lse, o);
    o.backend = Backend::reference;
    const AttentionResult r = attention(in.q, in.k, in.v, o);
    const AttentionGrads gr = attention_backward(dout, in.q, in.k, in.v, r.out, r.lse, o);
    // The reference's own results, bit for bit (its dq may overflow float, or be NaN where the f32
    // lse of scores past float's range is infinite); the output is finite.
    EXPECT_TRUE(bitwise_equal(a.out, r.out)) << names[which];
    EXPECT_TRUE(bitwise_equal(a.lse, r.lse)) << names[which];
    EXPECT_TRUE(bitwise_equal(ga.dq, gr.dq)) << names[which];
    for (double x : a.out.to_vector()) ASSERT_TRUE(std::isfinite(x)) << names[which];
    o.backend = Backend::cpu;
    expect_both(in, o, {names[which], "beyond the float range"});
  }
}

// Enum options holding values outside their enums (casts from ints) are refused naming the field.
TEST(Validation, EnumValuesOutsideTheirEnums) {
  const Inputs in;
  AttentionOptions o = ref();
  o.mask_type = static_cast<MaskType>(7);
  expect_both(in, o, {"mask_type 7", "keep, drop or add"});
  o = ref();
  o.align = static_cast<Align>(9);
  expect_both(in, o, {"align 9"});
  o = ref();
  o.backend = static_cast<Backend>(9);
  expect_both(in, o, {"backend 9"});
}

TEST(Validation, WindowDropoutAndAlibi) {
  const Inputs in;
  for (Window w : {Window{-2, 0}, Window{0, -2}, Window{-5, -5}}) {
    AttentionOptions o = ref();
    o.window = w;
    expect_both(in, o, {"window"});
  }
  for (double p : {-0.1, 1.0000001, 1.5, kNaN, kInf}) {
    AttentionOptions o = ref();
    o.dropout_p = p;
    expect_both(in, o, {"dropout_p"});
  }
  for (double bad : {kNaN, kInf, -kInf}) {
    AttentionOptions o = ref();
    o.alibi_slopes = Tensor::from_vector({4}, {0.5, 0.25, bad, 0.1}, DType::f32);
    expect_both(in, o, {"alibi_slopes[2]"});
  }
  {
    AttentionOptions o = ref();
    o.alibi_slopes = Tensor::from_vector({2}, {0.5, 0.25}, DType::f32);
    expect_both(in, o, {"alibi_slopes", "[2]", "Hq = 4"});
    o.alibi_slopes = Tensor::from_vector({4}, {1, 2, 3, 4}, DType::i32);
    expect_both(in, o, {"alibi_slopes", "i32"});
    o.alibi_slopes = Tensor::zeros({1, 4}, DType::f32);
    expect_both(in, o, {"alibi_slopes", "[1, 4]"});
  }
}

TEST(Validation, Masks) {
  const Inputs in;
  AttentionOptions o = ref();
  o.mask = Tensor::zeros({3, 6}, DType::f32);  // floating mask of type keep
  expect_both(in, o, {"mask", "keep", "bool", "f32"});
  o.mask_type = MaskType::drop;
  expect_both(in, o, {"mask", "drop", "bool"});
  o.mask = Tensor::zeros({3, 6}, DType::boolean);
  o.mask_type = MaskType::add;
  expect_both(in, o, {"mask", "add", "floating", "bool"});
  o.mask = Tensor::zeros({3, 6}, DType::i64);
  expect_both(in, o, {"mask", "i64"});
  o.mask_type = MaskType::keep;
  for (Shape bad :
       {Shape{3, 5}, Shape{4, 6}, Shape{3, 3, 6}, Shape{5, 1, 1, 1}, Shape{1, 2, 4, 3, 6}}) {
    o.mask = Tensor::zeros(bad, DType::boolean);
    expect_both(in, o, {"mask", shape_to_string(bad), "[2, 4, 3, 6]"});
  }
  // Broadcastable shapes are accepted.
  for (Shape good : {Shape{6}, Shape{3, 1}, Shape{4, 1, 6}, Shape{2, 1, 3, 6}, Shape{1, 1, 1, 1}}) {
    o.mask = Tensor::zeros(good, DType::boolean);
    EXPECT_NO_THROW(attention(in.q, in.k, in.v, o)) << shape_to_string(good);
  }
  // mask_grad without an add mask.
  AttentionOptions g = ref();
  g.mask_grad = true;
  const Tensor dout = Tensor::zeros({2, 4, 3, 7}, DType::f32),
               lse = Tensor::zeros({2, 4, 3}, DType::f32);
  expect_error([&] { attention_backward(dout, in.q, in.k, in.v, dout, lse, g); },
               "attn::attention_backward", {"mask_grad"});
  g.mask = Tensor::zeros({3, 6}, DType::boolean);
  expect_error([&] { attention_backward(dout, in.q, in.k, in.v, dout, lse, g); },
               "attn::attention_backward", {"mask_grad", "add"});
}

TEST(Validation, KeyLengths) {
  const Inputs in;
  AttentionOptions o = ref();
  o.key_lengths = Tensor::from_vector({2}, {3, 4}, DType::f32);
  expect_both(in, o, {"key_lengths", "f32"});
  o.key_lengths = Tensor::from_vector({3}, {3, 4, 5}, DType::i64);
  expect_both(in, o, {"key_lengths", "[3]", "[2]"});
  o.key_lengths = Tensor::from_vector({2, 1}, {3, 4}, DType::i64);
  expect_both(in, o, {"key_lengths", "[2, 1]"});
  o.key_lengths = Tensor::from_vector({2}, {3, -1}, DType::i32);
  expect_both(in, o, {"key_lengths[1]", "-1", "Lk = 6"});
  o.key_lengths = Tensor::from_vector({2}, {7, 0}, DType::i64);
  expect_both(in, o, {"key_lengths[0]", "7", "Lk = 6"});
  o.key_lengths = Tensor::from_vector({2}, {6, 0}, DType::i64);  // the bounds themselves are fine
  EXPECT_NO_THROW(attention(in.q, in.k, in.v, o));
  // Several batch dims: the batch shape itself, or the flat [B].
  Inputs in2;
  in2.q = random_tensor({2, 3, 4, 3, 5}, DType::f32, 1);
  in2.k = random_tensor({2, 3, 2, 6, 5}, DType::f32, 2);
  in2.v = random_tensor({2, 3, 2, 6, 7}, DType::f32, 3);
  o.key_lengths = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6}, DType::i64);
  EXPECT_NO_THROW(attention(in2.q, in2.k, in2.v, o));
  o.key_lengths = Tensor::from_vector({6}, {1, 2, 3, 4, 5, 6}, DType::i64);
  EXPECT_NO_THROW(attention(in2.q, in2.k, in2.v, o));
  o.key_lengths = Tensor::from_vector({3, 2}, {1, 2, 3, 4, 5, 6}, DType::i64);
  expect_error([&] { attention(in2.q, in2.k, in2.v, o); }, "attn::attention",
               {"key_lengths", "[3, 2]", "[2, 3]"});
  // No batch dims: a single length [1] (shape [] would be the batch shape itself).
  const Tensor q3 = in.q.select(0, 0), k3 = in.k.select(0, 0), v3 = in.v.select(0, 0);
  o.key_lengths = Tensor::from_vector({1}, {4}, DType::i32);
  EXPECT_NO_THROW(attention(q3, k3, v3, o));
  o.key_lengths = Tensor::from_vector({2}, {4, 4}, DType::i32);
  expect_error([&] { attention(q3, k3, v3, o); }, "attn::attention", {"key_lengths", "[2]"});
}

TEST(Validation, BlockLayout) {
  const Inputs in;
  AttentionOptions o = ref();
  o.block_layout = {Tensor::zeros({2, 3}, DType::boolean), 0, 2};
  expect_both(in, o, {"block", "block_q 0"});
  o.block_layout = {Tensor::zeros({2, 3}, DType::boolean), 2, -1};
  expect_both(in, o, {"block", "block_k -1"});
  o.block_layout = {Tensor::zeros({2, 3}, DType::f32), 2, 2};
  expect_both(in, o, {"block layout", "bool", "f32"});
  // Lq = 3, Lk = 6 with 2 x 2 blocks: a [2, 3] tile grid.
  o.block_layout = {Tensor::zeros({2, 2}, DType::boolean), 2, 2};
  expect_both(in, o, {"block layout", "[2, 2]", "[2, 4, 2, 3]"});
  o.block_layout = {Tensor::zeros({2, 3}, DType::boolean), 2, 2};
  EXPECT_NO_THROW(attention(in.q, in.k, in.v, o));
  // One block wider than any length: a [1, 1] grid (Lq + block - 1 overflowed: a grid of -1 tiles).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  o.block_layout = {Tensor::full({1, 1}, 1.0, DType::boolean), kMax, kMax};
  const Tensor all = attention(in.q, in.k, in.v, ref()).out;
  EXPECT_TRUE(bitwise_equal(attention(in.q, in.k, in.v, o).out, all));
}

TEST(Validation, BackwardTensors) {
  const Inputs in;
  const AttentionOptions o = ref();
  const Tensor dout = Tensor::zeros({2, 4, 3, 7}, DType::f32),
               lse = Tensor::zeros({2, 4, 3}, DType::f32);
  const std::string fn = "attn::attention_backward";
  expect_error(
      [&] {
        attention_backward(Tensor::zeros({2, 4, 3, 6}, DType::f32), in.q, in.k, in.v, dout, lse, o);
      },
      fn, {"dout", "[2, 4, 3, 6]", "[2, 4, 3, 7]"});
  expect_error(
      [&] {
        attention_backward(dout, in.q, in.k, in.v, Tensor::zeros({4, 3, 7}, DType::f32), lse, o);
      },
      fn, {"out", "[4, 3, 7]"});
  expect_error(
      [&] {
        attention_backward(dout, in.q, in.k, in.v, dout, Tensor::zeros({2, 4, 3, 1}, DType::f32),
                           o);
      },
      fn, {"lse", "[2, 4, 3, 1]", "[2, 4, 3]"});
  expect_error(
      [&] {
        attention_backward(Tensor::zeros({2, 4, 3, 7}, DType::i64), in.q, in.k, in.v, dout, lse, o);
      },
      fn, {"dout", "i64"});
  expect_error([&] { attention_backward(dout, in.q, in.k, in.v, dout, Tensor(), o); }, fn,
               {"lse", "undefined"});
  EXPECT_NO_THROW(attention_backward(dout, in.q, in.k, in.v, dout, lse, o));
}

// Shapes whose element counts overflow int64, built as stride-0 expands of one element (no memory
// is used).
TEST(Validation, OverflowingSizes) {
  // (q, k and v themselves fit in int64: only the output or the weights, which combine their dims,
  // overflow.)
  const Tensor one = Tensor::zeros({1, 1, 1, 1}, DType::f32);
  auto view = [&](const Shape& shape) { return one.expand(shape); };
  const int64_t big = int64_t{1} << 20;
  Inputs in;
  in.q = view({1, big, big, 1});
  in.k = view({1, 1, 1, 1});
  in.v = view({1, 1, 1, int64_t{1} << 40});  // out = 2^20 * 2^20 * 2^40 elements
  expect_error([&] { attention(in.q, in.k, in.v, ref()); }, "attn::attention", {"overflow"});
  // The weights [1, 2^20, 2^20, 2^30] overflow only when they are asked for.
  in.k = view({1, 1, int64_t{1} << 30, 1});
  in.v = view({1, 1, int64_t{1} << 30, 1});
  AttentionOptions o = ref();
  o.return_weights = true;
  expect_error([&] { attention(in.q, in.k, in.v, o); }, "attn::attention", {"overflow"});
}

}  // namespace
}  // namespace attn::test
