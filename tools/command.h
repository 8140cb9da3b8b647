// Subcommands of the `attn` tool register themselves: each tools/<name>.cc defines
//   static attn::tools::Command reg{"name", order, &add_name_command};
// where add_name_command(CLI::App& app) creates its subcommand with app.add_subcommand(...) and sets its
// callback. Errors are thrown (attn::Error or std::exception); main prints one line and exits non-zero.
#pragma once
#include <CLI/CLI.hpp>

namespace attn::tools {

struct Command {
  Command(const char* name, int order, void (*add)(CLI::App&));
};

}  // namespace attn::tools
