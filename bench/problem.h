// The inputs and work counts every attention benchmark uses (attn bench in tools/bench.cc,
// bench/attention_bench.cc, bench/decode_bench.cc), so their rows time the same problems: q, k, v
// (and dout) uniform in [-1, 1) from a fixed xorshift stream per tensor (made in f32, then
// converted, so a bf16 row reads the f32 row's values rounded), seeds 1-4 for the square
// problems and 5-7 for decode. Header-only: tools/ links libattn alone, bench/ is built only
// with ATTN_BUILD_BENCH.
#pragma once

#include <cstdint>

#include "attn/tensor.h"

namespace attn::bench {

inline Tensor random_input(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data_as<float>();
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1p-53 * 2.0 - 1.0);
  }
  return dtype == DType::f32 ? t : t.to(dtype);
}

// Self-attention over one sequence per head: q, k, v, dout [1, BH, L, D].
struct SquareProblem {
  Tensor q, k, v, dout;
};

inline SquareProblem square_problem(int64_t BH, int64_t L, int64_t D, DType dtype) {
  return {random_input({1, BH, L, D}, dtype, 1), random_input({1, BH, L, D}, dtype, 2),
          random_input({1, BH, L, D}, dtype, 3), random_input({1, BH, L, D}, dtype, 4)};
}

// Forward FLOPs of a square problem: 4 BH L^2 D (QK^T and PV), half under the causal mask.
inline double forward_flops(int64_t BH, int64_t L, int64_t D, bool causal) {
  const double flops =
      4.0 * static_cast<double>(BH) * static_cast<double>(L) * static_cast<double>(L) * D;
  return causal ? 0.5 * flops : flops;
}

// Forward + backward counts 3.5 x the forward (the backward 2.5 x).
constexpr double kForwardBackwardFactor = 3.5;

// Decode: Lq query rows per head against a KV cache of Lk keys: q [1, Hq, Lq, D], k, v
// [1, Hkv, Lk, D].
struct DecodeProblem {
  Tensor q, k, v;
};

inline DecodeProblem decode_problem(int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t D,
                                    DType dtype) {
  return {random_input({1, Hq, Lq, D}, dtype, 5), random_input({1, Hkv, Lk, D}, dtype, 6),
          random_input({1, Hkv, Lk, D}, dtype, 7)};
}

// Bytes of K and V a decode call reads (once per kv head, whatever the query heads).
inline double kv_bytes(int64_t Hkv, int64_t Lk, int64_t D, DType dtype) {
  return 2.0 * static_cast<double>(Hkv * Lk * D) * static_cast<double>(dtype_size(dtype));
}

}  // namespace attn::bench
