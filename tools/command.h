// Subcommands of the `attn` tool register themselves: each tools/<name>.cc defines
//   static attn::tools::Command reg{"name", order, &add_name_command};
// where add_name_command(CLI::App& app) creates its subcommand with app.add_subcommand(...) and sets its
// callback. Errors are thrown (attn::Error or std::exception); main prints one line and exits non-zero.
#pragma once
#include <CLI/CLI.hpp>
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

struct Command {
  Command(const char* name, int order, void (*add)(CLI::App&));
};

}  // namespace attn::tools
