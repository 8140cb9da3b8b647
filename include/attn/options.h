// The options of attn::attention described once: the string forms of the enum options, the rule each
// scalar option obeys, and one row per AttentionOptions field (kOptionInfo) with its names (the field,
// which is also its Python keyword, and its flag in `attn sdpa` / `attn ring`), a pointer to the field
// (its type is the option's kind), its rule, whether it is an input of both directions or one output
// request, and what ring attention does with it. The defaults are AttentionOptions{}'s member
// initialisers (attention.h). These loops read the table: the scalar checks of attn::attention
// (src/attention.cc), the CLI's shared flag set (tools/attention_flags.cc), the Python keywords, their
// signature text and conversion (python/csrc/attention_bindings.cc; attn.torch's op schema reads the
// table at import through attn._core.option_keywords) and ring attention's options hash
// (src/distributed/ring_validate.cc).
//
//   attn::parse_enum<attn::Align>("bottom-right") == attn::Align::bottom_right
//   attn::enum_name(attn::MaskType::drop) == "drop";  attn::enum_choices<attn::Backend>() == "auto, reference or cpu"
//
// Adding an option (a scalar `logit_bias`, say): its field and default in AttentionOptions
// (attention.h); its row in kOptionInfo and, if it has one, its ScalarRule (here); the kernels: the
// value the backends read in contract::ForwardProblem (src/contract/problem.h), set in validate
// (src/attention.cc, one line), its use in the reference and cpu backends (or a refusal) and, if it
// changes how the scores depend on q and k, in attn.torch's _weights_grad; tests (those that pin the
// keyword list, the torch op's schema or its positional arguments, and the ring's message, name it).
// The flag, the Python keyword and its signature, the stubs (scripts/check_stubs.sh --write), the
// torch op's schema and the ring's agreement check follow from the row. An option of a new kind (not
// a real, bool, integer, enum, window, tensor or block layout) also needs its case in those loops; one
// the ring cannot split by key blocks needs its refusal in ring_validate.cc's unsupported_option.
#pragma once
#include <cmath>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "attn/attention.h"

namespace attn {

// One accepted spelling of an enum value. The first spelling of a value is its name (what enum_name
// returns, what messages and help list); later ones are aliases that parse_enum also accepts.
template <class E>
struct EnumSpelling {
  E value;
  const char* text;
};

inline constexpr EnumSpelling<Backend> kBackendSpellings[] = {
    {Backend::automatic, "auto"}, {Backend::reference, "reference"}, {Backend::cpu, "cpu"}};
inline constexpr EnumSpelling<Align> kAlignSpellings[] = {{Align::bottom_right, "bottom-right"},
                                                          {Align::top_left, "top-left"},
                                                          {Align::bottom_right, "bottom_right"},
                                                          {Align::top_left, "top_left"}};
inline constexpr EnumSpelling<MaskType> kMaskTypeSpellings[] = {
    {MaskType::keep, "keep"}, {MaskType::drop, "drop"}, {MaskType::add, "add"}};

// Per enum: its spellings, what a value is called in messages, and the parser named in them.
template <class E>
struct EnumInfo;
template <>
struct EnumInfo<Backend> {
  static constexpr std::span<const EnumSpelling<Backend>> spellings = kBackendSpellings;
  static constexpr const char* what = "backend";
  static constexpr const char* parser = "attn::parse_backend";
};
template <>
struct EnumInfo<Align> {
  static constexpr std::span<const EnumSpelling<Align>> spellings = kAlignSpellings;
  static constexpr const char* what = "alignment";
  static constexpr const char* parser = "attn::parse_align";
};
template <>
struct EnumInfo<MaskType> {
  static constexpr std::span<const EnumSpelling<MaskType>> spellings = kMaskTypeSpellings;
  static constexpr const char* what = "mask type";
  static constexpr const char* parser = "attn::parse_mask_type";
};

// The value's name ("?" for a value outside the enum).
template <class E>
const char* enum_name(E value) {
  for (const EnumSpelling<E>& s : EnumInfo<E>::spellings) {
    if (s.value == value) return s.text;
  }
  return "?";
}

// The names of the values (aliases left out), joined: "keep, drop or add" by default, "keep | drop |
// add" with enum_choices<MaskType>(" | ", " | ").
template <class E>
std::string enum_choices(std::string_view sep = ", ", std::string_view last = " or ") {
  // A value's first spelling is its name: the pointer enum_name returns.
  auto is_name = [](const EnumSpelling<E>& s) { return enum_name(s.value) == s.text; };
  size_t total = 0;
  for (const EnumSpelling<E>& s : EnumInfo<E>::spellings) total += is_name(s) ? 1 : 0;
  std::string r;
  size_t i = 0;
  for (const EnumSpelling<E>& s : EnumInfo<E>::spellings) {
    if (!is_name(s)) continue;
    if (i > 0) r += i + 1 == total ? last : sep;
    r += s.text;
    ++i;
  }
  return r;
}

namespace detail {
[[noreturn]] void throw_unknown_name(const char* parser, const char* what, std::string_view text,
                                     const std::string& choices);
}  // namespace detail

// The value spelled `text`; throws attn::Error "<parser>: unknown <what> '<text>' (expected <names>)".
template <class E>
E parse_enum(std::string_view text) {
  for (const EnumSpelling<E>& s : EnumInfo<E>::spellings) {
    if (text == s.text) return s.value;
  }
  detail::throw_unknown_name(EnumInfo<E>::parser, EnumInfo<E>::what, text, enum_choices<E>());
}

// The rule a scalar option's value obeys. Messages read "<name or flag> <must>, got <value>":
// attn::attention names the field ("softcap must be finite and > 0, got 0"), the CLI its flag.
struct ScalarRule {
  const char* name;  // the AttentionOptions field and Python keyword
  const char* flag;  // the flag of attn sdpa / attn ring
  const char* must;
  bool (*allows)(double);
};

// scale: any finite value, as torch (0 gives uniform weights over the allowed keys, < 0 flips the
// scores); unset = 1 / sqrt(D).
inline constexpr ScalarRule kScaleRule{"scale", "--scale", "must be finite",
                                       [](double v) { return std::isfinite(v); }};
inline constexpr ScalarRule kSoftcapRule{"softcap", "--softcap", "must be finite and > 0",
                                         [](double v) { return std::isfinite(v) && v > 0; }};
// p = 1 drops every weight: out and every gradient are 0.
inline constexpr ScalarRule kDropoutRule{"dropout_p", "--dropout", "must be in [0, 1]",
                                         [](double v) { return v >= 0.0 && v <= 1.0; }};
// Each bound of the window; -1 = unbounded on that side.
inline constexpr ScalarRule kWindowRule{"window bounds", "--window bounds",
                                        "must be >= -1 (-1 = unbounded)",
                                        [](double v) { return v >= -1; }};

// A pointer to an AttentionOptions field. Its type is the option's kind, which decides its Python type,
// its flag's form and how the loops over kOptionInfo treat it: a real that may be unset (None), a real,
// a bool, an optional integer, an int, the 64-bit seed, an enum (named by EnumInfo), the window, a
// tensor, the block layout.
using OptionField =
    std::variant<std::optional<double> AttentionOptions::*, double AttentionOptions::*,
                 bool AttentionOptions::*, std::optional<int64_t> AttentionOptions::*,
                 int AttentionOptions::*, uint64_t AttentionOptions::*, Align AttentionOptions::*,
                 MaskType AttentionOptions::*, Backend AttentionOptions::*,
                 Window AttentionOptions::*, Tensor AttentionOptions::*,
                 BlockLayout AttentionOptions::*>;

// Which entry points take an option: every input of the computation is both directions'; an output
// request is one direction's (return_weights the forward's, mask_grad the backward's), and a command
// or binding adds its own argument for it.
enum class OptionUse : uint8_t { both, forward, backward };

// What ring attention does with an option: `agree` = passed to every block's attention() call and
// checked equal on every rank (the options hash); `local` = the rank's own (backend, threads); `none`
// = refused or meaningless there (unsupported_option says why) and not among `attn ring`'s flags.
enum class RingUse : uint8_t { agree, local, none };

// Every option of AttentionOptions with its names and a one-line description (CLI help, docs). flag is
// "" for an option the CLI does not take. The order is the Python keywords' (signatures, stubs, the
// torch op's schema) and the order in which flags are parsed and scalar rules checked. Adding an option
// adds a row here.
struct OptionInfo {
  const char* name;  // the AttentionOptions field and Python keyword
  const char* flag;  // attn sdpa's flag ("" = none)
  const char* help;
  OptionField field;
  const ScalarRule* rule = nullptr;  // checked by attn::attention (reals) and by the flags
  OptionUse use = OptionUse::both;
  RingUse ring = RingUse::agree;
};

inline constexpr OptionInfo kOptionInfo[] = {
    {"mask", "--mask", "dense mask .npy broadcastable to [..., Hq, Lq, Lk]",
     &AttentionOptions::mask, nullptr, OptionUse::both, RingUse::none},
    {"mask_type", "--mask-type",
     "keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the "
     "scores)",
     &AttentionOptions::mask_type, nullptr, OptionUse::both, RingUse::none},
    {"causal", "--causal", "query i attends to keys j <= p(i)", &AttentionOptions::causal},
    {"align", "--align", "bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)",
     &AttentionOptions::align},
    {"position_offset", "", "p(i) = i + offset, overriding align (chunked prefill, ring attention)",
     &AttentionOptions::position_offset},
    {"window", "--window", "LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded)",
     &AttentionOptions::window, &kWindowRule},
    {"scale", "--scale", "score scale (default 1/sqrt(D))", &AttentionOptions::scale, &kScaleRule},
    {"softcap", "--softcap", "s = C * tanh(s / C)", &AttentionOptions::softcap, &kSoftcapRule},
    {"alibi_slopes", "--alibi", "ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|",
     &AttentionOptions::alibi_slopes},
    {"key_lengths", "--key-lengths", "int .npy of the batch dims' shape: keys j >= len are padding",
     &AttentionOptions::key_lengths},
    {"block_layout", "", "bool map over (query tile, key tile), with block_size",
     &AttentionOptions::block_layout, nullptr, OptionUse::both, RingUse::none},
    {"dropout_p", "--dropout", "dropout probability in [0, 1] (needs --seed)",
     &AttentionOptions::dropout_p, &kDropoutRule, OptionUse::both, RingUse::none},
    {"seed", "--seed", "dropout seed (the keep-pattern is a function of seed, batch, head, i, j)",
     &AttentionOptions::seed, nullptr, OptionUse::both, RingUse::none},
    {"sinks", "--sinks", "sink logits .npy [Hq]: one per head in every row's softmax, no value",
     &AttentionOptions::sinks, nullptr, OptionUse::both, RingUse::none},
    {"return_weights", "--weights",
     "also write the attention weights [..., Hq, Lq, Lk] (before dropout)",
     &AttentionOptions::return_weights, nullptr, OptionUse::forward, RingUse::none},
    {"mask_grad", "", "the backward also returns d(add mask)", &AttentionOptions::mask_grad,
     nullptr, OptionUse::backward, RingUse::none},
    {"backend", "--backend", "auto | reference | cpu (default auto)", &AttentionOptions::backend,
     nullptr, OptionUse::both, RingUse::local},
    {"threads", "--threads", "threads (0 = the default)", &AttentionOptions::threads, nullptr,
     OptionUse::both, RingUse::local},
};

// A pointer to a field of type T, or nullptr when the row's field has another type:
//   if (auto m = field_as<std::optional<double>>(info)) { const std::optional<double>& v = o.*m; ... }
template <class T>
constexpr T AttentionOptions::*field_as(const OptionInfo& info) {
  auto* m = std::get_if<T AttentionOptions::*>(&info.field);
  return m ? *m : nullptr;
}

// The row of `name` (a field name); throws attn::Error for a name that is not an option.
const OptionInfo& option_info(std::string_view name);

}  // namespace attn
