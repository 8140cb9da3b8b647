// The cpu backend's entry: picks the instruction set once per call and runs that target's kernels.
#include "backends/cpu/attention_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backends/cpu/kernels.h"

namespace attn::cpu {

namespace bf16_probe {
double flops(int64_t iters);  // probe_bf16.cc
}  // namespace bf16_probe

namespace {

std::atomic<int64_t> g_tiles[4] = {0, 0, 0, 0};

#if defined(__x86_64__)
// Best of 3 single-thread runs of a throughput probe, in flops per second.
double probe_rate(double (*probe)(int64_t), int64_t iters) {
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    const double flops = probe(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, flops / s);
  }
  return best;
}

// Whether bf16 products on VDPBF16PS beat converting bf16 to f32 for the FMAs. One VDPBF16PS does
// the multiply-adds of two f32 FMAs; the probes measure both in flops per second. Zen 4 issues it at
// the FMA's rate (ratio 2: the pairs kernels ran 2.1-2.7x PyTorch there); Intel Emerald Rapids at a
// quarter of it, two FMA ports against one VDPBF16PS every other cycle (ratio 0.5: the pairs kernels
// ran 50-68 GFLOP/s per core against 112-122 for the f32 kernels on the same bf16 inputs). The
// pairs kernels also round P to bf16, so they need a clear lead in the products: ratio > 1.5.
// Measured once per process, ~2 ms on one thread, at the first bf16 problem.
bool bf16_dot_pays() {
  static const bool pays = [] {
    const double dot = probe_rate(bf16_probe::flops, 100'000);
    const double fma = probe_rate(kernels_of(Isa::avx512bf16).fma_probe_flops, 100'000);
    return dot > 1.5 * fma;
  }();
  return pays;
}
#endif

}  // namespace

// Every target with its entry points. Targets this build does not compile (not x86-64) get the
// portable kernels (isa_available never picks them).
struct IsaEntry {
  Isa isa;
  IsaKernels kernels;
};
#define ATTN_CPU_PORTABLE_KERNELS                                                                  \
  {                                                                                                \
    &portable::forward, &portable::backward, &portable::decode_shaped, &portable::fma_probe_flops, \
        &portable::read_probe_sum, &portable::exp_rows, &portable::exp2_rows_for_bf16,             \
        &portable::store_bf16_row                                                                  \
  }
#if defined(__x86_64__)
#define ATTN_CPU_KERNELS(ns)                                                                    \
  {                                                                                             \
    &ns::forward, &ns::backward, &ns::decode_shaped, &ns::fma_probe_flops, &ns::read_probe_sum, \
        &ns::exp_rows, &ns::exp2_rows_for_bf16, &ns::store_bf16_row                             \
  }
#else
#define ATTN_CPU_KERNELS(ns) ATTN_CPU_PORTABLE_KERNELS
#endif
constexpr IsaEntry kIsas[] = {
    {Isa::portable, ATTN_CPU_PORTABLE_KERNELS},
    {Isa::avx2, ATTN_CPU_KERNELS(avx2)},
    {Isa::avx512, ATTN_CPU_KERNELS(avx512)},
    {Isa::avx512bf16, ATTN_CPU_KERNELS(avx512bf16)},
    {Isa::amx_emulated, ATTN_CPU_KERNELS(amx_emulated)},
    {Isa::amx, ATTN_CPU_KERNELS(amx)},
};
#undef ATTN_CPU_KERNELS
#undef ATTN_CPU_PORTABLE_KERNELS

const IsaKernels& kernels_of(Isa isa) {
  for (const IsaEntry& e : kIsas) {
    if (e.isa == isa) return e.kernels;
  }
  return kIsas[0].kernels;
}

bool bf16_instructions_pay() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  return isa == Isa::amx || (isa == Isa::avx512bf16 && bf16_dot_pays());
#else
  return false;
#endif
}

Isa isa_for(DType dtype) {
  const Isa isa = active_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512bf16 && dtype == DType::bf16 && !isa_chosen_by_user() && !bf16_dot_pays()) {
    return Isa::avx512;
  }
#else
  (void)dtype;
#endif
  return isa;
}

Isa isa_for(const contract::ForwardProblem& p) {
  const Isa isa = isa_for(p.q.dtype());
  // Decode is bound by reading K and V, not by the products: bf16 stays on VDPBF16PS pairs there
  // (the bf16 values as they are, no widening pass), whatever the products' rate.
  if (isa == Isa::avx512 && active_isa() == Isa::avx512bf16 &&
      kernels_of(Isa::avx512bf16).decode_shaped(p)) {
    return Isa::avx512bf16;
  }
  return isa;
}

bool reads_pages(const contract::ForwardProblem& p) {
  return p.pages.table != nullptr && kernels_of(isa_for(p)).decode_shaped(p);
}

namespace {
std::atomic<int> g_prefetch_override{-1};  // -1: none, else a PrefetchLevel

// AMD family 25 and later (Zen 3, Zen 4; Zen 5 is family 26): L2, measured on a Zen 4 (see
// prefetch_ahead.h). Elsewhere L1, as measured on family 23 and never compared on an Intel Xeon.
PrefetchLevel prefetch_level_of_this_cpu() {
#if defined(__x86_64__)
  const CpuSignature sig = cpu_signature();
  if (sig.amd && sig.family >= 25) return PrefetchLevel::l2;
#endif
  return PrefetchLevel::l1;
}
}  // namespace

PrefetchLevel decode_prefetch_level() {
  static const PrefetchLevel chosen = prefetch_level_of_this_cpu();
  const int forced = g_prefetch_override.load(std::memory_order_relaxed);
  return forced < 0 ? chosen : static_cast<PrefetchLevel>(forced);
}

void set_decode_prefetch_override(const std::string& level) {
  if (level.empty()) {
    g_prefetch_override = -1;
  } else if (level == "l1" || level == "l2" || level == "none") {
    g_prefetch_override = static_cast<int>(level == "l1"   ? PrefetchLevel::l1
                                           : level == "l2" ? PrefetchLevel::l2
                                                           : PrefetchLevel::none);
  } else {
    throw Error(fmt::format(
        "attn::cpu: decode prefetch level must be l1, l2 or none (or empty: this CPU's), got '{}'",
        level));
  }
}

std::string decode_prefetch_name() {
  switch (decode_prefetch_level()) {
    case PrefetchLevel::l1:
      return "l1";
    case PrefetchLevel::l2:
      return "l2";
    case PrefetchLevel::none:
      return "none";
  }
  return "l2";
}

namespace {
std::atomic<int> g_amx_pipeline{0};  // 1: on
}  // namespace

bool amx_pipeline() {
  return g_amx_pipeline.load(std::memory_order_relaxed) != 0;
}

void set_amx_pipeline_override(const std::string& setting) {
  if (setting.empty() || setting == "off" || setting == "on") {
    g_amx_pipeline = setting == "on" ? 1 : 0;
  } else {
    throw Error(fmt::format(
        "attn::cpu: the AMX pipeline setting must be on or off (or empty: the default), got '{}'",
        setting));
  }
}

std::string amx_pipeline_name() {
  return amx_pipeline() ? "on" : "off";
}

void set_tile_override(int64_t fwd_bq, int64_t fwd_bk, int64_t bwd_bq, int64_t bwd_bk) {
  g_tiles[0] = fwd_bq, g_tiles[1] = fwd_bk, g_tiles[2] = bwd_bq, g_tiles[3] = bwd_bk;
}

// Tiles (query rows x keys) by head dim: the working set of a forward tile (K^T, V and S) must sit
// in L2 beside each other, and the backward's key tile is the row count of dK and dV (a multiple of
// the 6-row micro-tile). The sweeps that chose these shapes are in docs/PERFORMANCE.md
// ("Tile shapes").
TileSizes tile_sizes(int64_t D, int64_t Dv, bool backward, bool bf16_pairs, bool amx_tiles) {
  const int64_t dmax = std::max(D, Dv);
  TileSizes t;
  if (!backward) {
    t.bq = dmax <= 128 ? 96 : 48;
    t.bk = dmax <= 128 ? 256 : 128;
    // bf16 on AMX tiles: key tiles of 512 halve each row's fixed costs per key (the max and sum
    // reductions, alpha, the merge into O) beside a softmax that is half of the time; 128 rows
    // share each packed key tile. Measured on an AMX Xeon (docs/PERFORMANCE.md, "Tile shapes"):
    // 4-13% faster than 96 x 256 at D 64 and 128, L 512-2048; 192 or 256 rows and 768 or 1024
    // keys were no better.
    if (bf16_pairs && amx_tiles && dmax <= 128) t.bq = 128, t.bk = 512;
    if (g_tiles[0] > 0) t.bq = g_tiles[0];
    if (g_tiles[1] > 0) t.bk = g_tiles[1];
  } else {
    t.bq = dmax <= 64 ? 96 : dmax <= 128 ? 48 : 24;
    t.bk = dmax <= 128 ? 96 : 48;
    if (bf16_pairs && dmax > 64 && dmax <= 128) t.bq = 96, t.bk = 192;
    if (g_tiles[2] > 0) t.bq = g_tiles[2];
    if (g_tiles[3] > 0) t.bk = g_tiles[3];
  }
  return t;
}

bool supports(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

void forward(const contract::ForwardProblem& p) {
  kernels_of(isa_for(p)).forward(p);
}

void backward(const contract::BackwardProblem& p) {
  kernels_of(isa_for(p.q.dtype())).backward(p);
}

}  // namespace attn::cpu
