// The AMX tile layer (src/backends/cpu/amx_tiles-inl.h) and its product gemm_tiles.
//
// - The emulation against a model of TDPBF16PS written here from the instruction's documented
//   semantics (even and odd products in two FMA chains over a K chunk of 16 pairs, their sum then
//   added to C; rounded to nearest, bf16 denormals read as zero, f32 denormal results flushed), over
//   awkward M, N, K2 (edges of rows, columns and K chunks), both B layouts and accumulation: a
//   wrong stride, a missing zero pad or a chunk in the wrong order fails these bit for bit.
// - The semantics themselves on inputs chosen so that another order or rounding gives another
//   answer (pair sums apart vs one running sum, DAZ, FTZ).
// - The hardware against the emulation bit for bit, where this CPU has usable AMX; the test says on
//   its output which of the two ran.
// - tile_linear (the nn modules' bf16 Linear product, backends/cpu/tile_linear.h) on both targets
//   against the same model, element by element and bit for bit: odd K, K tails, rows and columns
//   past a block, weights split into panels, the bias, the rounding to bf16 (denormals, NaN), and
//   the same bits for any thread count.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attn/error.h"
#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/tile_linear.h"

namespace attn::test {
namespace {

#if defined(__x86_64__)

using TileGemm = void (*)(int64_t, int64_t, int64_t, const uint32_t*, int64_t, const uint32_t*,
                          int64_t, int64_t, float*, int64_t, bool);

float bf16_value(uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;  // denormals are zero
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
float flush(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
uint16_t half(uint32_t pair, int which) {
  return static_cast<uint16_t>(which == 0 ? pair & 0xffffu : pair >> 16);
}

// C[M x N] (+)= A B with one TDPBF16PS per chunk of 16 pairs, element by element. B element (k, n)
// at b[(n / 16) * bcs + k * ldb + n % 16].
void model_gemm(int64_t M, int64_t N, int64_t K2, const uint32_t* a, int64_t lda, const uint32_t* b,
                int64_t ldb, int64_t bcs, float* c, int64_t ldc, bool acc) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float sum = acc ? c[m * ldc + n] : 0.0f;
      for (int64_t k0 = 0; k0 < K2; k0 += 16) {
        float even = 0.0f, odd = 0.0f;
        for (int64_t k = k0; k < std::min(K2, k0 + 16); ++k) {
          const uint32_t x = a[m * lda + k], y = b[(n / 16) * bcs + k * ldb + n % 16];
          even = flush(std::fma(bf16_value(half(x, 0)), bf16_value(half(y, 0)), even));
          odd = flush(std::fma(bf16_value(half(x, 1)), bf16_value(half(y, 1)), odd));
        }
        sum = flush(sum + flush(even + odd));
      }
      c[m * ldc + n] = sum;
    }
  }
}

uint16_t to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
uint32_t pair_of(float lo, float hi) {
  return to_bf16(lo) | static_cast<uint32_t>(to_bf16(hi)) << 16;
}

std::vector<uint32_t> random_pairs(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = pair_of(d(rng), d(rng));
  return v;
}

bool hardware_amx() {
  return cpu::isa_available(cpu::Isa::amx);
}

// Runs gemm on (M, N, K2) in both B layouts, with and without accumulation, against the model.
void check_against_model(TileGemm gemm, int64_t M, int64_t N, int64_t K2, std::mt19937& rng) {
  const int64_t lda = K2 + 3;  // rows of A not packed tightly
  const auto a = random_pairs(static_cast<size_t>(M * lda), rng);
  for (bool panels : {false, true}) {
    // Row-major B [K2 x (N + 16)] or panels [N / 16][K2][16].
    const int64_t ldb = panels ? 16 : N + 16, bcs = panels ? K2 * 16 : 16;
    const auto b = random_pairs(static_cast<size_t>(panels ? N * K2 : K2 * ldb), rng);
    for (bool acc : {false, true}) {
      SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K2 " << K2 << " panels "
                                      << panels << " accumulate " << acc);
      const int64_t ldc = N + 5;
      std::vector<float> c0(static_cast<size_t>(M * ldc));
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (auto& x : c0) x = d(rng);
      std::vector<float> want = c0, got = c0;
      model_gemm(M, N, K2, a.data(), lda, b.data(), ldb, bcs, want.data(), ldc, acc);
      gemm(M, N, K2, a.data(), lda, b.data(), ldb, bcs, got.data(), ldc, acc);
      // Columns beyond N of C are left as they were (compared too).
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
    }
  }
}

TEST(AmxTiles, SaysWhichRan) {
  std::printf("[ AMX      ] hardware tiles: %s; emulation: %s\n",
              hardware_amx() ? "tested on this CPU" : "not on this CPU (emulation only)",
              cpu::isa_available(cpu::Isa::amx_emulated) ? "tested" : "needs AVX2");
  RecordProperty("amx_hardware", hardware_amx() ? "yes" : "no");
  EXPECT_EQ(cpu::isa_available(cpu::Isa::amx_emulated), cpu::isa_available(cpu::Isa::avx2));
}

TEST(AmxTiles, EmulatedProductMatchesTheInstructionModel) {
  if (!cpu::isa_available(cpu::Isa::amx_emulated)) GTEST_SKIP() << "needs AVX2";
  std::mt19937 rng(7);
  for (int64_t M : {1, 15, 16, 17, 32, 33, 70}) {
    for (int64_t N : {16, 32, 48, 80}) {
      for (int64_t K2 : {1, 15, 16, 17, 32, 40}) {
        check_against_model(&cpu::amx_emulated::tile_gemm, M, N, K2, rng);
      }
    }
  }
}

// One TDPBF16PS on 1 x 16 x 1 pair-rows through the emulation: c + (even + odd).
float one_dot(float c, uint32_t a_pair, uint32_t b_pair) {
  std::vector<uint32_t> a(1, a_pair), b(16, b_pair);
  std::vector<float> out(16, c);
  cpu::amx_emulated::tile_gemm(1, 16, 1, a.data(), 1, b.data(), 16, 16, out.data(), 16, true);
  return out[0];
}

TEST(AmxTiles, EmulationFollowsTheDocumentedRounding) {
  if (!cpu::isa_available(cpu::Isa::amx_emulated)) GTEST_SKIP() << "needs AVX2";
  // even = 2^30, odd = -2^30: summed apart first, then added to c = 1, the result is 1; a running
  // sum c + even + odd would lose the 1 (2^30 + 1 rounds to 2^30) and give 0.
  EXPECT_EQ(1.0f, one_dot(1.0f, pair_of(32768.0f, 32768.0f), pair_of(32768.0f, -32768.0f)));
  // A denormal bf16 input reads as zero: 2^-133 * 2^100 would be 2^-33, not 0.
  const uint32_t denormal_lo = 0x0001u;  // bf16 denormal 2^-133
  EXPECT_EQ(0.0f, one_dot(0.0f, denormal_lo, pair_of(0x1p100f, 0.0f)));
  // A denormal f32 result is flushed: 2^-70 * 2^-70 = 2^-140 is denormal in f32.
  const float flushed = one_dot(0.0f, pair_of(0x1p-70f, 0.0f), pair_of(0x1p-70f, 0.0f));
  EXPECT_EQ(0.0f, flushed);
  EXPECT_FALSE(std::signbit(flushed));
  // Products are exact: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 needs 15 bits, kept in f32.
  const float x = 1.0f + 0x1p-7f;
  EXPECT_EQ(x * x, one_dot(0.0f, pair_of(x, 0.0f), pair_of(x, 0.0f)));
  // The chain is of FMAs: -1.5 * 2^127 + 2^64 * 2^64 = 2^126, where a product rounded on its own
  // (2^128 overflows f32) would give inf.
  const std::vector<uint32_t> a = {pair_of(-1.5f * 0x1p64f, 0.0f), pair_of(0x1p64f, 0.0f)};
  std::vector<uint32_t> b(32);
  for (int n = 0; n < 16; ++n) b[n] = pair_of(0x1p63f, 0.0f), b[16 + n] = pair_of(0x1p64f, 0.0f);
  std::vector<float> out(16, 0.0f);
  cpu::amx_emulated::tile_gemm(1, 16, 2, a.data(), 2, b.data(), 16, 16, out.data(), 16, false);
  EXPECT_EQ(0x1p126f, out[0]);
}

TEST(AmxTiles, HardwareMatchesTheEmulationBitForBit) {
  if (!hardware_amx()) GTEST_SKIP() << "no usable AMX on this CPU: " << cpu::describe_cpu();
  std::mt19937 rng(11);
  for (int64_t M : {1, 16, 17, 33, 70}) {
    for (int64_t N : {16, 48, 80}) {
      for (int64_t K2 : {1, 16, 17, 40}) {
        check_against_model(&cpu::amx::tile_gemm, M, N, K2, rng);
      }
    }
  }
  // Values where rounding, flushing and order show: tiny, huge and mixed magnitudes.
  std::vector<uint32_t> a(32 * 32), b(32 * 32);
  std::uniform_int_distribution<int> e(-140, 60);
  std::uniform_int_distribution<int> sgn(0, 1);
  auto value = [&] { return (sgn(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f + 0x1p-5f, e(rng)); };
  for (auto& x : a) x = pair_of(value(), value());
  for (auto& x : b) x = pair_of(value(), value());
  std::vector<float> hw(32 * 32, 0.0f), emu(32 * 32, 0.0f);
  cpu::amx::tile_gemm(32, 32, 32, a.data(), 32, b.data(), 32, 16, hw.data(), 32, false);
  cpu::amx_emulated::tile_gemm(32, 32, 32, a.data(), 32, b.data(), 32, 16, emu.data(), 32, false);
  EXPECT_EQ(0, std::memcmp(hw.data(), emu.data(), hw.size() * sizeof(float)));
}

// ---- tile_linear ----

uint16_t random_bf16(std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  return to_bf16(d(rng));
}

// y = x w^T (+ bias) for x [M, K] and w [N, K] bf16, through model_gemm: x's rows as pairs (the
// last one half zero when K is odd), w as the tiles' column panels, then the bias added in f32.
std::vector<float> model_linear(int64_t M, int64_t N, int64_t K, const std::vector<uint16_t>& x,
                                const std::vector<uint16_t>& w, const float* bias) {
  const int64_t K2 = (K + 1) / 2, N16 = (N + 15) / 16 * 16;
  auto elem = [&](const std::vector<uint16_t>& v, int64_t row, int64_t k) -> uint32_t {
    return k < K ? v[static_cast<size_t>(row * K + k)] : 0u;
  };
  std::vector<uint32_t> a(static_cast<size_t>(std::max<int64_t>(1, M * K2)));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K2; ++k)
      a[m * K2 + k] = elem(x, m, 2 * k) | elem(x, m, 2 * k + 1) << 16;
  }
  std::vector<uint32_t> b(static_cast<size_t>(std::max<int64_t>(1, N16 * K2)), 0u);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K2; ++k) {
      b[(n / 16) * K2 * 16 + k * 16 + n % 16] = elem(w, n, 2 * k) | elem(w, n, 2 * k + 1) << 16;
    }
  }
  std::vector<float> y(static_cast<size_t>(M * N));
  model_gemm(M, N, K2, a.data(), K2, b.data(), 16, K2 * 16, y.data(), N, false);
  for (int64_t i = 0; bias != nullptr && i < M * N; ++i) y[i] += bias[i % N];
  return y;
}

struct LinearOut {
  std::vector<float> y32;
  std::vector<uint16_t> y16;
};
LinearOut run_linear(cpu::Isa isa, int64_t M, int64_t N, int64_t K, const std::vector<uint16_t>& x,
                     const std::vector<uint16_t>& w, const float* bias, int threads = 0) {
  LinearOut o{std::vector<float>(static_cast<size_t>(M * N), -7.0f),
              std::vector<uint16_t>(static_cast<size_t>(M * N), 0xdeadu)};
  for (bool bf16 : {false, true}) {
    cpu::tile_linear({.M = M,
                      .N = N,
                      .K = K,
                      .x = x.data(),
                      .w = w.data(),
                      .bias = bias,
                      .y16 = bf16 ? o.y16.data() : nullptr,
                      .y32 = bf16 ? nullptr : o.y32.data(),
                      .threads = threads},
                     isa);
  }
  return o;
}

void check_linear(cpu::Isa isa, int64_t M, int64_t N, int64_t K, std::mt19937& rng) {
  std::vector<uint16_t> x(static_cast<size_t>(M * K)), w(static_cast<size_t>(N * K));
  for (auto& v : x) v = random_bf16(rng);
  for (auto& v : w) v = random_bf16(rng);
  std::vector<float> bias(static_cast<size_t>(N));
  for (auto& v : bias) v = std::bit_cast<float>(static_cast<uint32_t>(random_bf16(rng)) << 16);
  for (const float* b :
       {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
    SCOPED_TRACE(testing::Message() << cpu::isa_name(isa) << " M " << M << " N " << N << " K " << K
                                    << (b ? " with bias" : ""));
    const std::vector<float> want = model_linear(M, N, K, x, w, b);
    const LinearOut got = run_linear(isa, M, N, K, x, w, b);
    ASSERT_EQ(0, std::memcmp(want.data(), got.y32.data(), want.size() * sizeof(float)));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(to_bf16(want[i]), got.y16[i]) << "at " << i;
  }
}

const std::vector<std::array<int64_t, 3>>& linear_shapes() {
  static const std::vector<std::array<int64_t, 3>> shapes = [] {
    std::vector<std::array<int64_t, 3>> v;
    for (int64_t M : {1, 16, 17, 33, 70}) {
      for (int64_t N : {1, 16, 17, 45, 64}) {
        for (int64_t K : {1, 2, 31, 32, 33, 99}) v.push_back({M, N, K});
      }
    }
    v.push_back({300, 100, 0});  // no K: the bias alone
    return v;
  }();
  return shapes;
}

TEST(TileLinear, EmulatedProductMatchesTheInstructionModel) {
  if (!cpu::isa_available(cpu::Isa::amx_emulated)) GTEST_SKIP() << "needs AVX2";
  std::mt19937 rng(13);
  for (const auto& [M, N, K] : linear_shapes()) check_linear(cpu::Isa::amx_emulated, M, N, K, rng);
}

TEST(TileLinear, HardwareProductMatchesTheInstructionModel) {
  if (!hardware_amx()) GTEST_SKIP() << "no usable AMX on this CPU: " << cpu::describe_cpu();
  std::mt19937 rng(17);
  for (const auto& [M, N, K] : linear_shapes()) check_linear(cpu::Isa::amx, M, N, K, rng);
  // Weights over the L2 budget (here 1.3 MB per column block pair): one column block per panel.
  check_linear(cpu::Isa::amx, 40, 96, 20000, rng);
  check_linear(cpu::Isa::amx, 700, 130, 200, rng);  // several row chunks per thread
}

TEST(TileLinear, SameBitsForAnyThreadCount) {
  std::mt19937 rng(19);
  const int64_t M = 300, N = 70, K = 90;
  std::vector<uint16_t> x(M * K), w(N * K);
  for (auto& v : x) v = random_bf16(rng);
  for (auto& v : w) v = random_bf16(rng);
  for (cpu::Isa isa : {cpu::Isa::amx_emulated, cpu::Isa::amx}) {
    if (!cpu::isa_available(isa)) continue;
    const LinearOut one = run_linear(isa, M, N, K, x, w, nullptr, 1);
    for (int threads : {2, 3}) {
      const LinearOut many = run_linear(isa, M, N, K, x, w, nullptr, threads);
      EXPECT_EQ(one.y16, many.y16) << cpu::isa_name(isa) << " " << threads << " threads";
      EXPECT_EQ(0, std::memcmp(one.y32.data(), many.y32.data(), one.y32.size() * sizeof(float)));
    }
  }
}

// Rounded as attn::f32_to_bf16 rounds: a denormal sum (a zero product plus a denormal bias) keeps
// its bits (VCVTNEPS2BF16 would flush it), a NaN comes out quiet, ties go to even.
TEST(TileLinear, RoundsAsF32ToBf16) {
  const int64_t M = 2, N = 32, K = 4;
  std::vector<uint16_t> x(M * K, 0), w(N * K, to_bf16(1.0f));
  x[K] = 0x7f81u;  // row 1: a signalling NaN
  std::vector<float> bias(N);
  // Denormal f32 biases, some of them ties or above half a bf16 step: n = 0 is bf16 0x0001.
  for (int64_t n = 0; n < N; ++n) {
    bias[n] = std::bit_cast<float>(static_cast<uint32_t>(n + 1) << 16 | static_cast<uint32_t>(n % 3)
                                                                            << 14);
  }
  bias[5] = 1.0f + 0x1p-8f;  // a tie between two bf16 values: to even, 1.0
  for (cpu::Isa isa : {cpu::Isa::amx_emulated, cpu::Isa::amx}) {
    if (!cpu::isa_available(isa)) continue;
    const LinearOut o = run_linear(isa, M, N, K, x, w, bias.data());
    for (int64_t n = 0; n < N; ++n) {
      SCOPED_TRACE(testing::Message() << cpu::isa_name(isa) << " column " << n);
      EXPECT_EQ(attn::f32_to_bf16(bias[n]), o.y16[n]);
      EXPECT_EQ(std::bit_cast<uint32_t>(bias[n]), std::bit_cast<uint32_t>(o.y32[n]));
      EXPECT_EQ(0x7fc0u, o.y16[N + n] & 0x7fc0u);  // quiet NaN
    }
    EXPECT_EQ(uint16_t{0x0001}, o.y16[0]);  // the denormal 2^-133 itself
  }
}

// A row function finishes each row in place of the bias and rounding: it sees the f32 products of
// its columns and writes the bf16 row (here bf16(2 y + n0 + j), from every block and edge).
TEST(TileLinear, RowFunctionFinishesEveryRow) {
  const int64_t M = 45, N = 70, K = 40;
  std::mt19937 rng(23);
  std::vector<uint16_t> x(M * K), w(N * K);
  for (auto& v : x) v = random_bf16(rng);
  for (auto& v : w) v = random_bf16(rng);
  const std::vector<float> want = model_linear(M, N, K, x, w, nullptr);
  auto row_fn = [](const void*, float* row, int64_t n0, uint16_t* out, int64_t cols) {
    for (int64_t j = 0; j < cols; ++j) out[j] = to_bf16(2.0f * row[j] + static_cast<float>(n0 + j));
  };
  for (cpu::Isa isa : {cpu::Isa::amx_emulated, cpu::Isa::amx}) {
    if (!cpu::isa_available(isa)) continue;
    std::vector<uint16_t> y(M * N, 0xdeadu);
    cpu::tile_linear(
        {.M = M, .N = N, .K = K, .x = x.data(), .w = w.data(), .y16 = y.data(), .row_fn = row_fn},
        isa);
    for (int64_t i = 0; i < M * N; ++i) {
      ASSERT_EQ(to_bf16(2.0f * want[i] + static_cast<float>(i % N)), y[i])
          << cpu::isa_name(isa) << " at " << i;
    }
    // A bias beside a row function would not be added: refused.
    const std::vector<float> bias(N, 1.0f);
    EXPECT_THROW(cpu::tile_linear({.M = M,
                                   .N = N,
                                   .K = K,
                                   .x = x.data(),
                                   .w = w.data(),
                                   .bias = bias.data(),
                                   .y16 = y.data(),
                                   .row_fn = row_fn},
                                  isa),
                 Error);
  }
}

#endif  // __x86_64__

}  // namespace
}  // namespace attn::test
