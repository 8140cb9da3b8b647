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
#include "attn/bench.h"
#include "attn/tensor.h"

namespace {

using attn::DType;

// args: BH, L, D
void attention_case(benchmark::State& state, bool backward, DType dtype, bool causal) {
  const int64_t BH = state.range(0), L = state.range(1), D = state.range(2);
  const attn::bench::SquareProblem p = attn::bench::square_problem(BH, L, D, dtype);
  attn::AttentionOptions o;
  o.causal = causal;
  for (auto _ : state) {
    const attn::AttentionResult r = attn::attention(p.q, p.k, p.v, o);
    if (backward) {
      const attn::AttentionGrads g =
          attn::attention_backward(p.dout, p.q, p.k, p.v, r.out, r.lse, o);
      benchmark::DoNotOptimize(g.dq.data());
    }
    benchmark::DoNotOptimize(r.out.data());
  }
  double flops = attn::bench::forward_flops(BH, L, D, causal);
  if (backward) flops *= attn::bench::kForwardBackwardFactor;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void decode_case(benchmark::State& state, DType dtype) {
  const int64_t H = 32, Lk = 32768, D = 128;
  const attn::bench::DecodeProblem p = attn::bench::decode_problem(H, H, 1, Lk, D, dtype);
  for (auto _ : state) {
    const attn::AttentionResult r = attn::attention(p.q, p.k, p.v);
    benchmark::DoNotOptimize(r.out.data());
  }
  const double bytes = attn::bench::kv_bytes(H, Lk, D, dtype);
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
