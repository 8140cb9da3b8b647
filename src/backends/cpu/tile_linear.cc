// tile_linear (tile_linear.h): the weights packed for the tiles, then the row blocks in parallel on
// the chosen amx target (tile_linear-inl.h).
#include "backends/cpu/tile_linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attn/error.h"
#include "backends/cpu/kernels.h"
#include "core/parallel.h"

namespace attn::cpu {

namespace {

constexpr int64_t kW = 16;         // columns of a tile (f32 results, pair columns of B)
constexpr int64_t kPairRows = 16;  // pair-rows of a B tile

struct Target {
  void (*rows)(const TileLinearRows&);
  void (*pack)(const uint16_t*, int64_t, int64_t, int64_t, int64_t, uint32_t*);
};
Target target_of(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::amx) return {amx::tile_linear_rows, amx::tile_linear_pack};
  if (isa == Isa::amx_emulated)
    return {amx_emulated::tile_linear_rows, amx_emulated::tile_linear_pack};
#endif
  throw Error(fmt::format(
      "attn::cpu::tile_linear: the '{}' target has no tiles (amx or amx-emulated)", isa_name(isa)));
}

// The packed weights of the calling thread's products (the modules call one product at a time per
// thread). Grows, never shrinks: no page faults per call.
std::vector<uint32_t>& packed_scratch() {
  thread_local std::vector<uint32_t> v;
  return v;
}

}  // namespace

std::optional<Isa> tile_linear_isa() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  if (isa == Isa::amx || isa == Isa::amx_emulated) return isa;
#endif
  return std::nullopt;
}

void tile_linear(const TileLinear& p, Isa isa) {
  if (p.M < 0 || p.N < 0 || p.K < 0 || (p.K > 0 && (p.x == nullptr || p.w == nullptr)) ||
      (p.y16 == nullptr) == (p.y32 == nullptr) ||
      (p.row_fn != nullptr && (p.y16 == nullptr || p.bias != nullptr))) {
    throw Error(
        fmt::format("attn::cpu::tile_linear: bad problem M {} N {} K {} (x and w unless K "
                    "is 0, exactly one of y16, y32, and a row_fn only with y16 and no bias: the "
                    "row function adds it)",
                    p.M, p.N, p.K));
  }
  if (p.M == 0 || p.N == 0) return;
  const Target target = target_of(isa);
  const double work =
      static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
  const int threads = p.threads > 0 ? p.threads : (work < 4e6 ? 1 : resolve_threads(0));
  const int64_t K2p = ((p.K + 1) / 2 + kPairRows - 1) / kPairRows * kPairRows;
  const int64_t col_blocks = (p.N + kW - 1) / kW, bcs = K2p * kW;
  std::vector<uint32_t>& packed = packed_scratch();
  if (static_cast<int64_t>(packed.size()) < col_blocks * bcs + kW) {
    packed.resize(static_cast<size_t>(col_blocks * bcs + kW));
  }
  // 64-byte aligned B tiles: a tile row split over two cache lines costs a second line per row.
  uint32_t* b = packed.data();
  b += (64 - reinterpret_cast<uintptr_t>(b) % 64) % 64 / 4;
  parallel_for(col_blocks, threads,
               [&](int64_t nb, int) { target.pack(p.w, p.N, p.K, K2p, nb, b + nb * bcs); });
  // Row chunks of 32-256 rows, about two per thread at least (blocks of 32 rows are the unit).
  const int64_t per = (p.M + 2 * threads - 1) / (2 * threads);
  const int64_t chunk = std::clamp<int64_t>((per + 31) / 32 * 32, 32, 256);
  const int64_t tasks = (p.M + chunk - 1) / chunk;
  parallel_for(tasks, threads, [&](int64_t t, int) {
    target.rows({.N = p.N,
                 .K = p.K,
                 .x = p.x,
                 .packed = b,
                 .bcs = bcs,
                 .m0 = t * chunk,
                 .m1 = std::min(p.M, (t + 1) * chunk),
                 .bias = p.bias,
                 .y16 = p.y16,
                 .y32 = p.y32,
                 .row_fn = p.row_fn,
                 .row_ctx = p.row_ctx});
  });
}

}  // namespace attn::cpu
