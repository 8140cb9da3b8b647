// What this build of attn is and which kernels it runs on this processor (`attn info`,
// `attn --version`, Python's attn.build_info()). Every kernel family follows one instruction-set
// choice: the best target the processor has, or the one ATTN_CPU_ISA names (portable, avx2, avx512,
// avx512bf16, amx, amx-emulated). The GEMM routing of the nn layers is attn::nn::gemm_kernels()
// (attn/nn/layers.h), which follows the same choice.
#pragma once
#include <string>
#include <vector>

namespace attn {

// "0.1.0": the project's version (CMakeLists.txt).
const char* version();

struct KernelChoice {
  std::string cpu;                     // vendor, brand, family/model and the features chosen by
  std::vector<std::string> available;  // the targets this processor runs, portable first
  std::string isa;                     // the target every kernel family follows
  std::string isa_source;              // "best available", "ATTN_CPU_ISA" or "forced"
  std::string attention_f32;           // the target attention's tiled kernels run f32 inputs on
  std::string attention_bf16;  // ... and bf16 inputs on (avx512 where VDPBF16PS does not pay)
  std::string elementwise;     // the plain-vector copy of the element-wise kernels
};
// Throws attn::Error when ATTN_CPU_ISA names an unknown target or one this processor cannot run.
KernelChoice kernel_choice();

}  // namespace attn
