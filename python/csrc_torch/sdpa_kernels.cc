// attn._torch_kernels: attn's kernels for torch's CPU SDPA operators, registered with torch's
// dispatcher in C++ (attn.torch.enable() loads this library when the build found PyTorch; without it the
// same registration is made of Python functions, python/src/attn/_torch_provider.py). Built against the
// installed torch, as the ecosystem's attention extensions are, and optional: attn's own package needs
// no torch.
//
//   aten::_scaled_dot_product_flash_attention_for_cpu(query [B, Hq, L, E], key [B, Hkv, S, E],
//       value [B, Hkv, S, Ev], dropout_p, is_causal, *, attn_mask, scale) -> (out [B, Hq, L, Ev],
//       logsumexp [B, Hq, L])
//   aten::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
//       logsumexp, dropout_p, is_causal, *, attn_mask, scale) -> (grad_query, grad_key, grad_value)
//
// The tensors are read in place (attn::Tensor views of torch's memory, any strides), results come back
// as torch tensors over attn's own buffers (no copy). is_causal is PyTorch's, top-left; a bool mask is
// attn's keep mask, a float one its add mask; dropout_p > 0 is refused (the backward has no seed to
// replay attn's pattern; SDPA with dropout takes torch's math path and never gets here).
//
// torch.ops.attn_kernels.enable() registers the kernels for the CPU key (a torch::Library made at run
// time), disable() destroys that Library, and torch's own kernels serve again.
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "attn/attention.h"
#include "attn/error.h"

namespace {

attn::DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return attn::DType::f32;
    case at::kBFloat16:
      return attn::DType::bf16;
    case at::kHalf:
      return attn::DType::f16;
    case at::kDouble:
      return attn::DType::f64;
    case at::kBool:
      return attn::DType::boolean;
    default:
      TORCH_CHECK(false, "attn.torch provider: tensors of ", t.scalar_type(),
                  " are not taken (float32, bfloat16, float16, float64; bool masks)");
  }
}

at::ScalarType scalar_type_of(attn::DType d) {
  switch (d) {
    case attn::DType::f32:
      return at::kFloat;
    case attn::DType::bf16:
      return at::kBFloat16;
    case attn::DType::f16:
      return at::kHalf;
    default:
      return at::kDouble;
  }
}

// A view of torch's memory (the tensor stays alive for the call).
attn::Tensor view_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "attn.torch provider: CPU tensors only");
  attn::Shape shape(t.sizes().begin(), t.sizes().end()),
      strides(t.strides().begin(), t.strides().end());
  return attn::Tensor::from_blob(t.data_ptr(), shape, dtype_of(t), strides);
}

// attn's result as a torch tensor over the same memory, which stays alive as long as torch holds it.
at::Tensor to_torch(attn::Tensor t) {
  auto held = std::make_shared<attn::Tensor>(std::move(t));
  std::vector<int64_t> sizes(held->shape().begin(), held->shape().end());
  std::vector<int64_t> strides(held->strides().begin(), held->strides().end());
  return at::from_blob(
      held->data(), sizes, strides, [held](void*) mutable { held.reset(); },
      at::TensorOptions().dtype(scalar_type_of(held->dtype())));
}

attn::AttentionOptions options_of(double dropout_p, bool is_causal,
                                  const std::optional<at::Tensor>& attn_mask,
                                  std::optional<double> scale, const attn::Tensor* mask_view) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      dropout_p == 0.0, "attn.torch provider: dropout_p=", dropout_p,
      " is not taken by attn (the backward operator has no seed to replay attn's dropout "
      "pattern); scaled_dot_product_attention with dropout runs torch's math path");
  attn::AttentionOptions o;
  o.align = attn::Align::top_left;
  o.causal = is_causal;
  if (scale.has_value()) o.scale = *scale;
  if (attn_mask.has_value() && attn_mask->defined()) {
    o.mask = *mask_view;
    o.mask_type =
        attn_mask->scalar_type() == at::kBool ? attn::MaskType::keep : attn::MaskType::add;
  }
  return o;
}

attn::Tensor mask_view_of(const std::optional<at::Tensor>& attn_mask) {
  return attn_mask.has_value() && attn_mask->defined() ? view_of(*attn_mask) : attn::Tensor();
}

std::tuple<at::Tensor, at::Tensor> sdpa_forward(const at::Tensor& query, const at::Tensor& key,
                                                const at::Tensor& value, double dropout_p,
                                                bool is_causal,
                                                const std::optional<at::Tensor>& attn_mask,
                                                std::optional<double> scale) {
  RECORD_FUNCTION("attn::attention", std::vector<c10::IValue>());
  const attn::Tensor mask = mask_view_of(attn_mask);
  const attn::AttentionOptions o = options_of(dropout_p, is_causal, attn_mask, scale, &mask);
  try {
    attn::AttentionResult r = attn::attention(view_of(query), view_of(key), view_of(value), o);
    return {to_torch(std::move(r.out)), to_torch(std::move(r.lse))};
  } catch (const attn::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  RECORD_FUNCTION("attn::attention_backward", std::vector<c10::IValue>());
  const attn::Tensor mask = mask_view_of(attn_mask);
  const attn::AttentionOptions o = options_of(dropout_p, is_causal, attn_mask, scale, &mask);
  try {
    attn::AttentionGrads g =
        attn::attention_backward(view_of(grad_out), view_of(query), view_of(key), view_of(value),
                                 view_of(out), view_of(logsumexp), o);
    return {to_torch(std::move(g.dq)), to_torch(std::move(g.dk)), to_torch(std::move(g.dv))};
  } catch (const attn::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

std::mutex g_mutex;
std::unique_ptr<torch::Library> g_library;  // the registration while enabled

void enable() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_library) return;
  g_library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CPU,
                                               __FILE__, __LINE__);
  g_library->impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(sdpa_forward));
  g_library->impl("_scaled_dot_product_flash_attention_for_cpu_backward", TORCH_FN(sdpa_backward));
}

void disable() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_library.reset();
}

bool enabled() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_library != nullptr;
}

}  // namespace

TORCH_LIBRARY(attn_kernels, m) {
  m.def("enable() -> ()", &enable);
  m.def("disable() -> ()", &disable);
  m.def("enabled() -> bool", &enabled);
}
