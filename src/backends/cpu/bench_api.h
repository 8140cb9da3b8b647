// What the benchmarks (`attn bench`, bench/) use of the cpu backend, and nothing more: the
// instruction-set targets by name, forcing one, the tile override of tile sweeps, the processor's
// description, the ceiling probes and the thread count a call resolves to. Names rather than the
// backend's Isa enum, so a benchmark includes neither attention_cpu.h (the kernels' entry points over
// contract problems) nor probes.h; bench_api.cc forwards to them.
#pragma once

#include <cstdint>
#include <string>

#include "attn/tensor.h"

namespace attn::cpu_bench {

// Forces the cpu backend's target by name (portable, avx2, avx512, avx512bf16, amx, amx-emulated;
// throws attn::Error naming the accepted values or saying this machine cannot run it); "" restores
// the default.
void force_isa(const std::string& name);
// The target the next call uses, and the one the tiled kernels of `dtype` problems run on.
std::string active_isa();
std::string kernels_isa(DType dtype);
// The instructions the products of a `dtype` problem run on, which picks the ceiling its rows are
// judged by: the bf16 dot (VDPBF16PS) or AMX tiles for bf16 on those targets, else fp32 FMA.
enum class Products { fma, bf16_dot, amx_tiles };
Products products(DType dtype);
// "AuthenticAMD AMD EPYC ... (family 26 model 2): avx2+fma yes, avx512 yes, ..."
std::string describe_cpu();
// Tile sizes (rows x keys) of the forward and the backward; 0 keeps the built-in choice.
void set_tile_override(int64_t fwd_bq, int64_t fwd_bk, int64_t bwd_bq, int64_t bwd_bk);
// Where decode's software prefetch puts the next blocks: "l1", "l2" or "none" (no software
// prefetch: the hardware prefetchers alone), "" = this CPU's choice;
// decode_prefetch() names the level in use.
void set_decode_prefetch(const std::string& level);
std::string decode_prefetch();
// Whether the AMX forward pipelines its tile products against the softmax: "on" or "off", "" =
// the default; amx_pipeline() names the setting in use.
void set_amx_pipeline(const std::string& setting);
std::string amx_pipeline();

// The ceiling probes: GFLOP/s of fp32 FMA, the bf16 dot (0 without AVX512_BF16) and AMX bf16
// tiles (0 when unusable) with `threads` threads, and per core per CPU-second in *per_core_cpu;
// copy bandwidth in GB/s (bytes read + written) over buffers far beyond L3.
double probe_fma_gflops(int threads, double* per_core_cpu);
double probe_bf16_dot_gflops(int threads, double* per_core_cpu);
double probe_amx_bf16_gflops(int threads, double* per_core_cpu);
double probe_copy_gbps(int threads);
double probe_read_gbps(int threads);  // GB/s read (a sum), the ceiling of decode, which only reads
double process_cpu_seconds();         // CPU time of the process, all threads

// The threads a call with `requested` (0 = default: set_num_threads, ATTN_NUM_THREADS, all
// cores) runs on.
int resolve_threads(int requested);

}  // namespace attn::cpu_bench
