// Training monitors: gradient norms (vanishing / exploding / non-finite warnings) and per-head
// attention entropy (heads that are near one-hot or near uniform).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attn/nn/module.h"

namespace attn::nn {

struct GradNormOptions {
  double vanishing =
      1e-7;  // a parameter whose gradient norm is below this (and not exactly 0) warns
  double exploding = 1e3;  // a total norm above this warns
  bool warn_zero = false;  // also warn on parameters whose gradient is exactly zero
};
struct GradNormReport {
  double total = 0.0;                                         // global L2 norm
  std::vector<std::pair<std::string, double>> per_parameter;  // name, L2 norm
  std::vector<std::string>
      warnings;  // "vanishing gradient: <name> norm 3e-09 < 1e-07", "exploding...", "non-finite..."
  bool ok() const { return warnings.empty(); }
};
GradNormReport check_gradients(const std::vector<NamedParameter>& params,
                               const GradNormOptions& options = {});

// Entropy of each attention row over the keys it may use, normalised by log(allowed keys) to [0, 1]
// (0 = one-hot, 1 = uniform), averaged per head over batch and rows. Rows with one allowed key are
// skipped.
struct EntropyOptions {
  Tensor key_padding_mask{};  // optional bool [B, Lk], true = padded key (not counted)
  bool causal = false;        // row i may use keys j <= i (top-left)
  double one_hot_below = 0.1;
  double uniform_above = 0.95;
};
struct HeadEntropy {
  int64_t head = 0;
  double entropy = 0.0;     // mean entropy in nats
  double normalized = 0.0;  // mean of entropy / log(allowed keys)
  bool near_one_hot = false;
  bool near_uniform = false;
};
struct EntropyReport {
  std::vector<HeadEntropy> heads;
  std::vector<std::string> warnings;  // "head 3: near one-hot (normalized entropy 0.02)"
};
// weights [B, H, Lq, Lk] (per-head weights: MhaOutput.weights with average_attn_weights = false, or
// TransformerEncoderLayer::attention_weights()).
EntropyReport attention_entropy(const Tensor& weights, const EntropyOptions& options = {});

}  // namespace attn::nn
