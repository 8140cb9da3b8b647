// attn.attention and attn.attention_backward: the whole contract of include/attn/attention.h, with
// NumPy / PyTorch arrays in and out. Arguments are parsed and arrays imported with the GIL held;
// the computation runs with it released.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "arrays.h"
#include "attn/attention.h"
#include "attn/memory.h"
#include "attn/options.h"
#include "attn/threads.h"
#include "bindings.h"

namespace attn::python {

namespace {

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

// (bq, bk) from block_size: an int (both) or a pair of ints.
std::pair<int64_t, int64_t> parse_block_size(nb::handle h, const char* fn) {
  int64_t bq = 0, bk = 0;
  if (nb::try_cast(h, bq)) return {bq, bq};
  if (PySequence_Check(h.ptr()) && PySequence_Size(h.ptr()) == 2 && nb::try_cast(h[0], bq) &&
      nb::try_cast(h[1], bk)) {
    return {bq, bk};
  }
  if (PyErr_Occurred()) PyErr_Clear();
  throw nb::type_error(fmt::format("{}: block_size must be an int or a pair of ints, got {}", fn,
                                   nb::cast<std::string>(nb::repr(h)))
                           .c_str());
}

// One keyword of attention / attention_backward after q, k, v (...): an option's row of
// attn/options.h, or one of the bindings' own (block_size, return_lse: row == nullptr).
struct Keyword {
  const char* name;
  const char* type;            // its Python type, for the signature text
  const char* kind;            // what attn.torch flattens it by: its C++ type in words
  nb::object default_;         // AttentionOptions{}'s value as Python sees it
  const OptionInfo* row;       // nullptr: the bindings' own
  const char* help = nullptr;  // the bindings' own: the docstring's text (a row's is its help)
};

// The Python type and default of an option, by its kind.
Keyword option_keyword(const OptionInfo& info) {
  static const AttentionOptions d;
  return std::visit(
      [&](auto m) -> Keyword {
        using T = std::remove_cvref_t<decltype(d.*m)>;
        if constexpr (std::is_same_v<T, std::optional<double>>) {
          return {info.name, "float | None", "optional real", nb::none(), &info};
        } else if constexpr (std::is_same_v<T, double>) {
          return {info.name, "float", "real", nb::cast(d.*m), &info};
        } else if constexpr (std::is_same_v<T, bool>) {
          return {info.name, "bool", "bool", nb::cast(d.*m), &info};
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          return {info.name, "int | None", "optional int", nb::none(), &info};
        } else if constexpr (std::is_same_v<T, int>) {
          return {info.name, "int | None", "int", nb::none(), &info};  // None = 0
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          return {info.name, "int | None", "seed", nb::none(), &info};  // None = drawn
        } else if constexpr (std::is_enum_v<T>) {
          return {info.name, "str", "enum", nb::cast(enum_name(d.*m)), &info};
        } else if constexpr (std::is_same_v<T, Window>) {
          return {info.name, "tuple[int | None, int | None] | None", "window", nb::none(), &info};
        } else {
          static_assert(std::is_same_v<T, Tensor> || std::is_same_v<T, BlockLayout>);
          return {info.name, "ArrayLike | None",
                  std::is_same_v<T, Tensor> ? "tensor" : "block layout", nb::none(), &info};
        }
      },
      info.field);
}

// At most this many keywords per function (after the arrays): the matched values live on the stack.
constexpr size_t kMaxKeywords = 32;
using KeywordValues = std::array<nb::handle, kMaxKeywords>;

// The keywords of one direction, in the table's order: the options of both directions and the
// direction's output request, with the bindings' own: block_size after block_layout, and before the
// forward's output request (return_weights) return_lse.
std::vector<Keyword> make_keywords(OptionUse direction) {
  std::vector<Keyword> kws;
  kws.reserve(kMaxKeywords);
  for (const OptionInfo& info : kOptionInfo) {
    if (info.use != OptionUse::both && info.use != direction) continue;
    if (info.use == OptionUse::forward) {
      kws.push_back({"return_lse", "bool", "bool", nb::cast(false), nullptr,
                     "also return lse [..., Hq, Lq] (natural log of each row's softmax sum; "
                     "attention_backward takes it)"});
    }
    kws.push_back(option_keyword(info));
    if (field_as<BlockLayout>(info)) {
      kws.push_back({"block_size", "int | tuple[int, int] | None", "block size", nb::none(),
                     nullptr,
                     "block_layout's tiles: bq or (bq, bk) (needed by block_layout, refused "
                     "without it)"});
    }
  }
  if (kws.size() > kMaxKeywords) throw std::logic_error("attn._core: raise kMaxKeywords");
  return kws;
}

// Built once; never destroyed (their Python defaults would outlive the interpreter).
const std::vector<Keyword>& keywords(OptionUse direction) {
  static const auto* forward = new std::vector<Keyword>(make_keywords(OptionUse::forward));
  static const auto* backward = new std::vector<Keyword>(make_keywords(OptionUse::backward));
  return direction == OptionUse::forward ? *forward : *backward;
}

// A keyword's value as nanobind's casters take it (the error nanobind itself raises for an argument
// of the wrong type, which attn.attention turns into one line naming the argument).
template <class T>
T cast_keyword(nb::handle h, const char* fn, const char* name) {
  T v{};
  if (!nb::try_cast(h, v)) {
    throw nb::type_error(fmt::format("{}(): incompatible function arguments: {}={}",
                                     std::strrchr(fn, '.') + 1, name,
                                     nb::cast<std::string>(nb::repr(h)))
                             .c_str());
  }
  return v;
}

// The call's keywords, matched to `kws` by name (index i holds keyword i's value, or an invalid handle).
KeywordValues match_keywords(const std::vector<Keyword>& kws, const nb::kwargs& given,
                             const char* fn) {
  KeywordValues values;
  for (auto [key, value] : given) {
    const char* name = PyUnicode_AsUTF8(key.ptr());  // a keyword is a str; the dict keeps it alive
    size_t i = 0;
    while (i < kws.size() && std::strcmp(kws[i].name, name) != 0) ++i;
    if (i == kws.size()) {
      throw nb::type_error(fmt::format("{}(): incompatible function arguments: unexpected keyword "
                                       "argument '{}'",
                                       std::strrchr(fn, '.') + 1, name)
                               .c_str());
    }
    values[i] = value;
  }
  return values;
}

// The call's keywords: matched and their types checked when constructed (as nanobind checks typed
// arguments before the call, so before q, k and v are read), then their values into the options, in
// the table's order.
class OptionParser {
 public:
  OptionParser(ArrayScope& scope, OptionUse direction, const nb::kwargs& given)
      : scope_(scope),
        kws_(keywords(direction)),
        values_(match_keywords(kws_, given, scope.fn())),
        direction_(direction) {
    for (size_t i = 0; i < kws_.size(); ++i) {
      if (values_[i].is_valid()) check_type(kws_[i], values_[i]);
    }
  }

  AttentionOptions options(bool* return_lse) {
    AttentionOptions o;
    for (size_t i = 0; i < kws_.size(); ++i) {
      const Keyword& kw = kws_[i];
      const bool given = values_[i].is_valid();
      const nb::handle h = given ? values_[i] : kw.default_;
      if (kw.row != nullptr) {
        // Not given: AttentionOptions{} holds the default already (the Python defaults are its
        // values), but for the seed, drawn when there is dropout.
        if (given || field_as<uint64_t>(*kw.row)) read(*kw.row, h, o);
      } else if (std::strcmp(kw.name, "block_size") == 0) {
        set_block_size(h, o);  // right after block_layout, as before the table
      } else if (given) {
        *return_lse = nb::cast<bool>(h);
      }
    }
    check_option_dtypes(o, scope_.fn());
    return o;
  }

 private:
  void check_type(const Keyword& kw, nb::handle h) const {
    const char* fn = scope_.fn();
    if (kw.row == nullptr) {
      if (std::strcmp(kw.name, "return_lse") == 0) (void)cast_keyword<bool>(h, fn, kw.name);
      return;
    }
    std::visit(
        [&](auto m) {
          using T = std::remove_cvref_t<decltype(std::declval<AttentionOptions&>().*m)>;
          if constexpr (std::is_same_v<T, std::optional<double>> || std::is_same_v<T, double> ||
                        std::is_same_v<T, bool> || std::is_same_v<T, std::optional<int64_t>>) {
            (void)cast_keyword<T>(h, fn, kw.name);
          } else if constexpr (std::is_same_v<T, int>) {
            (void)cast_keyword<std::optional<int>>(h, fn, kw.name);
          } else if constexpr (std::is_enum_v<T>) {
            (void)cast_keyword<std::string>(h, fn, kw.name);
          }
        },
        kw.row->field);
  }

  // One option's value (its type checked) into o, by its kind.
  void read(const OptionInfo& info, nb::handle h, AttentionOptions& o) {
    const char* fn = scope_.fn();
    std::visit(
        [&](auto m) {
          using T = std::remove_cvref_t<decltype(o.*m)>;
          if constexpr (std::is_same_v<T, std::optional<double>> || std::is_same_v<T, double> ||
                        std::is_same_v<T, bool> || std::is_same_v<T, std::optional<int64_t>>) {
            o.*m = nb::cast<T>(h);
          } else if constexpr (std::is_same_v<T, int>) {
            o.*m = nb::cast<std::optional<int>>(h).value_or(0);
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            // after dropout_p (the table's order): None draws a seed when there is dropout
            if (direction_ == OptionUse::backward && o.dropout_p > 0.0 && h.is_none()) {
              throw nb::value_error(fmt::format("{}: dropout_p > 0 needs the forward's seed to "
                                                "regenerate its keep-pattern",
                                                fn)
                                        .c_str());
            }
            o.*m = parse_seed(h, o.dropout_p, fn);
          } else if constexpr (std::is_enum_v<T>) {
            Py_ssize_t n = 0;
            const char* text = PyUnicode_AsUTF8AndSize(h.ptr(), &n);  // a str (check_type)
            o.*m = parse_enum<T>(std::string_view(text, static_cast<size_t>(n)));
          } else if constexpr (std::is_same_v<T, Window>) {
            o.*m = parse_window(h, fn);
          } else if constexpr (std::is_same_v<T, Tensor>) {
            o.*m = scope_.import(h, info.name, true);
          } else {
            static_assert(std::is_same_v<T, BlockLayout>);
            (o.*m).layout = scope_.import(h, info.name, true);
          }
        },
        info.field);
  }

  // block_size goes with block_layout (read before it): needed by one, refused without it.
  void set_block_size(nb::handle block_size, AttentionOptions& o) const {
    const char* fn = scope_.fn();
    if (o.block_layout.layout.defined()) {
      if (block_size.is_none()) {
        throw nb::value_error(
            fmt::format("{}: block_layout needs block_size (an int or a pair (block_q, block_k))",
                        fn)
                .c_str());
      }
      std::tie(o.block_layout.block_q, o.block_layout.block_k) = parse_block_size(block_size, fn);
    } else if (!block_size.is_none()) {
      throw nb::value_error(
          fmt::format("{}: block_size was given without block_layout", fn).c_str());
    }
  }

  ArrayScope& scope_;
  const std::vector<Keyword>& kws_;
  const KeywordValues values_;  // kws_[i]'s value, or an invalid handle when not given
  OptionUse direction_;
};

nb::object attention_py(nb::handle q, nb::handle k, nb::handle v, const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention");
  OptionParser parser(scope, OptionUse::forward, kwargs);
  const Tensor tq = scope.import(q, "q"), tk = scope.import(k, "k"), tv = scope.import(v, "v");
  for (auto [t, name] : {std::pair{&tq, "q"}, std::pair{&tk, "k"}, std::pair{&tv, "v"}})
    require_floating(*t, scope.fn(), name);
  bool return_lse = false;
  const AttentionOptions o = parser.options(&return_lse);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = attention(tq, tk, tv, o);
  }
  const bool torch = scope.torch();
  nb::object out = export_tensor(std::move(r.out), torch);
  if (!return_lse && !o.return_weights) return out;
  nb::list result;
  result.append(out);
  if (return_lse) result.append(export_tensor(std::move(r.lse), torch));
  if (o.return_weights) result.append(export_tensor(std::move(r.weights), torch));
  return nb::tuple(result);
}

// dweights (None: not given) = dL/dweights [..., Hq, Lq, Lk] for the weights the forward returned:
// an array of the backward like dout, not an option, so keyword-only ahead of the table's keywords.
nb::object attention_backward_py(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                 nb::handle out, nb::handle lse, nb::handle dweights,
                                 const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention_backward");
  OptionParser parser(scope, OptionUse::backward, kwargs);
  const Tensor tdout = scope.import(dout, "dout"), tq = scope.import(q, "q"),
               tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               tout = scope.import(out, "out"), tlse = scope.import(lse, "lse"),
               tdweights = scope.import(dweights, "dweights", true);
  const std::pair<const Tensor*, const char*> arrays[] = {
      {&tdout, "dout"}, {&tq, "q"}, {&tk, "k"}, {&tv, "v"}, {&tout, "out"}, {&tlse, "lse"}};
  for (auto [t, name] : arrays) require_floating(*t, scope.fn(), name);
  require_floating(tdweights, scope.fn(), "dweights");  // (undefined when not given)
  const AttentionOptions o = parser.options(nullptr);
  AttentionGrads g;
  {
    nb::gil_scoped_release release;
    g = attention_backward(tdout, tq, tk, tv, tout, tlse, o, tdweights);
  }
  const bool torch = scope.torch();
  nb::list result;
  result.append(export_tensor(std::move(g.dq), torch));
  result.append(export_tensor(std::move(g.dk), torch));
  result.append(export_tensor(std::move(g.dv), torch));
  if (o.mask_grad) result.append(export_tensor(std::move(g.dmask), torch));
  if (o.sinks.defined()) result.append(export_tensor(std::move(g.dsinks), torch));
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

// "def name(positional..., *, optional array = None, ..., keyword: type = default, ...) -> returns",
// from the keywords; `arrays` are the keyword-only arrays ahead of them (None: not given).
std::string signature(const char* name, std::initializer_list<const char*> positional,
                      std::initializer_list<const char*> arrays, const std::vector<Keyword>& kws,
                      const char* returns) {
  std::vector<std::string> parts;
  for (const char* p : positional) parts.push_back(fmt::format("{}: ArrayLike", p));
  parts.emplace_back("*");
  for (const char* a : arrays) parts.push_back(fmt::format("{}: ArrayLike | None = None", a));
  for (const Keyword& kw : kws) {
    parts.push_back(
        fmt::format("{}: {} = {}", kw.name, kw.type, nb::cast<std::string>(nb::repr(kw.default_))));
  }
  return fmt::format("def {}({}) -> {}", name, fmt::join(parts, ", "), returns);
}

// The docstring's options section: one entry per keyword of the direction, in order, with its type,
// default and flag, and the text of its row of attn/options.h (help, scalar rule, use); the bindings'
// own keywords (return_lse, block_size) carry their text. Adding a row adds its entry.
std::string options_doc(OptionUse direction) {
  std::string doc =
      "Options (keyword-only), from attn/options.h's table: each one's text is its row's, as "
      "`attn sdpa --help` shows it.\n";
  for (const Keyword& kw : keywords(direction)) {
    const OptionInfo* row = kw.row;
    doc += fmt::format("    {}: {} = {}", kw.name, kw.type,
                       nb::cast<std::string>(nb::repr(kw.default_)));
    if (row != nullptr && *row->flag != '\0') doc += fmt::format("  (attn sdpa {})", row->flag);
    doc += fmt::format("\n        {}", row != nullptr ? row->help : kw.help);
    if (row != nullptr && row->rule != nullptr)
      doc += fmt::format("; {} {}", row->rule->name, row->rule->must);
    if (row != nullptr && row->use == OptionUse::forward) doc += "; attention's output request";
    if (row != nullptr && row->use == OptionUse::backward)
      doc += "; attention_backward's output request";
    doc += '\n';
  }
  return doc;
}

OptionUse parse_direction(const std::string& direction, const char* fn) {
  if (direction != "forward" && direction != "backward") {
    throw nb::value_error(
        fmt::format("{}: direction must be 'forward' or 'backward', got '{}'", fn, direction)
            .c_str());
  }
  return direction == "forward" ? OptionUse::forward : OptionUse::backward;
}

// [(name, Python type, kind, default)] of a direction's keywords: attn.torch builds its op schema from it.
nb::list keyword_table(const std::string& direction) {
  nb::list table;
  for (const Keyword& kw : keywords(parse_direction(direction, "attn._core.option_keywords")))
    table.append(nb::make_tuple(kw.name, kw.type, kw.kind, kw.default_));
  return table;
}

}  // namespace

void bind_attention(nb::module_& m) {
  static const std::string attention_doc =
      std::string(
          "Exact scaled dot-product attention: softmax(scale * q k^T + bias) v under the masks "
          "below.\n\n"
          "Returns out, or a tuple (out[, lse][, weights]) with the ones asked for by return_lse "
          "and\n"
          "return_weights (weights are the probabilities before dropout).\n\n") +
      options_doc(OptionUse::forward) + kShapesDoc;
  // nanobind keeps the signature's pointer: the strings live as long as the module.
  static const std::string attention_sig =
      signature("attention", {"q", "k", "v"}, {}, keywords(OptionUse::forward), "Any");
  m.def("attention", &attention_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("kwargs"),
        nb::sig(attention_sig.c_str()), attention_doc.c_str());

  static const std::string backward_doc =
      std::string(
          "Gradients of attention(q, k, v, **options)[0] given dout = dL/dout.\n\n"
          "out and lse are that forward call's results (the backward recomputes the weights from "
          "lse);\n"
          "the options, seed included, must be the forward's. Returns (dq, dk, dv) with the shapes "
          "and\n"
          "dtypes of q, k and v (GQA: dk, dv summed over the query heads of a group), and d(mask) "
          "in the\n"
          "mask's shape as a fourth element when mask_grad=True (mask_type='add' only).\n\n"
          "dweights: ArrayLike | None = None\n"
          "    dL/dweights [..., Hq, Lq, Lk] (any floating dtype) when the forward's weights "
          "(return_weights:\n"
          "    the probabilities before dropout) were used too: their part, dS += P (dW - "
          "rowsum(P dW)) through\n"
          "    softcap, is folded into dq, dk and d(mask). Such a call runs on the reference "
          "backend (double,\n"
          "    exact) whatever backend says.\n\n") +
      options_doc(OptionUse::backward) + kShapesDoc;
  static const std::string backward_sig =
      signature("attention_backward", {"dout", "q", "k", "v", "out", "lse"}, {"dweights"},
                keywords(OptionUse::backward), "tuple[Any, ...]");
  m.def("attention_backward", &attention_backward_py, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::kw_only(),
        nb::arg("dweights").none() = nb::none(), nb::arg("kwargs"), nb::sig(backward_sig.c_str()),
        backward_doc.c_str());

  m.def("option_keywords", &keyword_table, nb::arg("direction"),
        nb::sig("def option_keywords(direction: str) -> list[tuple[str, str, str, Any]]"),
        "[(name, Python type, kind, default)] of attention's keywords (direction 'forward') or "
        "attention_backward's ('backward')\nafter the arrays, in order: attn.torch builds its op "
        "schema from them.");
  m.def(
      "options_doc",
      [](const std::string& direction) {
        return options_doc(parse_direction(direction, "attn._core.options_doc"));
      },
      nb::arg("direction"), nb::sig("def options_doc(direction: str) -> str"),
      "The options section of attention's docstring (direction 'forward') or "
      "attention_backward's ('backward'),\nbuilt from attn/options.h's table: attn.torch's "
      "docstrings show it too.");

  m.def(
      "set_num_threads", [](int n) { set_num_threads(n); }, nb::arg("n"),
      nb::sig("def set_num_threads(n: int) -> None"),
      "Threads used by calls that pass threads=None; n <= 0 restores the default "
      "(ATTN_NUM_THREADS, else all "
      "cores).");
  m.def(
      "get_num_threads", []() { return default_num_threads(); },
      nb::sig("def get_num_threads() -> int"), "Threads a call with threads=None uses.");
  m.def("cached_memory_bytes", &cached_memory_bytes, nb::sig("def cached_memory_bytes() -> int"),
        "Bytes attn holds in freed tensor buffers (>= 256 KiB each) for reuse.");
  m.def("release_cached_memory", &release_cached_memory,
        nb::sig("def release_cached_memory() -> int"),
        "Gives every buffer attn holds for reuse back to the C library; returns the bytes "
        "released.");
  m.def(
      "set_cached_memory_limit", [](size_t bytes) { set_cached_memory_limit(bytes); },
      nb::arg("bytes"), nb::sig("def set_cached_memory_limit(bytes: int) -> None"),
      "The most bytes attn holds in freed buffers (0: none); default ATTN_CACHE_MB MiB, else 1024 "
      "MiB.");
  m.def("cached_memory_limit", &cached_memory_limit, nb::sig("def cached_memory_limit() -> int"),
        "The budget of freed buffers held for reuse, in bytes.");
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
