// Positions: absolute embeddings added to the token embeddings, and the helpers behind the relative
// schemes of MultiHeadAttention (RoPE, ALiBi, Shaw, T5).
//
// x layout for the absolute embeddings: [B, L, E] when batch_first, else [L, B, E] (as the layers).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/nn/module.h"

namespace attn::nn {

// Adds pe[pos, 2i] = sin(pos / 10000^(2i/E)), pe[pos, 2i+1] = cos(...) ("Attention Is All You
// Need") to x * scale (scale = sqrt(E) as the tutorials do, or 1). No parameters; backward = dy *
// scale.
class SinusoidalPositionalEncoding : public Module {
 public:
  SinusoidalPositionalEncoding(int64_t d_model, int64_t max_len = 4096, bool batch_first = false,
                               double scale = 1.0);
  Tensor forward(const Tensor& x, int64_t offset = 0);  // positions offset .. offset + L - 1
  Tensor backward(const Tensor& dy);
  const Tensor& table() const { return pe_; }  // [max_len, E] f64

 private:
  int64_t d_, max_len_;
  bool batch_first_;
  double scale_;
  Tensor pe_;
};

// Learned absolute positions: y = x * scale + weight[offset + pos]. State: weight [max_len, E] ~
// N(0, init_std^2) (N(0, 1) by default, as an nn.Embedding of positions).
class LearnedPositionalEmbedding : public Module {
 public:
  LearnedPositionalEmbedding(int64_t max_len, int64_t d_model, bool batch_first = false,
                             double scale = 1.0, DType dtype = DType::f32, double init_std = 1.0);
  Tensor forward(const Tensor& x, int64_t offset = 0);
  Tensor backward(const Tensor& dy);  // -> dx; accumulates d(weight)

 private:
  int64_t max_len_, d_;
  bool batch_first_;
  double scale_;
  DType dtype_;
  Parameter* weight_;
  void release_cache() override { forwarded_ = false; }
  int64_t offset_ = 0, L_ = 0, B_ = 0;  // the last forward's
  bool forwarded_ = false;              // which the backward may use
};

// ALiBi slopes of the paper for n heads: 2^(-8 h / n), h = 1..n, when n is a power of two;
// otherwise the slopes of the next lower power of two m followed by every other slope of 2m.
std::vector<double> alibi_slopes(int64_t num_heads);

// T5's bucket of the relative position rel = j - i (key minus query): half the buckets for each
// sign when bidirectional, exact buckets for |rel| < max_exact = buckets/2 (of the half),
// log-spaced up to max_distance, the last bucket beyond.
int64_t t5_relative_bucket(int64_t rel, bool bidirectional, int64_t num_buckets,
                           int64_t max_distance);

// Rotary embedding of x [N, L, hd] (contiguous, N = batch * heads) in place: position p = offset +
// l rotates pair (a, b) by angle p * base^(-2i/hd): (a cos - b sin, a sin + b cos). Pairs are (i, i
// + hd/2) for half-split, (2i, 2i+1) when interleaved. inverse = rotate by -angle (the backward).
// hd must be even.
void rope_rotate(Tensor& x, int64_t offset, double base, bool interleaved, bool inverse);

}  // namespace attn::nn
