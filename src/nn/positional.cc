// Absolute position embeddings, RoPE, ALiBi slopes, T5 buckets, the Shaw and T5 score biases, and the
// mask helpers.
#include "attn/nn/positional.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/nn/layers.h"
#include "attn/nn/masks.h"
#include "nn/ops.h"
#include "nn/relative_bias.h"

namespace attn::nn {

using detail::dispatch;
using detail::fail;

namespace {
// x [B, L, E] or [L, B, E] -> (B, L) for a layout.
void batch_and_length(const Tensor& x, bool batch_first, int64_t d, const char* fn, int64_t& B,
                      int64_t& L) {
  if (!x.defined() || !is_floating(x.dtype()) || x.dim() != 3 || x.size(2) != d) {
    fail(fn, fmt::format("x must be floating {} with E = {}, got {}",
                         batch_first ? "[B, L, E]" : "[L, B, E]", d,
                         x.defined() ? x.shape_str() : "undefined"));
  }
  B = batch_first ? x.size(0) : x.size(1);
  L = batch_first ? x.size(1) : x.size(0);
}

void check_range(const char* fn, int64_t offset, int64_t L, int64_t max_len) {
  if (offset < 0 || offset + L > max_len) {
    fail(fn, fmt::format("positions [{}, {}) exceed max_len {}", offset, offset + L, max_len));
  }
}
}  // namespace

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t d_model, int64_t max_len,
                                                           bool batch_first, double scale)
    : d_(d_model), max_len_(max_len), batch_first_(batch_first), scale_(scale) {
  if (d_model <= 0 || max_len <= 0) {
    fail("attn::nn::SinusoidalPositionalEncoding",
         fmt::format("d_model {} and max_len {} must be > 0", d_model, max_len));
  }
  pe_ = Tensor::empty({max_len, d_model}, DType::f64);
  double* p = pe_.data_as<double>();
  for (int64_t pos = 0; pos < max_len; ++pos) {
    for (int64_t i = 0; i < d_model; i += 2) {
      const double angle = static_cast<double>(pos) *
                           std::exp(-std::log(10000.0) * static_cast<double>(i) / d_model);
      p[pos * d_model + i] = std::sin(angle);
      if (i + 1 < d_model) p[pos * d_model + i + 1] = std::cos(angle);
    }
  }
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, int64_t offset) {
  constexpr const char* fn = "attn::nn::SinusoidalPositionalEncoding::forward";
  int64_t B, L;
  batch_and_length(x, batch_first_, d_, fn, B, L);
  check_range(fn, offset, L, max_len_);
  const DType dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor y = detail::as_compute(x, dt).clone();
  dispatch(dt, fn, [&](auto tag) {
    using T = decltype(tag);
    T* yp = y.data_as<T>();
    const double* pe = pe_.data_as<double>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        T* row = yp + (batch_first_ ? (b * L + l) : (l * B + b)) * d_;
        const double* pr = pe + (offset + l) * d_;
        for (int64_t e = 0; e < d_; ++e) row[e] = static_cast<T>(row[e] * scale_ + pr[e]);
      }
  });
  return y;
}

Tensor SinusoidalPositionalEncoding::backward(const Tensor& dy) {
  if (scale_ == 1.0) return dy;
  const DType dt = dy.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor dx = detail::as_compute(dy, dt).clone();
  dispatch(dt, "attn::nn::SinusoidalPositionalEncoding::backward", [&](auto tag) {
    using T = decltype(tag);
    T* p = dx.data_as<T>();
    for (int64_t i = 0; i < dx.numel(); ++i) p[i] = static_cast<T>(p[i] * scale_);
  });
  return dx;
}

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len, int64_t d_model,
                                                       bool batch_first, double scale, DType dtype,
                                                       double init_std)
    : max_len_(max_len), d_(d_model), batch_first_(batch_first), scale_(scale), dtype_(dtype) {
  detail::check_compute_dtype(dtype, "attn::nn::LearnedPositionalEmbedding");
  if (d_model <= 0 || max_len <= 0) {
    fail("attn::nn::LearnedPositionalEmbedding",
         fmt::format("d_model {} and max_len {} must be > 0", d_model, max_len));
  }
  Tensor w = Tensor::empty({max_len, d_model}, dtype);
  init_normal(w, init_std);
  weight_ = &register_parameter("weight", w);
}

Tensor LearnedPositionalEmbedding::forward(const Tensor& x, int64_t offset) {
  constexpr const char* fn = "attn::nn::LearnedPositionalEmbedding::forward";
  forwarded_ = false;  // a forward that fails leaves no shape for a backward
  batch_and_length(x, batch_first_, d_, fn, B_, L_);
  check_range(fn, offset, L_, max_len_);
  offset_ = offset;
  forwarded_ = true;
  Tensor y = detail::as_compute(x, dtype_).clone();
  dispatch(dtype_, fn, [&](auto tag) {
    using T = decltype(tag);
    T* yp = y.data_as<T>();
    const T* w = weight_->value.data_as<T>();
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t l = 0; l < L_; ++l) {
        T* row = yp + (batch_first_ ? (b * L_ + l) : (l * B_ + b)) * d_;
        const T* pr = w + (offset + l) * d_;
        for (int64_t e = 0; e < d_; ++e) row[e] = static_cast<T>(row[e] * scale_ + pr[e]);
      }
  });
  end_forward();
  return y;
}

Tensor LearnedPositionalEmbedding::backward(const Tensor& dy_in) {
  constexpr const char* fn = "attn::nn::LearnedPositionalEmbedding::backward";
  if (!forwarded_) fail(fn, kNoForwardToGoBack);
  if (dy_in.numel() != B_ * L_ * d_)
    fail(fn, fmt::format("dy {} does not match the forward", dy_in.shape_str()));
  const Tensor dy = detail::as_compute(dy_in, dtype_);
  Tensor dx = dy.clone();
  dispatch(dtype_, fn, [&](auto tag) {
    using T = decltype(tag);
    const T* g = dy.data_as<T>();
    T* gw = weight_->grad.data_as<T>();
    T* d = dx.data_as<T>();
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t l = 0; l < L_; ++l) {
        const int64_t r = (batch_first_ ? (b * L_ + l) : (l * B_ + b)) * d_;
        for (int64_t e = 0; e < d_; ++e) {
          gw[(offset_ + l) * d_ + e] += g[r + e];
          d[r + e] = static_cast<T>(g[r + e] * scale_);
        }
      }
  });
  return dx;
}

std::vector<double> alibi_slopes(int64_t n) {
  if (n <= 0) fail("attn::nn::alibi_slopes", fmt::format("num_heads must be > 0, got {}", n));
  auto pow2_slopes = [](int64_t m) {
    std::vector<double> s(static_cast<size_t>(m));
    const double start = std::pow(2.0, -8.0 / static_cast<double>(m));
    for (int64_t h = 0; h < m; ++h) s[h] = std::pow(start, static_cast<double>(h + 1));
    return s;
  };
  int64_t m = 1;
  while (m * 2 <= n) m *= 2;
  std::vector<double> s = pow2_slopes(m);
  if (m < n) {
    const std::vector<double> extra = pow2_slopes(2 * m);
    for (int64_t h = 0; static_cast<int64_t>(s.size()) < n; h += 2) s.push_back(extra[h]);
  }
  return s;
}

int64_t t5_relative_bucket(int64_t rel, bool bidirectional, int64_t num_buckets,
                           int64_t max_distance) {
  int64_t bucket = 0;
  int64_t n = num_buckets;
  if (bidirectional) {
    n /= 2;
    if (rel > 0) bucket += n;
    rel = std::abs(rel);
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const int64_t max_exact = n / 2;
  if (rel < max_exact) return bucket + rel;
  // Float math as T5 does it (log in f32, truncation towards zero).
  const float ratio = std::log(static_cast<float>(rel) / static_cast<float>(max_exact)) /
                      std::log(static_cast<float>(max_distance) / static_cast<float>(max_exact));
  int64_t large = max_exact + static_cast<int64_t>(ratio * static_cast<float>(n - max_exact));
  large = std::min<int64_t>(large, n - 1);
  return bucket + large;
}

// ---------------------------------------------------------------------------------------------------------
// Shaw and T5 biases (nn/relative_bias.h)

namespace detail {

Tensor shaw_bias(const Tensor& q, const Tensor& table, int64_t Lk, int64_t max_distance,
                 double scale, const char* fn) {
  const int64_t BH = q.size(0) * q.size(1), Lq = q.size(2), hd = q.size(3);
  const int64_t md = max_distance;
  Tensor bias = Tensor::empty({q.size(0), q.size(1), Lq, Lk}, q.dtype());
  dispatch(q.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    const T* qp = q.data_as<T>();
    const T* a = table.data_as<T>();
    T* bp = bias.data_as<T>();
    for (int64_t bh = 0; bh < BH; ++bh)
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < Lk; ++j) {
          const int64_t r = std::clamp<int64_t>(j - i, -md, md) + md;
          double s = 0;
          for (int64_t d = 0; d < hd; ++d)
            s += static_cast<double>(qp[(bh * Lq + i) * hd + d]) * a[r * hd + d];
          bp[(bh * Lq + i) * Lk + j] = static_cast<T>(scale * s);
        }
  });
  return bias;
}

void shaw_bias_backward(const Tensor& dbias, const Tensor& q, const Tensor& table,
                        int64_t max_distance, double scale, Tensor& dq, Tensor& dtable,
                        const char* fn) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), hd = q.size(3);
  const int64_t Bm = dbias.size(0), Lk = dbias.size(3), md = max_distance;
  dispatch(q.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    const T* qp = q.data_as<T>();
    const T* a = table.data_as<T>();
    T* ga = dtable.data_as<T>();
    T* dqp = dq.data_as<T>();
    const T* g_bias = dbias.data_as<T>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i)
          for (int64_t j = 0; j < Lk; ++j) {
            const double gb = g_bias[(((Bm == 1 ? 0 : b) * H + h) * Lq + i) * Lk + j] * scale;
            if (gb == 0.0) continue;
            const int64_t r = std::clamp<int64_t>(j - i, -md, md) + md;
            const int64_t qrow = ((b * H + h) * Lq + i) * hd;
            for (int64_t d = 0; d < hd; ++d) {
              dqp[qrow + d] = static_cast<T>(dqp[qrow + d] + gb * a[r * hd + d]);
              ga[r * hd + d] = static_cast<T>(ga[r * hd + d] + gb * qp[qrow + d]);
            }
          }
  });
}

Tensor t5_bias(const Tensor& table, int64_t Lq, int64_t Lk, bool bidirectional,
               int64_t max_distance, DType dt) {
  const int64_t num_buckets = table.size(0), H = table.size(1);
  Tensor bias = Tensor::empty({1, H, Lq, Lk}, dt);
  const std::vector<double> tv = table.to_vector();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t j = 0; j < Lk; ++j) {
        const int64_t bucket = t5_relative_bucket(j - i, bidirectional, num_buckets, max_distance);
        store_from_double(
            static_cast<char*>(bias.data()) + ((h * Lq + i) * Lk + j) * dtype_size(dt), dt,
            tv[bucket * H + h]);
      }
  return bias;
}

void t5_bias_backward(const Tensor& dbias, bool bidirectional, int64_t max_distance,
                      Tensor& dtable) {
  const int64_t num_buckets = dtable.size(0), H = dtable.size(1);
  const int64_t Bm = dbias.size(0), Lq = dbias.size(2), Lk = dbias.size(3);
  const std::vector<double> g_bias = dbias.to_vector();
  std::vector<double> gt(static_cast<size_t>(num_buckets * H), 0.0);
  for (int64_t b = 0; b < Bm; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < Lk; ++j) {
          const int64_t bucket =
              t5_relative_bucket(j - i, bidirectional, num_buckets, max_distance);
          gt[bucket * H + h] += g_bias[((b * H + h) * Lq + i) * Lk + j];
        }
  add_into(dtable, Tensor::from_vector({num_buckets, H}, gt, DType::f64));
}

}  // namespace detail

void rope_rotate(Tensor& x, int64_t offset, double base, bool interleaved, bool inverse) {
  constexpr const char* fn = "attn::nn::rope_rotate";
  if (x.dim() != 3 || !x.is_contiguous())
    fail(fn, fmt::format("x must be contiguous [N, L, hd], got {}", x.shape_str()));
  const int64_t N = x.size(0), L = x.size(1), hd = x.size(2);
  if (hd % 2 != 0) fail(fn, fmt::format("head dim must be even for RoPE, got {}", hd));
  const int64_t half = hd / 2;
  // cos/sin table [L, half] in double
  std::vector<double> cs(static_cast<size_t>(L * half)), sn(static_cast<size_t>(L * half));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq =
          std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double a = static_cast<double>(offset + l) * inv_freq;
      cs[l * half + i] = std::cos(a);
      sn[l * half + i] = inverse ? -std::sin(a) : std::sin(a);
    }
  dispatch(x.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    T* p = x.data_as<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) {
        T* row = p + (n * L + l) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = interleaved ? 2 * i : i;
          const int64_t ib = interleaved ? 2 * i + 1 : i + half;
          const double a = row[ia], b = row[ib];
          const double c = cs[l * half + i], s = sn[l * half + i];
          row[ia] = static_cast<T>(a * c - b * s);
          row[ib] = static_cast<T>(a * s + b * c);
        }
      }
  });
}

// ---------------------------------------------------------------------------------------------------------
// Masks (true = not allowed)

Tensor padding_mask(const Tensor& ids, int64_t pad_id) {
  if (!ids.defined() || (ids.dtype() != DType::i32 && ids.dtype() != DType::i64) ||
      ids.dim() != 2) {
    fail("attn::nn::padding_mask", fmt::format("ids must be integer [B, L], got {}",
                                               ids.defined() ? ids.shape_str() : "undefined"));
  }
  const std::vector<double> v = ids.to_vector();
  Tensor m = Tensor::empty(ids.shape(), DType::boolean);
  uint8_t* p = m.data_as<uint8_t>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<int64_t>(v[i]) == pad_id;
  return m;
}

Tensor look_ahead_mask(int64_t L) {
  if (L < 0) fail("attn::nn::look_ahead_mask", fmt::format("length must be >= 0, got {}", L));
  Tensor m = Tensor::empty({L, L}, DType::boolean);
  uint8_t* p = m.data_as<uint8_t>();
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j) p[i * L + j] = j > i;
  return m;
}

Tensor combine_masks(const Tensor& padding, const Tensor& look_ahead) {
  constexpr const char* fn = "attn::nn::combine_masks";
  if (!padding.defined() || padding.dtype() != DType::boolean || padding.dim() != 2 ||
      !look_ahead.defined() || look_ahead.dtype() != DType::boolean || look_ahead.dim() != 2 ||
      look_ahead.size(1) != padding.size(1)) {
    fail(fn, fmt::format("expected bool padding [B, Lk] and look_ahead [Lq, Lk], got {} and {}",
                         padding.defined() ? padding.shape_str() : "undefined",
                         look_ahead.defined() ? look_ahead.shape_str() : "undefined"));
  }
  const int64_t B = padding.size(0), Lq = look_ahead.size(0), Lk = look_ahead.size(1);
  const Tensor pc = padding.contiguous(), lc = look_ahead.contiguous();
  Tensor m = Tensor::empty({B, Lq, Lk}, DType::boolean);
  uint8_t* o = m.data_as<uint8_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t j = 0; j < Lk; ++j)
        o[(b * Lq + i) * Lk + j] =
            pc.data_as<uint8_t>()[b * Lk + j] || lc.data_as<uint8_t>()[i * Lk + j];
  return m;
}

}  // namespace attn::nn
