// Subcommands of the `attn` tool register themselves: each tools/<name>.cc defines
//   static attn::tools::Command reg{"name", order, &add_name_command};
// where add_name_command(CLI::App& app) creates its subcommand with app.add_subcommand(...) and sets its
// callback. Errors are thrown (attn::Error or std::exception); main prints one line and exits non-zero.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace attn::tools {

// An integer flag's lower bound, checked on what the user gave ("--steps: must be >= 1, got 0";
// CLI11's own range checks print the whole double range). Defaults are not checked.
inline CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long long value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "must be an integer, got " + text;
        return value >= min ? std::string() : "must be >= " + std::to_string(min) + ", got " + text;
      },
      ">= " + std::to_string(min));
}

// A text flag given with nothing after it (`--scale ""`): refused rather than read as "not given",
// which would run the default without a word.
inline CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "needs a value, got an empty string" : std::string();
      },
      "");
}

// A number flag that must be finite (`--vmin nan` would read as "not given": the default range).
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "must be a number, got " + text;
        return std::isfinite(value) ? std::string() : "must be a finite number, got " + text;
      },
      "");
}

// "attn 0.1.0", the CPU and the instruction set chosen: the first lines of `attn info` (info.cc),
// all that `attn --version` prints.
std::string version_text();

struct Command {
  Command(const char* name, int order, void (*add)(CLI::App&));
};

}  // namespace attn::tools
