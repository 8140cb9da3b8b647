// The activations and the feed-forward block: forward and backward (f32 on the vectorised kernels of
// nn/elementwise.h, f64 on the scalar reference below, bf16 under autocast or in bf16 modules).
#include <cmath>

#include "attn/nn/layers.h"
#include "core/parallel.h"
#include "nn/bf16.h"
#include "nn/elementwise.h"
#include "nn/ops.h"

namespace attn::nn {

using detail::fail;

// ---------------------------------------------------------------------------------------------------------
// Activations

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  if (name == "silu") return Activation::silu;
  fail("attn::nn::parse_activation",
       fmt::format("unknown activation '{}' (expected relu, gelu, gelu_tanh or silu)", name));
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::silu:
      return "silu";
  }
  return "?";
}

namespace {
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

// 1 / (1 + e^-x) without overflow: e^-x for x < 0 is written as e^x / (1 + e^x).
inline double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

// f(x) and f'(x) in double (the f64 path, and the tests' reference). Infinities give the limits.
inline double act_value(Activation a, double x) {
  if (std::isinf(x) && a != Activation::relu) return x > 0 ? x : -0.0;
  switch (a) {
    case Activation::relu:
      return x > 0 || std::isnan(x) ? x : 0.0;
    case Activation::gelu:  // Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation below 0
      return 0.5 * x * std::erfc(-x * kInvSqrt2);
    case Activation::gelu_tanh: {  // x / 2 (1 + tanh u) = x sigmoid(2u)
      const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
      return x * sigmoid(2 * u);
    }
    case Activation::silu:
      return x * sigmoid(x);
  }
  return 0;
}
inline double act_grad(Activation a, double x) {
  if (std::isinf(x)) return x > 0 ? 1.0 : 0.0;
  switch (a) {
    case Activation::relu:
      return x > 0 ? 1.0 : 0.0;
    case Activation::gelu:
      return 0.5 * std::erfc(-x * kInvSqrt2) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
    case Activation::gelu_tanh: {
      // d/dx x s(2u) = s(2u) + x s(2u) s(-2u) 2u'
      const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
      return sigmoid(2 * u) +
             x * sigmoid(2 * u) * sigmoid(-2 * u) * 2 * kSqrt2OverPi * (1.0 + 3 * 0.044715 * x * x);
    }
    case Activation::silu: {
      // d/dx x s(x) = s(x) (1 + x (1 - s(x))), with 1 - s(x) = s(-x) (no cancellation for large x)
      return sigmoid(x) * (1.0 + x * sigmoid(-x));
    }
  }
  return 0;
}

// The f64 path: x / dy (may alias y / dx) in chunks on attn's threads.
constexpr int64_t kF64Chunk = 8192;
void f64_forward(Activation a, const double* x, double* y, int64_t n) {
  parallel_for((n + kF64Chunk - 1) / kF64Chunk, n < 2 * kF64Chunk ? 1 : 0, [&](int64_t t, int) {
    for (int64_t i = t * kF64Chunk; i < std::min(n, (t + 1) * kF64Chunk); ++i)
      y[i] = act_value(a, x[i]);
  });
}
void f64_backward(Activation a, const double* x, const double* dy, double* dx, int64_t n) {
  parallel_for((n + kF64Chunk - 1) / kF64Chunk, n < 2 * kF64Chunk ? 1 : 0, [&](int64_t t, int) {
    for (int64_t i = t * kF64Chunk; i < std::min(n, (t + 1) * kF64Chunk); ++i)
      dx[i] = dy[i] * act_grad(a, x[i]);
  });
}
}  // namespace

Tensor ActivationLayer::forward(const Tensor& x) {
  constexpr const char* fn = "attn::nn::ActivationLayer::forward";
  if (!x.defined() || !is_floating(x.dtype())) fail(fn, "x must be a floating tensor");
  if (x.dtype() == DType::bf16) {
    // bf16 in, bf16 out, one pass (float lanes sized for bf16 results; ReLU exact); the
    // backward widens x_ and is the f32 one.
    x_ = x.contiguous();
    Tensor y = Tensor::empty(x.shape(), DType::bf16);
    ew::act_forward_bf16(kind_, x_.data_as<uint16_t>(), y.data_as<uint16_t>(), x_.numel());
    end_forward();
    return y;
  }
  const DType dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  x_ = detail::as_compute(x, dt);
  Tensor y = Tensor::empty(x.shape(), dt);
  if (dt == DType::f32)
    ew::act_forward(kind_, x_.data_as<float>(), y.data_as<float>(), x_.numel());
  else
    f64_forward(kind_, x_.data_as<double>(), y.data_as<double>(), x_.numel());
  end_forward();
  return y;
}

Tensor ActivationLayer::forward_biased(const Tensor& pre, const Tensor& bias) {
  x_ = pre;
  const int64_t cols = bias.numel();
  Tensor y = Tensor::empty(pre.shape(), DType::f32);
  ew::bias_act_forward(kind_, x_.data_as<float>(), bias.data_as<float>(), y.data_as<float>(),
                       cols == 0 ? 0 : pre.numel() / cols, cols);
  end_forward();
  return y;
}

Tensor ActivationLayer::backward(const Tensor& dy) {
  constexpr const char* fn = "attn::nn::ActivationLayer::backward";
  if (!x_.defined()) fail(fn, kNoForwardToGoBack);
  if (dy.numel() != x_.numel())
    fail(fn, fmt::format("dy {} does not match x {}", dy.shape_str(), x_.shape_str()));
  const Tensor x = x_.dtype() == DType::bf16 ? detail::convert(x_, DType::f32) : x_;
  const Tensor g = detail::as_compute(dy, x.dtype());
  Tensor dx = Tensor::empty(x.shape(), x.dtype());
  if (x.dtype() == DType::f32) {
    ew::act_backward(kind_, x.data_as<float>(), g.data_as<float>(), dx.data_as<float>(), x.numel());
  } else {
    f64_backward(kind_, x.data_as<double>(), g.data_as<double>(), dx.data_as<double>(), x.numel());
  }
  return dx;
}

// ---------------------------------------------------------------------------------------------------------
// FeedForward

FeedForward::FeedForward(int64_t d_model, int64_t d_ff, Activation activation, double dropout,
                         DType dtype, bool bias)
    : linear1(d_model, d_ff, bias, dtype),
      linear2(d_ff, d_model, bias, dtype),
      act_(activation),
      dropout_(dropout) {
  register_module("linear1", linear1);
  register_module("linear2", linear2);
  register_module("activation", act_);
  register_module("dropout", dropout_);
}

// f32 with bias: linear1's product without its bias, then one pass adds the bias and applies the
// activation (instead of writing the bias into the output first and reading the product back for the
// activation). dnnl_sgemm has no epilogue; oneDNN's matmul primitive has (bias and eltwise post-ops),
// but its GELU is its own approximation and the backward needs the pre-activation anyway.
// bf16: linear1's product kept in f32, the same fused pass, h rounded to bf16 for linear2.
Tensor FeedForward::forward(const Tensor& x) {
  Tensor h;
  if (detail::autocasts(linear1.dtype_)) return forward_autocast(x);
  if (linear1.bf16_fuses_activation()) {
    // The product's epilogue (attn's tile product, or oneDNN's matmul) adds the bias, applies the
    // activation in f32 and rounds once to bf16.
    return linear2.forward(dropout_.forward(linear1.product_bf16_activated(x, act_.kind_)));
  }
  if (linear1.dtype_ == DType::bf16) {
    // bf16 is inference only, so nothing keeps the f32 product [N, d_ff]: bias and activation run in
    // place over it (one buffer of N x d_ff floats fewer, and its page faults), then one rounding.
    Tensor pre = linear1.product_bf16(x, false, true);
    const int64_t cols = pre.size(-1), rows = cols == 0 ? 0 : pre.numel() / cols;
    float* ph = pre.data_as<float>();
    const bool drops = dropout_.is_training() && dropout_.p() > 0.0;
    if (linear1.bias_ && !drops) {
      // The activations rounded to bf16 but kept in f32 rows, which linear2's f32 path reads as
      // they are: no bf16 tensor [N, d_ff] and no pass widening it again (the same values).
      const Tensor b = detail::as_compute(linear1.bias_->value, DType::f32);
      ew::bias_act_round_bf16(act_.kind_, ph, b.data_as<float>(), rows, cols);
      return linear2.product_bf16_of_rounded(pre);
    }
    if (linear1.bias_) {
      const Tensor b = detail::as_compute(linear1.bias_->value, DType::f32);
      ew::bias_act_forward(act_.kind_, ph, b.data_as<float>(), ph, rows, cols);
    } else {
      ew::act_forward(act_.kind_, ph, ph, pre.numel());
    }
    h = detail::convert(pre, DType::bf16);
    return linear2.forward(dropout_.forward(h));
  }
  if (linear1.dtype_ == DType::f32 && linear1.bias_ != nullptr)
    h = act_.forward_biased(linear1.product(x, false), linear1.bias_->value);
  else
    h = act_.forward(linear1.forward(x));
  return linear2.forward(dropout_.forward(h));
}

// Autocast: linear1's bf16 product kept in f32 (the pre-activation, kept for the backward), then
// with a bias and no dropout one pass adds the bias, applies the activation and rounds to bf16 for
// linear2; otherwise bias and activation in f32, dropout, one rounding.
Tensor FeedForward::forward_autocast(const Tensor& x) {
  Tensor pre = linear1.product_autocast(x, false, true);
  const bool drops = dropout_.is_training() && dropout_.p() > 0.0;
  if (linear1.bias_ == nullptr || drops) {
    const Tensor h =
        linear1.bias_ ? act_.forward_biased(pre, linear1.bias_->value) : act_.forward(pre);
    return linear2.forward(detail::convert(dropout_.forward(h), DType::bf16));
  }
  const int64_t cols = pre.size(-1), rows = cols == 0 ? 0 : pre.numel() / cols;
  Tensor h = Tensor::empty(pre.shape(), DType::bf16);
  ew::bias_act_forward_bf16(act_.kind_, pre.data_as<float>(), linear1.bias_->value.data_as<float>(),
                            h.data_as<uint16_t>(), rows, cols);
  act_.x_ = pre;
  act_.end_forward();
  return linear2.forward(dropout_.forward(h));
}

Tensor FeedForward::backward(const Tensor& dy) {
  detail::check_backward_dtype(linear1.dtype_, "attn::nn::FeedForward::backward");
  const Tensor dh = dropout_.backward(linear2.backward(dy));
  if (linear1.cast_ && dh.dtype() == DType::bf16 && act_.x_.defined() &&
      act_.x_.dtype() == DType::f32) {
    // Autocast's fused pass: d pre = bf16(dh f'(pre)), linear1's db summed from it in f32.
    const int64_t cols = dh.size(-1), rows = cols == 0 ? 0 : dh.numel() / cols;
    const Tensor g = dh.contiguous();
    Tensor dpre = Tensor::empty(dh.shape(), DType::bf16);
    ew::act_backward_bf16(
        act_.kind_, act_.x_.data_as<float>(), g.data_as<uint16_t>(), dpre.data_as<uint16_t>(),
        linear1.bias_ ? linear1.bias_->grad.data_as<float>() : nullptr, rows, cols);
    return linear1.backward_autocast(dpre, false);
  }
  return linear1.backward(act_.backward(dh));
}

}  // namespace attn::nn
