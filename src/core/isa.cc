// The one instruction-set choice (isa.h): detection from CPUID and the OS, ATTN_CPU_ISA parsed once,
// forcing, and the processor's description.
#include "core/isa.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "attn/error.h"

namespace attn::cpu {

namespace {

std::atomic<int> g_forced{-1};  // -1: not forced, else an Isa

// Every target with its name, in the order available_isas() lists them.
struct IsaName {
  Isa isa;
  const char* name;
};
constexpr IsaName kIsaNames[] = {
    {Isa::portable, "portable"},
    {Isa::avx2, "avx2"},
    {Isa::avx512, "avx512"},
    {Isa::avx512bf16, "avx512bf16"},
    {Isa::amx_emulated, "amx-emulated"},
    {Isa::amx, "amx"},
};

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

// "portable, avx2, ...": every target's name, or only those this processor runs, for messages.
std::string joined_names(bool only_available) {
  std::string names;
  for (const IsaName& e : kIsaNames) {
    if (only_available && !cpu_has(e.isa)) continue;
    names += names.empty() ? e.name : fmt::format(", {}", e.name);
  }
  return names;
}

// ATTN_CPU_ISA, read and parsed once: the target it names, or the error every call raises until it
// is fixed (an unknown name, or a target this processor cannot run).
struct EnvChoice {
  std::string text;  // empty: not set
  std::optional<Isa> isa;
  std::string error;
};

const EnvChoice& env_choice() {
  static const EnvChoice choice = [] {
    EnvChoice c;
    const char* env = std::getenv("ATTN_CPU_ISA");
    c.text = env != nullptr ? env : "";
    if (c.text.empty()) return c;
    for (const IsaName& e : kIsaNames) {
      if (c.text == e.name) c.isa = e.isa;
    }
    if (!c.isa) {
      c.error =
          fmt::format("attn::cpu: ATTN_CPU_ISA={} is not an instruction set (expected one of: {})",
                      c.text, joined_names(false));
      return c;
    }
    if (!cpu_has(*c.isa)) {
      c.error = fmt::format(
          "attn::cpu: ATTN_CPU_ISA={} but this processor cannot run it (it can run: {})", c.text,
          joined_names(true));
      c.isa.reset();
    }
    return c;
  }();
  return choice;
}

}  // namespace

const char* isa_name(Isa isa) {
  for (const IsaName& e : kIsaNames) {
    if (e.isa == isa) return e.name;
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  for (const IsaName& e : kIsaNames) {
    if (name == e.name) return e.isa;
  }
  throw Error(
      fmt::format("attn::cpu::parse_isa: unknown instruction set '{}' (expected one of: {})", name,
                  joined_names(false)));
}

bool isa_available(Isa isa) {
  return cpu_has(isa);
}

std::vector<Isa> available_isas() {
  std::vector<Isa> r;
  for (const IsaName& e : kIsaNames) {
    if (cpu_has(e.isa)) r.push_back(e.isa);
  }
  return r;
}

Isa active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Isa>(forced);
  const EnvChoice& env = env_choice();
  if (!env.error.empty()) throw Error(env.error);
  return env.isa ? *env.isa : best_isa();
}

const char* isa_source() {
  if (g_forced.load(std::memory_order_relaxed) >= 0) return "forced";
  return env_choice().text.empty() ? "best available" : "ATTN_CPU_ISA";
}

bool isa_chosen_by_user() {
  return g_forced.load(std::memory_order_relaxed) >= 0 || !env_choice().text.empty();
}

void force_isa(std::optional<Isa> isa) {
  if (isa && !cpu_has(*isa)) {
    throw Error(fmt::format("attn::cpu::force_isa: this processor cannot run the {} target",
                            isa_name(*isa)));
  }
  g_forced.store(isa ? static_cast<int>(*isa) : -1);
}

Isa vector_isa(Isa isa) {
  switch (isa) {
    case Isa::portable:
      return Isa::portable;
    case Isa::avx2:
    case Isa::amx_emulated:
      return Isa::avx2;
    case Isa::avx512:
    case Isa::avx512bf16:
    case Isa::amx:
      return Isa::avx512;
  }
  return Isa::portable;
}

#if defined(__x86_64__)
// CPUID leaf 0's vendor and leaf 1's display family and model (base family 15 adds the extended
// family; the extended model is the high nibble).
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
#else
CpuSignature cpu_signature() {
  return {};
}
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

}  // namespace attn::cpu
