// The bf16 dot probe: VDPBF16PS (AVX512_BF16) throughput. Its own translation unit because only it
// is built with -mavx512bf16; it runs only after the processor has been asked.
#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace attn::cpu::bf16_probe {

bool available() {
#if defined(__AVX512BF16__)
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// 12 independent chains of dot-products; each VDPBF16PS does 32 multiplies and 32 adds.
double flops(int64_t iters) {
#if defined(__AVX512BF16__)
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);        // 1.0 in both halves
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33803380);  // ~6e-8
  for (int64_t it = 0; it < iters; ++it) {
    // Opaque each iteration so nothing can be hoisted. (An asm barrier on every accumulator, as
    // an earlier version had, made GCC keep acc[] in memory: a store per chain per iteration
    // halved the measured rate.)
    __asm__ volatile("" : "+v"(a));
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  volatile float sink = lanes[0] + lanes[15];
  (void)sink;
  return 64.0 * kChains * static_cast<double>(iters);
#else
  (void)iters;
  return 0.0;
#endif
}

}  // namespace attn::cpu::bf16_probe
