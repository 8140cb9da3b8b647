// The fp32 FMA probe and the read probe's loop, compiled per ISA like the kernels (included inside
// namespace attn::cpu::<isa>). The FMA probe: 12 independent accumulator chains per thread, enough
// to cover the FMA latency on every target. Without -ffast-math the compiler may not reassociate the
// chains, so they run as written.

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

// The wrapping sum of w[0, n) in four chains of the target's vectors (the baseline's 16-byte
// vectors read at about half the bandwidth an AVX-512 loop reaches on a Xeon), read as eight
// interleaved streams: eight equal segments, one vector of each in turn. One stream per thread held
// a Zen 4 (2 threads) at 29.5 GB/s where eight streams read 34.7, and the bf16 decode, reading K and
// V, reached 116% of that probe: it understated the ceiling decode is judged against.
uint32_t read_probe_sum(const uint32_t* w, int64_t n) {
  constexpr int kStreams = 8;
  const int64_t seg = n / (kStreams * W) * W;  // words per stream
  vu acc[4] = {};
  for (int64_t i = 0; i < seg; i += W) {
#pragma GCC unroll 8
    for (int s = 0; s < kStreams; ++s) acc[s % 4] += load_words(w + s * seg + i);
  }
  uint32_t s = 0;
  for (int64_t i = kStreams * seg; i < n; ++i) s += w[i];
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < W; ++l) s += acc[c][l];
  return s;
}
