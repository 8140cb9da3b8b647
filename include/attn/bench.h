// What the benchmarks (`attn bench`, bench/) use of the library, and nothing more. Public but unstable:
// for attn's own benchmark programs, which include only public headers; not part of the API users rely
// on, and it may change with any commit.
//
// attn::cpu_bench: the cpu backend's instruction-set targets by name, forcing one, the tile override
// of tile sweeps, the processor's description, the ceiling probes and the thread count a call
// resolves to. Names rather than the backend's Isa enum; src/backends/cpu/bench_api.cc forwards to
// the backend.
//
// attn::bench: the inputs and work counts every attention benchmark uses (attn bench in
// tools/bench.cc, bench/attention_bench.cc, bench/decode_bench.cc), so their rows time the same
// problems: q, k, v (and dout) uniform in [-1, 1) from a fixed xorshift stream per tensor (made in
// f32, then converted, so a bf16 row reads the f32 row's values rounded), seeds 1-4 for the square
// problems and 5-7 for decode. Inline.
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

namespace attn::bench {

inline Tensor random_input(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data_as<float>();
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1p-53 * 2.0 - 1.0);
  }
  return dtype == DType::f32 ? t : t.to(dtype);
}

// Self-attention over one sequence per head: q, k, v, dout [1, BH, L, D].
struct SquareProblem {
  Tensor q, k, v, dout;
};

inline SquareProblem square_problem(int64_t BH, int64_t L, int64_t D, DType dtype) {
  return {random_input({1, BH, L, D}, dtype, 1), random_input({1, BH, L, D}, dtype, 2),
          random_input({1, BH, L, D}, dtype, 3), random_input({1, BH, L, D}, dtype, 4)};
}

// Forward FLOPs of a square problem: 4 BH L^2 D (QK^T and PV), half under the causal mask.
inline double forward_flops(int64_t BH, int64_t L, int64_t D, bool causal) {
  const double flops =
      4.0 * static_cast<double>(BH) * static_cast<double>(L) * static_cast<double>(L) * D;
  return causal ? 0.5 * flops : flops;
}

// Forward + backward counts 3.5 x the forward (the backward 2.5 x).
constexpr double kForwardBackwardFactor = 3.5;

// Decode: Lq query rows per head against a KV cache of Lk keys: q [1, Hq, Lq, D], k, v
// [1, Hkv, Lk, D].
struct DecodeProblem {
  Tensor q, k, v;
};

inline DecodeProblem decode_problem(int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t D,
                                    DType dtype) {
  return {random_input({1, Hq, Lq, D}, dtype, 5), random_input({1, Hkv, Lk, D}, dtype, 6),
          random_input({1, Hkv, Lk, D}, dtype, 7)};
}

// Bytes of K and V a decode call reads (once per kv head, whatever the query heads).
inline double kv_bytes(int64_t Hkv, int64_t Lk, int64_t D, DType dtype) {
  return 2.0 * static_cast<double>(Hkv * Lk * D) * static_cast<double>(dtype_size(dtype));
}

}  // namespace attn::bench
