// `attn bench --modes varlen`: the ragged batch of the varlen issue (16 causal sequences with
// lengths spread geometrically from 64 to 4096, Hq 16, Hkv 4, D 128) three ways, forward and forward
// + backward: packed (attn::attention_varlen over cu_seqlens), the same sequences as 16 separate
// attention() calls, and padded to the longest (one batched call, key lengths masking the padding).
// FLOPs are the useful ones, 4 Hq D sum(L^2) / 2 forward (3.5x with the backward), for all three.
#include "tools/bench_varlen.h"

#include <fmt/format.h>

#include <cmath>

#include "attn/dtype.h"
#include "attn/varlen.h"
#include "tools/bench_timing.h"

namespace attn::tools {
namespace {

constexpr int64_t kSeqs = 16, kHq = 16, kHkv = 4, kD = 128;

// 64 * 64^(b / 15), rounded: 64 ... 4096.
std::vector<int64_t> ragged_lengths() {
  std::vector<int64_t> lens;
  for (int64_t b = 0; b < kSeqs; ++b)
    lens.push_back(std::llround(64.0 * std::pow(64.0, static_cast<double>(b) / (kSeqs - 1))));
  return lens;
}

Tensor filled(const Shape& shape, DType dtype, double value) {
  return Tensor::full(shape, value, dtype);
}

struct Ragged {
  std::vector<int64_t> lens;
  int64_t total = 0, longest = 0;
  double flops = 0;      // the forward's useful FLOPs
  Tensor q, k, v, dout;  // packed
  VarlenBatch batch;
  std::vector<Tensor> qs, ks, vs, douts;  // per sequence [1, H, L, D]
  Tensor pq, pk, pv, pdout, lengths;      // padded [B, H, longest, D], key lengths [B]
};

// Inputs of one value each (the kernels' time does not depend on them).
Ragged make_ragged(DType dtype) {
  Ragged r;
  r.lens = ragged_lengths();
  std::vector<double> cu{0.0}, lens;
  for (int64_t n : r.lens) {
    cu.push_back(cu.back() + static_cast<double>(n));
    lens.push_back(static_cast<double>(n));
    r.longest = std::max(r.longest, n);
    r.flops += 4.0 * kHq * kD * static_cast<double>(n) * static_cast<double>(n) / 2.0;
  }
  r.total = static_cast<int64_t>(cu.back());
  r.batch.cu_seqlens_q = Tensor::from_vector({kSeqs + 1}, cu, DType::i32);
  r.batch.cu_seqlens_k = r.batch.cu_seqlens_q;
  r.q = filled({r.total, kHq, kD}, dtype, 0.01), r.dout = filled({r.total, kHq, kD}, dtype, 0.02);
  r.k = filled({r.total, kHkv, kD}, dtype, 0.03), r.v = filled({r.total, kHkv, kD}, dtype, 0.04);
  for (int64_t n : r.lens) {
    r.qs.push_back(filled({1, kHq, n, kD}, dtype, 0.01));
    r.douts.push_back(filled({1, kHq, n, kD}, dtype, 0.02));
    r.ks.push_back(filled({1, kHkv, n, kD}, dtype, 0.03));
    r.vs.push_back(filled({1, kHkv, n, kD}, dtype, 0.04));
  }
  r.pq = filled({kSeqs, kHq, r.longest, kD}, dtype, 0.01);
  r.pdout = filled({kSeqs, kHq, r.longest, kD}, dtype, 0.02);
  r.pk = filled({kSeqs, kHkv, r.longest, kD}, dtype, 0.03);
  r.pv = filled({kSeqs, kHkv, r.longest, kD}, dtype, 0.04);
  r.lengths = Tensor::from_vector({kSeqs}, lens, DType::i64);
  return r;
}

// The three ways of one direction: packed, per-sequence calls, padded.
std::vector<Timing> time_ways(const Ragged& r, const AttentionOptions& o, bool backward, int reps) {
  AttentionOptions padded = o;
  padded.key_lengths = r.lengths;
  auto packed = [&] {
    const AttentionResult f = attention_varlen(r.q, r.k, r.v, r.batch, o);
    if (backward) attention_varlen_backward(r.dout, r.q, r.k, r.v, f.out, f.lse, r.batch, o);
  };
  auto per_sequence = [&] {
    for (size_t b = 0; b < r.qs.size(); ++b) {
      const AttentionResult f = attention(r.qs[b], r.ks[b], r.vs[b], o);
      if (backward) attention_backward(r.douts[b], r.qs[b], r.ks[b], r.vs[b], f.out, f.lse, o);
    }
  };
  auto pad = [&] {
    const AttentionResult f = attention(r.pq, r.pk, r.pv, padded);
    if (backward) attention_backward(r.pdout, r.pq, r.pk, r.pv, f.out, f.lse, padded);
  };
  return {median_seconds(reps, packed), median_seconds(reps, per_sequence),
          median_seconds(reps, pad)};
}

}  // namespace

void run_varlen_rows(int reps, const std::vector<std::string>& dtypes, const AttentionOptions& base,
                     double fma_gflops) {
  AttentionOptions o = base;
  o.causal = true;
  for (const std::string& dt : dtypes) {
    const Ragged r = make_ragged(parse_dtype(dt));
    for (bool backward : {false, true}) {
      const std::vector<Timing> t = time_ways(r, o, backward, reps);
      const double flops = r.flops * (backward ? 3.5 : 1.0);
      const double gf = flops / t[0].wall * 1e-9;
      fmt::print(
          "varlen {} {} ({} causal sequences, L 64..4096, {} tokens, Hq {} Hkv {} D {}): packed "
          "{:.1f} ms ({:.1f} GFLOP/s, {:.1f}% of FMA), {} separate calls {:.1f} ms, padded to {} "
          "{:.1f} ms; packed / separate {:.3f}, packed / padded {:.3f}\n",
          dt, backward ? "fwd+bwd" : "fwd", kSeqs, r.total, kHq, kHkv, kD, t[0].wall * 1e3, gf,
          fma_gflops > 0 ? 100.0 * gf / fma_gflops : 0.0, kSeqs, t[1].wall * 1e3, r.longest,
          t[2].wall * 1e3, t[0].wall / t[1].wall, t[0].wall / t[2].wall);
      std::fflush(stdout);
    }
  }
}

}  // namespace attn::tools
