// oneDNN's matmul primitive for the nn products: y [M, N] = x [M, K] w [N, K]^T (+ bias [N]), then
// an optional activation, all row-major and contiguous; the backward's products read x stored
// transposed ([K, M]) or w as [K, N], and may add onto y (f32) instead of writing it. One primitive per shape and types, created
// once and kept (oneDNN's creation costs far more than a small product). Used by the bf16 products
// (nn/bf16.h) and by the f32 Linear products whose reduction is at least as long as their rows
// (detail::linear_forward, nn/ops.cc).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "attn/nn/layers.h"

namespace attn::nn::detail {

enum class MatmulType : uint8_t { f32, bf16 };

struct Matmul {
  int64_t M = 0, N = 0, K = 0;       // all > 0
  MatmulType in = MatmulType::f32;   // x, w and bias
  MatmulType out = MatmulType::f32;  // y
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // optional
  void* y = nullptr;
  // Applied in f32 to the product (+ bias) before y is written: oneDNN's eltwise post-op (its own
  // functions; SiLU is swish with alpha 1).
  std::optional<Activation> activation = std::nullopt;
  bool x_km = false;        // x stored [K, M] row-major (the product reads its transpose)
  bool w_kn = false;        // w stored [K, N] row-major instead of [N, K]
  bool accumulate = false;  // y += the product (oneDNN's sum post-op) instead of y = ...
};

// Runs m on attn's thread count (one thread under ~4M multiply-adds, as detail::gemm). Throws
// dnnl::error when oneDNN cannot make such a primitive.
void run_matmul(const Matmul& m);

// oneDNN's name for the implementation it picks for such a product ("brg:avx512_core",
// "gemm:jit", ...); throws dnnl::error when it has none.
std::string matmul_impl(MatmulType in, MatmulType out, int64_t M, int64_t N, int64_t K);

}  // namespace attn::nn::detail
