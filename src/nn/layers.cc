// Linear, LayerNorm, Dropout and Embedding: forward and backward (the activations and the
// feed-forward block: feed_forward.cc).
#include "attn/nn/layers.h"

#include <cmath>
#include <random>

#include "contract/dropout.h"
#include "core/parallel.h"
#include "nn/bf16.h"
#include "nn/elementwise.h"
#include "nn/ops.h"

namespace attn::nn {

using detail::dispatch;
using detail::fail;

// ---------------------------------------------------------------------------------------------------------
// Initialisation

namespace {
thread_local int g_skip_init = 0;  // SkipInit objects alive on this thread
}  // namespace

SkipInit::SkipInit() {
  ++g_skip_init;
}
SkipInit::~SkipInit() {
  --g_skip_init;
}

void init_uniform(Tensor& t, double bound) {
  if (g_skip_init > 0) return t.fill(0.0);
  std::mt19937_64 g(next_seed());
  std::uniform_real_distribution<double> u(-bound, bound);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (double& x : v) x = u(g);
  t.copy_from(Tensor::from_vector(t.shape(), v, DType::f64));
}

void init_normal(Tensor& t, double stddev) {
  if (g_skip_init > 0) return t.fill(0.0);
  std::mt19937_64 g(next_seed());
  std::normal_distribution<double> n(0.0, stddev);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (double& x : v) x = n(g);
  t.copy_from(Tensor::from_vector(t.shape(), v, DType::f64));
}

void init_weight(Tensor& w, Init init) {
  const double fan_out = static_cast<double>(w.size(0));
  const double fan_in = static_cast<double>(w.numel()) / std::max(1.0, fan_out);
  switch (init) {
    case Init::pytorch_default:
      init_uniform(w, 1.0 / std::sqrt(std::max(1.0, fan_in)));
      return;
    case Init::xavier_uniform:
      init_uniform(w, std::sqrt(6.0 / std::max(1.0, fan_in + fan_out)));
      return;
    case Init::kaiming_uniform:
      init_uniform(w, std::sqrt(6.0 / std::max(1.0, fan_in)));
      return;
    case Init::kaiming_normal:
      init_normal(w, std::sqrt(2.0 / std::max(1.0, fan_in)));
      return;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Linear: y [N, out] = x [N, in] W^T [in, out] + b

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype, Init init)
    : in_(in_features), out_(out_features), dtype_(dtype) {
  detail::check_module_dtype(dtype, "attn::nn::Linear");
  if (in_features < 0 || out_features < 0) {
    fail("attn::nn::Linear",
         fmt::format("feature counts must be >= 0, got in {} out {}", in_features, out_features));
  }
  Tensor w = Tensor::empty({out_, in_}, dtype);
  init_weight(w, init);
  weight_ = &register_parameter("weight", w);
  if (bias) {
    Tensor b = Tensor::zeros({out_}, dtype);
    if (init == Init::pytorch_default) init_uniform(b, 1.0 / std::sqrt(std::max<double>(1.0, in_)));
    bias_ = &register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) {
  return product(x, true);
}

// y = x W^T (+ b when add_bias: written first, the GEMM adds onto it).
Tensor Linear::product(const Tensor& x, bool add_bias) {
  if (dtype_ == DType::bf16) return product_bf16(x, add_bias, false);
  if (detail::autocasts(dtype_)) return product_autocast(x, add_bias, false);
  cast_ = false;
  x_ = detail::rows_of(x, in_, dtype_, "attn::nn::Linear::forward", "x");
  x_shape_ = x.shape();
  const int64_t N = x_.size(0);
  Shape out_shape = x_shape_;
  out_shape.back() = out_;
  Tensor y = Tensor::empty({N, out_}, dtype_);
  const bool bias = add_bias && bias_ != nullptr;
  dispatch(dtype_, "attn::nn::Linear::forward", [&](auto t) {
    using T = decltype(t);
    detail::linear_forward(x_.data_as<T>(), N, in_, weight_->value.data_as<T>(),
                           bias ? bias_->value.data_as<T>() : nullptr, out_, y.data_as<T>());
  });
  end_forward();
  return y.view(out_shape);
}

namespace {

// y [..., out] = rows [N, in] of x times w^T through gemm_bf16 (f32 accumulation), kept in f32
// (f32_out) or rounded to bf16; g names the rows (bf16 x, or f32 x32), the bias and the activation.
Tensor bf16_product(detail::Bf16Gemm g, const Shape& x_shape, int64_t N, int64_t in,
                    const Tensor& w, bool f32_out) {
  const int64_t out = w.size(0);
  Shape out_shape = x_shape;
  out_shape.back() = out;
  Tensor y = Tensor::empty({N, out}, f32_out ? DType::f32 : DType::bf16);
  g.M = N, g.N = out, g.K = in;
  g.w = w.data_as<uint16_t>();
  if (f32_out) {
    g.y32 = y.data_as<float>();
  } else {
    g.y16 = y.data_as<uint16_t>();
  }
  detail::gemm_bf16(g);
  return y.view(out_shape);
}

}  // namespace

// bf16: x rounded to bf16 on entry, the product accumulated in f32 (nn/bf16.h), then rounded to
// bf16 or, for FeedForward's fused bias + activation pass, kept in f32. Nothing is cached.
Tensor Linear::product_bf16(const Tensor& x, bool add_bias, bool f32_out) {
  const Tensor xb = detail::rows_of(x, in_, DType::bf16, "attn::nn::Linear::forward", "x");
  const bool bias = add_bias && bias_ != nullptr;
  return bf16_product(
      {.x = xb.data_as<uint16_t>(), .bias = bias ? bias_->value.data_as<uint16_t>() : nullptr},
      x.shape(), xb.size(0), in_, weight_->value, f32_out);
}

Tensor Linear::product_bf16_of_rounded(const Tensor& x) {
  return bf16_product({.x32 = x.data_as<float>(),
                       .bias = bias_ != nullptr ? bias_->value.data_as<uint16_t>() : nullptr},
                      x.shape(), in_ == 0 ? 0 : x.numel() / in_, in_, weight_->value, false);
}

bool Linear::bf16_fuses_activation() const {
  return dtype_ == DType::bf16 && in_ > 0 && detail::bf16_fuses_activations();
}

Tensor Linear::product_bf16_activated(const Tensor& x, Activation act) {
  const Tensor xb = detail::rows_of(x, in_, DType::bf16, "attn::nn::Linear::forward", "x");
  return bf16_product({.x = xb.data_as<uint16_t>(),
                       .bias = bias_ != nullptr ? bias_->value.data_as<uint16_t>() : nullptr,
                       .activation = act},
                      x.shape(), xb.size(0), in_, weight_->value, false);
}

Tensor Linear::product_autocast(const Tensor& x, bool add_bias, bool f32_out) {
  const Tensor xb = detail::rows_of(x, in_, DType::bf16, "attn::nn::Linear::forward", "x");
  const Tensor w16 = detail::convert(weight_->value, DType::bf16);
  const Tensor b16 =
      add_bias && bias_ != nullptr ? detail::convert(bias_->value, DType::bf16) : Tensor();
  Tensor y = bf16_product(
      {.x = xb.data_as<uint16_t>(), .bias = b16.defined() ? b16.data_as<uint16_t>() : nullptr},
      x.shape(), xb.size(0), in_, w16, f32_out);
  x_ = xb, w16_ = w16, x_shape_ = x.shape(), x_dtype_ = x.dtype(), cast_ = true;
  end_forward();
  return y;
}

// dx = dy W and dW += dy^T x as bf16 products (f32 accumulation, straight into the f32 gradient);
// db += the column sums of dy as it comes (f32 before any rounding). dx in the forward input's
// dtype: bf16 rounded once, else f32.
Tensor Linear::backward_autocast(const Tensor& dy_in, bool bias_grad) {
  constexpr const char* fn = "attn::nn::Linear::backward";
  const Tensor dy = detail::rows_of(dy_in, out_, DType::bf16, fn, "dy");
  const int64_t N = x_.size(0);
  if (dy.size(0) != N)
    fail(fn, fmt::format("dy {} does not match the forward's input {}", dy_in.shape_str(),
                         shape_to_string(x_shape_)));
  // dy as it came, for the bias sums before rounding (f32), or the bf16 rows themselves.
  const bool db = bias_ != nullptr && bias_grad;
  const Tensor dy32 = dy_in.dtype() == DType::f32 && db
                          ? detail::rows_of(dy_in, out_, DType::f32, fn, "dy")
                          : Tensor();
  const bool dx16 = x_dtype_ == DType::bf16;
  Tensor dx = Tensor::empty({N, in_}, dx16 ? DType::bf16 : DType::f32);
  detail::linear_backward_bf16({.N = N,
                                .in = in_,
                                .out = out_,
                                .dy = dy.data_as<uint16_t>(),
                                .dy32 = dy32.defined() ? dy32.data_as<float>() : nullptr,
                                .x = x_.data_as<uint16_t>(),
                                .w = w16_.data_as<uint16_t>(),
                                .gw = weight_->grad.data_as<float>(),
                                .gb = db ? bias_->grad.data_as<float>() : nullptr,
                                .dx32 = dx16 ? nullptr : dx.data_as<float>(),
                                .dx16 = dx16 ? dx.data_as<uint16_t>() : nullptr});
  dx = dx.view(x_shape_);
  return x_dtype_ == DType::f64 ? dx.to(DType::f64) : dx;
}

Tensor Linear::backward(const Tensor& dy_in) {
  constexpr const char* fn = "attn::nn::Linear::backward";
  detail::check_backward_dtype(dtype_, fn);
  if (!x_.defined()) fail(fn, kNoForwardToGoBack);
  if (cast_) return backward_autocast(dy_in);
  const Tensor dy = detail::rows_of(dy_in, out_, dtype_, fn, "dy");
  const int64_t N = x_.size(0);
  if (dy.size(0) != N)
    fail(fn, fmt::format("dy {} does not match the forward's input {}", dy_in.shape_str(),
                         shape_to_string(x_shape_)));
  Tensor dx = Tensor::empty({N, in_}, dtype_);
  dispatch(dtype_, fn, [&](auto t) {
    using T = decltype(t);
    detail::linear_backward(dy.data_as<T>(), x_.data_as<T>(), N, in_, out_,
                            weight_->value.data_as<T>(), weight_->grad.data_as<T>(),
                            bias_ ? bias_->grad.data_as<T>() : nullptr, dx.data_as<T>());
  });
  if (out_ == 0) dx.fill(0.0);
  return dx.view(x_shape_);
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm over the last dim

LayerNorm::LayerNorm(int64_t d, double eps, bool elementwise_affine, bool bias, DType dtype)
    : d_(d), eps_(eps), dtype_(dtype) {
  detail::check_module_dtype(dtype, "attn::nn::LayerNorm");
  if (!(eps > 0)) fail("attn::nn::LayerNorm", fmt::format("eps must be > 0, got {}", eps));
  if (elementwise_affine) {
    weight_ = &register_parameter("weight", Tensor::full({d}, 1.0, dtype));
    if (bias) bias_ = &register_parameter("bias", Tensor::zeros({d}, dtype));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  Tensor y = run_forward(x, nullptr);
  end_forward();
  return y;
}

Tensor LayerNorm::forward_residual(const Tensor& x, const Tensor& residual) {
  Tensor y = run_forward(x, &residual);
  end_forward();
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  return run_backward(dy, nullptr);
}

Tensor LayerNorm::backward_sum(const Tensor& dy, const Tensor& dy2) {
  return run_backward(dy, &dy2);
}

// f32: one vectorised pass per row over x (+ residual), statistics in double (elementwise.h); f64:
// two passes in double.
// bf16: the f32 pass on x (and the residual) widened row by row inside it (not rounded first when
// they come in f32), each output row rounded to bf16 there; bf16 inputs of an f32 module are widened
// the same way.
namespace {
// A LayerNorm kernel operand: the tensor's data when it has that dtype, else null.
float* f32_rows(const Tensor& t) {
  return t.defined() && t.dtype() == DType::f32 ? t.data_as<float>() : nullptr;
}
uint16_t* bf16_rows(const Tensor& t) {
  return t.defined() && t.dtype() == DType::bf16 ? t.data_as<uint16_t>() : nullptr;
}
}  // namespace

Tensor LayerNorm::run_forward(const Tensor& x_in, const Tensor* residual) {
  constexpr const char* fn = "attn::nn::LayerNorm::forward";
  const bool bf16 = dtype_ == DType::bf16;
  const DType dt = bf16 ? DType::f32 : dtype_;
  // An input's rows in the dtype the kernel reads: bf16 as it is when computing in f32.
  const auto rows = [&](const Tensor& t, const char* name) {
    const bool as_bf16 = dt == DType::f32 && t.defined() && t.dtype() == DType::bf16;
    return detail::rows_of(t, d_, as_bf16 ? DType::bf16 : dt, fn, name);
  };
  const Tensor x = rows(x_in, "x");
  Tensor r;
  if (residual) {
    r = rows(*residual, "residual");
    if (residual->shape() != x_in.shape()) {
      fail(fn, fmt::format("residual {} must have x's shape {}", residual->shape_str(),
                           x_in.shape_str()));
    }
  }
  shape_ = x_in.shape();
  const int64_t N = x.size(0);
  const bool cast = detail::autocasts(dtype_);
  Tensor y = Tensor::empty({N, d_}, cast ? DType::bf16 : dtype_);
  release_cache();
  cast_ = cast, x_dtype_ = x_in.dtype();
  if (dt == DType::f32) {
    // bf16 modules run inference only: nothing is kept for a backward. f32 keeps the input rows (no
    // copy) and the statistics.
    if (!bf16) {
      x_ = x;
      r_ = r;
      stats_ = Tensor::empty({N, 3}, DType::f32);
    }
    const Tensor w = weight_ ? detail::as_compute(weight_->value, dt) : Tensor();
    const Tensor b = bias_ ? detail::as_compute(bias_->value, dt) : Tensor();
    ew::layer_norm_forward({.x = f32_rows(x),
                            .r = f32_rows(r),
                            .w = f32_rows(w),
                            .b = f32_rows(b),
                            .y = f32_rows(y),
                            .stats = f32_rows(stats_),
                            .rows = N,
                            .d = d_,
                            .eps = eps_,
                            .x16 = bf16_rows(x),
                            .r16 = bf16_rows(r),
                            .y16 = bf16_rows(y)});
    return y.view(shape_);
  }
  xhat_ = Tensor::empty({N, d_}, dt);
  rstd_ = Tensor::empty({N}, dt);
  const Tensor s = residual ? detail::add(x, r) : x;
  const double* w = weight_ ? weight_->value.data_as<double>() : nullptr;
  const double* b = bias_ ? bias_->value.data_as<double>() : nullptr;
  for (int64_t n = 0; n < N; ++n) {
    const double* xr = s.data_as<double>() + n * d_;
    // Two passes: mean, then the variance around it (no cancellation).
    double mean = 0;
    for (int64_t i = 0; i < d_; ++i) mean += xr[i];
    mean /= static_cast<double>(d_);
    double var = 0;
    for (int64_t i = 0; i < d_; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(d_);
    const double rstd = 1.0 / std::sqrt(var + eps_);
    rstd_.data_as<double>()[n] = rstd;
    double* h = xhat_.data_as<double>() + n * d_;
    double* yr = y.data_as<double>() + n * d_;
    for (int64_t i = 0; i < d_; ++i) {
      h[i] = (xr[i] - mean) * rstd;
      yr[i] = (w ? h[i] * w[i] : h[i]) + (b ? b[i] : 0.0);
    }
  }
  return y.view(shape_);
}

Tensor LayerNorm::run_backward(const Tensor& dy_in, const Tensor* dy2_in) {
  constexpr const char* fn = "attn::nn::LayerNorm::backward";
  detail::check_backward_dtype(dtype_, fn);
  const bool f32 = dtype_ == DType::f32;
  if (!(f32 ? stats_ : xhat_).defined()) fail(fn, kNoForwardToGoBack);
  const Tensor dy = detail::rows_of(dy_in, d_, dtype_, fn, "dy");
  const int64_t N = (f32 ? stats_ : xhat_).size(0);
  if (dy.size(0) != N)
    fail(fn, fmt::format("dy {} does not match the forward's input", dy_in.shape_str()));
  Tensor dy2;
  if (dy2_in) {
    dy2 = detail::rows_of(*dy2_in, d_, dtype_, fn, "dy2");
    if (dy2.size(0) != N)
      fail(fn, fmt::format("dy2 {} does not match the forward's input", dy2_in->shape_str()));
  }
  Tensor dx = Tensor::empty({N, d_}, dtype_);
  if (f32) {
    ew::layer_norm_backward({.dy = dy.data_as<float>(),
                             .dy2 = dy2_in ? dy2.data_as<float>() : nullptr,
                             .x = f32_rows(x_),
                             .r = f32_rows(r_),
                             .x16 = bf16_rows(x_),
                             .r16 = bf16_rows(r_),
                             .stats = stats_.data_as<float>(),
                             .w = weight_ ? weight_->value.data_as<float>() : nullptr,
                             .dx = dx.data_as<float>(),
                             .dw = weight_ ? weight_->grad.data_as<float>() : nullptr,
                             .db = bias_ ? bias_->grad.data_as<float>() : nullptr,
                             .rows = N,
                             .d = d_});
    if (cast_ && x_dtype_ != DType::f32) dx = detail::convert(dx, x_dtype_);  // its input dtype
    return dx.view(shape_);
  }
  const Tensor gsum = dy2_in ? detail::add(dy, dy2) : dy;
  const double* w = weight_ ? weight_->value.data_as<double>() : nullptr;
  for (int64_t n = 0; n < N; ++n) {
    const double* g = gsum.data_as<double>() + n * d_;
    const double* h = xhat_.data_as<double>() + n * d_;
    double* dxr = dx.data_as<double>() + n * d_;
    // y = h * w + b; dh = dy * w; dx = rstd * (dh - mean(dh) - h * mean(dh * h))
    double sum_dh = 0, sum_dh_h = 0;
    for (int64_t i = 0; i < d_; ++i) {
      const double dh = w ? g[i] * w[i] : g[i];
      sum_dh += dh;
      sum_dh_h += dh * h[i];
      if (weight_) weight_->grad.data_as<double>()[i] += g[i] * h[i];
      if (bias_) bias_->grad.data_as<double>()[i] += g[i];
    }
    const double rstd = rstd_.data_as<double>()[n];
    const double inv_d = 1.0 / static_cast<double>(d_);
    for (int64_t i = 0; i < d_; ++i) {
      const double dh = w ? g[i] * w[i] : g[i];
      dxr[i] = rstd * (dh - sum_dh * inv_d - h[i] * sum_dh_h * inv_d);
    }
  }
  return dx.view(shape_);
}

// ---------------------------------------------------------------------------------------------------------
// Dropout

Dropout::Dropout(double p) : p_(p), seed_(next_seed()) {
  if (!(p >= 0.0 && p < 1.0))
    fail("attn::nn::Dropout", fmt::format("p must be in [0, 1), got {}", p));
}

void Dropout::on_seed(uint64_t seed) {
  seed_ = seed;
  calls_ = 0;
}

// f32 and bf16 through the element-wise kernels (multithreaded, 16 counters per step on AVX-512),
// f64 (gradient checks) element by element here; the same pattern either way.
Tensor Dropout::apply(const Tensor& x, uint64_t seed, uint64_t call) const {
  const uint32_t threshold = contract::dropout_threshold(p_);
  const int64_t n = x.numel();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  if (x.dtype() != DType::f64) {
    const ew::DropoutDraw d{seed, call, threshold, static_cast<float>(1.0 / (1.0 - p_))};
    if (x.dtype() == DType::bf16) {
      ew::dropout_bf16(d, x.data_as<uint16_t>(), y.data_as<uint16_t>(), n);
    } else {
      ew::dropout_f32(d, x.data_as<float>(), y.data_as<float>(), n);
    }
    return y;
  }
  const double keep_scale = 1.0 / (1.0 - p_);
  const double* xp = x.data_as<double>();
  double* yp = y.data_as<double>();
  uint32_t r[4];
  for (int64_t e4 = 0; e4 * 4 < n; ++e4) {
    contract::element_draws4(seed, call, static_cast<uint64_t>(e4), r);
    for (int l = 0; l < 4 && e4 * 4 + l < n; ++l) {
      yp[e4 * 4 + l] = xp[e4 * 4 + l] * (r[l] >= threshold ? keep_scale : 0.0);
    }
  }
  return y;
}

Tensor Dropout::forward(const Tensor& x) {
  forwarded_ = true;
  dropped_ = false;
  if (!is_training() || p_ == 0.0) {
    end_forward();
    return x;
  }
  detail::check_compute_dtype(x.dtype() == DType::bf16 ? DType::f32 : x.dtype(),
                              "attn::nn::Dropout::forward");
  x_dtype_ = x.dtype();
  dropped_ = true;
  drawn_seed_ = seed_;
  drawn_call_ = calls_++;
  drawn_numel_ = x.numel();
  const Tensor y = apply(x.contiguous(), drawn_seed_, drawn_call_);
  end_forward();
  return y;
}

// dx = dy * the forward's pattern, drawn again; in the forward input's dtype.
Tensor Dropout::backward(const Tensor& dy) {
  constexpr const char* fn = "attn::nn::Dropout::backward";
  if (!forwarded_) fail(fn, kNoForwardToGoBack);
  if (!dropped_) return dy;  // the forward was the identity
  if (dy.numel() != drawn_numel_) {
    fail(fn, fmt::format("dy {} does not match the forward's input ({} elements)", dy.shape_str(),
                         drawn_numel_));
  }
  const DType compute = x_dtype_ == DType::f64 ? DType::f64 : DType::f32;
  const Tensor g = dy.dtype() == DType::bf16 && x_dtype_ == DType::bf16
                       ? dy.contiguous()
                       : detail::as_compute(dy, compute);
  const Tensor dx = apply(g, drawn_seed_, drawn_call_);
  return dx.dtype() == x_dtype_ ? dx : detail::convert(dx, x_dtype_);
}

// ---------------------------------------------------------------------------------------------------------
// Embedding

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx,
                     DType dtype)
    : num_(num_embeddings), dim_(embedding_dim), padding_idx_(padding_idx), dtype_(dtype) {
  constexpr const char* fn = "attn::nn::Embedding";
  detail::check_module_dtype(dtype, fn);
  if (num_embeddings <= 0 || embedding_dim <= 0) {
    fail(fn, fmt::format("sizes must be > 0, got {} x {}", num_embeddings, embedding_dim));
  }
  if (padding_idx < -1 || padding_idx >= num_embeddings) {
    fail(fn,
         fmt::format("padding_idx {} outside [0, {}) (-1 = none)", padding_idx, num_embeddings));
  }
  Tensor w = Tensor::empty({num_, dim_}, dtype);
  init_normal(w, 1.0);
  if (padding_idx_ >= 0) w.select(0, padding_idx_).fill(0.0);
  weight_ = &register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& ids) {
  constexpr const char* fn = "attn::nn::Embedding::forward";
  if (!ids.defined() || (ids.dtype() != DType::i32 && ids.dtype() != DType::i64)) {
    fail(fn, fmt::format("ids must be i32 or i64, got {}",
                         ids.defined() ? dtype_name(ids.dtype()) : "undefined"));
  }
  const std::vector<double> v = ids.to_vector();
  ids_.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= static_cast<double>(num_)) {
      fail(fn, fmt::format("id {} at flat position {} is outside [0, {}) (ids shape {})", v[i], i,
                           num_, ids.shape_str()));
    }
    ids_[i] = static_cast<int64_t>(v[i]);
  }
  Shape shape = ids.shape();
  shape.push_back(dim_);
  Tensor y = Tensor::empty(shape, dtype_);
  const size_t row = static_cast<size_t>(dim_) * dtype_size(dtype_);
  const char* w = static_cast<const char*>(weight_->value.data());
  char* yp = static_cast<char*>(y.data());
  for (size_t i = 0; i < ids_.size(); ++i) std::memcpy(yp + i * row, w + ids_[i] * row, row);
  forwarded_ = true;
  end_forward();
  return y;
}

void Embedding::backward(const Tensor& dy_in) {
  constexpr const char* fn = "attn::nn::Embedding::backward";
  detail::check_backward_dtype(dtype_, fn);
  if (!forwarded_) fail(fn, kNoForwardToGoBack);
  const Tensor dy = detail::rows_of(dy_in, dim_, dtype_, fn, "dy");
  if (dy.size(0) != static_cast<int64_t>(ids_.size())) {
    fail(fn,
         fmt::format("dy {} does not match the forward's {} ids", dy_in.shape_str(), ids_.size()));
  }
  dispatch(dtype_, fn, [&](auto tag) {
    using T = decltype(tag);
    T* gw = weight_->grad.data_as<T>();
    const T* g = dy.data_as<T>();
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] == padding_idx_) continue;
      for (int64_t c = 0; c < dim_; ++c) gw[ids_[i] * dim_ + c] += g[i * dim_ + c];
    }
  });
}

}  // namespace attn::nn
