// The ceilings `attn bench` measures: dispatch to the per-ISA FMA probe, the bf16 probe, and a copy
// probe.
#include "backends/cpu/probes.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/kernels.h"
#include "core/parallel.h"

namespace attn::cpu {

namespace bf16_probe {
bool available();
double flops(int64_t iters);
}  // namespace bf16_probe

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn(iters) on every thread at once; best of 3 rounds of total flops / wall time, in GFLOP/s.
template <class Fn>
double throughput(int threads, int64_t iters, Fn&& fn, double* per_core_cpu = nullptr) {
  threads = resolve_threads(threads);
  double best = 0.0, best_cpu = 0.0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> flops(static_cast<size_t>(threads), 0.0);
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    parallel_for(threads, threads,
                 [&](int64_t t, int) { flops[static_cast<size_t>(t)] = fn(iters); });
    const double s = seconds_since(t0), cpu = process_cpu_seconds() - c0;
    double total = 0.0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
    if (cpu > 0) best_cpu = std::max(best_cpu, total / cpu * 1e-9);
  }
  if (per_core_cpu != nullptr) *per_core_cpu = best_cpu;
  return best;
}

}  // namespace

double probe_fma_gflops(int threads, double* per_core_cpu) {
  return throughput(threads, 20'000'000, kernels_of(active_isa()).fma_probe_flops, per_core_cpu);
}

double probe_bf16_dot_gflops(int threads, double* per_core_cpu) {
  if (!bf16_probe::available()) return 0.0;
  return throughput(threads, 20'000'000, bf16_probe::flops, per_core_cpu);
}

double probe_amx_bf16_gflops(int threads, double* per_core_cpu) {
#if defined(__x86_64__)
  if (isa_available(Isa::amx)) {
    return throughput(threads, 2'000'000, amx::tile_probe_flops, per_core_cpu);
  }
#endif
  (void)threads, (void)per_core_cpu;
  return 0.0;
}

double probe_copy_gbps(int threads) {
  threads = resolve_threads(threads);
  const int64_t n =
      int64_t{128} << 20;  // floats per buffer: 512 MB, twice the largest L3 seen (260 MB)
  std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n), 0.0f);
  const int64_t per = (n + threads - 1) / threads;
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(threads, threads, [&](int64_t t, int) {
      const int64_t a = t * per, b = std::min(n, a + per);
      if (a < b) std::memcpy(dst.data() + a, src.data() + a, static_cast<size_t>(b - a) * 4);
    });
    const double s = seconds_since(t0);
    best = std::max(best, 2.0 * static_cast<double>(n) * 4.0 / s * 1e-9);
  }
  return best;
}

double probe_read_gbps(int threads) {
  threads = resolve_threads(threads);
  const int64_t n = int64_t{256} << 20;  // words: 1 GiB, four times the largest L3 seen (260 MB)
  const std::vector<uint32_t> src(static_cast<size_t>(n), 1u);
  std::vector<uint32_t> sums(static_cast<size_t>(threads));
  const auto sum = kernels_of(active_isa()).read_probe_sum;
  const int64_t per = (n + threads - 1) / threads;
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(threads, threads, [&](int64_t t, int) {
      const int64_t a = t * per, len = std::max<int64_t>(0, std::min(n, a + per) - a);
      sums[t] = sum(src.data() + a, len);
    });
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(n) * 4.0 / s * 1e-9);
  }
  uint32_t total = 0;
  for (const uint32_t s : sums) total += s;
  if (total != static_cast<uint32_t>(n)) throw Error("attn::cpu: the read probe summed wrongly");
  return best;
}

}  // namespace attn::cpu
