// The cpu backend's entry: picks the instruction set once per call and runs that target's kernels.
#include "backends/cpu/attention_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <cstdlib>
#include <cstring>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "backends/cpu/kernels.h"

namespace attn::cpu {

namespace bf16_probe {
double flops(int64_t iters);  // probe_bf16.cc
}  // namespace bf16_probe

namespace {

std::atomic<int> g_forced{-1};  // -1: not forced, else an Isa
std::atomic<int64_t> g_tiles[4] = {0, 0, 0, 0};

#if defined(__x86_64__)
// CPUID leaf 1, ECX bit 29. (clang 14's __builtin_cpu_supports does not know "f16c".)
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// AMX: CPUID leaf 7 EDX bit 22 (AMX-BF16) and bit 24 (AMX-TILE); the OS must enable the tile state
// in XCR0 (bits 17 TILECFG and 18 TILEDATA) and, on Linux, grant this process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile load faults).
enum class AmxState { absent, not_enabled, not_permitted, usable };

AmxState detect_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return AmxState::absent;
  __cpuid_count(7, 0, a, b, c, d);
  if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return AmxState::absent;
  __get_cpuid(1, &a, &b, &c, &d);
  if ((c & bit_OSXSAVE) == 0) return AmxState::not_enabled;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return AmxState::not_enabled;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return AmxState::not_permitted;
  }
#endif
  return AmxState::usable;
}

// Asked once per process (the permission, once granted, holds for every thread).
AmxState amx_state() {
  static const AmxState state = detect_amx();
  return state;
}
#endif

bool cpu_has(Isa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case Isa::portable:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
             __builtin_cpu_supports("bmi2");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             cpu_has(Isa::avx2);
    case Isa::avx512bf16:
      return __builtin_cpu_supports("avx512bf16") && cpu_has(Isa::avx512);
    case Isa::amx_emulated:  // AVX2 code (isa_amx_emulated.cc)
      return cpu_has(Isa::avx2);
    case Isa::amx:
      return amx_state() == AmxState::usable && cpu_has(Isa::avx512bf16);
  }
  return false;
#else
  return isa == Isa::portable;
#endif
}

// amx_emulated is never chosen: it is for tests and benchmarks that force it.
Isa detect_best_isa() {
  if (cpu_has(Isa::amx)) return Isa::amx;
  if (cpu_has(Isa::avx512bf16)) return Isa::avx512bf16;
  if (cpu_has(Isa::avx512)) return Isa::avx512;
  if (cpu_has(Isa::avx2)) return Isa::avx2;
  return Isa::portable;
}

// Detected once: CPUID traps to the hypervisor in a VM, a cost every small call would pay.
Isa best_isa() {
  static const Isa best = detect_best_isa();
  return best;
}

// ATTN_CPU_ISA, read once (parse errors are raised on every call until it is fixed).
const char* isa_from_env() {
  static const char* env = std::getenv("ATTN_CPU_ISA");
  return env;
}

bool isa_chosen_by_user() {
  const char* env = isa_from_env();
  return g_forced.load() >= 0 || (env != nullptr && *env != '\0');
}

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

// Every target with its name and entry points, in the order available_isas() lists them. Targets
// this build does not compile (not x86-64) keep their names, so that parse_isa knows them, and the
// portable kernels (cpu_has never picks them).
struct IsaEntry {
  Isa isa;
  const char* name;
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
    {Isa::portable, "portable", ATTN_CPU_PORTABLE_KERNELS},
    {Isa::avx2, "avx2", ATTN_CPU_KERNELS(avx2)},
    {Isa::avx512, "avx512", ATTN_CPU_KERNELS(avx512)},
    {Isa::avx512bf16, "avx512bf16", ATTN_CPU_KERNELS(avx512bf16)},
    {Isa::amx_emulated, "amx-emulated", ATTN_CPU_KERNELS(amx_emulated)},
    {Isa::amx, "amx", ATTN_CPU_KERNELS(amx)},
};
#undef ATTN_CPU_KERNELS
#undef ATTN_CPU_PORTABLE_KERNELS

const IsaKernels& kernels_of(Isa isa) {
  for (const IsaEntry& e : kIsas) {
    if (e.isa == isa) return e.kernels;
  }
  return kIsas[0].kernels;
}

const char* isa_name(Isa isa) {
  for (const IsaEntry& e : kIsas) {
    if (e.isa == isa) return e.name;
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  std::string names;
  for (const IsaEntry& e : kIsas) {
    if (name == e.name) return e.isa;
    names += names.empty() ? e.name : fmt::format(", {}", e.name);
  }
  throw Error(fmt::format(
      "attn::cpu::parse_isa: unknown instruction set '{}' (expected one of: {})", name, names));
}

#if defined(__x86_64__)
namespace {
// CPUID leaf 0's vendor and leaf 1's display family and model (base family 15 adds the extended
// family; the extended model is the high nibble).
struct CpuSignature {
  bool amd = false;
  unsigned family = 0, model = 0;
};
CpuSignature cpu_signature() {
  unsigned r[4] = {0, 0, 0, 0};
  __get_cpuid(0, &r[0], &r[1], &r[2], &r[3]);
  CpuSignature sig;
  sig.amd = r[1] == 0x68747541u && r[3] == 0x69746e65u && r[2] == 0x444d4163u;  // AuthenticAMD
  __get_cpuid(1, &r[0], &r[1], &r[2], &r[3]);
  const unsigned base = (r[0] >> 8) & 0xf;
  sig.family = base + (base == 0xf ? (r[0] >> 20) & 0xff : 0);
  sig.model = ((r[0] >> 4) & 0xf) | (((r[0] >> 16) & 0xf) << 4);
  return sig;
}
}  // namespace
#endif

std::string describe_cpu() {
#if defined(__x86_64__)
  unsigned r[4] = {0, 0, 0, 0};
  char vendor[13] = {};
  __get_cpuid(0, &r[0], &r[1], &r[2], &r[3]);
  std::memcpy(vendor, &r[1], 4), std::memcpy(vendor + 4, &r[3], 4),
      std::memcpy(vendor + 8, &r[2], 4);
  char brand[49] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  for (unsigned leaf = 0; leaf < 3 && max_ext >= 0x80000004u; ++leaf) {
    __get_cpuid(0x80000002u + leaf, &r[0], &r[1], &r[2], &r[3]);
    std::memcpy(brand + 16 * leaf, r, 16);
  }
  const CpuSignature sig = cpu_signature();
  const unsigned family = sig.family, model = sig.model;
  const char* amx = "no";
  switch (amx_state()) {
    case AmxState::absent:
      amx = "no";
      break;
    case AmxState::not_enabled:
      amx = "in CPUID, tile state not enabled by the OS";
      break;
    case AmxState::not_permitted:
      amx = "in CPUID, tile data not permitted (arch_prctl)";
      break;
    case AmxState::usable:
      amx = "yes";
      break;
  }
  std::string b(brand);
  b.erase(0, b.find_first_not_of(' '));
  b.erase(b.find_last_not_of(' ') + 1);
  auto yes = [](bool v) { return v ? "yes" : "no"; };
  return fmt::format(
      "{} {} (family {} model {}): avx2+fma {}, avx512 {}, avx512bf16 {}, amx-bf16 {}", vendor, b,
      family, model, yes(cpu_has(Isa::avx2)), yes(cpu_has(Isa::avx512)),
      yes(cpu_has(Isa::avx512bf16)), amx);
#else
  return "not x86-64: portable kernels only";
#endif
}

bool isa_available(Isa isa) {
  return cpu_has(isa);
}

std::vector<Isa> available_isas() {
  std::vector<Isa> r;
  for (const IsaEntry& e : kIsas) {
    if (cpu_has(e.isa)) r.push_back(e.isa);
  }
  return r;
}

Isa active_isa() {
  const int forced = g_forced.load();
  if (forced >= 0) return static_cast<Isa>(forced);
  if (const char* env = isa_from_env(); env != nullptr && *env != '\0') {
    const Isa isa = parse_isa(env);
    if (!cpu_has(isa)) {
      throw Error(fmt::format("attn::cpu: ATTN_CPU_ISA={} but this processor cannot run it", env));
    }
    return isa;
  }
  return best_isa();
}

bool bf16_instructions_pay() {
#if defined(__x86_64__)
  return cpu_has(Isa::amx) || (cpu_has(Isa::avx512bf16) && bf16_dot_pays());
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

void force_isa(std::optional<Isa> isa) {
  if (isa && !cpu_has(*isa)) {
    throw Error(fmt::format("attn::cpu::force_isa: this processor cannot run the {} target",
                            isa_name(*isa)));
  }
  g_forced.store(isa ? static_cast<int>(*isa) : -1);
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
// ("Optimisation log", items 5 and 14).
TileSizes tile_sizes(int64_t D, int64_t Dv, bool backward, bool bf16_pairs, bool amx_tiles) {
  const int64_t dmax = std::max(D, Dv);
  TileSizes t;
  if (!backward) {
    t.bq = dmax <= 128 ? 96 : 48;
    t.bk = dmax <= 128 ? 256 : 128;
    // bf16 on AMX tiles: key tiles of 512 halve each row's fixed costs per key (the max and sum
    // reductions, alpha, the merge into O) beside a softmax that is half of the time; 128 rows
    // share each packed key tile. Measured on an AMX Xeon (docs/PERFORMANCE.md, 2026-12-06):
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
