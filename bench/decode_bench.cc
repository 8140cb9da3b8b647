// attn_bench_decode: decode (few query rows against a long KV cache) next to the memory probes it
// is judged by. Prints, per row, the median time and the bytes of K + V read per second, and the
// machine's read bandwidth (a pure streaming-read loop) and copy bandwidth (the probe of `attn
// bench`, read + write bytes). The rows are measured round-robin, one run of each per round, so a
// change of load on a shared machine hits every row alike.
//
//   attn_bench_decode [threads] [rounds] [Lk]      (defaults: all cores, 7, 32768)
//
// Rows: MHA (32 heads, the decode row), GQA (32 query heads over 8 kv heads: K and V are
// read once per group, so the same bytes serve 4x the query heads), Lq = 4 (speculative decoding),
// each in f32 and bf16, D = 128.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "attn/bench.h"
#include "attn/tensor.h"

namespace {

using attn::DType;
using attn::Tensor;

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct DecodeRow {
  std::string name;
  int64_t Hq, Hkv, Lq;
  DType dtype;
  Tensor q, k, v;
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = attn::cpu_bench::resolve_threads(argc > 1 ? std::atoi(argv[1]) : 0);
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  const int64_t Lk = argc > 3 ? std::max(1, std::atoi(argv[3])) : 32768;
  const int64_t D = 128;
  std::vector<DecodeRow> rows;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dt = attn::dtype_name(dtype);
    rows.push_back({"MHA   Hq 32 Hkv 32 Lq 1 " + dt, 32, 32, 1, dtype, {}, {}, {}, {}});
    rows.push_back({"GQA   Hq 32 Hkv  8 Lq 1 " + dt, 32, 8, 1, dtype, {}, {}, {}, {}});
    rows.push_back({"spec  Hq 32 Hkv 32 Lq 4 " + dt, 32, 32, 4, dtype, {}, {}, {}, {}});
    rows.push_back({"GQA+s Hq 32 Hkv  8 Lq 4 " + dt, 32, 8, 4, dtype, {}, {}, {}, {}});
  }
  for (DecodeRow& r : rows) {
    attn::bench::DecodeProblem p = attn::bench::decode_problem(r.Hq, r.Hkv, r.Lq, Lk, D, r.dtype);
    r.q = std::move(p.q), r.k = std::move(p.k), r.v = std::move(p.v);
  }
  attn::AttentionOptions o;
  o.backend = attn::Backend::cpu;
  o.threads = threads;
  std::vector<double> read_bw, copy_bw;
  for (DecodeRow& r : rows) attn::attention(r.q, r.k, r.v, o);  // warm-up: pages, scratch
  for (int round = 0; round < rounds; ++round) {
    read_bw.push_back(attn::cpu_bench::probe_read_gbps(threads) * 1e9);
    copy_bw.push_back(attn::cpu_bench::probe_copy_gbps(threads) * 1e9);
    for (DecodeRow& r : rows)
      r.times.push_back(seconds([&] { attn::attention(r.q, r.k, r.v, o); }));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double rd = median(read_bw), cp = median(copy_bw);
  fmt::print("attn_bench_decode: {} threads, Lk {}, D {}, median of {} rounds\n", threads, Lk, D,
             rounds);
  fmt::print("read probe {:.1f} GB/s (bytes read), copy probe {:.1f} GB/s (read + write)\n",
             rd * 1e-9, cp * 1e-9);
  fmt::print("{:<30} {:>9} {:>14} {:>8} {:>8} {:>16}\n", "row", "time ms", "K+V GB/s", "% copy",
             "% read", "us / query head");
  for (const DecodeRow& r : rows) {
    const double t = median(r.times);
    const double bytes = attn::bench::kv_bytes(r.Hkv, Lk, D, r.dtype);
    fmt::print("{:<30} {:>9.3f} {:>14.1f} {:>7.1f}% {:>7.1f}% {:>16.1f}\n", r.name, t * 1e3,
               bytes / t * 1e-9, 100.0 * bytes / t / cp, 100.0 * bytes / t / rd,
               t * 1e6 / static_cast<double>(r.Hq));
  }
  return 0;
}
