// The canonical attention problem handed to a backend after validation (src/attention.cc): every tensor
// is a 4-D view [B, H, L, D] with a unit-stride last dim (B = the product of the leading batch dims), every
// option resolved. Backends trust it and only assert.
#pragma once
#include <cstdint>
#include <vector>

#include "attn/attention.h"
#include "contract/dropout.h"
#include "contract/mask.h"

namespace attn::contract {

struct ForwardProblem {
  int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  int64_t group = 1;  // Hq / Hkv: query head h reads kv head h / group
  DType dtype = DType::f32;

  double scale = 1.0;
  double softcap = 0.0;  // 0: none
  PositionRule rule;
  std::vector<int64_t> key_length;  // [B]; empty = every key (Lk)

  // Dense mask as a view [B, Hq, Lq, Lk] with stride 0 on broadcast dims; undefined = none.
  Tensor mask;
  MaskType mask_type = MaskType::keep;
  // Block layout as a bool view [B, Hq, ceil(Lq / block_q), ceil(Lk / block_k)]; undefined = none.
  Tensor block_layout;
  int64_t block_q = 0, block_k = 0;
  std::vector<double> alibi;  // [Hq]; empty = none. s -= alibi[h] * |p(i) - j|
  DropoutRule dropout;
  int threads = 0;

  Tensor q, k, v;  // [B, Hq, Lq, D], [B, Hkv, Lk, D], [B, Hkv, Lk, Dv]
  Tensor out;      // [B, Hq, Lq, Dv], q's dtype, written by the backend
  Tensor lse;      // [B, Hq, Lq], f64 for f64 else f32, written by the backend
  Tensor weights;  // [B, Hq, Lq, Lk] out's dtype when requested (before dropout), else undefined

  int64_t key_length_of(int64_t b) const { return key_length.empty() ? Lk : key_length[b]; }
};

// The backward extends the forward: the same problem plus the incoming gradient and the outputs.
struct BackwardProblem : ForwardProblem {
  Tensor dout;        // [B, Hq, Lq, Dv]
  Tensor dq, dk, dv;  // written by the backend; dk/dv summed over the query heads of a GQA group
  // [B, Hq, Lq, Lk] (f64 for f64 else f32) when d(add mask) is asked, else undefined
  Tensor dscores;
};

}  // namespace attn::contract
