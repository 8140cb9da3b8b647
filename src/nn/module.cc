#include "attn/nn/module.h"

#include <fmt/format.h>

#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "core/storage_cache.h"
#include "nn/ops.h"

namespace attn::nn {

namespace {
thread_local bool t_grad_enabled = true;
thread_local bool t_autocast = false;
std::mutex g_mutex;
std::mt19937_64& generator() {
  static std::mt19937_64 g(0x5eed);
  return g;
}
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_mutex);
  generator().seed(seed);
}

uint64_t next_seed() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return generator()();
}

bool grad_enabled() {
  return t_grad_enabled;
}

void set_grad_enabled(bool on) {
  t_grad_enabled = on;
}

bool autocast_enabled() {
  return t_autocast;
}

void set_autocast_enabled(bool on) {
  t_autocast = on;
}

Parameter& Module::register_parameter(const std::string& name, Tensor value) {
  auto p = std::make_unique<Parameter>();
  p->value = value.contiguous();
  p->grad = Tensor::zeros(value.shape(), value.dtype());
  params_.emplace_back(name, std::move(p));
  return *params_.back().second;
}

void Module::register_module(const std::string& name, Module& child) {
  children_.emplace_back(name, &child);
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) const {
  for (const auto& [name, p] : params_) out.push_back({prefix + name, p->value, p->grad});
  for (const auto& [name, child] : children_)
    child->collect(name.empty() ? prefix : prefix + name + ".", out);
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  collect("", out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.value.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& p : named_parameters()) p.grad.fill(0.0);
}

void Module::free_cache() {
  release_cache();
  for (auto& [name, child] : children_) child->free_cache();
}

void Module::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& [name, child] : children_) child->train(on);
}

void Module::manual_seed(uint64_t seed) {
  on_seed(seed);
  uint64_t i = 0;
  for (auto& [name, child] : children_) {
    // Children get distinct, deterministic seeds (splitmix64 of the parent's seed and the child
    // index).
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (++i);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    child->manual_seed(z ^ (z >> 31));
  }
}

TensorList Module::state_dict() const {
  TensorList out;
  for (const auto& p : named_parameters()) out.emplace_back(p.name, p.value);
  return out;
}

void Module::load_state_dict(const TensorList& tensors, bool strict) {
  constexpr const char* fn = "attn::nn::Module::load_state_dict";
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  // Check everything first, copy afterwards: a refused state dict leaves every parameter untouched.
  std::vector<std::pair<NamedParameter, const Tensor*>> plan;
  std::set<std::string> used;
  for (auto& p : named_parameters()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      if (strict)
        detail::fail(fn,
                     fmt::format("missing tensor '{}' of shape {}", p.name, p.value.shape_str()));
      continue;
    }
    const Tensor& src = *it->second;
    if (src.shape() != p.value.shape()) {
      detail::fail(fn, fmt::format("tensor '{}' has shape {}, the module expects {}", p.name,
                                   src.shape_str(), p.value.shape_str()));
    }
    if (!is_floating(src.dtype())) {
      detail::fail(
          fn, fmt::format("tensor '{}' must be floating, got {}", p.name, dtype_name(src.dtype())));
    }
    used.insert(p.name);
    plan.emplace_back(p, &src);
  }
  if (strict) {
    for (const auto& [name, t] : tensors) {
      if (!used.count(name)) {
        detail::fail(fn, fmt::format("unexpected tensor '{}' of shape {}", name, t.shape_str()));
      }
    }
  }
  for (auto& [p, src] : plan) p.value.copy_from(*src);
}

void Module::save(const std::string& path,
                  const std::map<std::string, std::string>& metadata) const {
  write_safetensors(path, state_dict(), metadata);
}

void Module::load(const std::string& path, bool strict) {
  const attn::detail::CheckpointLoadScope load_scope;
  load_state_dict(read_safetensors(path), strict);
}

}  // namespace attn::nn
