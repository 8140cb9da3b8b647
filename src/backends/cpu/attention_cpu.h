// The fast CPU backend: flash-style tiled kernels (f32 / bf16 / f16 inputs, fp32 accumulation) with
// runtime ISA dispatch. The instruction set is chosen once per call at the entry (never inside
// loops): core/isa.h's active_isa() (the best one the processor has, unless forced by force_isa()
// or the ATTN_CPU_ISA environment variable), which is how the tests run every target the machine
// has.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "contract/problem.h"
#include "core/isa.h"

namespace attn::cpu {

// Whether this backend can run problems of `dtype` (f64 problems go to the reference backend).
bool supports(DType dtype);
void forward(const contract::ForwardProblem& p);
void backward(const contract::BackwardProblem& p);

// The instruction-set choice (Isa, active_isa, force_isa, describe_cpu) is core/isa.h's.
// The target the tiled kernels of a problem whose q is `dtype` run on: active_isa(), except that
// bf16 problems go from avx512bf16 to avx512 (bf16 converted to f32 for the FMAs) on CPUs where
// VDPBF16PS issues at half the FMA rate or less (measured once per process) -- unless the target was
// forced or set in ATTN_CPU_ISA.
Isa isa_for(DType dtype);
// The target forward(p) runs on: isa_for(q's dtype), except that decode-shaped bf16 forwards (few
// query rows, bound by memory) keep avx512bf16.
Isa isa_for(const contract::ForwardProblem& p);
// Whether forward(p) reads the keys and values of a paged problem (p.pages) where they are: the
// decode kernel does for pages of a multiple of its vector width without a window's left bound;
// other problems need their keys gathered first (src/attention_paged.cc).
bool reads_pages(const contract::ForwardProblem& p);
// Whether bf16 products run faster on bf16 instructions than widened to f32 for the FMAs on the
// active target: amx, or avx512bf16 where VDPBF16PS runs at over 1.5x the FMA rate (measured once per
// process; the rule isa_for applies). nn's bf16 GEMMs (nn/bf16.cc) follow the same rule.
bool bf16_instructions_pay();
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
