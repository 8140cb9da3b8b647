// bf16 conversions and the bf16 product of the nn modules (see bf16.h for the two paths).
#include "nn/bf16.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/dot_linear_bf16.h"
#include "backends/cpu/tile_linear.h"
#include "nn/elementwise.h"
#include "nn/matmul.h"
#include "nn/ops.h"

namespace attn::nn::detail {

namespace {

// Scratch of the f32 path, per calling thread (the products are called from one thread at a time
// per module; oneDNN parallelises inside). Grows, never shrinks: no page faults per call.
std::vector<float>& scratch(int which) {
  thread_local std::vector<float> buffers[3];
  return buffers[which];
}
float* scratch_of(int which, int64_t n) {
  std::vector<float>& v = scratch(which);
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The f32 path: widen x and w, sgemm (f32 accumulation), then the bias added in f32 and one rounding
// in a single pass (or the bias alone into an f32 result). At most ew::kDotLinearRows rows: the dot
// kernel on w as it is (ew::linear_dot).
void gemm_via_f32(const Bf16Gemm& g) {
  const float* xf = g.x32;
  if (xf == nullptr) {
    float* widened = scratch_of(0, g.M * g.K);
    ew::widen_bf16(g.x, widened, g.M * g.K);
    xf = widened;
  }
  std::vector<float> bias(static_cast<size_t>(g.bias ? g.N : 0));
  if (g.bias) ew::widen_bf16(g.bias, bias.data(), g.N);
  if (ew::linear_dot_route(g.M)) {
    // Few rows: w read in place, widened in registers (its widened copy would cost more than
    // the product), the bias added in f32 by the dot kernel.
    float* yf = g.y32 ? g.y32 : scratch_of(2, g.M * g.N);
    ew::linear_dot({.x = xf,
                    .w = nullptr,
                    .b = g.bias ? bias.data() : nullptr,
                    .y = yf,
                    .M = g.M,
                    .N = g.N,
                    .K = g.K,
                    .w16 = g.w});
    if (!g.y32) ew::round_bf16(yf, g.y16, g.M * g.N);
    return;
  }
  float* wf = scratch_of(1, g.N * g.K);
  ew::widen_bf16(g.w, wf, g.N * g.K);
  if (g.y32) {
    linear_forward(xf, g.M, g.K, wf, g.bias ? bias.data() : nullptr, g.N, g.y32);
    return;
  }
  float* yf = scratch_of(2, g.M * g.N);
  gemm(false, true, g.M, g.N, g.K, 1.0f, xf, g.K, wf, g.K, 0.0f, yf, g.N);
  ew::bias_round_bf16(yf, g.bias ? bias.data() : nullptr, g.y16, g.M, g.N);
}

// ---- the oneDNN path: its matmul primitive (nn/matmul.h) ----

void gemm_native(const Bf16Gemm& g) {
  run_matmul({.M = g.M,
              .N = g.N,
              .K = g.K,
              .in = MatmulType::bf16,
              .out = g.y32 != nullptr ? MatmulType::f32 : MatmulType::bf16,
              .x = g.x,
              .w = g.w,
              .bias = g.bias,
              .y = g.y32 != nullptr ? static_cast<void*>(g.y32) : static_cast<void*>(g.y16),
              .activation = g.activation});
}

// ---- the policy: ATTN_BF16_GEMM, read and parsed once ----

// unset or "": each product's path by shape and CPU (automatic); "onednn": oneDNN's bf16 matmul
// for every product; "f32": every product widened to f32; "tiles": attn's tile product for every
// forward product. Any other value is an error naming it, raised by every bf16 product.
enum class Bf16Policy { automatic, onednn, f32, tiles };

struct ParsedPolicy {
  std::optional<Bf16Policy> policy;
  std::string text, error;
};

const ParsedPolicy& parsed_policy() {
  static const ParsedPolicy parsed = [] {
    ParsedPolicy p;
    const char* env = std::getenv("ATTN_BF16_GEMM");
    p.text = env != nullptr ? env : "";
    constexpr std::pair<const char*, Bf16Policy> kNames[] = {{"", Bf16Policy::automatic},
                                                             {"onednn", Bf16Policy::onednn},
                                                             {"f32", Bf16Policy::f32},
                                                             {"tiles", Bf16Policy::tiles}};
    for (const auto& [name, policy] : kNames) {
      if (p.text == name) p.policy = policy;
    }
    if (!p.policy) {
      p.error = fmt::format(
          "ATTN_BF16_GEMM={} is not a bf16 product path (expected onednn, f32 or tiles, "
          "or unset)",
          p.text);
    }
    return p;
  }();
  return parsed;
}

Bf16Policy policy() {
  const ParsedPolicy& p = parsed_policy();
  if (!p.policy) fail("attn::nn", p.error);
  return *p.policy;
}

// ---- attn's own tile product (backends/cpu/tile_linear.h), on CPUs with AMX tiles ----

// The target of attn's tile product (cpu::tile_linear_isa), unless ATTN_BF16_GEMM asks for
// another path.
std::optional<cpu::Isa> tile_isa() {
  const Bf16Policy p = policy();
  if (p != Bf16Policy::automatic && p != Bf16Policy::tiles) return std::nullopt;
  return cpu::tile_linear_isa();
}

// A fused activation on the tile product: each row of results gets the bias added and the
// activation applied in f32 (bf16 results: float lanes, ew's bias_act_bf16_row, as
// autocast's FFN), then one rounding.
struct ActivatedRows {
  const ew::Kernels* kernels = nullptr;
  Activation activation = Activation::relu;
  const float* bias = nullptr;  // [N]: the bias, or zeros
};
void activated_row(const void* ctx, float* row, int64_t n0, uint16_t* out, int64_t cols) {
  const ActivatedRows& a = *static_cast<const ActivatedRows*>(ctx);
  a.kernels->bias_act_bf16_row(a.activation, row, a.bias + n0, out, cols);
}

// g's rows as bf16: g.x, or g.x32 rounded (exactly: its values are bf16 ones) into `keep`.
const uint16_t* bf16_rows(const Bf16Gemm& g, Tensor& keep) {
  if (g.x != nullptr) return g.x;
  keep = Tensor::empty({g.M, g.K}, DType::bf16);
  ew::round_bf16(g.x32, keep.data_as<uint16_t>(), g.M * g.K);
  return keep.data_as<uint16_t>();
}

void gemm_tiles(const Bf16Gemm& g, cpu::Isa isa) {
  Tensor x16;
  const uint16_t* x = bf16_rows(g, x16);
  std::vector<float> bias(static_cast<size_t>(g.bias || g.activation ? g.N : 0), 0.0f);
  if (g.bias) ew::widen_bf16(g.bias, bias.data(), g.N);
  const ActivatedRows rows{.kernels = &ew::active_kernels(),
                           .activation = g.activation.value_or(Activation::relu),
                           .bias = bias.data()};
  cpu::tile_linear({.M = g.M,
                    .N = g.N,
                    .K = g.K,
                    .x = x,
                    .w = g.w,
                    .bias = g.bias && !g.activation ? bias.data() : nullptr,
                    .y16 = g.y16,
                    .y32 = g.y32,
                    .row_fn = g.activation ? activated_row : nullptr,
                    .row_ctx = &rows},
                   isa);
}

bool cpu_has_bf16_isa() {
  cap_onednn_isa();
  const unsigned isa = dnnl_get_effective_cpu_isa();
  const unsigned want = dnnl_cpu_isa_avx512_core_bf16;
  return (isa & want) == want;
}

// A 37 x 29 x 67 product on both paths: the native one is used only when they agree to bf16's
// rounding of the output (both accumulate in f32, so they differ by one rounding at most).
bool native_agrees() {
  const int64_t M = 37, N = 29, K = 67;
  std::vector<uint16_t> x(M * K), w(N * K), b(N), y1(M * N), y2(M * N);
  for (int64_t i = 0; i < M * K; ++i) x[i] = f32_to_bf16(std::sin(0.37 * static_cast<double>(i)));
  for (int64_t i = 0; i < N * K; ++i) w[i] = f32_to_bf16(std::cos(0.11 * static_cast<double>(i)));
  for (int64_t i = 0; i < N; ++i) b[i] = f32_to_bf16(0.01f * static_cast<float>(i));
  gemm_native(
      {.M = M, .N = N, .K = K, .x = x.data(), .w = w.data(), .bias = b.data(), .y16 = y1.data()});
  gemm_via_f32(
      {.M = M, .N = N, .K = K, .x = x.data(), .w = w.data(), .bias = b.data(), .y16 = y2.data()});
  for (int64_t i = 0; i < M * N; ++i) {
    const float a = bf16_to_f32(y1[i]), r = bf16_to_f32(y2[i]);
    if (!(std::abs(a - r) <= 1e-2f * (1.0f + std::abs(r)))) return false;
  }
  return true;
}

struct PathChoice {
  bool native = false;
  std::string text;
};

const PathChoice& path_choice() {
  static const PathChoice choice = [] {
    PathChoice c;
    const dnnl_version_t* v = dnnl_version();
    const std::string lib = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
    const std::string f32 = fmt::format(
        "widened to f32 once per product, {} sgemm, f32 accumulation, rounded to bf16", lib);
    const Bf16Policy want = policy();
    if (want == Bf16Policy::f32) {
      c.text = f32 + " (ATTN_BF16_GEMM=f32)";
      return c;
    }
    if (!cpu_has_bf16_isa()) {
      c.text = f32 + " (no bf16 dot instruction: oneDNN's ISA is below avx512_core_bf16)";
      return c;
    }
    if (want != Bf16Policy::onednn && !cpu::bf16_instructions_pay()) {
      c.text = f32 + " (no AMX, and VDPBF16PS runs at under 1.5x the FMA rate here)";
      return c;
    }
    std::string impl;
    try {
      impl = matmul_impl(MatmulType::bf16, MatmulType::bf16, 256, 256, 256);
    } catch (const dnnl::error& e) {
      c.text = f32 + fmt::format(" ({} has no bf16 matmul here: {})", lib, e.what());
      return c;
    }
    if (impl.find("ref") != std::string::npos) {
      c.text = f32 + fmt::format(" ({}'s bf16 matmul is its reference code '{}')", lib, impl);
      return c;
    }
    bool agrees = false;
    try {
      agrees = native_agrees();
    } catch (const dnnl::error&) {
    }
    if (!agrees) {
      c.text = f32 + fmt::format(" ({}'s bf16 matmul '{}' failed its check)", lib, impl);
      return c;
    }
    c.native = true;
    c.text = fmt::format("{} bf16 matmul ({}), f32 accumulation", lib, impl);
    return c;
  }();
  return choice;
}

// Rows from which the tile product runs by default: it packs the weights once per call (N x K
// words), which fewer rows do not amortise. AMX Xeon, 2 threads, BERT's shapes against oneDNN
// 2.6.3's AMX matmul: 128 rows 0.5-0.67x, 512 rows 0.78-0.88x, 1024 rows 0.99-1.35x, 2048 rows
// 1.12-1.30x, 4096 rows 1.2-1.31x. The two paths sum in different orders (and fuse a GELU of their
// own), so a row's bf16 result can differ by a rounding between a product below and one above it.
constexpr int64_t kTileMinRows = 1024;

// The tile product's target for g: tile_isa() for products of kTileMinRows rows or more (or any,
// when ATTN_BF16_GEMM=tiles or oneDNN's bf16 matmul is not available), else nullopt.
std::optional<cpu::Isa> tiles_for(const Bf16Gemm& g) {
  const std::optional<cpu::Isa> isa = tile_isa();
  if (!isa || g.M >= kTileMinRows || !path_choice().native) return isa;
  return policy() == Bf16Policy::tiles ? isa : std::nullopt;
}

// ---- attn's dot-product kernel for products of few rows (backends/cpu/dot_linear_bf16.h) ----

// Rows up to which the native path takes the dot kernel: oneDNN's bf16 matmul packs all of w on
// every call and runs a 16-row product on one thread (docs/PERFORMANCE.md, "Linear routes").
constexpr int64_t kDotMaxRows = 16;

// The dot kernel's target for g: products of at most kDotMaxRows rows on the native path where the
// active target has VDPBF16PS, unless ATTN_BF16_GEMM names a path (onednn: oneDNN's matmul alone).
std::optional<cpu::Isa> dot_for(const Bf16Gemm& g) {
  if (g.M > kDotMaxRows || !path_choice().native || policy() != Bf16Policy::automatic) {
    return std::nullopt;
  }
  return cpu::dot_linear_bf16_isa();
}

// The product in f32, then the bias (and activation: ew's float lanes for bf16 results, as the tile
// path) and one rounding in a pass over the f32 rows.
void gemm_dot(const Bf16Gemm& g, cpu::Isa isa) {
  Tensor x16;
  const uint16_t* x = bf16_rows(g, x16);
  float* y = g.y32 ? g.y32 : scratch_of(2, g.M * g.N);
  cpu::dot_linear_bf16({.x = x, .w = g.w, .y = y, .M = g.M, .N = g.N, .K = g.K}, isa);
  std::vector<float> bias(static_cast<size_t>(g.bias || g.activation ? g.N : 0), 0.0f);
  if (g.bias) ew::widen_bf16(g.bias, bias.data(), g.N);
  if (g.activation)
    return ew::bias_act_forward_bf16(*g.activation, y, bias.data(), g.y16, g.M, g.N);
  if (g.y16) return ew::bias_round_bf16(y, g.bias ? bias.data() : nullptr, g.y16, g.M, g.N);
  if (g.bias)
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) y[i * g.N + j] += bias[j];
}

}  // namespace

Tensor convert(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x.contiguous();
  const bool f32_bf16 = x.dtype() == DType::f32 && dtype == DType::bf16;
  const bool bf16_f32 = x.dtype() == DType::bf16 && dtype == DType::f32;
  if (!(f32_bf16 || bf16_f32)) return x.to(dtype);
  const Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), dtype);
  if (f32_bf16)
    ew::round_bf16(c.data_as<float>(), out.data_as<uint16_t>(), c.numel());
  else
    ew::widen_bf16(c.data_as<uint16_t>(), out.data_as<float>(), c.numel());
  return out;
}

void gemm_bf16(const Bf16Gemm& g) {
  if (g.M == 0 || g.N == 0) return;
  if (g.activation && (g.y16 == nullptr || !bf16_fuses_activations())) {
    throw Error(
        "attn::nn::detail::gemm_bf16: an activation needs the tiles or the onednn path and a bf16 "
        "result");
  }
  if (const std::optional<cpu::Isa> isa = tiles_for(g)) return gemm_tiles(g, *isa);
  if (g.K == 0 || !path_choice().native) return gemm_via_f32(g);
  if (const std::optional<cpu::Isa> isa = dot_for(g)) return gemm_dot(g, *isa);
  Tensor x16;
  Bf16Gemm rounded = g;
  rounded.x = bf16_rows(g, x16);
  rounded.x32 = nullptr;
  gemm_native(rounded);
}

void product_bf16(const Bf16Product& p) {
  if (p.M == 0 || p.N == 0) return;
  if ((p.c32 == nullptr) == (p.c16 == nullptr) || (p.accumulate && p.c32 == nullptr)) {
    throw Error("attn::nn::detail::product_bf16: one result, f32 when it accumulates");
  }
  if (p.K == 0) {
    if (p.accumulate) return;
    if (p.c32) std::fill(p.c32, p.c32 + p.M * p.N, 0.0f);
    if (p.c16) std::fill(p.c16, p.c16 + p.M * p.N, uint16_t{0});
    return;
  }
  if (path_choice().native) {
    run_matmul({.M = p.M,
                .N = p.N,
                .K = p.K,
                .in = MatmulType::bf16,
                .out = p.c32 != nullptr ? MatmulType::f32 : MatmulType::bf16,
                .x = p.a,
                .w = p.b,
                .y = p.c32 != nullptr ? static_cast<void*>(p.c32) : static_cast<void*>(p.c16),
                .x_km = p.a_km,
                .w_kn = !p.b_nk,
                .accumulate = p.accumulate});
    return;
  }
  float* a = scratch_of(0, p.M * p.K);
  float* b = scratch_of(1, p.K * p.N);
  ew::widen_bf16(p.a, a, p.M * p.K);
  ew::widen_bf16(p.b, b, p.K * p.N);
  float* c = p.c32 != nullptr ? p.c32 : scratch_of(2, p.M * p.N);
  gemm(p.a_km, p.b_nk, p.M, p.N, p.K, 1.0f, a, p.a_km ? p.M : p.K, b, p.b_nk ? p.K : p.N,
       p.accumulate ? 1.0f : 0.0f, c, p.N);
  if (p.c16) ew::round_bf16(c, p.c16, p.M * p.N);
}

void linear_backward_bf16(const Bf16LinearBackward& b) {
  if (b.gb != nullptr) {
    if (b.dy32 != nullptr)
      bias_grad(b.dy32, b.N, b.out, b.gb);
    else
      ew::column_sums_bf16(b.dy, b.N, b.out, b.gb);
  }
  product_bf16(
      {.M = b.N, .N = b.in, .K = b.out, .a = b.dy, .b = b.w, .c32 = b.dx32, .c16 = b.dx16});
  product_bf16({.M = b.out,
                .N = b.in,
                .K = b.N,
                .a = b.dy,
                .a_km = true,
                .b = b.x,
                .c32 = b.gw,
                .accumulate = true});
}

bool bf16_gemm_native() {
  return path_choice().native;
}

bool bf16_fuses_activations() {
  return tile_isa().has_value() || path_choice().native;
}

std::string bf16_gemm_path() {
  const std::optional<cpu::Isa> tiles = tile_isa();
  const std::optional<cpu::Isa> dot =
      policy() == Bf16Policy::automatic ? cpu::dot_linear_bf16_isa() : std::nullopt;
  const std::string dot_text =
      path_choice().native && dot
          ? fmt::format("; Linear products of at most {} rows on attn's VDPBF16PS dot kernel ({})",
                        kDotMaxRows, cpu::isa_name(*dot))
          : "";
  const std::string chosen =
      parsed_policy().text.empty() ? "" : fmt::format(" [ATTN_BF16_GEMM={}]", parsed_policy().text);
  if (!tiles) return path_choice().text + dot_text + chosen;
  return fmt::format(
      "attn's AMX tile product ({} target) for the Linear products of {}, bias, activation and "
      "rounding in its epilogue; smaller ones and the backward's products: {}{}{}",
      cpu::isa_name(*tiles), policy() == Bf16Policy::tiles ? "every size" : "1024 rows or more",
      path_choice().text, dot_text, chosen);
}

}  // namespace attn::nn::detail
