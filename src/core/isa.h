// The one instruction-set choice of the project: every kernel family (attention, the nn element-wise
// kernels, attn's own products, oneDNN's GEMMs) runs on what active_isa() says. Detected once from
// CPUID and the OS state (AMX tile permission); ATTN_CPU_ISA (portable, avx2, avx512, avx512bf16, amx,
// amx-emulated) or force_isa() override it, and a value this processor cannot run is an error naming
// it. How each family maps the choice onto the copies it compiles:
//   attention (src/backends/cpu)   one copy per target (kernels-inl.h compiled six times);
//   element-wise (src/nn)          the plain-vector width of the target: vector_isa();
//   oneDNN (src/nn/ops.cc)         capped to the target where ATTN_CPU_ISA names one.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace attn::cpu {

// avx512bf16: the avx512 kernels plus VDPBF16PS (AVX512_BF16) for the products of bf16 inputs.
// amx: the avx512bf16 kernels with the bf16 products whose A is row-major on AMX-BF16 tiles.
// amx_emulated: the amx kernels over a software emulation of the tiles and of VDPBF16PS, compiled as
// AVX2 code (tests, any AVX2 CPU; never chosen by default).
enum class Isa { portable, avx2, avx512, avx512bf16, amx, amx_emulated };
const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws attn::Error naming the accepted values
bool isa_available(Isa isa);             // compiled in and supported by this processor
std::vector<Isa> available_isas();       // portable first
// The target the next call uses: the forced one, else ATTN_CPU_ISA, else the best available.
Isa active_isa();
// Why active_isa() is what it is: "forced", "ATTN_CPU_ISA" or "best available".
const char* isa_source();
// Whether the target was forced or set in ATTN_CPU_ISA (then no kernel family second-guesses it).
bool isa_chosen_by_user();
// Forces a target (throws attn::Error when this machine cannot run it); nullopt restores the
// default.
void force_isa(std::optional<Isa> isa);
// The plain-vector target whose instructions `isa`'s code may use: portable, avx2 or avx512 (the
// copies the element-wise kernels are compiled for). amx_emulated is AVX2 code.
Isa vector_isa(Isa isa);

// CPUID leaf 0's vendor and leaf 1's display family and model (zeros off x86-64).
struct CpuSignature {
  bool amd = false;
  unsigned family = 0, model = 0;
};
CpuSignature cpu_signature();

// This processor as the benchmarks name it: vendor, brand string, family/model, and the features
// the kernels choose by (AVX2/FMA, AVX-512, AVX512_BF16, AMX-BF16/AMX-TILE), e.g. "AuthenticAMD AMD
// EPYC 7B13 (family 25 model 1): avx2+fma yes, avx512 no, avx512bf16 no, amx-bf16 no".
std::string describe_cpu();

}  // namespace attn::cpu
