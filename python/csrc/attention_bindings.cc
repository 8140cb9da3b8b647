// attn.attention and attn.attention_backward: the whole contract of include/attn/attention.h, with
// NumPy / PyTorch arrays in and out. Arguments are parsed and arrays imported with the GIL held;
// the computation runs with it released.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attn/attention.h"
#include "attn/options.h"
#include "bindings.h"
#include "core/parallel.h"

namespace attn::python {

namespace {

// The keyword arguments shared by the forward and the backward, as Python passes them.
struct OptionArgs {
  nb::handle mask;
  std::string mask_type;
  bool causal;
  std::string align;
  std::optional<int64_t> position_offset;
  nb::handle window;
  std::optional<double> scale;
  std::optional<double> softcap;
  nb::handle alibi_slopes;
  nb::handle key_lengths;
  nb::handle block_layout;
  nb::handle block_size;
  double dropout_p;
  nb::handle seed;
  std::string backend;
  std::optional<int> threads;
};

int64_t window_bound(nb::handle h, const char* fn) {
  if (h.is_none()) return -1;
  int64_t v;
  if (!nb::try_cast(h, v)) {
    throw nb::type_error(fmt::format("{}: window bounds must be int or None, got {}", fn,
                                     nb::cast<std::string>(nb::repr(h)))
                             .c_str());
  }
  return v;
}

// (left, right) -> Window; None = unbounded.
Window parse_window(nb::handle w, const char* fn) {
  if (w.is_none()) return {};
  if (!PySequence_Check(w.ptr()) || PySequence_Size(w.ptr()) != 2) {
    if (PyErr_Occurred()) PyErr_Clear();
    throw nb::type_error(
        fmt::format("{}: window must be a pair (left, right) of int or None, got {}", fn,
                    nb::cast<std::string>(nb::repr(w)))
            .c_str());
  }
  return {window_bound(w[0], fn), window_bound(w[1], fn)};
}

uint64_t parse_seed(nb::handle s, double dropout_p, const char* fn) {
  if (s.is_none()) {
    // A fresh pattern per call; pass a seed to reproduce it (attention_backward needs the
    // forward's).
    if (dropout_p == 0.0) return 0;
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  uint64_t v;
  if (!nb::try_cast(s, v)) {
    throw nb::value_error(fmt::format("{}: seed must be an int in [0, 2**64), got {}", fn,
                                      nb::cast<std::string>(nb::repr(s)))
                              .c_str());
  }
  return v;
}

[[noreturn]] void dtype_error(const char* fn, const char* name, const char* expected,
                              const Tensor& t) {
  throw nb::type_error(fmt::format("{}: {} must be {}, got {} with shape {}", fn, name, expected,
                                   dtype_name(t.dtype()), t.shape_str())
                           .c_str());
}

// An array of a dtype the argument does not take is a TypeError, as the docstring promises (the C++
// entry points, which see only tensors, report it as a bad option: ValueError). Shapes and the
// agreement of q, k and v's dtypes stay with the C++ validation.
void require_floating(const Tensor& t, const char* fn, const char* name) {
  if (t.defined() && !is_floating(t.dtype())) dtype_error(fn, name, "f64, f32, bf16 or f16", t);
}

void check_option_dtypes(const AttentionOptions& o, const char* fn) {
  if (o.mask.defined()) {
    if (o.mask_type == MaskType::add) {
      require_floating(o.mask, fn, "mask (mask_type 'add')");
    } else if (o.mask.dtype() != DType::boolean) {
      dtype_error(
          fn, o.mask_type == MaskType::keep ? "mask (mask_type 'keep')" : "mask (mask_type 'drop')",
          "bool (or mask_type='add' for a float mask)", o.mask);
    }
  }
  require_floating(o.alibi_slopes, fn, "alibi_slopes");
  const Tensor& kl = o.key_lengths;
  if (kl.defined() && kl.dtype() != DType::i32 && kl.dtype() != DType::i64)
    dtype_error(fn, "key_lengths", "an integer array", kl);
  const Tensor& bl = o.block_layout.layout;
  if (bl.defined() && bl.dtype() != DType::boolean) dtype_error(fn, "block_layout", "bool", bl);
}

AttentionOptions parse_options(ArrayScope& scope, const OptionArgs& a, bool backward) {
  const char* fn = scope.fn();
  AttentionOptions o;
  o.mask_type = parse_mask_type(a.mask_type);
  o.mask = scope.import(a.mask, "mask", true);
  o.causal = a.causal;
  o.align = parse_align(a.align);
  o.position_offset = a.position_offset;
  o.window = parse_window(a.window, fn);
  o.scale = a.scale;
  o.softcap = a.softcap;
  o.alibi_slopes = scope.import(a.alibi_slopes, "alibi_slopes", true);
  o.key_lengths = scope.import(a.key_lengths, "key_lengths", true);
  o.block_layout.layout = scope.import(a.block_layout, "block_layout", true);
  if (o.block_layout.layout.defined()) {
    if (a.block_size.is_none()) {
      throw nb::value_error(
          fmt::format("{}: block_layout needs block_size (an int or a pair (block_q, block_k))", fn)
              .c_str());
    }
    int64_t bq = 0, bk = 0;
    if (nb::try_cast(a.block_size, bq)) {
      bk = bq;
    } else if (PySequence_Check(a.block_size.ptr()) && PySequence_Size(a.block_size.ptr()) == 2 &&
               nb::try_cast(a.block_size[0], bq) && nb::try_cast(a.block_size[1], bk)) {
    } else {
      if (PyErr_Occurred()) PyErr_Clear();
      throw nb::type_error(fmt::format("{}: block_size must be an int or a pair of ints, got {}",
                                       fn, nb::cast<std::string>(nb::repr(a.block_size)))
                               .c_str());
    }
    o.block_layout.block_q = bq;
    o.block_layout.block_k = bk;
  } else if (!a.block_size.is_none()) {
    throw nb::value_error(fmt::format("{}: block_size was given without block_layout", fn).c_str());
  }
  o.dropout_p = a.dropout_p;
  if (backward && a.dropout_p > 0.0 && a.seed.is_none()) {
    throw nb::value_error(
        fmt::format("{}: dropout_p > 0 needs the forward's seed to regenerate its keep-pattern", fn)
            .c_str());
  }
  o.seed = parse_seed(a.seed, a.dropout_p, fn);
  o.backend = parse_backend(a.backend);
  o.threads = a.threads.value_or(0);
  check_option_dtypes(o, fn);
  return o;
}

nb::object attention_py(nb::handle q, nb::handle k, nb::handle v, const OptionArgs& args,
                        bool return_lse, bool return_weights) {
  ArrayScope scope("attn.attention");
  const Tensor tq = scope.import(q, "q"), tk = scope.import(k, "k"), tv = scope.import(v, "v");
  for (auto [t, name] : {std::pair{&tq, "q"}, std::pair{&tk, "k"}, std::pair{&tv, "v"}})
    require_floating(*t, scope.fn(), name);
  AttentionOptions o = parse_options(scope, args, false);
  o.return_weights = return_weights;
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = attention(tq, tk, tv, o);
  }
  const bool torch = scope.torch();
  nb::object out = export_tensor(std::move(r.out), torch);
  if (!return_lse && !return_weights) return out;
  nb::list result;
  result.append(out);
  if (return_lse) result.append(export_tensor(std::move(r.lse), torch));
  if (return_weights) result.append(export_tensor(std::move(r.weights), torch));
  return nb::tuple(result);
}

nb::object attention_backward_py(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                 nb::handle out, nb::handle lse, const OptionArgs& args,
                                 bool mask_grad) {
  ArrayScope scope("attn.attention_backward");
  const Tensor tdout = scope.import(dout, "dout"), tq = scope.import(q, "q"),
               tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               tout = scope.import(out, "out"), tlse = scope.import(lse, "lse");
  const std::pair<const Tensor*, const char*> arrays[] = {
      {&tdout, "dout"}, {&tq, "q"}, {&tk, "k"}, {&tv, "v"}, {&tout, "out"}, {&tlse, "lse"}};
  for (auto [t, name] : arrays) require_floating(*t, scope.fn(), name);
  AttentionOptions o = parse_options(scope, args, true);
  o.mask_grad = mask_grad;
  AttentionGrads g;
  {
    nb::gil_scoped_release release;
    g = attention_backward(tdout, tq, tk, tv, tout, tlse, o);
  }
  const bool torch = scope.torch();
  nb::list result;
  result.append(export_tensor(std::move(g.dq), torch));
  result.append(export_tensor(std::move(g.dk), torch));
  result.append(export_tensor(std::move(g.dv), torch));
  if (mask_grad) result.append(export_tensor(std::move(g.dmask), torch));
  return nb::tuple(result);
}

constexpr const char* kShapesDoc = R"(
Shapes (any number of leading batch dims "...", equal across q, k and v):
    q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]  ->  out [..., Hq, Lq, Dv]
    lse [..., Hq, Lq] (float64 for float64 inputs, else float32), weights [..., Hq, Lq, Lk].
    Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors), which is the
compute type (float64 computes in double, the others accumulate in float32 or better). Arrays are
NumPy arrays or PyTorch CPU tensors; they are read without a copy when their last dim is contiguous.
Results are NumPy arrays, or torch tensors when any input is a torch tensor.

Alignment: query i sits at key position p(i) = i + Lk - Lq with align='bottom-right' (the default,
FlashAttention's causal) and p(i) = i with align='top-left' (PyTorch's is_causal);
position_offset=n overrides both: p(i) = i + n (chunked prefill, ring attention).
Key j is used by query i only when every rule allows it:
    causal: j <= p(i); window=(left, right): p(i) - left <= j <= p(i) + right (None or -1 = unbounded);
    mask: broadcastable to [..., Hq, Lq, Lk], with mask_type 'keep' (bool, True = may attend, as
    torch's scaled_dot_product_attention), 'drop' (bool, True = masked, as nn.MultiheadAttention) or
    'add' (float added to the scores, -inf removes the key);
    key_lengths [...] (int): keys j >= key_lengths[b] are padding;
    block_layout [..., Hq, ceil(Lq / bq), ceil(Lk / bk)] (bool) with block_size bq or (bq, bk).
Score s = scale * q.k (scale defaults to 1/sqrt(D)); softcap c: s = c * tanh(s / c); ALiBi slopes [Hq]:
s -= slope[h] * |p(i) - j|; then an 'add' mask is added. Softmax over the allowed keys only; a row
with no allowed key gives out = 0, weights = 0, lse = -inf (never NaN).
Dropout p drops weights with probability p and scales the rest by 1/(1 - p); the keep-pattern is a
function of (seed, batch, head, i, j): seed=None draws a fresh seed, pass one to reproduce it.
backend: 'auto', 'reference' (double precision, defines the contract) or 'cpu'; threads=None uses
attn.set_num_threads, ATTN_NUM_THREADS or all cores. Raises ValueError (bad shapes or options) or
TypeError (not an array, unsupported dtype); the GIL is released while computing.)";

// One keyword of a binding: nanobind's argument (name, and default when it has one) and its Python type
// for the signature text.
template <class Arg>
struct Keyword {
  Arg arg;
  const char* type;
};
template <class Arg>
Keyword<Arg> kw(Arg arg, const char* type) {
  return {std::move(arg), type};
}

// The name of an option keyword, checked against attn/options.h's table when the module loads (a
// keyword renamed here alone fails the import).
const char* opt(const char* name) {
  return option_info(name).name;
}

// The option keywords of attention and attention_backward, in this order, with AttentionOptions{}'s
// defaults; the part before each function's own keywords (return_lse, ...), and the part after them.
auto option_keywords() {
  const AttentionOptions d;
  return std::make_tuple(
      kw(nb::arg(opt("mask")).none() = nb::none(), "ArrayLike | None"),
      kw(nb::arg(opt("mask_type")) = enum_name(d.mask_type), "str"),
      kw(nb::arg(opt("causal")) = d.causal, "bool"),
      kw(nb::arg(opt("align")) = enum_name(d.align), "str"),
      kw(nb::arg(opt("position_offset")).none() = nb::none(), "int | None"),
      kw(nb::arg(opt("window")).none() = nb::none(), "tuple[int | None, int | None] | None"),
      kw(nb::arg(opt("scale")).none() = nb::none(), "float | None"),
      kw(nb::arg(opt("softcap")).none() = nb::none(), "float | None"),
      kw(nb::arg(opt("alibi_slopes")).none() = nb::none(), "ArrayLike | None"),
      kw(nb::arg(opt("key_lengths")).none() = nb::none(), "ArrayLike | None"),
      kw(nb::arg(opt("block_layout")).none() = nb::none(), "ArrayLike | None"),
      kw(nb::arg("block_size").none() = nb::none(), "int | tuple[int, int] | None"),
      kw(nb::arg(opt("dropout_p")) = d.dropout_p, "float"),
      kw(nb::arg(opt("seed")).none() = nb::none(), "int | None"));
}
auto run_keywords() {
  const AttentionOptions d;
  return std::make_tuple(kw(nb::arg(opt("backend")) = enum_name(d.backend), "str"),
                         kw(nb::arg(opt("threads")).none() = nb::none(), "int | None"));
}
template <class... A>
auto positional(A... names) {
  return std::make_tuple(kw(nb::arg(names), "ArrayLike")...);
}

// "name: type" or "name: type = repr(default)".
template <class Arg>
std::string keyword_sig(const Keyword<Arg>& k) {
  if constexpr (requires { k.arg.value; }) {
    return fmt::format("{}: {} = {}", k.arg.name_, k.type,
                       nb::cast<std::string>(nb::repr(k.arg.value)));
  } else {
    return fmt::format("{}: {}", k.arg.name_, k.type);
  }
}

// Defines fn(positional..., *, keywords...) with its signature text built from the same keywords.
template <class Fn, class... P, class... K>
void def_attention_fn(nb::module_& m, const char* name, Fn&& fn, const std::tuple<P...>& pos,
                      const std::tuple<K...>& kws, const char* returns, const char* doc) {
  std::vector<std::string> parts;
  std::apply([&](const auto&... k) { (parts.push_back(keyword_sig(k)), ...); }, pos);
  parts.emplace_back("*");
  std::apply([&](const auto&... k) { (parts.push_back(keyword_sig(k)), ...); }, kws);
  // nanobind keeps the pointer: one string per function, alive as long as the module.
  static std::vector<std::unique_ptr<std::string>> sigs;
  sigs.push_back(std::make_unique<std::string>(
      fmt::format("def {}({}) -> {}", name, fmt::join(parts, ", "), returns)));
  const char* sig = sigs.back()->c_str();
  std::apply(
      [&](const auto&... p) {
        std::apply(
            [&](const auto&... k) {
              m.def(name, std::forward<Fn>(fn), p.arg..., nb::kw_only(), k.arg..., nb::sig(sig),
                    doc);
            },
            kws);
      },
      pos);
}

}  // namespace

void bind_attention(nb::module_& m) {
  static const std::string attention_doc =
      std::string(
          "Exact scaled dot-product attention: softmax(scale * q k^T + bias) v under the masks "
          "below.\n\n"
          "Returns out, or a tuple (out[, lse][, weights]) with the ones asked for by return_lse "
          "and\n"
          "return_weights (weights are the probabilities before dropout).\n") +
      kShapesDoc;
  const AttentionOptions d;
  def_attention_fn(
      m, "attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle mask, const std::string& mask_type,
         bool causal, const std::string& align, std::optional<int64_t> position_offset,
         nb::handle window, std::optional<double> scale, std::optional<double> softcap,
         nb::handle alibi_slopes, nb::handle key_lengths, nb::handle block_layout,
         nb::handle block_size, double dropout_p, nb::handle seed, bool return_lse,
         bool return_weights, const std::string& backend, std::optional<int> threads) {
        const OptionArgs args{mask,         mask_type,  causal,    align,        position_offset,
                              window,       scale,      softcap,   alibi_slopes, key_lengths,
                              block_layout, block_size, dropout_p, seed,         backend,
                              threads};
        return attention_py(q, k, v, args, return_lse, return_weights);
      },
      positional("q", "k", "v"),
      std::tuple_cat(option_keywords(),
                     std::make_tuple(kw(nb::arg("return_lse") = false, "bool"),
                                     kw(nb::arg(opt("return_weights")) = d.return_weights, "bool")),
                     run_keywords()),
      "Any", attention_doc.c_str());

  static const std::string backward_doc =
      std::string(
          "Gradients of attention(q, k, v, **options)[0] given dout = dL/dout.\n\n"
          "out and lse are that forward call's results (the backward recomputes the weights from "
          "lse);\n"
          "the options, seed included, must be the forward's. Returns (dq, dk, dv) with the shapes "
          "and\n"
          "dtypes of q, k and v (GQA: dk, dv summed over the query heads of a group), and d(mask) "
          "in the\n"
          "mask's shape as a fourth element when mask_grad=True (mask_type='add' only).\n") +
      kShapesDoc;
  def_attention_fn(
      m, "attention_backward",
      [](nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle mask, const std::string& mask_type, bool causal, const std::string& align,
         std::optional<int64_t> position_offset, nb::handle window, std::optional<double> scale,
         std::optional<double> softcap, nb::handle alibi_slopes, nb::handle key_lengths,
         nb::handle block_layout, nb::handle block_size, double dropout_p, nb::handle seed,
         bool mask_grad, const std::string& backend, std::optional<int> threads) {
        const OptionArgs args{mask,         mask_type,  causal,    align,        position_offset,
                              window,       scale,      softcap,   alibi_slopes, key_lengths,
                              block_layout, block_size, dropout_p, seed,         backend,
                              threads};
        return attention_backward_py(dout, q, k, v, out, lse, args, mask_grad);
      },
      positional("dout", "q", "k", "v", "out", "lse"),
      std::tuple_cat(option_keywords(),
                     std::make_tuple(kw(nb::arg(opt("mask_grad")) = d.mask_grad, "bool")),
                     run_keywords()),
      "tuple[Any, ...]", backward_doc.c_str());

  m.def(
      "set_num_threads", [](int n) { set_num_threads(n); }, nb::arg("n"),
      nb::sig("def set_num_threads(n: int) -> None"),
      "Threads used by calls that pass threads=None; n <= 0 restores the default "
      "(ATTN_NUM_THREADS, else all "
      "cores).");
  m.def(
      "get_num_threads", []() { return default_num_threads(); },
      nb::sig("def get_num_threads() -> int"), "Threads a call with threads=None uses.");
  m.def(
      "resolve_backend",
      [](const std::string& backend, const std::string& dtype) {
        return std::string(
            backend_name(attn::resolve_backend(parse_backend(backend), parse_dtype(dtype))));
      },
      nb::arg("backend"), nb::arg("dtype"),
      nb::sig("def resolve_backend(backend: str, dtype: str) -> str"),
      "The backend ('reference' or 'cpu') that `backend` ('auto', 'reference', 'cpu') runs for "
      "inputs of `dtype` "
      "('float64', 'float32', 'float16', 'bfloat16') on this machine.");
}

}  // namespace attn::python
