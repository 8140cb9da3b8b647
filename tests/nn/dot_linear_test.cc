// ew::linear_dot, the f32 Linear product of few rows in dot-product form (nn/elementwise.h): on
// every instruction set this CPU has, against a double loop over awkward sizes (K tails, rows and
// columns that do not fill a block), the same bits for any thread count, for a row computed alone
// or among others and for bf16 weights read in place, and a NaN reaching only the outputs of its own
// row or column.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/dtype.h"
#include "attn/threads.h"
#include "ew_test_util.h"
#include "nn/elementwise.h"
#include "test_util.h"

namespace attn::nn {
namespace {

using testing::for_each_ew_isa;

struct Product {
  int64_t M, N, K;
  std::vector<float> x, w, b, y;
  Product(int64_t m, int64_t n, int64_t k, uint64_t seed)
      : M(m), N(n), K(k), x(m * k), w(n * k), b(n), y(m * n, std::nanf("")) {
    test::Rng rng(seed);
    for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
    for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
    for (float& v : b) v = static_cast<float>(rng.uniform(-1, 1));
  }
  void run(bool bias) {
    ew::linear_dot({.x = x.data(),
                    .w = w.data(),
                    .b = bias ? b.data() : nullptr,
                    .y = y.data(),
                    .M = M,
                    .N = N,
                    .K = K});
  }
};

// Each output within (K + 2) u sum |x w| (+ |b|) of the double dot product: the bound of any
// order of f32 additions.
void check_against_double(Product& p, bool bias, cpu::Isa isa) {
  p.run(bias);
  const double u = std::numeric_limits<float>::epsilon() / 2;
  int bad = 0;
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      double want = bias ? p.b[j] : 0.0, mag = std::abs(want);
      for (int64_t k = 0; k < p.K; ++k) {
        const double t = static_cast<double>(p.x[i * p.K + k]) * p.w[j * p.K + k];
        want += t;
        mag += std::abs(t);
      }
      const double got = p.y[i * p.N + j], tol = (p.K + 2) * u * mag;
      if (!(std::abs(got - want) <= tol) && bad++ < 3) {
        ADD_FAILURE() << cpu::isa_name(isa) << " M " << p.M << " N " << p.N << " K " << p.K
                      << " bias " << bias << ": y[" << i << ", " << j << "] = " << got << ", want "
                      << want << " (tol " << tol << ")";
      }
    }
  }
}

TEST(DotLinear, MatchesDoubleOnEveryIsa) {
  for_each_ew_isa([](cpu::Isa isa) {
    uint64_t seed = 1;
    for (int64_t M : {1, 2, 3, 5, 17})
      for (int64_t N : {1, 3, 4, 5, 33})
        for (int64_t K : {0, 1, 15, 16, 17, 100})
          for (bool bias : {false, true}) {
            Product p(M, N, K, seed++);
            check_against_double(p, bias, isa);
          }
    Product big(64, 1031, 777, seed++);  // threaded: over 1M multiply-adds
    check_against_double(big, true, isa);
  });
}

TEST(DotLinear, SameBitsForAnyThreadCountAndForARowAlone) {
  for_each_ew_isa([](cpu::Isa isa) {
    Product p(63, 1031, 301, 5);
    set_num_threads(1);
    p.run(true);
    const std::vector<float> one = p.y;
    set_num_threads(3);
    p.run(true);
    set_num_threads(0);
    EXPECT_EQ(p.y, one) << cpu::isa_name(isa);
    for (int64_t r : {0, 31, 62}) {
      Product alone(1, p.N, p.K, 0);
      alone.x.assign(p.x.begin() + r * p.K, p.x.begin() + (r + 1) * p.K);
      alone.w = p.w;
      alone.b = p.b;
      alone.run(true);
      EXPECT_TRUE(std::equal(alone.y.begin(), alone.y.end(), one.begin() + r * p.N))
          << cpu::isa_name(isa) << " row " << r;
    }
  });
}

// bf16 weights read in place (w16) give the bits of the f32 kernel on the same weights widened:
// the widening is exact and the chain the same.
TEST(DotLinear, Bf16WeightsGiveTheBitsOfTheirWidenedCopy) {
  for_each_ew_isa([](cpu::Isa isa) {
    for (int64_t K : {1, 17, 300}) {
      Product p(6, 37, K, 21);
      std::vector<uint16_t> w16(p.w.size());
      for (size_t i = 0; i < w16.size(); ++i) {
        w16[i] = f32_to_bf16(p.w[i]);
        p.w[i] = bf16_to_f32(w16[i]);
      }
      p.run(true);
      std::vector<float> y16(p.y.size(), std::nanf(""));
      ew::linear_dot({.x = p.x.data(),
                      .w = nullptr,
                      .b = p.b.data(),
                      .y = y16.data(),
                      .M = p.M,
                      .N = p.N,
                      .K = p.K,
                      .w16 = w16.data()});
      EXPECT_EQ(y16, p.y) << cpu::isa_name(isa) << " K " << K;
    }
  });
}

// Blocks past the last row or column read that row or column again: a NaN in the last row of x
// and in the last row of w must reach the outputs of that row and that column only.
TEST(DotLinear, NanStaysInItsRowAndColumn) {
  for_each_ew_isa([](cpu::Isa isa) {
    Product p(7, 9, 37, 9);
    p.x[(p.M - 1) * p.K + 5] = std::nanf("");
    p.w[(p.N - 1) * p.K + 36] = std::nanf("");
    p.run(true);
    for (int64_t i = 0; i < p.M; ++i)
      for (int64_t j = 0; j < p.N; ++j) {
        const bool nan = i == p.M - 1 || j == p.N - 1;
        EXPECT_EQ(std::isnan(p.y[i * p.N + j]), nan)
            << cpu::isa_name(isa) << " y[" << i << ", " << j << "]";
      }
  });
}

}  // namespace
}  // namespace attn::nn
