// Shaw's and T5's relative positions as additive score biases (MultiHeadAttention hands them to
// attn::attention through its add mask, whose gradient d(bias) comes back from the backward), and
// their backward. Defined in positional.cc, beside t5_relative_bucket.
#pragma once
#include <cstdint>

#include "attn/tensor.h"

namespace attn::nn::detail {

// Shaw et al.: bias [B, H, Lq, Lk] of q's dtype,
//   bias[b, h, i, j] = scale * q[b, h, i] . table[clip(j - i, -md, md) + md],
// q [B, H, Lq, hd] contiguous, table [2 md + 1, hd] of q's dtype (f32 or f64); md = max_distance.
Tensor shaw_bias(const Tensor& q, const Tensor& table, int64_t Lk, int64_t max_distance,
                 double scale, const char* fn);

// Its backward from dbias [Bm, H, Lq, Lk] (Bm = 1 or B), into dq [B, H, Lq, hd] and dtable (both
// contiguous, q's dtype): dq_i += scale * sum_j dbias_ij table_r, dtable_r += scale * dbias_ij q_i.
void shaw_bias_backward(const Tensor& dbias, const Tensor& q, const Tensor& table,
                        int64_t max_distance, double scale, Tensor& dq, Tensor& dtable,
                        const char* fn);

// T5: bias [1, H, Lq, Lk] of dtype dt, bias[0, h, i, j] = table[bucket(j - i), h] with
// table [num_buckets, H] (t5_relative_bucket's buckets).
Tensor t5_bias(const Tensor& table, int64_t Lq, int64_t Lk, bool bidirectional,
               int64_t max_distance, DType dt);

// Its backward: dtable[bucket(j - i), h] += sum_b dbias[b, h, i, j] for dbias [Bm, H, Lq, Lk].
void t5_bias_backward(const Tensor& dbias, bool bidirectional, int64_t max_distance,
                      Tensor& dtable);

}  // namespace attn::nn::detail
