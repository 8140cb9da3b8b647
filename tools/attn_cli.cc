// attn: the command-line tool. Subcommands live in their own files and register through tools/command.h.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "attn/error.h"
#include "tools/command.h"

namespace attn::tools {
namespace {
struct Entry {
  const char* name;
  int order;
  void (*add)(CLI::App&);
};
std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}
}  // namespace

Command::Command(const char* name, int order, void (*add)(CLI::App&)) {
  registry().push_back({name, order, add});
}

}  // namespace attn::tools

int main(int argc, char** argv) {
  CLI::App app{"attn: exact scaled dot-product attention on the CPU"};
  bool show_version = false;
  app.add_flag("--version", show_version,
               "Print the version, the CPU and the instruction set chosen");
  app.require_subcommand(0, 1);
  auto entries = attn::tools::registry();
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  for (const auto& e : entries) e.add(app);
  try {
    app.parse(argc, argv);
    if (show_version) {
      std::printf("%s\n", attn::tools::version_text().c_str());
    } else if (app.get_subcommands().empty()) {
      throw CLI::RequiredError("A subcommand");
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error of the tool (CLI11 would add a "Run with --help" line).
    std::fprintf(stderr, "attn: %s (see attn --help)\n", e.what());
    return e.get_exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: %s\n", e.what());
    return 1;
  }
  return 0;
}
