// Cross-entropy, SGD, AdamW, gradient clipping, the warm-up + cosine schedule.
#include "attn/nn/training.h"

#include <cmath>
#include <numbers>

#include "nn/ops.h"

namespace attn::nn {

using detail::dispatch;
using detail::fail;

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 double label_smoothing) {
  constexpr const char* fn = "attn::nn::cross_entropy";
  if (!logits.defined() || !is_floating(logits.dtype()) || logits.dim() < 1) {
    fail(fn, "logits must be a floating tensor [..., C]");
  }
  if (!targets.defined() || (targets.dtype() != DType::i32 && targets.dtype() != DType::i64)) {
    fail(fn, "targets must be i32 or i64");
  }
  const int64_t C = logits.size(-1);
  const int64_t N = C > 0 ? logits.numel() / C : 0;
  if (targets.numel() != N || C == 0) {
    fail(fn, fmt::format("targets {} must have one entry per row of logits {} ([..., C], C > 0)",
                         targets.shape_str(), logits.shape_str()));
  }
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
    fail(fn, fmt::format("label_smoothing must be in [0, 1], got {}", label_smoothing));
  }
  const DType dt = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor x = detail::as_compute(logits, dt);
  const std::vector<double> t = targets.to_vector();
  CrossEntropyResult r;
  for (int64_t n = 0; n < N; ++n) {
    if (static_cast<int64_t>(t[n]) == ignore_index) continue;
    if (t[n] < 0 || t[n] >= static_cast<double>(C)) {
      fail(fn, fmt::format("target {} at row {} is outside [0, {}) and not ignore_index ({})", t[n],
                           n, C, ignore_index));
    }
    ++r.count;
  }
  r.dlogits = Tensor::zeros(logits.shape(), dt);
  if (r.count == 0) return r;
  const double eps = label_smoothing;
  const double inv_count = 1.0 / static_cast<double>(r.count);
  double total = 0.0;
  dispatch(dt, fn, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t target = static_cast<int64_t>(t[n]);
      if (target == ignore_index) continue;
      const T* row = x.data_as<T>() + n * C;
      T* d = r.dlogits.data_as<T>() + n * C;
      double mx = -INFINITY;
      for (int64_t c = 0; c < C; ++c) mx = std::max<double>(mx, row[c]);
      double sum = 0.0;
      for (int64_t c = 0; c < C; ++c) sum += std::exp(row[c] - mx);
      const double lse = mx + std::log(sum);
      double sum_neg_logp = 0.0;
      for (int64_t c = 0; c < C; ++c) sum_neg_logp += lse - row[c];
      // Each term only where its weight is not 0: a -inf logit makes -log p infinite, and 0 * inf
      // was NaN (logits [0, -inf, 1], target 0, no smoothing: NaN instead of log(1 + e)).
      if (eps < 1.0) total += (1.0 - eps) * (lse - row[target]);
      if (eps > 0.0) total += eps / static_cast<double>(C) * sum_neg_logp;
      // d/dz_c = p_c - (1 - eps) [c == t] - eps / C, divided by the count of rows (mean)
      for (int64_t c = 0; c < C; ++c) {
        const double p = std::exp(row[c] - lse);
        const double g = p - (c == target ? 1.0 - eps : 0.0) - eps / static_cast<double>(C);
        d[c] = static_cast<T>(g * inv_count);
      }
    }
  });
  r.loss = total * inv_count;
  return r;
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.grad.fill(0.0);
}

SGD::SGD(std::vector<NamedParameter> params, double lr, double momentum, double weight_decay,
         bool nesterov, double dampening)
    : Optimizer(std::move(params), lr),
      momentum_(momentum),
      weight_decay_(weight_decay),
      dampening_(dampening),
      nesterov_(nesterov) {
  if (!(lr >= 0) || !(momentum >= 0) || !(weight_decay >= 0)) {
    fail("attn::nn::SGD", fmt::format("lr, momentum, weight_decay must be >= 0, got {}, {}, {}", lr,
                                      momentum, weight_decay));
  }
  if (nesterov && (momentum <= 0 || dampening != 0)) {
    fail("attn::nn::SGD", "nesterov needs momentum > 0 and dampening 0");
  }
  for (auto& p : params_) buf_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    NamedParameter& p = params_[i];
    dispatch(p.value.dtype(), "attn::nn::SGD::step", [&](auto tag) {
      using T = decltype(tag);
      T* w = p.value.data_as<T>();
      const T* g = p.grad.data_as<T>();
      T* b = buf_[i].data_as<T>();
      for (int64_t e = 0; e < p.value.numel(); ++e) {
        double d = g[e] + weight_decay_ * w[e];
        if (momentum_ > 0) {
          // PyTorch: the first step sets the buffer to the gradient itself.
          b[e] = static_cast<T>(first_ ? d : momentum_ * b[e] + (1.0 - dampening_) * d);
          d = nesterov_ ? d + momentum_ * b[e] : static_cast<double>(b[e]);
        }
        w[e] = static_cast<T>(w[e] - lr_ * d);
      }
    });
  }
  first_ = false;
}

AdamW::AdamW(std::vector<NamedParameter> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer(std::move(params), lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay) {
  if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0) ||
      !(weight_decay >= 0)) {
    fail("attn::nn::AdamW",
         fmt::format("invalid hyper-parameters lr {}, betas ({}, {}), eps {}, weight_decay {}", lr,
                     beta1, beta2, eps, weight_decay));
  }
  for (auto& p : params_) {
    m_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
    v_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
  }
}

void AdamW::step() {
  ++t_;
  const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    NamedParameter& p = params_[i];
    dispatch(p.value.dtype(), "attn::nn::AdamW::step", [&](auto tag) {
      using T = decltype(tag);
      T* w = p.value.data_as<T>();
      const T* g = p.grad.data_as<T>();
      T* m = m_[i].data_as<T>();
      T* v = v_[i].data_as<T>();
      for (int64_t e = 0; e < p.value.numel(); ++e) {
        const double ge = g[e];
        m[e] = static_cast<T>(beta1_ * m[e] + (1.0 - beta1_) * ge);
        v[e] = static_cast<T>(beta2_ * v[e] + (1.0 - beta2_) * ge * ge);
        const double denom = std::sqrt(v[e] / bc2) + eps_;
        w[e] = static_cast<T>(w[e] * (1.0 - lr_ * weight_decay_) - lr_ * (m[e] / bc1) / denom);
      }
    });
  }
}

namespace {

// Copies state tensors by name into `targets` (same order as `names`); every name must be present
// with the target's shape. All are checked before any is copied: a refused state changes nothing.
void load_named(const char* fn, const TensorList& state, const std::vector<std::string>& names,
                std::vector<Tensor>& targets) {
  std::vector<const Tensor*> found(names.size(), nullptr);
  for (size_t i = 0; i < names.size(); ++i) {
    for (const auto& [name, t] : state) {
      if (name == names[i]) found[i] = &t;
    }
    if (!found[i]) fail(fn, fmt::format("optimizer state '{}' is missing", names[i]));
    if (found[i]->shape() != targets[i].shape()) {
      fail(fn, fmt::format("optimizer state '{}' has shape {}, expected {}", names[i],
                           found[i]->shape_str(), targets[i].shape_str()));
    }
  }
  for (size_t i = 0; i < names.size(); ++i) targets[i].copy_from(*found[i]);
}

}  // namespace

void Optimizer::load_state_dict(const TensorList& state) {
  if (!state.empty())
    fail("attn::nn::Optimizer::load_state_dict", "this optimizer has no state to load");
}

TensorList SGD::state_dict() const {
  TensorList out;
  if (first_ || momentum_ == 0.0) return out;
  for (size_t i = 0; i < params_.size(); ++i)
    out.push_back({params_[i].name + ".momentum_buffer", buf_[i]});
  return out;
}

void SGD::load_state_dict(const TensorList& state) {
  if (state.empty()) return;
  std::vector<std::string> names;
  for (const auto& p : params_) names.push_back(p.name + ".momentum_buffer");
  if (buf_.size() != params_.size()) {
    buf_.clear();
    for (const auto& p : params_) buf_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
  }
  load_named("attn::nn::SGD::load_state_dict", state, names, buf_);
  first_ = false;
}

TensorList AdamW::state_dict() const {
  TensorList out;
  Tensor step = Tensor::from_vector({1}, {static_cast<double>(t_)}, DType::i64);
  out.push_back({"step", step});
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i].name + ".exp_avg", m_[i]});
    out.push_back({params_[i].name + ".exp_avg_sq", v_[i]});
  }
  return out;
}

void AdamW::load_state_dict(const TensorList& state) {
  constexpr const char* fn = "attn::nn::AdamW::load_state_dict";
  std::vector<std::string> names;
  std::vector<Tensor> targets;
  for (size_t i = 0; i < params_.size(); ++i) {
    names.push_back(params_[i].name + ".exp_avg");
    targets.push_back(m_[i]);
    names.push_back(params_[i].name + ".exp_avg_sq");
    targets.push_back(v_[i]);
  }
  // 'step' is checked before the moments are copied, so a refused state leaves the optimizer as it was.
  std::vector<Tensor> step{Tensor::zeros({1}, DType::i64)};
  load_named(fn, state, {"step"}, step);
  const auto t = static_cast<int64_t>(step[0].at({0}));
  if (t < 0) fail(fn, fmt::format("optimizer state 'step' is negative ({})", t));
  load_named(fn, state, names, targets);  // targets share storage with m_ and v_
  t_ = t;
}

double grad_norm(const std::vector<NamedParameter>& params) {
  double sq = 0.0;
  for (const auto& p : params) {
    dispatch(p.grad.dtype(), "attn::nn::grad_norm", [&](auto tag) {
      using T = decltype(tag);
      const T* g = p.grad.data_as<T>();
      for (int64_t e = 0; e < p.grad.numel(); ++e) sq += static_cast<double>(g[e]) * g[e];
    });
  }
  return std::sqrt(sq);
}

double clip_grad_norm(const std::vector<NamedParameter>& params, double max_norm) {
  if (!(max_norm > 0))
    fail("attn::nn::clip_grad_norm", fmt::format("max_norm must be > 0, got {}", max_norm));
  const double norm = grad_norm(params);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (const auto& p : params) {
      dispatch(p.grad.dtype(), "attn::nn::clip_grad_norm", [&](auto tag) {
        using T = decltype(tag);
        T* g = p.grad.data_as<T>();
        for (int64_t e = 0; e < p.grad.numel(); ++e) g[e] = static_cast<T>(g[e] * coef);
      });
    }
  }
  return norm;
}

double WarmupCosine::operator()(int64_t step) const {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = static_cast<double>(step - warmup_steps) / span;
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace attn::nn
