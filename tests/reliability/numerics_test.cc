// Numerical extremes (docs/semantics.md): scores around 1e4 and 1e6, huge and tiny scales, NaN/inf
// in queries or allowed keys (IEEE propagation to exactly the rows that use them) versus in removed
// keys (no effect at all), f16/bf16 values near the top of their range, every row masked. Each case
// runs on the reference and the automatic (fast) backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "test_util.h"

namespace attn {
namespace {

using test::all_finite;
using test::bitwise_equal;
using test::random_tensor;
using test::rel_error;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

AttentionResult run(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o,
                    Backend b) {
  o.backend = b;
  return attention(q, k, v, o);
}

const Backend kBackends[] = {Backend::reference, Backend::automatic};

// Scores s_ij = big + c_ij with small integer offsets c_ij: q_i = [big, a_i], k_j = [1, b_j] with
// integer a_i, b_j, scale 1. Every product and sum is an integer below 2^24, so f32 represents the
// scores exactly and the fast backend must match the double reference to f32 accuracy even at |s| =
// 1e6, where a softmax without max subtraction overflows (exp(1e4) is inf in double) and one that
// subtracts a rounded max loses every digit.
class LargeScores : public ::testing::TestWithParam<double> {};

TEST_P(LargeScores, MaxSubtractedSoftmaxStaysExact) {
  const double big = GetParam();
  const int64_t Lq = 5, Lk = 9;
  std::vector<double> qv, kv;
  for (int64_t i = 0; i < Lq; ++i) qv.insert(qv.end(), {big, static_cast<double>(i % 3) - 1});
  for (int64_t j = 0; j < Lk; ++j) kv.insert(kv.end(), {1.0, static_cast<double>(j % 5) - 2});
  const Tensor v = random_tensor({1, 1, Lk, 3}, DType::f64, 3);
  AttentionOptions o;
  o.scale = 1.0;
  o.return_weights = true;
  const Tensor q64 = Tensor::from_vector({1, 1, Lq, 2}, qv, DType::f64);
  const Tensor k64 = Tensor::from_vector({1, 1, Lk, 2}, kv, DType::f64);
  const AttentionResult ref = run(q64, k64, v, o, Backend::reference);
  ASSERT_TRUE(all_finite(ref.out) && all_finite(ref.lse) && all_finite(ref.weights));
  // lse_i = big + log(sum_j exp(c_ij)): independent of `big` apart from the shift.
  for (int64_t i = 0; i < Lq; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < Lk; ++j) sum += std::exp((i % 3 - 1.0) * (j % 5 - 2.0));
    EXPECT_NEAR(ref.lse.at({0, 0, i}), big + std::log(sum), 1e-9 * std::abs(big)) << "row " << i;
  }
  for (DType dt : {DType::f32, DType::f64}) {
    const AttentionResult fast = run(q64.to(dt), k64.to(dt), v.to(dt), o, Backend::automatic);
    EXPECT_LE(rel_error(fast.out, ref.out), dt == DType::f64 ? 1e-12 : 1e-6) << dtype_name(dt);
    // Returned weights may be recomputed as exp(s - lse) from the stored lse, which an f32 lse
    // knows to |lse| * 2^-24 only (docs/RELIABILITY.md, "remains"): bound that, not 1e-6.
    const double w_tol = dt == DType::f64 ? 1e-12 : 1e-6 + std::abs(big) * 0x1p-23;
    EXPECT_LE(rel_error(fast.weights, ref.weights), w_tol) << dtype_name(dt);
    EXPECT_LE(rel_error(fast.lse, ref.lse), dt == DType::f64 ? 1e-15 : 1e-7) << dtype_name(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Reliability, LargeScores, ::testing::Values(1e4, -1e4, 1e6, -1e6));

// Huge and tiny scales: scale 1e30 turns small score differences into a one-hot softmax (the output
// is the value row of the largest score), scale 1e-30 into a uniform one (the output is the mean
// value row).
TEST(Numerics, HugeAndTinyScales) {
  const int64_t Lk = 7;
  // Scores q.k: key 4 is the largest by a clear margin.
  const Tensor q = Tensor::from_vector({1, 1, 1, 2}, {1.0, 0.5}, DType::f32);
  const Tensor k = Tensor::from_vector(
      {1, 1, Lk, 2}, {1, 0, 0, 1, -1, 0, 0.5, 0.5, 2, 1, 1, 1, 0, -1}, DType::f32);
  const Tensor v = random_tensor({1, 1, Lk, 4}, DType::f32, 5);
  for (Backend b : kBackends) {
    AttentionOptions o;
    o.scale = 1e30;
    const AttentionResult hot = run(q, k, v, o, b);
    for (int64_t e = 0; e < 4; ++e)
      EXPECT_NEAR(hot.out.at({0, 0, 0, e}), v.at({0, 0, 4, e}), 1e-6) << backend_name(b);
    EXPECT_NEAR(hot.lse.at({0, 0, 0}), 1e30 * 2.5, 1e30 * 2.5 * 1e-6) << backend_name(b);
    o.scale = 1e-30;
    const AttentionResult flat = run(q, k, v, o, b);
    for (int64_t e = 0; e < 4; ++e) {
      double mean = 0;
      for (int64_t j = 0; j < Lk; ++j) mean += v.at({0, 0, j, e}) / Lk;
      EXPECT_NEAR(flat.out.at({0, 0, 0, e}), mean, 1e-6) << backend_name(b);
    }
    EXPECT_NEAR(flat.lse.at({0, 0, 0}), std::log(7.0), 1e-6) << backend_name(b);
  }
}

// Softcap bounds any score: at |s| = 1e6 every capped score is +-c, the softmax is finite, and the
// gradient through the cap (1 - (s_capped / c)^2 = 0) is zero rather than NaN.
TEST(Numerics, SoftcapOfHugeScores) {
  const Tensor q = Tensor::full({1, 2, 3, 4}, 500.0, DType::f32);
  const Tensor k = Tensor::full({1, 2, 5, 4}, 500.0, DType::f32);
  const Tensor v = random_tensor({1, 2, 5, 3}, DType::f32, 7);
  const Tensor dout = random_tensor({1, 2, 3, 3}, DType::f32, 8);
  AttentionOptions o;
  o.scale = 1.0;  // scores 1e6
  o.softcap = 30.0;
  for (Backend b : kBackends) {
    const AttentionResult r = run(q, k, v, o, b);
    EXPECT_TRUE(all_finite(r.out) && all_finite(r.lse)) << backend_name(b);
    EXPECT_NEAR(r.lse.at({0, 0, 0}), 30.0 + std::log(5.0), 1e-5) << backend_name(b);
    AttentionOptions ob = o;
    ob.backend = b;
    const AttentionGrads g = attention_backward(dout, q, k, v, r.out, r.lse, ob);
    EXPECT_TRUE(all_finite(g.dq) && all_finite(g.dk) && all_finite(g.dv)) << backend_name(b);
    // Exactly 0 in exact arithmetic; a fast tanh may leave 1 - (s_capped / c)^2 at a few f32 ulps.
    EXPECT_LE(test::max_abs(g.dq), 1e-2) << backend_name(b);
  }
}

// NaN or inf where the contract lets it reach the arithmetic: a query row (every allowed score of
// that row is NaN/inf), an allowed key (every row that uses it). Those rows are NaN; every other
// row is bitwise unchanged. The same values in keys that a mask, the key lengths or causality
// remove change nothing.
class NonFinite : public ::testing::TestWithParam<DType> {};

TEST_P(NonFinite, PropagatesOnlyThroughAllowedEntries) {
  const DType dt = GetParam();
  const int64_t H = 2, Lq = 6, Lk = 8, D = 5;
  const Tensor q = random_tensor({1, H, Lq, D}, dt, 31);
  const Tensor k = random_tensor({1, H, Lk, D}, dt, 32);
  const Tensor v = random_tensor({1, H, Lk, D}, dt, 33);
  AttentionOptions o;
  o.causal = true;  // bottom-right: row i sees keys j <= i + 2
  o.key_lengths = Tensor::from_vector({1}, {7}, DType::i64);  // key 7 is padding
  o.mask = Tensor::full({Lq, Lk}, 1.0, DType::boolean);
  o.mask.set({0, 0}, 0.0);  // (row 0, key 0) removed by the mask
  for (Backend b : kBackends) {
    const AttentionResult clean = run(q, k, v, o, b);
    ASSERT_TRUE(all_finite(clean.out)) << backend_name(b);

    for (double bad : {kNaN, kInf, -kInf}) {
      const std::string what =
          std::string(backend_name(b)) + " " + dtype_name(dt) + " value " + std::to_string(bad);
      // Removed keys: key 7 (padding) for every row, and keys 6..7 for row 0.. whose causal limit
      // is below.
      Tensor k2 = k.clone(), v2 = v.clone();
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < D; ++e) {
          k2.set({0, h, 7, e}, bad);
          v2.set({0, h, 7, e}, bad);
        }
      EXPECT_TRUE(bitwise_equal(run(q, k2, v2, o, b).out, clean.out))
          << what << ": padding key changed out";

      // Key 0 of head 1 is allowed for rows 1..5 and removed for row 0 (mask): rows 1..5 of head 1
      // become non-finite, row 0 of head 1 and all of head 0 are unchanged.
      // (+-inf in a key may give that key a score of -inf, which IEEE treats like removal: only NaN
      // is certain to propagate.)
      Tensor k3 = k.clone();
      k3.set({0, 1, 0, 2}, kNaN);
      const AttentionResult r3 = run(q, k3, v, o, b);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i)
          for (int64_t e = 0; e < D; ++e) {
            const double x = r3.out.at({0, h, i, e}), x0 = clean.out.at({0, h, i, e});
            if (h == 1 && i >= 1) {
              EXPECT_FALSE(std::isfinite(x)) << what << ": row " << i << " uses the bad key";
            } else {
              EXPECT_EQ(std::memcmp(&x, &x0, sizeof x), 0)
                  << what << ": row (" << h << ", " << i << ") changed";
            }
          }

      // A bad query entry: that row only.
      Tensor q4 = q.clone();
      q4.set({0, 0, 3, 1}, bad);
      const AttentionResult r4 = run(q4, k, v, o, b);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          const double l = r4.lse.at({0, h, i}), l0 = clean.lse.at({0, h, i});
          if (h == 0 && i == 3) {
            EXPECT_TRUE(std::isnan(r4.out.at({0, h, i, 0}))) << what << ": the bad query row";
          } else {
            EXPECT_EQ(std::memcmp(&l, &l0, sizeof l), 0)
                << what << ": lse of row (" << h << ", " << i << ")";
          }
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Reliability, NonFinite,
                         ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::f16),
                         [](const auto& test_info) {
                           return std::string(dtype_name(test_info.param));
                         });

// f16 tops out at 65504: products of f16 inputs (q.k up to 16 * 200 * 200 = 640000, times scale
// 0.25) and the output accumulation overflow f16 but not the fp32 accumulators the contract
// promises.
TEST(Numerics, HalfPrecisionOverflowRange) {
  const int64_t Lk = 40, D = 16;
  std::vector<double> qv(static_cast<size_t>(3 * D)), kv(static_cast<size_t>(Lk * D)),
      vv(static_cast<size_t>(Lk * 2));
  for (size_t e = 0; e < qv.size(); ++e) qv[e] = (e % 3 == 0 ? -1 : 1) * 200.0;
  for (size_t e = 0; e < kv.size(); ++e) kv[e] = ((e / D + e) % 4 == 0 ? -1 : 1) * 196.0;
  for (size_t e = 0; e < vv.size(); ++e) vv[e] = (e % 2 ? 65504.0 : -60000.0);
  AttentionOptions o;
  o.scale = 0.25;
  const AttentionResult ref =
      run(Tensor::from_vector({1, 1, 3, D}, qv, DType::f64),
          Tensor::from_vector({1, 1, Lk, D}, kv, DType::f64),
          Tensor::from_vector({1, 1, Lk, 2}, vv, DType::f64), o, Backend::reference);
  for (DType dt : {DType::f16, DType::bf16}) {
    for (Backend b : kBackends) {
      const AttentionResult r =
          run(Tensor::from_vector({1, 1, 3, D}, qv, dt), Tensor::from_vector({1, 1, Lk, D}, kv, dt),
              Tensor::from_vector({1, 1, Lk, 2}, vv, dt), o, b);
      const std::string what = std::string(backend_name(b)) + " " + dtype_name(dt);
      EXPECT_TRUE(all_finite(r.out) && all_finite(r.lse)) << what;
      EXPECT_LE(rel_error(r.out, ref.out), 4 * test::unit_roundoff(dt)) << what;
      EXPECT_LE(rel_error(r.lse, ref.lse), 1e-6) << what;
    }
  }
}

// bf16 shares f32's range: values near 1e37 must not overflow an fp32 accumulator that adds Lk
// unnormalised terms before dividing (Lk = 16 terms of 1e37 stay below 3.4e38; near the top of the
// range see docs/RELIABILITY.md).
TEST(Numerics, BFloat16LargeValues) {
  const int64_t Lk = 16;
  const Tensor q =
      random_tensor({1, 1, 4, 8}, DType::bf16, 41, -0.01, 0.01);  // nearly uniform weights
  const Tensor k = random_tensor({1, 1, Lk, 8}, DType::bf16, 42);
  const Tensor v = random_tensor({1, 1, Lk, 3}, DType::bf16, 43, 0.9e37, 1e37);
  for (Backend b : kBackends) {
    const AttentionResult r = run(q, k, v, {}, b);
    EXPECT_TRUE(all_finite(r.out)) << backend_name(b);
    for (double x : r.out.to_vector()) EXPECT_NEAR(x, 0.95e37, 0.06e37) << backend_name(b);
  }
}

// Every row masked, in every way the contract removes keys: out = 0, weights = 0, lse = -inf,
// gradients 0, never NaN, for every dtype and both backends.
TEST(Numerics, EveryRowMasked) {
  const int64_t H = 2, Lq = 5, Lk = 6, D = 4;
  std::vector<std::pair<std::string, AttentionOptions>> ways;
  {
    AttentionOptions o;
    o.mask = Tensor::zeros({Lq, Lk}, DType::boolean);
    ways.emplace_back("keep mask all false", o);
  }
  {
    AttentionOptions o;
    o.mask = Tensor::full({1, 1, 1}, 1.0, DType::boolean);
    o.mask_type = MaskType::drop;
    ways.emplace_back("drop mask all true", o);
  }
  {
    AttentionOptions o;
    o.mask = Tensor::full({H, 1, Lk}, -kInf, DType::f32);
    o.mask_type = MaskType::add;
    o.mask_grad = true;
    ways.emplace_back("add mask all -inf", o);
  }
  {
    AttentionOptions o;
    o.key_lengths = Tensor::from_vector({1}, {0}, DType::i32);
    ways.emplace_back("key_lengths 0", o);
  }
  {
    AttentionOptions o;
    o.causal = true;
    o.align = Align::top_left;
    o.position_offset = -Lk;  // p(i) = i - 6 < 0: no key j <= p(i)
    ways.emplace_back("causal before the first key", o);
  }
  {
    AttentionOptions o;
    o.block_layout.layout = Tensor::zeros({1, 1}, DType::boolean);
    o.block_layout.block_q = Lq;
    o.block_layout.block_k = Lk;
    ways.emplace_back("empty block layout", o);
  }
  for (auto& [name, opts] : ways) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      // NaN in the keys and values: they are all removed, so even that must not show.
      Tensor k = random_tensor({1, H, Lk, D}, dt, 52), v = random_tensor({1, H, Lk, D}, dt, 53);
      k.set({0, 0, 1, 1}, kNaN);
      v.set({0, 1, 2, 3}, kInf);
      const Tensor q = random_tensor({1, H, Lq, D}, dt, 51);
      const Tensor dout = random_tensor({1, H, Lq, D}, dt, 54);
      for (Backend b : kBackends) {
        AttentionOptions o = opts;
        o.backend = b;
        o.return_weights = true;
        o.dropout_p = 0.25;
        const std::string what = name + ", " + dtype_name(dt) + ", " + backend_name(b);
        const AttentionResult r = attention(q, k, v, o);
        EXPECT_TRUE(test::all_equal(r.out, 0.0)) << what;
        EXPECT_TRUE(test::all_equal(r.weights, 0.0)) << what;
        EXPECT_TRUE(test::all_equal(r.lse, -kInf)) << what;
        const AttentionGrads g = attention_backward(dout, q, k, v, r.out, r.lse, o);
        EXPECT_TRUE(test::all_equal(g.dq, 0.0) && test::all_equal(g.dk, 0.0) &&
                    test::all_equal(g.dv, 0.0))
            << what;
        if (o.mask_grad) {
          EXPECT_TRUE(test::all_equal(g.dmask, 0.0)) << what;
        }
      }
    }
  }
}

// A finite -1e30 in an add mask is a bias, not a removal: with every key at -1e30 the row is a
// uniform average of the (finite) scores shifted by -1e30, not a masked row.
TEST(Numerics, HugeFiniteAddMaskIsNotMasking) {
  const Tensor q = random_tensor({1, 1, 2, 4}, DType::f32, 61);
  const Tensor k = random_tensor({1, 1, 3, 4}, DType::f32, 62);
  const Tensor v = random_tensor({1, 1, 3, 2}, DType::f32, 63);
  AttentionOptions o;
  o.mask = Tensor::full({2, 3}, -1e30, DType::f32);
  o.mask_type = MaskType::add;
  for (Backend b : kBackends) {
    const AttentionResult r = run(q, k, v, o, b);
    EXPECT_TRUE(all_finite(r.out) && all_finite(r.lse)) << backend_name(b);
    EXPECT_NEAR(r.lse.at({0, 0, 0}), -1e30, 1e24) << backend_name(b);
    EXPECT_NEAR(r.out.at({0, 0, 0, 0}),
                (v.at({0, 0, 0, 0}) + v.at({0, 0, 1, 0}) + v.at({0, 0, 2, 0})) / 3, 1e-6)
        << backend_name(b);
  }
}

}  // namespace
}  // namespace attn
