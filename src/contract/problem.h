// The canonical attention problems handed to a backend after validation (src/attention.cc,
// src/linear_attention.cc): every tensor is a 4-D view [B, H, L, D] with a unit-stride last dim (B = the
// product of the leading batch dims), every option resolved. Backends trust them and only assert.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
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
  // [Hq]; empty = none. Sink logit of head h: joins every row's softmax denominator, no value.
  std::vector<double> sinks;
  DropoutRule dropout;
  int threads = 0;

  // Keys and values in pages (attn::attention_paged, read in place by the cpu decode kernel when
  // cpu::reads_pages says so): k and v are then the pools as views [num_blocks, Hkv, block_size, X]
  // and key j of batch entry b is row j % block_size of block table[b * table_stride + j /
  // block_size]. table == nullptr: k and v are [B, Hkv, Lk, X] views.
  struct KeyPages {
    const int32_t* table = nullptr;
    int64_t table_stride = 0, block_size = 0;
  } pages;

  // Quantized keys and values (attn::attention_paged's int8 pools, read in place by the cpu decode
  // kernel): k and v int8 and element (.., j, d) stands for k[.., j, d] * k_scale[.., j] (f32 views
  // shaped as k and v without their last dim, addressed through pages as they are). Undefined: k
  // and v hold the values.
  Tensor k_scale, v_scale;

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
  // [B, Hq, Lq, Lk] view of dL/dweights (any floating dtype), or undefined; the reference backend's
  Tensor dweights;
  // [B, Hq] f64 when sinks are given and the reference backend runs: dL/dsink per (batch, head),
  // summed over the rows by the backend (the entry sums over the batch)
  Tensor dsinks;
};

// Linear attention (include/attn/linear_attention.h): phi(q_i)^T S_i / (phi(q_i) . z_i) over the keys
// query i may use. Contiguous q, k, v; the keys each row sees as the position rule's causal bound and a
// per-(batch, key) keep flag.
struct LinearProblem {
  int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  int64_t group = 1;  // Hq / Hkv: query head h reads kv head h / group
  Tensor q, k, v;     // [B, Hq, Lq, D], [B, Hkv, Lk, D], [B, Hkv, Lk, Dv], contiguous, f32 or f64
  bool causal = false;
  int64_t offset = 0;         // query i sits at key position p(i) = i + offset (causal only)
  std::vector<uint8_t> keep;  // [B * Lk], 1 = use the key; empty = all
  int threads = 0;

  bool kept(int64_t b, int64_t j) const { return keep.empty() || keep[b * Lk + j]; }
  // The keys visible to query i: [0, Lk) (non-causal) or [0, p(i)] clipped to [0, Lk) (causal).
  int64_t visible_end(int64_t i) const {
    return causal ? std::clamp<int64_t>(i + offset + 1, 0, Lk) : Lk;
  }
};

// The backward: dout [B, Hq, Lq, Dv] (contiguous, q's dtype) in; dq, dk, dv zero-filled by the
// caller, written by the backend (dk, dv summed over the query heads of a group).
struct LinearBackwardProblem : LinearProblem {
  Tensor dout, dq, dk, dv;
};

// The shape rules every attention variant shares, after each has checked its own dtypes and ranks
// (rank >= 3, one rank for q, k and v): equal leading batch dims, one head dim for q and k, one head
// count and length for k and v, whole query groups per key/value head. Returns the problem's text
// ("" when none), for the caller's fail(fn, ...).
std::string check_qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace attn::contract
