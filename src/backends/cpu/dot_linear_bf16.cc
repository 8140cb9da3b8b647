// dot_linear_bf16 (dot_linear_bf16.h): column chunks in parallel on the chosen target
// (dot_linear_bf16-inl.h).
#include "backends/cpu/dot_linear_bf16.h"

#include <fmt/format.h>

#include <algorithm>

#include "attn/error.h"
#include "backends/cpu/kernels.h"
#include "core/dot_form.h"

namespace attn::cpu {

namespace {

using Cols = void (*)(const DotLinearBf16&, int64_t, int64_t);
Cols cols_of(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::avx512bf16) return avx512bf16::dot_linear_bf16_cols;
  if (isa == Isa::amx) return amx::dot_linear_bf16_cols;
  if (isa == Isa::amx_emulated) return amx_emulated::dot_linear_bf16_cols;
#endif
  throw Error(
      fmt::format("attn::cpu::dot_linear_bf16: the '{}' target has no VDPBF16PS", isa_name(isa)));
}

}  // namespace

std::optional<Isa> dot_linear_bf16_isa() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  if (isa == Isa::avx512bf16 || isa == Isa::amx || isa == Isa::amx_emulated) return isa;
#endif
  return std::nullopt;
}

void dot_linear_bf16(const DotLinearBf16& p, Isa isa) {
  if (p.M < 0 || p.N < 0 || p.K < 0 || (p.M > 0 && p.N > 0 && p.y == nullptr) ||
      (p.K > 0 && (p.x == nullptr || p.w == nullptr))) {
    throw Error(
        fmt::format("attn::cpu::dot_linear_bf16: bad problem M {} N {} K {}", p.M, p.N, p.K));
  }
  if (p.M == 0 || p.N == 0) return;
  const Cols cols = cols_of(isa);
  parallel_dot_columns(p.M, p.N, p.K, [&](int64_t n0, int64_t n1) { cols(p, n0, n1); });
}

}  // namespace attn::cpu
