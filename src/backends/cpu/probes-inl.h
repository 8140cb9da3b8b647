// The fp32 FMA probe, compiled per ISA like the kernels (included inside namespace
// attn::cpu::<isa>): 12 independent accumulator chains per thread, enough to cover the FMA latency
// on every target. Without -ffast-math the compiler may not reassociate the chains, so they run as
// written.

double fma_probe_flops(int64_t iters) {
  constexpr int kChains = 12;
  vf acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + 0.001f * static_cast<float>(c));
  vf a = splat(0.9999999f);
  const vf b = splat(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#if defined(ATTN_CPU_SOFT_BF16)
    __asm__ volatile("" : : "r"(&a) : "memory");  // 16 lanes in two AVX2 registers: through memory
#else
    __asm__ volatile("" : "+v"(a));  // opaque each iteration: nothing can be precomputed
#endif
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  }
  vf sum = vf{};
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  volatile float sink = hsum(sum);
  (void)sink;
  return 2.0 * W * kChains * static_cast<double>(iters);
}
