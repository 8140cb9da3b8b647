// Training pieces: cross-entropy, optimizers (SGD with momentum, AdamW), clipping by global norm,
// the warm-up + cosine learning-rate schedule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/nn/module.h"

namespace attn::nn {

// Cross-entropy over classes as torch.nn.functional.cross_entropy(reduction='mean'):
//   logits [N, C] (or [..., C], flattened), targets i32/i64 [N] (or [...]).
//   loss_n = (1 - eps) * (-log p[n, t_n]) + eps / C * sum_c (-log p[n, c]), averaged over the rows
//   whose target != ignore_index (0 when every row is ignored). Targets outside [0, C) that are not
//   ignore_index are refused.
struct CrossEntropyResult {
  double loss = 0.0;
  int64_t count = 0;  // rows that counted
  Tensor dlogits;     // d(loss)/d(logits), the shape and compute dtype (f32/f64) of the logits
};
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index = -100, double label_smoothing = 0.0);

// Optimizers update NamedParameter values in place from their gradients (the parameters share
// storage with the modules). The state (momentum, moments) has each parameter's dtype.
class Optimizer {
 public:
  explicit Optimizer(std::vector<NamedParameter> params, double lr)
      : params_(std::move(params)), lr_(lr) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  const std::vector<NamedParameter>& params() const { return params_; }
  // The optimizer's state as named tensors (for checkpoints with resume), shared, not copied:
  // "<param>.exp_avg" / "<param>.exp_avg_sq" and "step" [1] for AdamW, "<param>.momentum_buffer"
  // for SGD with momentum. load_state_dict copies them back, refusing missing names and bad shapes.
  virtual TensorList state_dict() const { return {}; }
  virtual void load_state_dict(const TensorList& state);

 protected:
  std::vector<NamedParameter> params_;
  double lr_;
};

// p -= lr * (g + wd p) with momentum buffer b = momentum * b + (1 - dampening) * g (PyTorch's SGD);
// nesterov uses g + momentum * b.
class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedParameter> params, double lr, double momentum = 0.0,
      double weight_decay = 0.0, bool nesterov = false, double dampening = 0.0);
  void step() override;
  TensorList state_dict() const override;
  void load_state_dict(const TensorList& state) override;

 private:
  double momentum_, weight_decay_, dampening_;
  bool nesterov_;
  std::vector<Tensor> buf_;
  bool first_ = true;
};

// AdamW (Loshchilov & Hutter) as torch.optim.AdamW: p *= 1 - lr * wd; m, v moments with bias
// correction; p -= lr * m_hat / (sqrt(v_hat) + eps).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<NamedParameter> params, double lr = 1e-3, double beta1 = 0.9,
        double beta2 = 0.999, double eps = 1e-8, double weight_decay = 1e-2);
  void step() override;
  int64_t steps() const { return t_; }
  TensorList state_dict() const override;
  void load_state_dict(const TensorList& state) override;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

// The global L2 norm of all gradients; scales them by max_norm / (norm + 1e-6) when the norm
// exceeds max_norm (torch.nn.utils.clip_grad_norm_). Returns the norm before clipping. A NaN
// norm (a NaN gradient) is returned and the gradients are left as they are (torch
// scales them all to NaN): check the norm before stepping.
double clip_grad_norm(const std::vector<NamedParameter>& params, double max_norm);
double grad_norm(const std::vector<NamedParameter>& params);

// lr(step): linear warm-up from 0 to base_lr over warmup_steps, then a cosine decay to min_lr at
// total_steps, min_lr afterwards. step counts from 0.
struct WarmupCosine {
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr = 0.0;
  double operator()(int64_t step) const;
};

}  // namespace attn::nn
