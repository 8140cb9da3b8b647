// Links attn::core alone: one attention call, checked against softmax(q k^T / sqrt(D)) v computed
// here in double. Exit 0 and "core_consumer: ok" when the largest difference is below 1e-6.
#include <attn/attention.h>
#include <attn/tensor.h>

#include <cmath>
#include <cstdio>

int main() {
  const int64_t L = 5, D = 3;
  attn::Tensor q = attn::Tensor::empty({1, 1, L, D}, attn::DType::f32);
  attn::Tensor k = attn::Tensor::empty({1, 1, L, D}, attn::DType::f32);
  attn::Tensor v = attn::Tensor::empty({1, 1, L, D}, attn::DType::f32);
  for (int64_t i = 0; i < L * D; ++i) {
    q.data_as<float>()[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
    k.data_as<float>()[i] = static_cast<float>(std::cos(0.3 * static_cast<double>(i)));
    v.data_as<float>()[i] = static_cast<float>(0.1 * static_cast<double>(i) - 0.5);
  }
  const attn::Tensor out = attn::attention(q, k, v, attn::AttentionOptions{}).out;
  double worst = 0;
  for (int64_t i = 0; i < L; ++i) {
    double w[L], sum = 0, mx = -INFINITY;
    for (int64_t j = 0; j < L; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d)
        s += double{q.data_as<float>()[i * D + d]} * k.data_as<float>()[j * D + d];
      w[j] = s / std::sqrt(static_cast<double>(D));
      mx = std::fmax(mx, w[j]);
    }
    for (int64_t j = 0; j < L; ++j) sum += (w[j] = std::exp(w[j] - mx));
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t j = 0; j < L; ++j) o += w[j] / sum * v.data_as<float>()[j * D + d];
      worst = std::fmax(worst, std::fabs(o - out.data_as<float>()[i * D + d]));
    }
  }
  std::printf("core_consumer: largest difference from the double softmax %.3g: %s\n", worst,
              worst < 1e-6 ? "ok" : "WRONG");
  return worst < 1e-6 ? 0 : 1;
}
