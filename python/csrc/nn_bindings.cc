// attn._core.nn: the C++ Transformer modules (include/attn/nn.h) for the pure-Python attn.nn, which
// gives them PyTorch's constructors and forward arguments. Inputs are not copied: they reach the
// modules as views of the caller's memory (arrays.h says when the import itself must copy), and a
// module converts only what is not contiguous or not of its dtype (detail::as_compute, rows_of:
// one copy, on entry). Outputs are NumPy arrays, or torch tensors when the last forward's inputs
// were, handed over without a copy. See SavedInputs for what that means between forward and
// backward.
#include <fmt/format.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "arrays.h"
#include "attn/nn.h"
#include "bindings.h"
#include "nn_parameters.h"

namespace attn::python {

namespace {

using namespace attn::nn;

[[noreturn]] void runtime_error(const std::string& msg) {
  PyErr_SetString(PyExc_RuntimeError, msg.c_str());
  throw nb::python_error();
}

// An array argument the module reads as values (an input or a gradient): floating, else a
// TypeError naming it. Masks and ids go through scope.import, which takes bool and integers too.
Tensor values(ArrayScope& scope, nb::handle obj, const char* name) {
  Tensor t = scope.import(obj, name);
  if (!is_floating(t.dtype())) {
    throw nb::type_error(
        fmt::format("{}: {} must be a floating array (f64, f32, f16 or bf16), got {}", scope.fn(),
                    name, dtype_name(t.dtype()))
            .c_str());
  }
  return t;
}

// The inputs of a module's last forward. A module caches what its backward reads (Linear's input,
// attention's q/k/v and masks, a checkpointed layer's src), and those caches are views of the
// caller's arrays, so the objects are kept alive here until the next forward. A torch tensor
// changed in place in between (its version counter moved) or moved to other memory (resize_,
// set_) makes the backward refuse, as torch's autograd refuses a saved tensor modified in place.
// NumPy arrays have no version counter: one changed in place between forward and backward changes
// the gradients, as a torch.from_numpy tensor's would under autograd.
class SavedInputs {
 public:
  void keep(const ArrayScope& scope) {
    std::vector<Entry> kept;
    kept.reserve(scope.owners().size());
    for (const ArrayScope::Owner& o : scope.owners()) {
      Entry e{o.obj, o.name};
      if (o.torch) {
        e.version = torch_version(o.obj);
        e.data = nb::cast<uintptr_t>(o.obj.attr("data_ptr")());
      }
      kept.push_back(std::move(e));
    }
    entries_ = std::move(kept);  // the previous forward's inputs are released only now
  }
  void check(const char* fn) const {
    for (const Entry& e : entries_) {
      if (e.version == kNumpy) continue;
      const int64_t version = torch_version(e.obj);
      const auto data = nb::cast<uintptr_t>(e.obj.attr("data_ptr")());
      if (version == e.version && data == e.data) continue;
      runtime_error(
          fmt::format("{}: {} was modified in place after the forward ({}); the backward reads the "
                      "forward's inputs, so run the forward again or pass a copy (x.clone())",
                      fn, e.name,
                      data != e.data ? "its storage moved"
                                     : fmt::format("torch version {} -> {}", e.version, version)));
    }
  }

 private:
  static constexpr int64_t kNumpy = -1, kNoVersion = -2;
  // A tensor's version counter; kNoVersion for an inference tensor (torch.inference_mode), which
  // has none (torch refuses to save one for its own backward; here only its data pointer is checked).
  static int64_t torch_version(const nb::object& t) {
    PyObject* v = PyObject_GetAttrString(t.ptr(), "_version");
    if (!v) {
      PyErr_Clear();
      return kNoVersion;
    }
    return nb::cast<int64_t>(nb::steal(v));
  }
  struct Entry {
    nb::object obj;
    std::string name;
    int64_t version = kNumpy;  // torch's _version at the forward
    uintptr_t data = 0;
  };
  std::vector<Entry> entries_;
};

// Every module: parameters as name -> (value, grad), state dicts, train/eval, seeding.
template <class M>
struct Holder {
  std::unique_ptr<M> m;
  bool torch = false;  // the framework of the last forward's inputs
  SavedInputs saved;   // the last forward's inputs

  nb::dict state_dict() const {
    nb::dict d;
    for (auto& [name, t] : m->state_dict()) d[name.c_str()] = export_tensor(t, torch);
    return d;
  }
  nb::dict grads() const {
    nb::dict d;
    for (const NamedParameter& p : m->named_parameters())
      d[p.name.c_str()] = export_tensor(p.grad.clone(), torch);
    return d;
  }
  void load_state_dict(nb::dict sd, bool strict) {
    ArrayScope scope("attn.nn.load_state_dict");
    TensorList list;
    for (auto [k, v] : sd) {
      if (!nb::isinstance<nb::str>(k))
        throw nb::type_error("attn.nn.load_state_dict: keys must be str");
      const std::string name = nb::cast<std::string>(k);
      list.emplace_back(name, scope.import(v, name.c_str()));
    }
    m->load_state_dict(list, strict);
  }
};

// Runs a forward `f` (GIL released) on views of the inputs `scope` imported, then keeps them for
// the backward; also when `f` throws, since the module may have cached a view before failing.
template <class M, class F>
auto forward_on_views(Holder<M>& h, const ArrayScope& scope, F&& f) {
  decltype(f()) r;
  try {
    nb::gil_scoped_release release;
    r = f();
  } catch (...) {
    h.saved.keep(scope);
    throw;
  }
  h.saved.keep(scope);
  h.torch = scope.torch();
  return r;
}

// Runs a backward `f` (GIL released) once the last forward's torch inputs are checked unchanged.
template <class M, class F>
auto backward_on_views(Holder<M>& h, const char* fn, F&& f) {
  h.saved.check(fn);
  nb::gil_scoped_release release;
  return f();
}

template <class M>
void bind_module_common(nb::class_<Holder<M>>& c) {
  c.def("state_dict", &Holder<M>::state_dict,
        "Parameters by PyTorch's names (arrays sharing the module's memory).")
      .def("grads", &Holder<M>::grads, "Accumulated parameter gradients by name (copies).")
      .def(
          "parameters",
          [](const Holder<M>& h, const std::string& prefix) {
            ParameterList l{h.m->named_parameters()};
            if (!prefix.empty())
              for (NamedParameter& p : l.items) p.name = prefix + "." + p.name;
            return l;
          },
          nb::arg("prefix") = "",
          "The parameters (sharing the module's memory), for an optimizer; names get 'prefix.'.")
      .def("load_state_dict", &Holder<M>::load_state_dict, nb::arg("state_dict"),
           nb::arg("strict") = true,
           "Copies values by name, converting dtype; strict: every parameter present and no extra "
           "name.")
      .def(
          "train", [](Holder<M>& h, bool on) { h.m->train(on); }, nb::arg("mode") = true)
      .def_prop_ro("training", [](const Holder<M>& h) { return h.m->is_training(); })
      .def("zero_grad", [](Holder<M>& h) { h.m->zero_grad(); })
      .def(
          "manual_seed", [](Holder<M>& h, uint64_t seed) { h.m->manual_seed(seed); },
          nb::arg("seed"),
          "Re-seeds every dropout of the module: the same seed gives the same patterns on the next "
          "forward.")
      .def("num_parameters", [](const Holder<M>& h) { return h.m->num_parameters(); })
      .def(
          "save",
          [](const Holder<M>& h, const std::string& path,
             const std::map<std::string, std::string>& metadata) {
            nb::gil_scoped_release release;
            h.m->save(path, metadata);
          },
          nb::arg("path"), nb::arg("metadata") = std::map<std::string, std::string>{},
          "Writes the state dict (PyTorch's names) to a safetensors file, with str -> str "
          "metadata.")
      .def(
          "load",
          [](Holder<M>& h, const std::string& path, bool strict) {
            nb::gil_scoped_release release;
            h.m->load(path, strict);
          },
          nb::arg("path"), nb::arg("strict") = true,
          "Reads a safetensors file by name, converting dtype; strict as load_state_dict.");
}

// backward(grad_output) of a module: its backward (GIL released, once the last forward's torch
// inputs are checked unchanged) on the gradient, whose result `out(scope, torch, grads)` returns in
// the framework of the last forward.
template <class M, class Out>
void bind_backward(nb::class_<Holder<M>>& c, const char* backward_fn, Out out) {
  c.def(
      "backward",
      [backward_fn, out](Holder<M>& h, nb::handle dout) {
        ArrayScope scope(backward_fn);
        const Tensor d = values(scope, dout, "grad_output");
        auto g = backward_on_views(h, scope.fn(), [&] { return h.m->backward(d); });
        return out(scope, h.torch, std::move(g));
      },
      nb::arg("grad_output"));
}

// backward(grad_output) -> d(input) of a module with one input.
template <class M>
void bind_unary_backward(nb::class_<Holder<M>>& c, const char* backward_fn) {
  bind_backward(c, backward_fn, [](ArrayScope& scope, bool torch, Tensor dx) {
    return scope.export_result(std::move(dx), torch);
  });
}

// Forward / backward of a module mapping one array to one array of the same kind: x [..., in] ->
// y [..., out] (Linear, LayerNorm, ...), backward(dy) -> dx. The forward's further arguments, of
// types Extra, are named by extra_args: an absolute position module's forward(x, offset) takes
// x [B, L, E] or [L, B, E] -> the same, positions offset .. offset + L - 1.
template <class... Extra, class M, class... ExtraArgs>
void bind_unary(nb::class_<Holder<M>>& c, const char* forward_fn, const char* backward_fn,
                ExtraArgs... extra_args) {
  c.def(
      "forward",
      [forward_fn](Holder<M>& h, nb::handle input, Extra... extra) {
        ArrayScope scope(forward_fn);
        const Tensor x = values(scope, input, "input");
        Tensor y = forward_on_views(h, scope, [&] { return h.m->forward(x, extra...); });
        return scope.export_result(std::move(y), h.torch);
      },
      nb::arg("input"), extra_args...);
  bind_unary_backward(c, backward_fn);
  bind_module_common(c);
}

// forward(src, <mask_name>, src_key_padding_mask, is_causal) and backward(grad_output) of an encoder
// layer or stack: src [..., L, E] -> [..., L, E]; backward -> d(src).
template <class M>
void bind_encoder_passes(nb::class_<Holder<M>>& c, const char* forward_fn, const char* backward_fn,
                         const char* mask_name) {
  c.def(
      "forward",
      [forward_fn, mask_name](Holder<M>& h, nb::handle src, nb::handle mask,
                              nb::handle src_key_padding_mask, bool is_causal) {
        ArrayScope scope(forward_fn);
        const Tensor x = values(scope, src, "src");
        EncoderMasks masks;
        masks.mask = scope.import(mask, mask_name, true);
        masks.src_key_padding_mask =
            scope.import(src_key_padding_mask, "src_key_padding_mask", true);
        masks.is_causal = is_causal;
        Tensor y = forward_on_views(h, scope, [&] { return h.m->forward(x, masks); });
        return scope.export_result(std::move(y), h.torch);
      },
      nb::arg("src"), nb::arg(mask_name).none() = nb::none(),
      nb::arg("src_key_padding_mask").none() = nb::none(), nb::arg("is_causal") = false);
  bind_unary_backward(c, backward_fn);
}

// forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
// tgt_is_causal, memory_is_causal) and backward(grad_output) -> (d(tgt), d(memory)) of a decoder
// layer or stack: tgt [..., T, E], memory [..., S, E] -> [..., T, E].
template <class M>
void bind_decoder_passes(nb::class_<Holder<M>>& c, const char* forward_fn,
                         const char* backward_fn) {
  c.def(
      "forward",
      [forward_fn](Holder<M>& h, nb::handle tgt, nb::handle memory, nb::handle tgt_mask,
                   nb::handle memory_mask, nb::handle tgt_key_padding_mask,
                   nb::handle memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
        ArrayScope scope(forward_fn);
        const Tensor x = values(scope, tgt, "tgt"), mem = values(scope, memory, "memory");
        DecoderMasks masks;
        masks.tgt_mask = scope.import(tgt_mask, "tgt_mask", true);
        masks.memory_mask = scope.import(memory_mask, "memory_mask", true);
        masks.tgt_key_padding_mask =
            scope.import(tgt_key_padding_mask, "tgt_key_padding_mask", true);
        masks.memory_key_padding_mask =
            scope.import(memory_key_padding_mask, "memory_key_padding_mask", true);
        masks.tgt_is_causal = tgt_is_causal;
        masks.memory_is_causal = memory_is_causal;
        Tensor y = forward_on_views(h, scope, [&] { return h.m->forward(x, mem, masks); });
        return scope.export_result(std::move(y), h.torch);
      },
      nb::arg("tgt"), nb::arg("memory"), nb::arg("tgt_mask").none() = nb::none(),
      nb::arg("memory_mask").none() = nb::none(),
      nb::arg("tgt_key_padding_mask").none() = nb::none(),
      nb::arg("memory_key_padding_mask").none() = nb::none(), nb::arg("tgt_is_causal") = false,
      nb::arg("memory_is_causal") = false);
  bind_backward(c, backward_fn, [](ArrayScope& scope, bool torch, DecoderGrads g) {
    return nb::make_tuple(scope.export_result(std::move(g.dtgt), torch),
                          scope.export_result(std::move(g.dmemory), torch));
  });
}

// attn.nn.MultiheadAttention's position argument: its strings, the C++ schemes' names.
PositionScheme position_arg(const std::string& name) {
  static constexpr std::pair<const char*, PositionScheme> kSchemes[] = {
      {"none", PositionScheme::none},
      {"rope", PositionScheme::rope},
      {"rope_interleaved", PositionScheme::rope_interleaved},
      {"alibi", PositionScheme::alibi},
      {"shaw", PositionScheme::shaw},
      {"t5", PositionScheme::t5}};
  for (const auto& [n, scheme] : kSchemes)
    if (name == n) return scheme;
  throw nb::value_error(fmt::format("attn.nn.MultiheadAttention: position must be one of 'none', "
                                    "'rope', 'rope_interleaved', 'alibi', 'shaw', 't5', got '{}'",
                                    name)
                            .c_str());
}

// attn.nn.MultiheadAttention's kind argument: 'softmax' or 'linear' (attn::nn::AttentionKind).
AttentionKind kind_arg(const std::string& name) {
  if (name == "softmax") return AttentionKind::softmax;
  if (name == "linear") return AttentionKind::linear;
  throw nb::value_error(
      fmt::format("attn.nn.MultiheadAttention: kind must be 'softmax' or 'linear', got '{}'", name)
          .c_str());
}

DType dtype_arg(const std::string& name) {
  std::string n = name;
  if (n.rfind("torch.", 0) == 0) n = n.substr(6);
  return parse_dtype(n);
}

using MhaHolder = Holder<MultiHeadAttention>;
using EncoderHolder = Holder<TransformerEncoderLayer>;
using DecoderHolder = Holder<TransformerDecoderLayer>;
using EncoderStackHolder = Holder<TransformerEncoder>;
using DecoderStackHolder = Holder<TransformerDecoder>;
using LinearHolder = Holder<Linear>;
using LayerNormHolder = Holder<LayerNorm>;
using EmbeddingHolder = Holder<Embedding>;
using ActivationHolder = Holder<ActivationLayer>;
using DropoutHolder = Holder<Dropout>;
using SinusoidalHolder = Holder<SinusoidalPositionalEncoding>;
using LearnedPositionsHolder = Holder<LearnedPositionalEmbedding>;
using FeedForwardHolder = Holder<FeedForward>;

// TransformerLayerOptions' per-site dropout probabilities, in their order (None: dropout).
using DropoutSites = std::tuple<std::optional<double>, std::optional<double>, std::optional<double>,
                                std::optional<double>>;

TransformerLayerOptions layer_options(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                      double dropout, const std::string& activation,
                                      double layer_norm_eps, bool batch_first, bool norm_first,
                                      bool bias, const std::string& dtype, int64_t num_kv_heads,
                                      const std::string& backend, const DropoutSites& sites) {
  TransformerLayerOptions o;
  o.d_model = d_model;
  o.nhead = nhead;
  o.dim_feedforward = dim_feedforward;
  o.dropout = dropout;
  o.activation = parse_activation(activation);
  o.layer_norm_eps = layer_norm_eps;
  o.batch_first = batch_first;
  o.norm_first = norm_first;
  o.bias = bias;
  o.dtype = dtype_arg(dtype);
  o.num_kv_heads = num_kv_heads;
  o.backend = parse_backend(backend);
  std::tie(o.attention_dropout, o.activation_dropout, o.attention_output_dropout,
           o.ffn_output_dropout) = sites;
  return o;
}

// Those arguments' names and defaults, PyTorch's (num_kv_heads and backend are attn's own).
auto layer_arg_names() {
  return std::make_tuple(
      nb::arg("d_model"), nb::arg("nhead"), nb::arg("dim_feedforward") = 2048,
      nb::arg("dropout") = 0.1, nb::arg("activation") = "relu", nb::arg("layer_norm_eps") = 1e-5,
      nb::arg("batch_first") = false, nb::arg("norm_first") = false, nb::arg("bias") = true,
      nb::arg("dtype") = "float32", nb::arg("num_kv_heads") = 0, nb::arg("backend") = "auto",
      nb::arg("attention_dropout").none() = nb::none(),
      nb::arg("activation_dropout").none() = nb::none(),
      nb::arg("attention_output_dropout").none() = nb::none(),
      nb::arg("ffn_output_dropout").none() = nb::none());
}

template <class... T>
struct Args {};  // the types of a constructor's own arguments

// __init__(lead..., <layer_options' arguments>, tail...) of a Transformer layer or stack: `make`(the
// options, lead..., tail...) builds its module; lead_names / tail_names (tuples of nb::arg) name the
// arguments of its own.
template <class Holder, class... Lead, class... Tail, class LeadNames, class TailNames, class Make>
void bind_layer_init(nb::class_<Holder>& c, Args<Lead...>, LeadNames lead_names, Args<Tail...>,
                     TailNames tail_names, Make make) {
  auto init = [make](Holder* self, Lead... lead, int64_t d_model, int64_t nhead,
                     int64_t dim_feedforward, double dropout, const std::string& activation,
                     double layer_norm_eps, bool batch_first, bool norm_first, bool bias,
                     const std::string& dtype, int64_t num_kv_heads, const std::string& backend,
                     std::optional<double> attention_dropout,
                     std::optional<double> activation_dropout,
                     std::optional<double> attention_output_dropout,
                     std::optional<double> ffn_output_dropout, Tail... tail) {
    new (self) Holder{make(
        layer_options(
            d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
            norm_first, bias, dtype, num_kv_heads, backend,
            {attention_dropout, activation_dropout, attention_output_dropout, ffn_output_dropout}),
        lead..., tail...)};
  };
  std::apply([&](auto&&... names) { c.def("__init__", init, names...); },
             std::tuple_cat(lead_names, layer_arg_names(), tail_names));
}

// set_checkpoint(on) of an encoder layer, or of every layer of an encoder stack.
template <class M>
void bind_set_checkpoint(nb::class_<Holder<M>>& c) {
  c.def(
      "set_checkpoint",
      [](Holder<M>& h, bool on) {
        if constexpr (std::is_same_v<M, TransformerEncoder>) {
          for (auto& layer : h.m->layers) layer->set_checkpoint(on);
        } else {
          h.m->set_checkpoint(on);
        }
      },
      nb::arg("on"), "Activation checkpointing (training mode) from the next forward on.");
}

// The module behind attn.nn.MultiheadAttention.
void bind_multihead_attention(nb::module_& m) {
  nb::class_<MhaHolder> mha(m, "MultiheadAttention");
  mha.def(
         "__init__",
         [](MhaHolder* self, int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
            int64_t kdim, int64_t vdim, bool batch_first, const std::string& dtype,
            int64_t num_kv_heads, const std::string& backend, const std::string& position,
            int64_t max_distance, int64_t num_buckets, double rope_base, const std::string& kind) {
           MultiHeadAttentionOptions o;
           o.embed_dim = embed_dim;
           o.num_heads = num_heads;
           o.num_kv_heads = num_kv_heads;
           o.dropout = dropout;
           o.bias = bias;
           o.kdim = kdim;
           o.vdim = vdim;
           o.batch_first = batch_first;
           o.dtype = dtype_arg(dtype);
           o.backend = parse_backend(backend);
           o.position = position_arg(position);
           o.max_distance = max_distance;
           o.num_buckets = num_buckets;
           o.rope_base = rope_base;
           o.kind = kind_arg(kind);
           new (self) MhaHolder{std::make_unique<MultiHeadAttention>(o)};
         },
         nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("dropout") = 0.0,
         nb::arg("bias") = true, nb::arg("kdim") = 0, nb::arg("vdim") = 0,
         nb::arg("batch_first") = false, nb::arg("dtype") = "float32", nb::arg("num_kv_heads") = 0,
         nb::arg("backend") = "auto", nb::arg("position") = "none", nb::arg("max_distance") = 16,
         nb::arg("num_buckets") = 32, nb::arg("rope_base") = 10000.0, nb::arg("kind") = "softmax")
      .def(
          "forward",
          [](MhaHolder& h, nb::handle query, nb::handle key, nb::handle value,
             nb::handle key_padding_mask, bool need_weights, nb::handle attn_mask,
             bool average_attn_weights, bool is_causal, int64_t position_offset) {
            ArrayScope scope("attn.nn.MultiheadAttention.forward");
            const Tensor q = values(scope, query, "query"), k = values(scope, key, "key"),
                         v = values(scope, value, "value");
            AttentionMasks masks;
            masks.key_padding_mask = scope.import(key_padding_mask, "key_padding_mask", true);
            masks.attn_mask = scope.import(attn_mask, "attn_mask", true);
            masks.need_weights = need_weights;
            masks.average_attn_weights = average_attn_weights;
            masks.is_causal = is_causal;
            masks.position_offset = position_offset;
            MhaOutput r = forward_on_views(h, scope, [&] { return h.m->forward(q, k, v, masks); });
            return nb::make_tuple(scope.export_result(std::move(r.output), h.torch),
                                  scope.export_result(std::move(r.weights), h.torch));
          },
          nb::arg("query"), nb::arg("key"), nb::arg("value"),
          nb::arg("key_padding_mask").none() = nb::none(), nb::arg("need_weights") = true,
          nb::arg("attn_mask").none() = nb::none(), nb::arg("average_attn_weights") = true,
          nb::arg("is_causal") = false, nb::arg("position_offset") = 0);
  bind_backward(mha, "attn.nn.MultiheadAttention.backward",
                [](ArrayScope& scope, bool torch, MhaGrads g) {
                  return nb::make_tuple(scope.export_result(std::move(g.dquery), torch),
                                        scope.export_result(std::move(g.dkey), torch),
                                        scope.export_result(std::move(g.dvalue), torch));
                });
  bind_module_common(mha);
}

// The Transformer layers and their stacks (attn.nn.TransformerEncoder, ...).
void bind_transformer_layers(nb::module_& m) {
  nb::class_<EncoderHolder> enc(m, "TransformerEncoderLayer");
  bind_layer_init(enc, Args<>{}, std::make_tuple(), Args<bool>{},
                  std::make_tuple(nb::arg("checkpoint") = false),
                  [](TransformerLayerOptions o, bool checkpoint) {
                    o.checkpoint = checkpoint;
                    return std::make_unique<TransformerEncoderLayer>(o);
                  });
  bind_set_checkpoint(enc);
  bind_encoder_passes(enc, "attn.nn.TransformerEncoderLayer.forward",
                      "attn.nn.TransformerEncoderLayer.backward", "src_mask");
  bind_module_common(enc);

  nb::class_<DecoderHolder> dec(m, "TransformerDecoderLayer");
  bind_layer_init(dec, Args<>{}, std::make_tuple(), Args<>{}, std::make_tuple(),
                  [](const TransformerLayerOptions& o) {
                    return std::make_unique<TransformerDecoderLayer>(o);
                  });
  bind_decoder_passes(dec, "attn.nn.TransformerDecoderLayer.forward",
                      "attn.nn.TransformerDecoderLayer.backward");
  bind_module_common(dec);

  nb::class_<EncoderStackHolder> stack(m, "TransformerEncoder");
  bind_layer_init(
      stack, Args<int64_t, bool>{}, std::make_tuple(nb::arg("num_layers"), nb::arg("final_norm")),
      Args<bool, const std::string&>{},
      std::make_tuple(nb::arg("checkpoint") = false, nb::arg("activation_dtype") = "float32"),
      [](TransformerLayerOptions o, int64_t num_layers, bool final_norm, bool checkpoint,
         const std::string& activation_dtype) {
        o.checkpoint = checkpoint;
        return std::make_unique<TransformerEncoder>(o, num_layers, final_norm,
                                                    dtype_arg(activation_dtype));
      });
  bind_set_checkpoint(stack);
  bind_encoder_passes(stack, "attn.nn.TransformerEncoder.forward",
                      "attn.nn.TransformerEncoder.backward", "mask");
  bind_module_common(stack);

  nb::class_<DecoderStackHolder> dstack(m, "TransformerDecoder");
  bind_layer_init(dstack, Args<int64_t, bool>{},
                  std::make_tuple(nb::arg("num_layers"), nb::arg("final_norm")), Args<>{},
                  std::make_tuple(),
                  [](const TransformerLayerOptions& o, int64_t num_layers, bool final_norm) {
                    return std::make_unique<TransformerDecoder>(o, num_layers, final_norm);
                  });
  bind_decoder_passes(dstack, "attn.nn.TransformerDecoder.forward",
                      "attn.nn.TransformerDecoder.backward");
  bind_module_common(dstack);
}

// Linear, LayerNorm, the activations, Dropout, the positions and FeedForward.
void bind_single_layers(nb::module_& m) {
  nb::class_<LinearHolder> linear(m, "Linear");
  linear.def(
      "__init__",
      [](LinearHolder* self, int64_t in_features, int64_t out_features, bool bias,
         const std::string& dtype) {
        new (self) LinearHolder{
            std::make_unique<Linear>(in_features, out_features, bias, dtype_arg(dtype))};
      },
      nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true,
      nb::arg("dtype") = "float32");
  bind_unary(linear, "attn.nn.Linear.forward", "attn.nn.Linear.backward");

  nb::class_<LayerNormHolder> layer_norm(m, "LayerNorm");
  layer_norm.def(
      "__init__",
      [](LayerNormHolder* self, int64_t normalized_shape, double eps, bool elementwise_affine,
         bool bias, const std::string& dtype) {
        new (self) LayerNormHolder{std::make_unique<LayerNorm>(
            normalized_shape, eps, elementwise_affine, bias, dtype_arg(dtype))};
      },
      nb::arg("normalized_shape"), nb::arg("eps") = 1e-5, nb::arg("elementwise_affine") = true,
      nb::arg("bias") = true, nb::arg("dtype") = "float32");
  bind_unary(layer_norm, "attn.nn.LayerNorm.forward", "attn.nn.LayerNorm.backward");

  nb::class_<ActivationHolder> activation(m, "Activation");
  activation.def(
      "__init__",
      [](ActivationHolder* self, const std::string& kind) {
        new (self) ActivationHolder{std::make_unique<ActivationLayer>(parse_activation(kind))};
      },
      nb::arg("kind"));
  bind_unary(activation, "attn.nn.Activation.forward", "attn.nn.Activation.backward");

  nb::class_<DropoutHolder> dropout(m, "Dropout");
  dropout.def(
      "__init__",
      [](DropoutHolder* self, double p) { new (self) DropoutHolder{std::make_unique<Dropout>(p)}; },
      nb::arg("p") = 0.5);
  bind_unary(dropout, "attn.nn.Dropout.forward", "attn.nn.Dropout.backward");

  nb::class_<SinusoidalHolder> sinusoidal(m, "SinusoidalPositionalEncoding");
  sinusoidal.def(
      "__init__",
      [](SinusoidalHolder* self, int64_t d_model, int64_t max_len, bool batch_first, double scale) {
        new (self) SinusoidalHolder{
            std::make_unique<SinusoidalPositionalEncoding>(d_model, max_len, batch_first, scale)};
      },
      nb::arg("d_model"), nb::arg("max_len") = 4096, nb::arg("batch_first") = false,
      nb::arg("scale") = 1.0);
  bind_unary<int64_t>(sinusoidal, "attn.nn.SinusoidalPositionalEncoding.forward",
                      "attn.nn.SinusoidalPositionalEncoding.backward", nb::arg("offset") = 0);

  nb::class_<LearnedPositionsHolder> learned(m, "LearnedPositionalEmbedding");
  learned.def(
      "__init__",
      [](LearnedPositionsHolder* self, int64_t max_len, int64_t d_model, bool batch_first,
         double scale, const std::string& dtype, double init_std) {
        new (self) LearnedPositionsHolder{std::make_unique<LearnedPositionalEmbedding>(
            max_len, d_model, batch_first, scale, dtype_arg(dtype), init_std)};
      },
      nb::arg("max_len"), nb::arg("d_model"), nb::arg("batch_first") = false,
      nb::arg("scale") = 1.0, nb::arg("dtype") = "float32", nb::arg("init_std") = 1.0);
  bind_unary<int64_t>(learned, "attn.nn.LearnedPositionalEmbedding.forward",
                      "attn.nn.LearnedPositionalEmbedding.backward", nb::arg("offset") = 0);

  nb::class_<FeedForwardHolder> feed_forward(m, "FeedForward");
  feed_forward.def(
      "__init__",
      [](FeedForwardHolder* self, int64_t d_model, int64_t d_ff, const std::string& activation,
         double dropout, bool bias, const std::string& dtype) {
        new (self) FeedForwardHolder{std::make_unique<FeedForward>(
            d_model, d_ff, parse_activation(activation), dropout, dtype_arg(dtype), bias)};
      },
      nb::arg("d_model"), nb::arg("d_ff"), nb::arg("activation") = "relu", nb::arg("dropout") = 0.0,
      nb::arg("bias") = true, nb::arg("dtype") = "float32");
  bind_unary(feed_forward, "attn.nn.FeedForward.forward", "attn.nn.FeedForward.backward");
}

// Embedding: integer ids in, so its own forward and backward.
void bind_embedding(nb::module_& m) {
  nb::class_<EmbeddingHolder> embedding(m, "Embedding");
  embedding
      .def(
          "__init__",
          [](EmbeddingHolder* self, int64_t num_embeddings, int64_t embedding_dim,
             int64_t padding_idx, const std::string& dtype) {
            new (self) EmbeddingHolder{std::make_unique<Embedding>(num_embeddings, embedding_dim,
                                                                   padding_idx, dtype_arg(dtype))};
          },
          nb::arg("num_embeddings"), nb::arg("embedding_dim"), nb::arg("padding_idx") = -1,
          nb::arg("dtype") = "float32")
      .def(
          "forward",
          [](EmbeddingHolder& h, nb::handle input) {
            ArrayScope scope("attn.nn.Embedding.forward");
            const Tensor ids = scope.import(input, "input");
            Tensor y = forward_on_views(h, scope, [&] { return h.m->forward(ids); });
            return scope.export_result(std::move(y), h.torch);
          },
          nb::arg("input"))
      .def(
          "backward",
          [](EmbeddingHolder& h, nb::handle dout) {
            ArrayScope scope("attn.nn.Embedding.backward");
            const Tensor d = values(scope, dout, "grad_output");
            backward_on_views(h, scope.fn(), [&] { h.m->backward(d); });
          },
          nb::arg("grad_output"));
  bind_module_common(embedding);
}

}  // namespace

void bind_nn(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("nn", "attn::nn modules (use attn.nn, which wraps them).");
  bind_training(m);  // ParameterList first: parameters() returns one
  // The GEMM libraries the nn products run on and their kernels on this CPU, as `attn bench` prints
  // them ("f32: oneDNN 2.7.3 sgemm (ISA avx512_core_bf16); f64: OpenBLAS ..."); no docstring: the
  // stubs stay within nn.pyi's 700 lines.
  m.def("gemm_kernels", [] { return gemm_kernels(); });
  // attn::nn's gradient mode of the calling thread (attn.nn.no_grad and friends, attn/_grad_mode.py,
  // carry the docstrings: these stubs stay within python/src/attn/_core/nn.pyi's 700 lines).
  m.def("is_grad_enabled", &grad_enabled);
  m.def("set_grad_enabled", &set_grad_enabled, nb::arg("on"));
  // Autocast (attn.nn.autocast, attn/_grad_mode.py), per thread as the gradient mode.
  m.def("is_autocast_enabled", &autocast_enabled);
  m.def("set_autocast_enabled", &set_autocast_enabled, nb::arg("on"));

  bind_multihead_attention(m);
  bind_transformer_layers(m);
  bind_single_layers(m);
  bind_embedding(m);
}

}  // namespace attn::python
