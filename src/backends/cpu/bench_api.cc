// include/attn/bench.h (attn::cpu_bench) over the backend's own headers.
#include <optional>

#include "attn/bench.h"
#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/probes.h"
#include "core/parallel.h"

namespace attn::cpu_bench {

void force_isa(const std::string& name) {
  cpu::force_isa(name.empty() ? std::nullopt : std::optional<cpu::Isa>(cpu::parse_isa(name)));
}

std::string active_isa() {
  return cpu::isa_name(cpu::active_isa());
}

std::string kernels_isa(DType dtype) {
  return cpu::isa_name(cpu::isa_for(dtype));
}

Products products(DType dtype) {
  if (dtype != DType::bf16) return Products::fma;
  const cpu::Isa kernels = cpu::isa_for(dtype);
  if (kernels == cpu::Isa::avx512bf16) return Products::bf16_dot;
  if (kernels == cpu::Isa::amx) return Products::amx_tiles;
  return Products::fma;
}

std::string describe_cpu() {
  return cpu::describe_cpu();
}

void set_tile_override(int64_t fwd_bq, int64_t fwd_bk, int64_t bwd_bq, int64_t bwd_bk) {
  cpu::set_tile_override(fwd_bq, fwd_bk, bwd_bq, bwd_bk);
}

void set_decode_prefetch(const std::string& level) {
  cpu::set_decode_prefetch_override(level);
}

std::string decode_prefetch() {
  return cpu::decode_prefetch_name();
}

void set_amx_pipeline(const std::string& setting) {
  cpu::set_amx_pipeline_override(setting);
}

std::string amx_pipeline() {
  return cpu::amx_pipeline_name();
}

double probe_fma_gflops(int threads, double* per_core_cpu) {
  return cpu::probe_fma_gflops(threads, per_core_cpu);
}
double probe_bf16_dot_gflops(int threads, double* per_core_cpu) {
  return cpu::probe_bf16_dot_gflops(threads, per_core_cpu);
}
double probe_amx_bf16_gflops(int threads, double* per_core_cpu) {
  return cpu::probe_amx_bf16_gflops(threads, per_core_cpu);
}
double probe_copy_gbps(int threads) {
  return cpu::probe_copy_gbps(threads);
}
double probe_read_gbps(int threads) {
  return cpu::probe_read_gbps(threads);
}
double process_cpu_seconds() {
  return cpu::process_cpu_seconds();
}

int resolve_threads(int requested) {
  return attn::resolve_threads(requested);
}

}  // namespace attn::cpu_bench
