// `attn bench --modes paged`: the varlen issue's paged decode. 8 sequences with contexts spread
// geometrically from 1024 to 32768 keys, Hq 32, Hkv 8, D 128, one query each, the cache's blocks of
// 16 keys handed out in a shuffled order: attention_paged against the same keys packed
// contiguously (attention_varlen, one call) and head-major ([1, Hkv, L, D] per sequence, one
// attention() call each), judged by the bytes of K and V read per second against
// the read probe of this run; and a mixed batch (prefill chunks beside decode steps) in one call
// against the same work in two.
#include "tools/bench_paged.h"

#include <fmt/format.h>

#include <cmath>
#include <numeric>
#include <random>

#include "attn/dtype.h"
#include "attn/paged.h"
#include "attn/varlen.h"
#include "tools/bench_timing.h"

namespace attn::tools {
namespace {

constexpr int64_t kSeqs = 8, kHq = 32, kHkv = 8, kD = 128, kBlock = 16;

struct PagedDecode {
  std::vector<int64_t> lens;
  Tensor q, cu_q;
  PagedKV kv;
  Tensor packed_k, packed_v;       // the same keys contiguous
  std::vector<Tensor> qs, ks, vs;  // per sequence, head-major: [1, H, L, D]
  VarlenBatch batch;
  double bytes = 0;  // K and V read by one step
};

PagedDecode make_decode(DType dtype) {
  PagedDecode d;
  int64_t blocks = 0, total = 0;
  for (int64_t b = 0; b < kSeqs; ++b) {
    d.lens.push_back(std::llround(1024.0 * std::pow(32.0, static_cast<double>(b) / (kSeqs - 1))));
    blocks += (d.lens.back() + kBlock - 1) / kBlock, total += d.lens.back();
  }
  const int64_t max_blocks = (d.lens.back() + kBlock - 1) / kBlock;
  d.kv.k_pages = Tensor::full({blocks, kBlock, kHkv, kD}, 0.01, dtype);
  d.kv.v_pages = Tensor::full({blocks, kBlock, kHkv, kD}, 0.02, dtype);
  std::vector<int64_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<double> table(static_cast<size_t>(kSeqs * max_blocks), 0.0), used, cu_q{0}, cu_k{0};
  size_t next = 0;
  for (int64_t b = 0; b < kSeqs; ++b) {
    for (int64_t i = 0; i * kBlock < d.lens[b]; ++i)
      table[b * max_blocks + i] = static_cast<double>(order[next++]);
    used.push_back(static_cast<double>(d.lens[b]));
    cu_q.push_back(static_cast<double>(b + 1));
    cu_k.push_back(cu_k.back() + static_cast<double>(d.lens[b]));
  }
  d.kv.block_table = Tensor::from_vector({kSeqs, max_blocks}, table, DType::i32);
  d.kv.seqused_k = Tensor::from_vector({kSeqs}, used, DType::i32);
  d.q = Tensor::full({kSeqs, kHq, kD}, 0.03, dtype);
  d.cu_q = Tensor::from_vector({kSeqs + 1}, cu_q, DType::i32);
  d.packed_k = Tensor::full({total, kHkv, kD}, 0.01, dtype);
  d.packed_v = Tensor::full({total, kHkv, kD}, 0.02, dtype);
  d.batch.cu_seqlens_q = d.cu_q;
  d.batch.cu_seqlens_k = Tensor::from_vector({kSeqs + 1}, cu_k, DType::i32);
  d.bytes = 2.0 * static_cast<double>(total * kHkv * kD) * static_cast<double>(dtype_size(dtype));
  for (int64_t n : d.lens) {
    d.qs.push_back(Tensor::full({1, kHq, 1, kD}, 0.03, dtype));
    d.ks.push_back(Tensor::full({1, kHkv, n, kD}, 0.01, dtype));
    d.vs.push_back(Tensor::full({1, kHkv, n, kD}, 0.02, dtype));
  }
  return d;
}

// A pool holding sequences of the given key counts (blocks in order), their block table and
// seqused_k, and queries packed by lq.
struct MixedBatch {
  PagedKV kv;
  Tensor q, cu_q;
};

MixedBatch make_batch(const std::vector<int64_t>& lk, const std::vector<int64_t>& lq, DType dtype) {
  MixedBatch m;
  const auto B = static_cast<int64_t>(lk.size());
  int64_t blocks = 0, max_blocks = 1, total_q = 0;
  for (int64_t n : lk) blocks += (n + kBlock - 1) / kBlock;
  for (int64_t n : lk) max_blocks = std::max(max_blocks, (n + kBlock - 1) / kBlock);
  m.kv.k_pages = Tensor::full({blocks, kBlock, kHkv, kD}, 0.01, dtype);
  m.kv.v_pages = Tensor::full({blocks, kBlock, kHkv, kD}, 0.02, dtype);
  std::vector<double> table(static_cast<size_t>(B * max_blocks), 0.0), used, cu{0};
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i * kBlock < lk[b]; ++i)
      table[b * max_blocks + i] = static_cast<double>(next++);
    used.push_back(static_cast<double>(lk[b]));
    total_q += lq[b];
    cu.push_back(static_cast<double>(total_q));
  }
  m.kv.block_table = Tensor::from_vector({B, max_blocks}, table, DType::i32);
  m.kv.seqused_k = Tensor::from_vector({B}, used, DType::i32);
  m.q = Tensor::full({total_q, kHq, kD}, 0.03, dtype);
  m.cu_q = Tensor::from_vector({B + 1}, cu, DType::i32);
  return m;
}

// The mixed batch: 4 prefill chunks of 512 queries (the second chunk of each prompt: 1024
// keys, causal) and 60 decode steps at 4096 keys, in one call against the same work as two calls.
void run_mixed_row(int reps, const std::string& dt, const AttentionOptions& base) {
  const DType dtype = parse_dtype(dt);
  std::vector<int64_t> lk(4, 1024), lq(4, 512);
  lk.resize(64, 4096), lq.resize(64, 1);
  const MixedBatch mixed = make_batch(lk, lq, dtype);
  const MixedBatch prefill =
      make_batch({lk.begin(), lk.begin() + 4}, {lq.begin(), lq.begin() + 4}, dtype);
  const MixedBatch decode =
      make_batch({lk.begin() + 4, lk.end()}, {lq.begin() + 4, lq.end()}, dtype);
  AttentionOptions o = base;
  o.causal = true;
  const Timing one =
      median_seconds(reps, [&] { attention_paged(mixed.q, mixed.cu_q, mixed.kv, o); });
  const Timing two = median_seconds(reps, [&] {
    attention_paged(prefill.q, prefill.cu_q, prefill.kv, o);
    attention_paged(decode.q, decode.cu_q, decode.kv, o);
  });
  fmt::print(
      "mixed paged {} (4 prefill chunks of 512 at 1024 keys + 60 decodes at 4096, Hq {} Hkv {} D "
      "{}): one call {:.3f} ms, two calls {:.3f} ms; one / two {:.3f}\n",
      dt, kHq, kHkv, kD, one.wall * 1e3, two.wall * 1e3, one.wall / two.wall);
  std::fflush(stdout);
}

// The quantized row: 4 sequences at a 32768-key context, one query each, the cache int8
// (one scale per token and kv head) against the same geometry in q's dtype (bf16 or f32).
void run_int8_row(int reps, const std::string& dt, const AttentionOptions& base, double read_gbps) {
  const DType dtype = parse_dtype(dt);
  const std::vector<int64_t> lk(4, 32768), lq(4, 1);
  const MixedBatch plain = make_batch(lk, lq, dtype);
  MixedBatch int8 = plain;
  for (Tensor* pool : {&int8.kv.k_pages, &int8.kv.v_pages})
    *pool = Tensor::full(pool->shape(), 3.0, DType::i8);
  const Shape scales = {plain.kv.k_pages.size(0), kBlock, kHkv};
  int8.kv.k_scales = Tensor::full(scales, 0.01, DType::f32);
  int8.kv.v_scales = Tensor::full(scales, 0.02, DType::f32);
  const Timing t_plain =
      median_seconds(reps, [&] { attention_paged(plain.q, plain.cu_q, plain.kv, base); });
  const Timing t_int8 =
      median_seconds(reps, [&] { attention_paged(int8.q, int8.cu_q, int8.kv, base); });
  const double keys = 4.0 * 32768 * kHkv;
  const double plain_bytes = keys * 2 * kD * static_cast<double>(dtype_size(dtype));
  const double int8_bytes = keys * 2 * (kD + 4);  // int8 elements and an f32 scale per row
  auto pct = [&](double gbps) { return read_gbps > 0 ? 100.0 * gbps / read_gbps : 0.0; };
  const double g_plain = plain_bytes / t_plain.wall * 1e-9,
               g_int8 = int8_bytes / t_int8.wall * 1e-9;
  fmt::print(
      "paged decode int8 cache, q {} (4 sequences at 32768 keys, Hq {} Hkv {} D {}, blocks of {}): "
      "{} cache {:.3f} ms ({:.1f} GB/s, {:.1f}% of read), int8 cache {:.3f} ms ({:.1f} GB/s with "
      "scales, {:.1f}% of read); {} / int8 {:.2f}x\n",
      dt, kHq, kHkv, kD, kBlock, dt, t_plain.wall * 1e3, g_plain, pct(g_plain), t_int8.wall * 1e3,
      g_int8, pct(g_int8), dt, t_plain.wall / t_int8.wall);
  std::fflush(stdout);
}

}  // namespace

void run_paged_rows(int reps, const std::vector<std::string>& dtypes, const AttentionOptions& base,
                    double read_gbps) {
  for (const std::string& dt : dtypes) {
    const PagedDecode d = make_decode(parse_dtype(dt));
    const Timing paged = median_seconds(reps, [&] { attention_paged(d.q, d.cu_q, d.kv, base); });
    const Timing packed =
        median_seconds(reps, [&] { attention_varlen(d.q, d.packed_k, d.packed_v, d.batch, base); });
    auto gbps = [&](const Timing& t) { return d.bytes / t.wall * 1e-9; };
    const Timing head_major = median_seconds(reps, [&] {
      for (size_t b = 0; b < d.qs.size(); ++b) attention(d.qs[b], d.ks[b], d.vs[b], base);
    });
    fmt::print(
        "paged decode {} ({} sequences, Lk {}..{}, Hq {} Hkv {} D {}, blocks of {}): paged {:.3f} "
        "ms "
        "({:.1f} GB/s of K+V, {:.1f}% of read), packed {:.3f} ms ({:.1f} GB/s), head-major {:.3f} "
        "ms ({:.1f} GB/s); paged / packed {:.3f}, paged / head-major {:.3f}\n",
        dt, kSeqs, d.lens.front(), d.lens.back(), kHq, kHkv, kD, kBlock, paged.wall * 1e3,
        gbps(paged), read_gbps > 0 ? 100.0 * gbps(paged) / read_gbps : 0.0, packed.wall * 1e3,
        gbps(packed), head_major.wall * 1e3, gbps(head_major), paged.wall / packed.wall,
        paged.wall / head_major.wall);
    std::fflush(stdout);
    run_mixed_row(reps, dt, base);
    run_int8_row(reps, dt, base, read_gbps);
  }
}

}  // namespace attn::tools
