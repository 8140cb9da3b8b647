// The attention options' shared flags (tools/attention_flags.h).
#include "tools/attention_flags.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>

#include "attn/options.h"

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

void add(CLI::App* sub, const char* name, std::string& value) {
  const OptionInfo& info = option_info(name);
  sub->add_option(info.flag, value, info.help);
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

void add_attention_flags(CLI::App* sub, AttentionFlags& f, unsigned groups) {
  if (groups & kMaskFlags) {
    add(sub, "mask", f.mask);
    add(sub, "mask_type", f.mask_type);
  }
  if (groups & kKeyLengthFlag) add(sub, "key_lengths", f.key_lengths);
  if (groups & kPositionFlags) {
    const OptionInfo& causal = option_info("causal");
    sub->add_flag(causal.flag, f.causal, causal.help);
    add(sub, "align", f.align);
    add(sub, "window", f.window);
  }
  if (groups & kScoreFlags) {
    add(sub, "scale", f.scale);
    add(sub, "softcap", f.softcap);
  }
  if (groups & kAlibiFlag) add(sub, "alibi_slopes", f.alibi);
  if (groups & kDropoutFlags) {
    add(sub, "dropout_p", f.dropout);
    add(sub, "seed", f.seed);
  }
  if (groups & kRunFlags) {
    add(sub, "backend", f.backend);
    add(sub, "threads", f.threads);
  }
}

// In this order: the enums, then the position rule, the scores, dropout and seed, threads (the first
// bad flag names the error).
AttentionOptions parse_attention_flags(const char* cmd, const AttentionFlags& f) {
  AttentionOptions o;
  if (!f.backend.empty()) o.backend = parse_enum_flag<Backend>(cmd, f.backend);
  if (!f.align.empty()) o.align = parse_enum_flag<Align>(cmd, f.align);
  if (!f.mask_type.empty()) o.mask_type = parse_enum_flag<MaskType>(cmd, f.mask_type);
  o.causal = f.causal;
  if (!f.window.empty()) o.window = parse_window(cmd, f.window);
  if (!f.scale.empty()) o.scale = parse_scalar(cmd, kScaleRule, f.scale);
  if (!f.softcap.empty()) o.softcap = parse_scalar(cmd, kSoftcapRule, f.softcap);
  if (!f.dropout.empty()) {
    o.dropout_p = parse_scalar(cmd, kDropoutRule, f.dropout);
    if (o.dropout_p > 0 && f.seed.empty())
      fail(cmd, "--dropout needs --seed N (the keep-pattern is a function of it)");
  }
  if (!f.seed.empty()) {
    uint64_t seed = 0;
    const auto [end, ec] = std::from_chars(f.seed.data(), f.seed.data() + f.seed.size(), seed);
    if (ec != std::errc() || end != f.seed.data() + f.seed.size()) {
      fail(cmd, fmt::format("--seed expects an integer in [0, 2^64), got '{}'", f.seed));
    }
    o.seed = seed;
  }
  if (!f.threads.empty()) {
    const int64_t t = parse_int_flag(cmd, "--threads", f.threads);
    if (t < 0 || t > 4096)
      fail(cmd, fmt::format("--threads must be in [0, 4096] (0 = all cores), got {}", f.threads));
    o.threads = static_cast<int>(t);
  }
  return o;
}

}  // namespace attn::tools
