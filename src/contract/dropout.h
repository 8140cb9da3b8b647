// The dropout keep-pattern: a pure function of (seed, batch, head, i, j), so that every backend, tiling
// and thread count drops the same weights, and the backward regenerates them exactly.
//
// Philox4x32-10 (Random123) with key = (seed low 32 bits, seed high 32 bits) and counter =
// (j / 4, i, head, batch) gives four 32-bit words; word j % 4 is the draw r of (i, j). The weight is kept
// when r >= threshold, threshold = floor(p * 2^32) (so P(keep) = 1 - p up to 2^-32), and a kept weight is
// multiplied by 1 / (1 - p). Indices are taken modulo 2^32 (lengths beyond 2^32 are not supported).
#pragma once
#include <Random123/philox.h>

#include <cmath>
#include <cstdint>

namespace attn::contract {

// A draw r is kept when r >= threshold = floor(p * 2^32) (so P(keep) = 1 - p up to 2^-32).
inline uint32_t dropout_threshold(double p) {
  const double t = std::floor(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
}

// nn::Dropout's pattern (attn/nn/layers.h), the same generator over a flat tensor: element e of
// call `call` draws word e % 4 of Philox4x32-10(key = seed, counter = (e / 4 low, e / 4 high,
// call low, call high)); these are the four draws of elements 4 e4 .. 4 e4 + 3.
inline void element_draws4(uint64_t seed, uint64_t call, uint64_t e4, uint32_t out[4]) {
  r123::Philox4x32 gen;
  const r123::Philox4x32::ctr_type ctr = {
      {static_cast<uint32_t>(e4), static_cast<uint32_t>(e4 >> 32), static_cast<uint32_t>(call),
       static_cast<uint32_t>(call >> 32)}};
  const r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  const auto r = gen(ctr, key);
  for (int l = 0; l < 4; ++l) out[l] = r.v[l];
}

struct DropoutRule {
  double p = 0.0;
  uint64_t seed = 0;
  // Added to the batch index of every draw: a problem that is one sequence of a packed batch (the
  // varlen entries) draws as batch entry batch_base + b.
  int64_t batch_base = 0;

  bool active() const { return p > 0.0; }
  uint32_t threshold() const { return dropout_threshold(p); }
  double keep_scale() const { return 1.0 / (1.0 - p); }

  // The four draws for keys 4*j4 .. 4*j4+3 of row i.
  void draws4(int64_t batch, int64_t head, int64_t i, int64_t j4, uint32_t out[4]) const {
    r123::Philox4x32 gen;
    r123::Philox4x32::ctr_type ctr = {{static_cast<uint32_t>(j4), static_cast<uint32_t>(i),
                                       static_cast<uint32_t>(head),
                                       static_cast<uint32_t>(batch + batch_base)}};
    r123::Philox4x32::key_type key = {
        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
    const auto r = gen(ctr, key);
    for (int l = 0; l < 4; ++l) out[l] = r.v[l];
  }

  bool keep(int64_t batch, int64_t head, int64_t i, int64_t j) const {
    if (!active()) return true;
    uint32_t r[4];
    draws4(batch, head, i, j >> 2, r);
    return r[j & 3] >= threshold();
  }
};

}  // namespace attn::contract
