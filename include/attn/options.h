// The options of attn::attention described once: the string forms of the enum options, the rule each
// scalar option obeys, and each option's names (its AttentionOptions field, which is also its Python
// keyword, and its flag in `attn sdpa` / `attn ring`). The defaults are AttentionOptions{}'s member
// initialisers (attention.h). Validation (src/attention.cc), the CLI's shared flag set
// (tools/attention_flags.cc), the Python bindings and ring attention all read these.
//
//   attn::parse_enum<attn::Align>("bottom-right") == attn::Align::bottom_right
//   attn::enum_name(attn::MaskType::drop) == "drop";  attn::enum_choices<attn::Backend>() == "auto, reference or cpu"
//
// Adding an option (a scalar `logit_bias`, say) today: the field and its default in AttentionOptions
// (attention.h); a row in kOptionInfo and, if it has one, its ScalarRule (here); one check step in
// validate and its field in contract::ForwardProblem (src/attention.cc, src/contract/problem.h); the
// kernels; in tools/attention_flags.{h,cc} a member, an add() and a parse line; in
// python/csrc/attention_bindings.cc a member of OptionArgs, a parameter and an initialiser in each of
// the two bound lambdas, a row of option_keywords() and a line of parse_options; for the ring, the
// options hash in describe() or unsupported_option() (src/distributed/ring_validate.cc); the stubs
// regenerated (scripts/check_stubs.sh --write); tests.
#pragma once
#include <cmath>
#include <span>
#include <string>
#include <string_view>

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

// Every option of AttentionOptions with its names and a one-line description (CLI help, docs). flag is
// "" for an option the CLI does not take. Adding an option adds a row here.
struct OptionInfo {
  const char* name;  // the AttentionOptions field and Python keyword
  const char* flag;  // attn sdpa's flag ("" = none)
  const char* help;
};

inline constexpr OptionInfo kOptionInfo[] = {
    {"scale", "--scale", "score scale (default 1/sqrt(D))"},
    {"softcap", "--softcap", "s = C * tanh(s / C)"},
    {"causal", "--causal", "query i attends to keys j <= p(i)"},
    {"align", "--align", "bottom-right (p(i) = i + Lk - Lq, default) | top-left (p(i) = i)"},
    {"position_offset", "",
     "p(i) = i + offset, overriding align (chunked prefill, ring attention)"},
    {"window", "--window", "LEFT,RIGHT: keys p(i)-LEFT <= j <= p(i)+RIGHT (-1 = unbounded)"},
    {"mask", "--mask", "dense mask .npy broadcastable to [..., Hq, Lq, Lk]"},
    {"mask_type", "--mask-type",
     "keep (bool, true = may attend) | drop (bool, true = masked) | add (float added to the "
     "scores)"},
    {"key_lengths", "--key-lengths",
     "int .npy of the batch dims' shape: keys j >= len are padding"},
    {"block_layout", "", "bool map over (query tile, key tile), with block_size"},
    {"alibi_slopes", "--alibi", "ALiBi slopes .npy [Hq]: s -= slope * |p(i) - j|"},
    {"dropout_p", "--dropout", "dropout probability in [0, 1] (needs --seed)"},
    {"seed", "--seed", "dropout seed (the keep-pattern is a function of seed, batch, head, i, j)"},
    {"return_weights", "--weights",
     "also write the attention weights [..., Hq, Lq, Lk] (before dropout)"},
    {"mask_grad", "", "the backward also returns d(add mask)"},
    {"backend", "--backend", "auto | reference | cpu (default auto)"},
    {"threads", "--threads", "threads (0 = the default)"},
};

// The row of `name` (a field name); throws attn::Error for a name that is not an option.
const OptionInfo& option_info(std::string_view name);

}  // namespace attn
