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
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/kernels.h"

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

#endif  // __x86_64__

}  // namespace
}  // namespace attn::test
