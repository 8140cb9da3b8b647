// `attn info`: this build's version and the kernels every family runs on this processor, and why:
//
//   attn info [--json]
//
// The instruction-set target is the best this CPU has, or the one ATTN_CPU_ISA names (an impossible
// value is an error naming it); attention, the element-wise kernels and the nn GEMM routing all
// follow it. `attn --version` prints the first lines.
#include "attn/info.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "attn/nn/layers.h"
#include "tools/command.h"

namespace attn::tools {

std::string version_text() {
  const KernelChoice c = kernel_choice();
  return fmt::format("attn {}\ncpu: {}\nisa: {} ({})", version(), c.cpu, c.isa, c.isa_source);
}

namespace {

void print_info(bool json) {
  const KernelChoice c = kernel_choice();
  const std::string gemm = nn::gemm_kernels();
  if (json) {
    const nlohmann::json j = {{"version", version()},
                              {"cpu", c.cpu},
                              {"available", c.available},
                              {"isa", c.isa},
                              {"isa_source", c.isa_source},
                              {"attention_f32", c.attention_f32},
                              {"attention_bf16", c.attention_bf16},
                              {"elementwise", c.elementwise},
                              {"gemm", gemm},
                              {"bf16_gemm_native", nn::gemm_bf16_native()}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}\n", version_text());
  fmt::print("targets this cpu runs: {}\n", fmt::join(c.available, ", "));
  fmt::print("attention: f32 on {}, bf16 on {}\n", c.attention_f32, c.attention_bf16);
  fmt::print("element-wise: {}\n", c.elementwise);
  fmt::print("gemm (nn layers): {}\n", gemm);
}

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "info", "Version, CPU, and the instruction set each kernel family runs on (ATTN_CPU_ISA)");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([json] { print_info(*json); });
}

const Command reg{"info", 90, &add_info_command};

}  // namespace
}  // namespace attn::tools
