// attn::nn::Module: the base of every layer. A module owns its parameters (value + gradient, same
// shape and dtype), names them with PyTorch's state-dict names, and knows its children. Layers add
//   Tensor forward(const Tensor& x, ...)   -- computes the output and caches what the backward
//   needs Tensor backward(const Tensor& dy)      -- returns d(input) and ADDS d(parameters) into
//   the gradients
// One backward per forward: a second forward overwrites the cache. There is no autograd graph.
// Inference keeps no cache at all under a NoGradGuard (below).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/io.h"
#include "attn/tensor.h"

namespace attn::nn {

// Module initialisation draws from one global generator, as torch.manual_seed does.
void manual_seed(uint64_t seed);
uint64_t next_seed();  // a fresh 64-bit seed from the global generator (advances it)

// Gradient mode of the calling thread, as torch.no_grad / torch.set_grad_enabled: while it is off, a
// module's forward keeps nothing for a backward (each module drops its cache as its forward
// returns, so a stack holds one layer's activations at a time instead of all of them), and a
// backward then fails as one called before any forward. Dropout still follows train() / eval().
// On by default, per thread (a forward runs its modules on the calling thread).
bool grad_enabled();
void set_grad_enabled(bool on);
class NoGradGuard {  // gradients off for the guard's life, then back to what they were
 public:
  NoGradGuard() : was_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(was_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool was_;
};
// What every backward says when no forward left it a cache.
inline constexpr const char* kNoForwardToGoBack =
    "called before forward (or after a forward with gradients disabled: NoGradGuard, "
    "attn.nn.no_grad())";

// Mixed precision, as torch.autocast(dtype=torch.bfloat16): while autocast is on (per thread, off
// by default), the f32 modules' forwards on this thread compute as the bf16 modules do (products on
// bf16 copies of the weights and bf16 activations, f32 accumulation, LayerNorm and softmax
// statistics in f32, outputs bf16) while the parameters, their gradients and the optimizer stay f32
// (master weights). A forward run under autocast keeps what its backward needs in bf16, and that
// backward (called inside or outside autocast, as torch's) runs the products in bf16 too: parameter
// gradients accumulate in f32, each input's gradient comes back in that input's dtype. Which modules
// take part: Linear, LayerNorm (its output bf16), FeedForward, MultiHeadAttention (softmax attention
// without a position scheme; others run in f32, as torch runs ops off its autocast list), the
// Transformer layers and stacks; Embedding, Dropout and the activations keep their input's dtype.
// f64 and bf16 modules ignore it.
bool autocast_enabled();
void set_autocast_enabled(bool on);
class Autocast {  // autocast on (or as `on` says) for the guard's life, then back to what it was
 public:
  explicit Autocast(bool on = true) : was_(autocast_enabled()) { set_autocast_enabled(on); }
  ~Autocast() { set_autocast_enabled(was_); }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool was_;
};

struct Parameter {
  Tensor value;  // owning, contiguous, the module's dtype
  Tensor grad;   // same shape and dtype; zero after zero_grad()
};

// A parameter seen from outside: the tensors share storage with the module's, so an optimizer that
// writes value in place updates the module.
struct NamedParameter {
  std::string name;  // PyTorch's state-dict name, e.g. "layers.0.self_attn.in_proj_weight"
  Tensor value;
  Tensor grad;
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;  // children are referenced by address
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Every parameter of this module and its children, in registration order (the state-dict order).
  std::vector<NamedParameter> named_parameters() const;
  int64_t num_parameters() const;  // total element count
  void zero_grad();

  // Drops what the last forward cached for the backward (in this module and its children).
  void free_cache();

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Re-seeds every dropout in this module tree deterministically from `seed` (for reproducible runs
  // and gradient checks: the same seed gives the same dropout patterns on the next forward).
  void manual_seed(uint64_t seed);

  // The parameters as named tensors (the values, shared, not copied).
  TensorList state_dict() const;
  // Copies values (converting dtype) by name. strict: every parameter must be present and no extra
  // name; shapes must match. Throws attn::Error naming the tensor.
  void load_state_dict(const TensorList& tensors, bool strict = true);
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  void load(const std::string& path, bool strict = true);

 protected:
  // `name` is the local name ("weight"); returns a reference that stays valid for the module's
  // life.
  Parameter& register_parameter(const std::string& name, Tensor value);
  // `name` = "" flattens the child's names into this module (PyTorch keeps linear1 at the layer's
  // level even though attn groups it in a FeedForward).
  void register_module(const std::string& name, Module& child);
  virtual void on_train(bool /*training*/) {}
  virtual void on_seed(uint64_t /*seed*/) {}
  virtual void release_cache() {}
  // The last line of a forward that caches: drops the cache again when gradients are disabled.
  void end_forward() {
    if (!grad_enabled()) free_cache();
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedParameter>& out) const;
  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

// A named group of modules owned elsewhere: model.add("embed", emb).add("encoder", enc) gives one
// parameter list ("embed.weight", "encoder.layers.0....") and one state dict / safetensors file for
// all.
class Container : public Module {
 public:
  Container& add(const std::string& name, Module& child) {
    register_module(name, child);
    return *this;
  }
};

}  // namespace attn::nn
