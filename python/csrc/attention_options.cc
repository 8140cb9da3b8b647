// The keyword options of attn._core's attention entry points, from attn/options.h's table
// (attention_options.h).
#include "attention_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

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

// keywords(direction) less the bindings' return_lse.
std::vector<Keyword> without_return_lse(OptionUse direction) {
  std::vector<Keyword> kws;
  for (const Keyword& kw : keywords(direction)) {
    if (kw.row != nullptr || std::strcmp(kw.name, "return_lse") != 0) kws.push_back(kw);
  }
  return kws;
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

}  // namespace

// Built once; never destroyed (their Python defaults would outlive the interpreter).
const std::vector<Keyword>& keywords(OptionUse direction) {
  static const auto* forward = new std::vector<Keyword>(make_keywords(OptionUse::forward));
  static const auto* backward = new std::vector<Keyword>(make_keywords(OptionUse::backward));
  return direction == OptionUse::forward ? *forward : *backward;
}

const std::vector<Keyword>& varlen_keywords(OptionUse direction) {
  static const auto* forward = new std::vector<Keyword>(without_return_lse(OptionUse::forward));
  static const auto* backward = new std::vector<Keyword>(without_return_lse(OptionUse::backward));
  return direction == OptionUse::forward ? *forward : *backward;
}

[[noreturn]] void dtype_error(const char* fn, const char* name, const char* expected,
                              const Tensor& t) {
  throw nb::type_error(fmt::format("{}: {} must be {}, got {} with shape {}", fn, name, expected,
                                   dtype_name(t.dtype()), t.shape_str())
                           .c_str());
}

void require_floating(const Tensor& t, const char* fn, const char* name) {
  if (t.defined() && !is_floating(t.dtype())) dtype_error(fn, name, "f64, f32, bf16 or f16", t);
}

nb::tuple grads_tuple(AttentionGrads g, const AttentionOptions& o, bool torch) {
  nb::list result;
  result.append(export_tensor(std::move(g.dq), torch));
  result.append(export_tensor(std::move(g.dk), torch));
  result.append(export_tensor(std::move(g.dv), torch));
  if (o.mask_grad) result.append(export_tensor(std::move(g.dmask), torch));
  if (o.sinks.defined()) result.append(export_tensor(std::move(g.dsinks), torch));
  return nb::tuple(result);
}

OptionParser::OptionParser(ArrayScope& scope, OptionUse direction, const std::vector<Keyword>& kws,
                           const nb::kwargs& given)
    : scope_(scope),
      kws_(kws),
      values_(match_keywords(kws_, given, scope.fn())),
      direction_(direction) {
  for (size_t i = 0; i < kws_.size(); ++i) {
    if (values_[i].is_valid()) check_type(kws_[i], values_[i]);
  }
}

AttentionOptions OptionParser::options(bool* return_lse) {
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

void OptionParser::check_type(const Keyword& kw, nb::handle h) const {
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
void OptionParser::read(const OptionInfo& info, nb::handle h, AttentionOptions& o) {
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
void OptionParser::set_block_size(nb::handle block_size, AttentionOptions& o) const {
  const char* fn = scope_.fn();
  if (o.block_layout.layout.defined()) {
    if (block_size.is_none()) {
      throw nb::value_error(
          fmt::format("{}: block_layout needs block_size (an int or a pair (block_q, block_k))", fn)
              .c_str());
    }
    std::tie(o.block_layout.block_q, o.block_layout.block_k) = parse_block_size(block_size, fn);
  } else if (!block_size.is_none()) {
    throw nb::value_error(fmt::format("{}: block_size was given without block_layout", fn).c_str());
  }
}

std::string signature(const char* name, std::initializer_list<const char*> positional,
                      std::initializer_list<const char*> keyword_only,
                      const std::vector<Keyword>& kws, const char* returns) {
  std::vector<std::string> parts;
  for (const char* p : positional)
    parts.push_back(std::strchr(p, ':') != nullptr ? std::string(p)
                                                   : fmt::format("{}: ArrayLike", p));
  parts.emplace_back("*");
  for (const char* p : keyword_only) parts.emplace_back(p);
  for (const Keyword& kw : kws) {
    parts.push_back(
        fmt::format("{}: {} = {}", kw.name, kw.type, nb::cast<std::string>(nb::repr(kw.default_))));
  }
  return fmt::format("def {}({}) -> {}", name, fmt::join(parts, ", "), returns);
}

std::string options_doc(const std::vector<Keyword>& kws) {
  std::string doc =
      "Options (keyword-only), from attn/options.h's table: each one's text is its row's, as "
      "`attn sdpa --help` shows it.\n";
  for (const Keyword& kw : kws) {
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

}  // namespace attn::python
