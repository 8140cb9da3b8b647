// The fast CPU backend: flash-style tiled kernels (f32 / bf16 / f16 inputs, fp32 accumulation) with
// runtime ISA dispatch. The instruction set is chosen once per call at the entry (never inside
// loops): the best one the processor has, unless forced by force_isa() or the ATTN_CPU_ISA
// environment variable (portable, avx2, avx512, avx512bf16, amx, amx-emulated), which is how the
// tests run every target the machine has.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "contract/problem.h"

namespace attn::cpu {

// Whether this backend can run problems of `dtype` (f64 problems go to the reference backend).
bool supports(DType dtype);
void forward(const contract::ForwardProblem& p);
void backward(const contract::BackwardProblem& p);

// avx512bf16: the avx512 kernels plus VDPBF16PS (AVX512_BF16) for the products of bf16 inputs.
// amx: the avx512bf16 kernels with the bf16 products whose A is row-major on AMX-BF16 tiles.
// amx_emulated: the amx kernels over a software emulation of the tiles and of VDPBF16PS (tests, any
// AVX2 CPU; never chosen by default).
enum class Isa { portable, avx2, avx512, avx512bf16, amx, amx_emulated };
const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws attn::Error naming the accepted values
bool isa_available(Isa isa);             // compiled in and supported by this processor
std::vector<Isa> available_isas();       // portable first
// The target the next call uses: the forced one, else ATTN_CPU_ISA, else the best available.
Isa active_isa();
// The target the tiled kernels of a problem whose q is `dtype` run on: active_isa(), except that
// bf16 problems go from avx512bf16 to avx512 (bf16 converted to f32 for the FMAs) on CPUs where
// VDPBF16PS issues at half the FMA rate or less (measured once per process) -- unless the target was
// forced or set in ATTN_CPU_ISA.
Isa isa_for(DType dtype);
// The target forward(p) runs on: isa_for(q's dtype), except that decode-shaped bf16 forwards (few
// query rows, bound by memory) keep avx512bf16.
Isa isa_for(const contract::ForwardProblem& p);
// Whether bf16 products run faster on bf16 instructions than widened to f32 for the FMAs on this
// CPU: AMX-BF16 tiles usable, or VDPBF16PS at over 1.5x the FMA rate (measured once per process; the
// rule isa_for applies). nn's bf16 GEMMs (nn/bf16.cc) follow the same rule.
bool bf16_instructions_pay();
// Forces a target (throws attn::Error when this machine cannot run it); nullopt restores the
// default.
void force_isa(std::optional<Isa> isa);

// This processor as the benchmarks name it: vendor, brand string, family/model, and the features
// the kernels choose by (AVX2/FMA, AVX-512, AVX512_BF16, AMX-BF16/AMX-TILE), e.g. "AuthenticAMD AMD
// EPYC 7B13 (family 25 model 1): avx2+fma yes, avx512 no, avx512bf16 no, amx-bf16 no".
std::string describe_cpu();

// Overrides the tile sizes (rows x keys) for benchmarks' tile sweeps; 0 keeps the built-in choice.
void set_tile_override(int64_t fwd_bq, int64_t fwd_bk, int64_t bwd_bq, int64_t bwd_bk);
// The cache level decode prefetches into, "l1" or "l2" (this CPU's choice unless overridden), and
// its override for sweeps ("" restores this CPU's; results are the same bits either way).
std::string decode_prefetch_name();
void set_decode_prefetch_override(const std::string& level);
// Whether the AMX forward pipelines its tile products against the softmax, "on" or "off", and its
// override ("" restores the default; results are the same bits either way).
std::string amx_pipeline_name();
void set_amx_pipeline_override(const std::string& setting);

}  // namespace attn::cpu
