// cpu::dot_linear_bf16, the nn modules' bf16 Linear product of few rows on VDPBF16PS
// (backends/cpu/dot_linear_bf16.h): on the hardware instruction where the CPU has it and on the
// amx-emulated target's software VDPBF16PS everywhere (the test output says which ran), against a
// double loop over K tails and partial blocks, the same bits on both, for any thread count and for
// a row computed alone.
#include "backends/cpu/dot_linear_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "attn/dtype.h"
#include "attn/threads.h"
#include "test_util.h"

namespace attn::cpu {
namespace {

std::vector<Isa> dot_isas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::avx512bf16, Isa::amx_emulated})
    if (isa_available(isa)) v.push_back(isa);
  return v;
}

struct Product {
  int64_t M, N, K;
  std::vector<uint16_t> x, w;
  std::vector<float> y;
  Product(int64_t m, int64_t n, int64_t k, uint64_t seed)
      : M(m), N(n), K(k), x(m * k), w(n * k), y(m * n, std::nanf("")) {
    test::Rng rng(seed);
    for (uint16_t& v : x) v = f32_to_bf16(static_cast<float>(rng.uniform(-1, 1)));
    for (uint16_t& v : w) v = f32_to_bf16(static_cast<float>(rng.uniform(-1, 1)));
  }
  void run(Isa isa) {
    dot_linear_bf16({.x = x.data(), .w = w.data(), .y = y.data(), .M = M, .N = N, .K = K}, isa);
  }
};

TEST(DotLinearBf16, MatchesDoubleOnEachTarget) {
  const std::vector<Isa> isas = dot_isas();
  if (isas.empty()) GTEST_SKIP() << "no AVX2 (the emulated target's floor) on this CPU";
  for (Isa isa : isas) {
    std::printf("[ dot_linear_bf16 ] target %s\n", isa_name(isa));
    uint64_t seed = 1;
    for (int64_t M : {1, 3, 4, 6, 17})
      for (int64_t N : {1, 5, 16, 37})
        for (int64_t K : {0, 1, 31, 32, 33, 100}) {
          Product p(M, N, K, seed++);
          p.run(isa);
          const double u = std::numeric_limits<float>::epsilon() / 2;
          int bad = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double want = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double t =
                    static_cast<double>(bf16_to_f32(p.x[i * K + k])) * bf16_to_f32(p.w[j * K + k]);
                want += t;
                mag += std::abs(t);
              }
              const double got = p.y[i * N + j], tol = (K + 2) * u * mag;
              if (!(std::abs(got - want) <= tol) && bad++ < 3) {
                ADD_FAILURE() << isa_name(isa) << " M " << M << " N " << N << " K " << K << ": y["
                              << i << ", " << j << "] = " << got << ", want " << want;
              }
            }
        }
  }
}

// The hardware instruction and the emulation give the same bits; so do 1 and 3 threads, and a row
// computed alone.
TEST(DotLinearBf16, SameBitsOnEachTargetThreadCountAndRowAlone) {
  const std::vector<Isa> isas = dot_isas();
  if (isas.empty()) GTEST_SKIP() << "no AVX2 (the emulated target's floor) on this CPU";
  std::vector<float> first;
  for (Isa isa : isas) {
    Product p(15, 1031, 301, 7);
    set_num_threads(1);
    p.run(isa);
    const std::vector<float> one = p.y;
    set_num_threads(3);
    p.run(isa);
    set_num_threads(0);
    EXPECT_EQ(p.y, one) << isa_name(isa);
    if (first.empty()) first = one;
    EXPECT_EQ(one, first) << isa_name(isa) << " against " << isa_name(isas[0]);
    for (int64_t r : {0, 13, 14}) {
      Product alone(1, p.N, p.K, 0);
      alone.x.assign(p.x.begin() + r * p.K, p.x.begin() + (r + 1) * p.K);
      alone.w = p.w;
      alone.run(isa);
      EXPECT_TRUE(std::equal(alone.y.begin(), alone.y.end(), one.begin() + r * p.N))
          << isa_name(isa) << " row " << r;
    }
  }
}

}  // namespace
}  // namespace attn::cpu
