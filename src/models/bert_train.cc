// BertModel fine-tuning: train / eval, the backward through pooler, encoder layers, the embeddings'
// LayerNorm and the three embeddings, and the parameters for an optimizer.
#include <fmt/format.h>

#include <cmath>

#include "attn/error.h"
#include "attn/models/bert.h"
#include "models/bert_net.h"
#include "nn/bf16.h"

namespace attn::models {

namespace {
[[noreturn]] void fail(const std::string& msg) {
  throw Error("attn::models::BertModel::backward: " + msg);
}

// g [B, L, H] f32, the gradient of last_hidden_state as given (zero when undefined).
Tensor hidden_grad(const Tensor& d, const Shape& shape) {
  Tensor g = Tensor::zeros(shape, DType::f32);
  if (!d.defined()) return g;
  if (!is_floating(d.dtype()) || d.shape() != shape) {
    fail(fmt::format("d_last_hidden_state must be floating {}, got {}", shape_to_string(shape),
                     d.shape_str()));
  }
  g.copy_from(d);
  return g;
}
}  // namespace

void BertModel::train(bool on) {
  net_->train(on);
  if (!on) net_->cached = false;
}

bool BertModel::is_training() const {
  return net_->is_training();
}

std::vector<nn::NamedParameter> BertModel::named_parameters() const {
  return net_->named_parameters();
}

void BertModel::zero_grad() {
  net_->zero_grad();
}

void BertModel::manual_seed(uint64_t seed) {
  net_->manual_seed(seed);
}

// pooled = tanh(dense(h[:, 0])): d dense = d_pooler (1 - pooled^2), whose input gradient joins
// h[:, 0]'s; then the layers in reverse, the embeddings' LayerNorm, and its input's gradient into
// each of the three embeddings (their sum was the LayerNorm's input).
void BertModel::backward(const Tensor& d_hidden, const Tensor& d_pooler) {
  Net& n = *net_;
  if (dtype_ == DType::bf16) {
    fail(
        "a bf16 model runs inference only; fine-tune the f32 model (under nn::Autocast for bf16 "
        "compute)");
  }
  if (!n.cached) fail("no forward in training mode to go back from (train(), gradients enabled)");
  const Shape& hs = n.hidden_shape;
  const int64_t B = hs[0], L = hs[1], H = hs[2];
  Tensor g = hidden_grad(d_hidden, hs);
  if (d_pooler.defined()) {
    if (!n.dense) fail("this model has no pooler (d_pooler_output must be undefined)");
    if (!is_floating(d_pooler.dtype()) || d_pooler.shape() != Shape{B, H}) {
      fail(fmt::format("d_pooler_output must be floating [{}, {}], got {}", B, H,
                       d_pooler.shape_str()));
    }
    Tensor dz = Tensor::empty({B, H}, DType::f32);
    dz.copy_from(d_pooler);
    float* z = dz.data_as<float>();
    const float* p = n.pooled.data_as<float>();
    for (int64_t i = 0; i < B * H; ++i) z[i] *= 1.0f - p[i] * p[i];
    const Tensor dfirst = nn::detail::convert(n.dense->backward(dz), DType::f32);
    float* gp = g.data_as<float>();
    const float* f = dfirst.data_as<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < H; ++c) gp[(b * L) * H + c] += f[b * H + c];
  }
  for (auto it = n.layers.rbegin(); it != n.layers.rend(); ++it) g = (*it)->backward(g);
  const Tensor de =
      nn::detail::convert(n.norm.backward(n.embeddings_dropout.backward(g)), DType::f32);
  n.word.backward(de);
  n.position.backward(de);
  if (n.token_type) n.token_type->backward(de);
  n.cached = false;  // one backward per forward
}

}  // namespace attn::models
