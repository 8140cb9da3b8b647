// Google Benchmark over the grid: forward and forward + backward, f32 and bf16, causal or
// not, B x H in {8, 32}, L in {128, 512, 2048, 8192}, D in {64, 128}, plus decode (Lq = 1, Lk =
// 32768, 32 heads, D = 128). Counters: GFLOP/s (forward 4 B H L^2 D, half when causal; forward +
// backward 3.5 x that) and, for decode, GB/s of K and V read. `attn bench` prints the same rows
// next to the measured ceilings.
//
//   attn_bench_attention --benchmark_filter='fwd/f32/.*/2048/' --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "attn/attention.h"
#include "attn/tensor.h"

namespace {

using attn::DType;
using attn::Tensor;

Tensor random_input(const attn::Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data_as<float>();
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1p-53 * 2.0 - 1.0);
  }
  return dtype == DType::f32 ? t : t.to(dtype);
}

// args: BH, L, D
void attention_case(benchmark::State& state, bool backward, DType dtype, bool causal) {
  const int64_t BH = state.range(0), L = state.range(1), D = state.range(2);
  const Tensor q = random_input({1, BH, L, D}, dtype, 1), k = random_input({1, BH, L, D}, dtype, 2),
               v = random_input({1, BH, L, D}, dtype, 3),
               dout = random_input({1, BH, L, D}, dtype, 4);
  attn::AttentionOptions o;
  o.causal = causal;
  for (auto _ : state) {
    const attn::AttentionResult r = attn::attention(q, k, v, o);
    if (backward) {
      const attn::AttentionGrads g = attn::attention_backward(dout, q, k, v, r.out, r.lse, o);
      benchmark::DoNotOptimize(g.dq.data());
    }
    benchmark::DoNotOptimize(r.out.data());
  }
  double flops =
      4.0 * static_cast<double>(BH) * static_cast<double>(L) * static_cast<double>(L) * D;
  if (causal) flops *= 0.5;
  if (backward) flops *= 3.5;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void decode_case(benchmark::State& state, DType dtype) {
  const int64_t H = 32, Lk = 32768, D = 128;
  const Tensor q = random_input({1, H, 1, D}, dtype, 5), k = random_input({1, H, Lk, D}, dtype, 6),
               v = random_input({1, H, Lk, D}, dtype, 7);
  for (auto _ : state) {
    const attn::AttentionResult r = attn::attention(q, k, v);
    benchmark::DoNotOptimize(r.out.data());
  }
  const double bytes = 2.0 * H * Lk * D * static_cast<double>(attn::dtype_size(dtype));
  state.counters["GB/s"] = benchmark::Counter(
      bytes * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void register_all() {
  for (bool backward : {false, true}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool causal : {false, true}) {
        const std::string name = std::string(backward ? "fwdbwd/" : "fwd/") +
                                 attn::dtype_name(dtype) + (causal ? "/causal" : "/full");
        auto* b =
            benchmark::RegisterBenchmark(name.c_str(), attention_case, backward, dtype, causal);
        b->ArgNames({"BH", "L", "D"})->Unit(benchmark::kMillisecond)->UseRealTime();
        for (int64_t bh : {8, 32}) {
          for (int64_t L : {128, 512, 2048, 8192}) {
            for (int64_t D : {64, 128}) b->Args({bh, L, D});
          }
        }
      }
    }
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string name = std::string("decode/") + attn::dtype_name(dtype) + "/H32/Lk32768/D128";
    benchmark::RegisterBenchmark(name.c_str(), decode_case, dtype)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
