// One instruction-set choice for every kernel family (core/isa.h). These tests read ATTN_CPU_ISA:
// tests/CMakeLists.txt runs them once with it unset (the best target) and once per value (every
// target name, and a name that is none), so each run asserts what that value must give here:
//   a target this CPU runs  attention (f32 and bf16), the element-wise copy and oneDNN's cap all
//                           report it, and an attention call and a Linear run on it;
//   a target it cannot run  attention, kernel_choice and a Linear raise attn::Error naming
//   or an unknown name      ATTN_CPU_ISA and the value; nothing runs on another target instead.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "attn/attention.h"
#include "attn/info.h"
#include "attn/nn/layers.h"
#include "core/isa.h"
#include "nn/elementwise.h"
#include "test_util.h"

namespace attn {
namespace {

std::string env_isa() {
  const char* env = std::getenv("ATTN_CPU_ISA");
  return env != nullptr ? env : "";
}

// The target ATTN_CPU_ISA names when this CPU runs it.
std::optional<cpu::Isa> runnable_env_isa() {
  try {
    const cpu::Isa isa = cpu::parse_isa(env_isa());
    return cpu::isa_available(isa) ? std::optional<cpu::Isa>(isa) : std::nullopt;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// oneDNN's name for the instructions a target uses (what gemm_kernels() reports as oneDNN's ISA).
const char* onednn_name(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::portable:
      return "sse41";
    case cpu::Isa::avx2:
    case cpu::Isa::amx_emulated:
      return "avx2";
    case cpu::Isa::avx512:
      return "avx512_core";
    case cpu::Isa::avx512bf16:
      return "avx512_core_bf16";
    case cpu::Isa::amx:
      return "avx512_core_amx";
  }
  return "?";
}

// fn raises attn::Error starting "attn::cpu: ATTN_CPU_ISA=<value>".
void expect_refused(void (*fn)()) {
  const std::string want = "attn::cpu: ATTN_CPU_ISA=" + env_isa();
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
    return;
  }
  ADD_FAILURE() << "nothing thrown; expected an error starting " << want;
}

void run_attention_and_linear() {
  const Tensor q = test::random_tensor({1, 2, 5, 8}, DType::f32, 1),
               k = test::random_tensor({1, 2, 7, 8}, DType::f32, 2);
  const Tensor v = test::random_tensor({1, 2, 7, 8}, DType::f32, 3);
  (void)attention(q, k, v, AttentionOptions{});
  nn::Linear lin(8, 4, true);
  (void)lin.forward(test::random_tensor({3, 8}, DType::f32, 4));
}

TEST(IsaChoice, EveryFamilyReportsTheOneTarget) {
  if (!env_isa().empty() && !runnable_env_isa()) GTEST_SKIP() << "covered by RefusedWithTheName";
  const KernelChoice c = kernel_choice();
  const cpu::Isa isa = env_isa().empty() ? cpu::active_isa() : *runnable_env_isa();
  EXPECT_EQ(c.isa, cpu::isa_name(isa));
  EXPECT_EQ(c.isa_source, env_isa().empty() ? "best available" : "ATTN_CPU_ISA");
  if (env_isa().empty()) {
    EXPECT_NE(isa, cpu::Isa::amx_emulated) << "the emulation is never chosen by itself";
    EXPECT_EQ(c.available.back() == "amx-emulated" ? c.available[c.available.size() - 2]
                                                   : c.available.back(),
              c.isa)
        << "the default is the best target available";
  } else {
    // A target the user named is taken as it is, by every family.
    EXPECT_EQ(c.attention_f32, env_isa());
    EXPECT_EQ(c.attention_bf16, env_isa());
    EXPECT_NE(nn::gemm_kernels().find(fmt::format("capped to {}", onednn_name(isa))),
              std::string::npos)
        << nn::gemm_kernels();
    EXPECT_NE(nn::gemm_kernels().find(fmt::format("(ISA {})", onednn_name(isa))), std::string::npos)
        << nn::gemm_kernels();
    if (isa != cpu::Isa::avx512bf16 && isa != cpu::Isa::amx) {
      EXPECT_FALSE(nn::gemm_bf16_native());
    }
  }
  EXPECT_EQ(c.elementwise, cpu::isa_name(cpu::vector_isa(isa)));
  EXPECT_EQ(nn::ew::active_isa(), cpu::vector_isa(isa));
  run_attention_and_linear();
}

TEST(IsaChoice, RefusedWithTheName) {
  if (env_isa().empty() || runnable_env_isa()) GTEST_SKIP() << "ATTN_CPU_ISA is unset or runnable";
  expect_refused([] { (void)kernel_choice(); });
  expect_refused([] { run_attention_and_linear(); });
}

// ATTN_BF16_GEMM (the bf16 products' path) is parsed once too: a value that names no path is
// refused by every bf16 product and by the report, never taken as some other path.
TEST(ProductPolicy, AnUnknownPathIsRefused) {
  const char* env = std::getenv("ATTN_BF16_GEMM");
  const std::string value = env != nullptr ? env : "";
  if (value.empty() || value == "onednn" || value == "f32" || value == "tiles") {
    GTEST_SKIP() << "ATTN_BF16_GEMM is unset or names a path";
  }
  const std::string want = "ATTN_BF16_GEMM=" + value;
  auto expect_refused = [&](auto fn) {
    try {
      fn();
      ADD_FAILURE() << "nothing thrown; expected an error naming " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_refused([] { (void)nn::gemm_kernels(); });
  expect_refused([] {
    nn::Linear lin(8, 4, true, DType::bf16);
    (void)lin.forward(test::random_tensor({3, 8}, DType::bf16, 5));
  });
}

TEST(IsaChoice, VectorWidthOfEachTarget) {
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::portable), cpu::Isa::portable);
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::avx2), cpu::Isa::avx2);
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::amx_emulated), cpu::Isa::avx2);
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::avx512), cpu::Isa::avx512);
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::avx512bf16), cpu::Isa::avx512);
  EXPECT_EQ(cpu::vector_isa(cpu::Isa::amx), cpu::Isa::avx512);
}

}  // namespace
}  // namespace attn
