// The attention options' shared flags (tools/attention_flags.h).
#include "tools/attention_flags.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <variant>

#include "attn/options.h"
#include "tools/command.h"

namespace attn::tools {
namespace {

[[noreturn]] void fail(const char* cmd, const std::string& msg) {
  throw Error(fmt::format("{}: {}", cmd, msg));
}

// A scalar flag by its option's rule: "<flag> <must>, got <text as typed>".
double parse_scalar(const char* cmd, const ScalarRule& rule, const std::string& s) {
  const double v = parse_double_flag(cmd, rule.flag, s);
  if (!rule.allows(v)) fail(cmd, fmt::format("{} {}, got {}", rule.flag, rule.must, s));
  return v;
}

Window parse_window(const char* cmd, const std::string& s) {
  const size_t comma = s.find(',');
  if (comma == std::string::npos)
    fail(cmd, fmt::format("--window expects LEFT,RIGHT (integers >= -1), got '{}'", s));
  Window w;
  w.left = parse_int_flag(cmd, "--window LEFT", s.substr(0, comma));
  w.right = parse_int_flag(cmd, "--window RIGHT", s.substr(comma + 1));
  if (!kWindowRule.allows(static_cast<double>(w.left)) ||
      !kWindowRule.allows(static_cast<double>(w.right))) {
    fail(cmd, fmt::format("{} {}, got '{}'", kWindowRule.flag, kWindowRule.must, s));
  }
  return w;
}

template <class E>
E parse_enum_flag(const char* cmd, const std::string& s) {
  try {
    return parse_enum<E>(s);
  } catch (const Error& e) {
    fail(cmd, e.what());
  }
}

uint64_t parse_seed(const char* cmd, const char* flag, const std::string& s) {
  uint64_t seed = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seed);
  if (ec != std::errc() || end != s.data() + s.size()) {
    fail(cmd, fmt::format("{} expects an integer in [0, 2^64), got '{}'", flag, s));
  }
  return seed;
}

int parse_threads(const char* cmd, const char* flag, const std::string& s) {
  const int64_t t = parse_int_flag(cmd, flag, s);
  if (t < 0 || t > 4096)
    fail(cmd, fmt::format("{} must be in [0, 4096] (0 = all cores), got {}", flag, s));
  return static_cast<int>(t);
}

// The row's value from its flag's text into o, by the field's kind; the tensors' paths are the
// command's to read.
void parse_flag(const char* cmd, const OptionInfo& info, const std::string& s,
                AttentionOptions& o) {
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(o.*m)>;
        if constexpr (std::is_same_v<T, std::optional<double>> || std::is_same_v<T, double>) {
          o.*m = info.rule != nullptr ? parse_scalar(cmd, *info.rule, s)
                                      : parse_double_flag(cmd, info.flag, s);
        } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
          o.*m = parse_int_flag(cmd, info.flag, s);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          o.*m = parse_seed(cmd, info.flag, s);
        } else if constexpr (std::is_same_v<T, int>) {
          o.*m = parse_threads(cmd, info.flag, s);
        } else if constexpr (std::is_enum_v<T>) {
          o.*m = parse_enum_flag<T>(cmd, s);
        } else if constexpr (std::is_same_v<T, Window>) {
          o.*m = parse_window(cmd, s);
        }
      },
      info.field);
}

// The rows of the shared flag set: a flag, an input of both directions (not an output request).
bool is_shared_flag(const OptionInfo& info) {
  return *info.flag != '\0' && info.use == OptionUse::both;
}

size_t row_of(std::string_view name) {
  return static_cast<size_t>(&option_info(name) - kOptionInfo);
}

}  // namespace

double parse_double_flag(const char* cmd, const char* flag, const std::string& s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    fail(cmd, fmt::format("{} expects a number, got '{}'", flag, s));
  }
  return v;
}

int64_t parse_int_flag(const char* cmd, const char* flag, const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    fail(cmd, fmt::format("{} expects an integer, got '{}'", flag, s));
  }
  return v;
}

std::string& AttentionFlags::operator[](std::string_view name) {
  return text[row_of(name)];
}
const std::string& AttentionFlags::operator[](std::string_view name) const {
  return text[row_of(name)];
}
bool AttentionFlags::is_on(std::string_view name) const {
  return on[row_of(name)];
}

void add_attention_flags(CLI::App* sub, AttentionFlags& f, bool (*takes)(const OptionInfo&)) {
  for (size_t i = 0; i < std::size(kOptionInfo); ++i) {
    const OptionInfo& info = kOptionInfo[i];
    if (!is_shared_flag(info) || (takes != nullptr && !takes(info))) continue;
    if (field_as<bool>(info)) {
      sub->add_flag(info.flag, f.on[i], info.help);
    } else {
      sub->add_option(info.flag, f.text[i], info.help)->check(not_empty());
    }
  }
}

// In the table's order (the first bad flag names the error), then the flags that need each other.
AttentionOptions parse_attention_flags(const char* cmd, const AttentionFlags& f) {
  AttentionOptions o;
  for (size_t i = 0; i < std::size(kOptionInfo); ++i) {
    const OptionInfo& info = kOptionInfo[i];
    if (!is_shared_flag(info)) continue;
    if (auto m = field_as<bool>(info)) {
      o.*m = f.on[i];
    } else if (!f.text[i].empty()) {
      parse_flag(cmd, info, f.text[i], o);
    }
  }
  if (o.dropout_p > 0 && f["seed"].empty())
    fail(cmd, "--dropout needs --seed N (the keep-pattern is a function of it)");
  return o;
}

}  // namespace attn::tools
