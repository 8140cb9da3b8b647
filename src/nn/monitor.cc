// Gradient-norm and attention-entropy monitors.
#include "attn/nn/monitor.h"

#include <cmath>

#include "nn/ops.h"

namespace attn::nn {

using detail::fail;

GradNormReport check_gradients(const std::vector<NamedParameter>& params,
                               const GradNormOptions& o) {
  GradNormReport r;
  double sq = 0;
  for (const auto& p : params) {
    double s = 0;
    bool finite = true;
    for (double v : p.grad.to_vector()) {
      if (!std::isfinite(v)) finite = false;
      s += v * v;
    }
    const double norm = std::sqrt(s);
    r.per_parameter.emplace_back(p.name, norm);
    sq += s;
    if (!finite) {
      r.warnings.push_back(fmt::format("non-finite gradient: {}", p.name));
    } else if ((norm > 0 || o.warn_zero) && norm < o.vanishing) {
      r.warnings.push_back(
          fmt::format("vanishing gradient: {} norm {:.3g} < {:.3g}", p.name, norm, o.vanishing));
    }
  }
  r.total = std::sqrt(sq);
  if (std::isfinite(r.total) && r.total > o.exploding) {
    r.warnings.push_back(
        fmt::format("exploding gradient: total norm {:.3g} > {:.3g}", r.total, o.exploding));
  }
  return r;
}

EntropyReport attention_entropy(const Tensor& weights, const EntropyOptions& o) {
  constexpr const char* fn = "attn::nn::attention_entropy";
  if (!weights.defined() || !is_floating(weights.dtype()) || weights.dim() != 4) {
    fail(fn, fmt::format("weights must be floating [B, H, Lq, Lk], got {}",
                         weights.defined() ? weights.shape_str() : "undefined"));
  }
  const int64_t B = weights.size(0), H = weights.size(1), Lq = weights.size(2),
                Lk = weights.size(3);
  std::vector<double> kpm;
  if (o.key_padding_mask.defined()) {
    const Tensor& m = o.key_padding_mask;
    if (m.dtype() != DType::boolean || m.dim() != 2 || m.size(0) != B || m.size(1) != Lk) {
      fail(fn, fmt::format("key_padding_mask must be bool [B = {}, Lk = {}], got {}", B, Lk,
                           m.shape_str()));
    }
    kpm = m.to_vector();
  }
  const std::vector<double> w = weights.to_vector();
  EntropyReport r;
  for (int64_t h = 0; h < H; ++h) {
    double sum_e = 0, sum_n = 0;
    int64_t rows = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Lq; ++i) {
        int64_t allowed = 0;
        double e = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          if (o.causal && j > i) continue;
          if (!kpm.empty() && kpm[b * Lk + j] != 0) continue;
          ++allowed;
          const double p = w[((b * H + h) * Lq + i) * Lk + j];
          if (p > 0) e -= p * std::log(p);
        }
        if (allowed < 2) continue;
        sum_e += e;
        sum_n += e / std::log(static_cast<double>(allowed));
        ++rows;
      }
    HeadEntropy he;
    he.head = h;
    if (rows > 0) {
      he.entropy = sum_e / static_cast<double>(rows);
      he.normalized = sum_n / static_cast<double>(rows);
      he.near_one_hot = he.normalized < o.one_hot_below;
      he.near_uniform = he.normalized > o.uniform_above;
    }
    if (he.near_one_hot) {
      r.warnings.push_back(
          fmt::format("head {}: near one-hot (normalized entropy {:.3f})", h, he.normalized));
    }
    if (he.near_uniform) {
      r.warnings.push_back(
          fmt::format("head {}: near uniform (normalized entropy {:.3f})", h, he.normalized));
    }
    r.heads.push_back(he);
  }
  return r;
}

}  // namespace attn::nn
