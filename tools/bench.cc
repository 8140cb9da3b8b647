// `attn bench`: times the attention kernels over the grid and prints, per row, the median
// time, GFLOP/s and the fraction of this machine's ceiling measured by probes it runs first (fp32
// FMA, bf16 dot, copy and read bandwidth). Forward FLOPs = 4 B H Lq Lk D (half under a square causal mask);
// forward + backward = 3.5 x that (the backward counts 2.5 x the forward). Decode rows (Lq = 1) are
// judged in bytes of K and V read per second against the copy probe and the read probe (decode
// only reads; on some machines a read stream is slower than a copy's reads and writes together).
// Modes linear and linear-bwd time nn::Linear on the encoder shapes of all-MiniLM-L6-v2 and
// BERT-base (the products of a Transformer layer) for --linear-m tokens: 2 M N K FLOPs forward, 3x
// that with the backward (dx and dW), judged against the ceiling of the instructions the GEMM
// library runs for that dtype here.
//
//   attn bench [--quick] [--threads N] [--reps R] [--backend auto|cpu|reference] [--isa NAME]
//              [--modes fwd,fwdbwd,linear,linear-bwd,varlen,paged] [--dtypes f32,bf16] [--bh 8,32]
//              [--L 128,512,2048,8192] [--D 64,128] [--linear-m 1024,4096]
//              [--causal both|yes|no] [--no-decode] [--no-probes] [--tiles BQ,BK] [--bwd-tiles
//              BQ,BK] [--decode-lk 32768] [--decode-prefetch l1|l2|none|l1,l2,none]
//              [--amx-pipeline on|off|on,off]
#include "attn/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/nn/layers.h"
#include "attn/tensor.h"
#include "tools/bench_paged.h"
#include "tools/bench_timing.h"
#include "tools/bench_varlen.h"
#include "tools/command.h"

namespace attn::tools {
namespace {

constexpr const char* kCmd = "attn bench";

struct BenchArgs {
  bool quick = false, no_decode = false, no_probes = false;
  int threads = 0, reps = 5;
  std::string backend = "auto", isa, modes = "fwd,fwdbwd", dtypes = "f32,bf16", bh = "8,32",
              L = "128,512,2048,8192", D = "64,128", causal = "both", tiles, bwd_tiles,
              linear_m = "1024,4096", decode_lk = "32768", decode_prefetch, amx_pipeline;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string item =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) r.push_back(item);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return r;
}

std::vector<int64_t> split_ints(const char* flag, const std::string& s) {
  std::vector<int64_t> r;
  for (const std::string& item : split(s)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v <= 0) {
      throw Error(fmt::format("{}: {} takes positive integers separated by commas, got '{}'", kCmd,
                              flag, s));
    }
    r.push_back(v);
  }
  return r;
}

// n settings of one run-time choice (set(i) applies setting i) timed against each other call by
// call in this process, the order reversed every other round: each setting's median wall and CPU
// time and the number of rounds it was the fastest in. Comparing two processes one after the other
// moved identical code by 2-3% on a shared host (docs/PERFORMANCE.md, "Comparing two variants");
// alternating calls shares the host's swings between the settings.
struct Alternation {
  std::vector<Timing> medians;
  std::vector<int> wins;
};
template <class Set, class Fn>
Alternation alternate(size_t n, int reps, Set&& set, Fn&& fn) {
  std::vector<std::vector<double>> t(n), c(n);
  Alternation a{std::vector<Timing>(n), std::vector<int>(n, 0)};
  auto timed = [&](size_t i) {
    set(i);
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_bench::process_cpu_seconds();
    fn();
    c[i].push_back(cpu_bench::process_cpu_seconds() - c0);
    t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return t[i].back();
  };
  for (size_t i = 0; i < n; ++i) timed(i);  // warm-up
  for (size_t i = 0; i < n; ++i) t[i].clear(), c[i].clear();
  for (int r = 0; r < reps; ++r) {
    std::vector<double> round(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = r % 2 == 0 ? k : n - 1 - k;
      round[i] = timed(i);
    }
    ++a.wins[static_cast<size_t>(std::min_element(round.begin(), round.end()) - round.begin())];
  }
  for (size_t i = 0; i < n; ++i) a.medians[i] = {median(t[i]), median(c[i])};
  return a;
}

struct Ceiling {
  double all = 0, core = 0;  // GFLOP/s of every thread (wall clock), per core per CPU-second
};

struct Ceilings {
  double fma = 0, fma_core_cpu = 0, bf16 = 0, bf16_core_cpu = 0, amx = 0, amx_core_cpu = 0,
         copy = 0, read = 0;
  // Each row is judged against the ceiling of the instructions its products run on; a probe that
  // found nothing usable (or did not run) falls back to fp32 FMA.
  Ceiling of(cpu_bench::Products p) const {
    if (p == cpu_bench::Products::amx_tiles && amx > 0) return {amx, amx_core_cpu};
    if (p == cpu_bench::Products::bf16_dot && bf16 > 0) return {bf16, bf16_core_cpu};
    return {fma, fma_core_cpu};
  }
};

// The columns of a timed row after its label: time, GFLOP/s, share of the ceiling (wall clock, all
// threads), GFLOP per CPU-second per thread and its share of the per-core ceiling.
void print_rate(double flops, const Timing& s, Ceiling ceil, const std::string& extra = "") {
  const double gf = flops / s.wall * 1e-9;
  const double gf_core = s.cpu > 0 ? flops / s.cpu * 1e-9 : 0.0;
  fmt::print(" {:>11.3f} {:>9.1f} {:>7.1f}% {:>12.1f} {:>7.1f}%{}\n", s.wall * 1e3, gf,
             ceil.all > 0 ? 100.0 * gf / ceil.all : 0.0, gf_core,
             ceil.core > 0 ? 100.0 * gf_core / ceil.core : 0.0, extra);
  std::fflush(stdout);
}

// The Linear layers of a post-norm BERT encoder layer: [out, in] of its products.
struct LinearShape {
  const char* name;
  int64_t out, in;
};
constexpr LinearShape kLinearShapes[] = {
    {"minilm qkv", 1152, 384},     {"minilm out", 384, 384},      {"minilm ffn1", 1536, 384},
    {"minilm ffn2", 384, 1536},    {"bert-base qkv", 2304, 768},  {"bert-base out", 768, 768},
    {"bert-base ffn1", 3072, 768}, {"bert-base ffn2", 768, 3072},
};

// nn::Linear forward (or forward + backward) over kLinearShapes for each M of --linear-m. f32 and
// f16 products run on the f32 GEMM (the FMA ceiling); bf16 on oneDNN's bf16 matmul where attn
// chose it (AMX tiles where usable, else VDPBF16PS), else widened to the f32 GEMM.
void run_linear_rows(const BenchArgs& a, const Ceilings& c, const std::vector<std::string>& modes,
                     const std::vector<int64_t>& Ms) {
  fmt::print("{:<10} {:<5} {:<15} {:>5} {:>5} {:>5} {:>11} {:>9} {:>8} {:>12} {:>8}\n", "mode",
             "dtype", "layer", "M", "N", "K", "time ms", "GFLOP/s", "% peak", "cpu GF/s/core",
             "% core");
  for (const std::string& mode : modes) {
    const bool backward = mode == "linear-bwd";
    for (const std::string& dt : split(a.dtypes)) {
      const DType dtype = parse_dtype(dt);
      if (backward && dtype != DType::f32) {
        fmt::print("{:<10} {:<5} skipped: nn modules train in f32 (bf16 and f16 are inference)\n",
                   mode, dt);
        continue;
      }
      // oneDNN's bf16 matmul runs on AMX tiles where they are usable, else on VDPBF16PS.
      const bool native16 = dtype == DType::bf16 && nn::gemm_bf16_native();
      const Ceiling ceil = c.of(!native16   ? cpu_bench::Products::fma
                                : c.amx > 0 ? cpu_bench::Products::amx_tiles
                                            : cpu_bench::Products::bf16_dot);
      for (int64_t M : Ms) {
        for (const LinearShape& sh : kLinearShapes) {
          nn::Linear lin(sh.in, sh.out, /*bias=*/true, dtype == DType::f16 ? DType::f32 : dtype);
          if (backward) lin.train();
          const Tensor x = bench::random_input({M, sh.in}, dtype, 8);
          const Tensor dy = backward ? bench::random_input({M, sh.out}, DType::f32, 9) : Tensor();
          const Timing s = median_seconds(a.reps, [&] {
            const Tensor y = lin.forward(x);
            if (backward) lin.backward(dy);
          });
          fmt::print("{:<10} {:<5} {:<15} {:>5} {:>5} {:>5}", mode, dt, sh.name, M, sh.out, sh.in);
          print_rate((backward ? 6.0 : 2.0) * M * sh.out * sh.in, s, ceil);
        }
      }
    }
  }
}

// Decode: one query row per head against a KV cache of --decode-lk keys (32k by default: K and V
// stream from memory; a few hundred keys keep them in the caches), 32 heads, D = 128. One prefetch
// level (or the CPU's): the median of --reps calls. Several (--decode-prefetch l1,l2,none): the
// levels alternate call by call (alternate()), each level's median printed with the rounds it was
// the fastest in.
void run_decode_rows(const BenchArgs& a, const Ceilings& c, const AttentionOptions& base) {
  const std::vector<std::string> levels = split(a.decode_prefetch);
  const int64_t H = 32, D = 128;
  for (const int64_t Lk : split_ints("--decode-lk", a.decode_lk)) {
    for (const std::string& dt : split(a.dtypes)) {
      const DType dtype = parse_dtype(dt);
      const bench::DecodeProblem p = bench::decode_problem(H, H, 1, Lk, D, dtype);
      const double bytes = bench::kv_bytes(H, Lk, D, dtype);
      auto line = [&](double s, const std::string& extra) {
        const double gbps = bytes / s * 1e-9;
        fmt::print(
            "decode {} H {} Lq 1 Lk {} D {}: {:.3f} ms, {:.1f} GB/s of K+V read ({:.1f}% of copy, "
            "{:.1f}% of read; prefetch to {}){}\n",
            dt, H, Lk, D, s * 1e3, gbps, c.copy > 0 ? 100.0 * gbps / c.copy : 0.0,
            c.read > 0 ? 100.0 * gbps / c.read : 0.0, cpu_bench::decode_prefetch(), extra);
      };
      if (levels.size() < 2) {
        line(median_seconds(a.reps, [&] { attention(p.q, p.k, p.v, base); }).wall, "");
        continue;
      }
      const Alternation alt = alternate(
          levels.size(), a.reps, [&](size_t i) { cpu_bench::set_decode_prefetch(levels[i]); },
          [&] { attention(p.q, p.k, p.v, base); });
      for (size_t i = 0; i < levels.size(); ++i) {
        cpu_bench::set_decode_prefetch(levels[i]);
        line(alt.medians[i].wall,
             fmt::format(", fastest in {} of {} alternating rounds", alt.wins[i], a.reps));
      }
    }
  }
  cpu_bench::set_decode_prefetch("");
}

// The ceilings of this run (fp32 FMA, bf16 dot, AMX tiles, copy and read bandwidth), printed.
Ceilings measure_ceilings(int threads) {
  Ceilings c;
  c.fma = cpu_bench::probe_fma_gflops(threads, &c.fma_core_cpu);
  c.bf16 = cpu_bench::probe_bf16_dot_gflops(threads, &c.bf16_core_cpu);
  c.amx = cpu_bench::probe_amx_bf16_gflops(threads, &c.amx_core_cpu);
  c.copy = cpu_bench::probe_copy_gbps(threads);
  c.read = cpu_bench::probe_read_gbps(threads);
  fmt::print(
      "ceilings: fp32 FMA {:.1f} GFLOP/s ({:.1f} per core per CPU-second), bf16 dot {:.1f} "
      "GFLOP/s ({:.1f} per core), AMX bf16 tiles {}, copy {:.1f} GB/s (read + write), read "
      "{:.1f} GB/s\n",
      c.fma, c.fma_core_cpu, c.bf16, c.bf16_core_cpu,
      c.amx > 0 ? fmt::format("{:.1f} GFLOP/s ({:.1f} per core)", c.amx, c.amx_core_cpu)
                : std::string("none usable"),
      c.copy, c.read);
  return c;
}

// The attention grid: every mode of grid_modes over --dtypes x --bh x --D x --L x --causal, each row
// against its ceiling (alternating the AMX pipeline settings when several are named).
void run_grid_rows(const BenchArgs& a, const Ceilings& c, const AttentionOptions& base,
                   const std::vector<std::string>& grid_modes,
                   const std::vector<std::string>& pipelines) {
  std::vector<int64_t> Ls = split_ints("--L", a.L), Ds = split_ints("--D", a.D),
                       BHs = split_ints("--bh", a.bh);
  if (a.quick) Ls = {512, 2048}, Ds = {64}, BHs = {8};
  std::vector<bool> causals;
  if (a.causal == "both" || a.causal == "no") causals.push_back(false);
  if (a.causal == "both" || a.causal == "yes") causals.push_back(true);
  if (causals.empty())
    throw Error(fmt::format("{}: --causal is both, yes or no, got '{}'", kCmd, a.causal));

  if (!grid_modes.empty()) {
    fmt::print("{:<7} {:<5} {:<6} {:>4} {:>6} {:>4} {:>11} {:>9} {:>8} {:>12} {:>8}\n", "mode",
               "dtype", "causal", "BH", "L", "D", "time ms", "GFLOP/s", "% peak", "cpu GF/s/core",
               "% core");
  }
  for (const std::string& mode : grid_modes) {
    for (const std::string& dt : split(a.dtypes)) {
      const DType dtype = parse_dtype(dt);
      for (int64_t BH : BHs) {
        for (int64_t D : Ds) {
          for (int64_t L : Ls) {
            for (bool causal : causals) {
              const bench::SquareProblem p = bench::square_problem(BH, L, D, dtype);
              AttentionOptions o = base;
              o.causal = causal;
              const double fwd_flops = bench::forward_flops(BH, L, D, causal);
              auto run = [&] {
                const AttentionResult r = attention(p.q, p.k, p.v, o);
                if (mode != "fwd") attention_backward(p.dout, p.q, p.k, p.v, r.out, r.lse, o);
              };
              const double flops =
                  mode == "fwd" ? fwd_flops : bench::kForwardBackwardFactor * fwd_flops;
              // bf16 rows on the avx512bf16 target run on the bf16 dot instruction, on the amx
              // target on tiles; f32, f16 (computed in f32) and bf16 rows that the dispatcher sends
              // to the f32 kernels on fp32 FMA.
              const Ceiling ceil = c.of(cpu_bench::products(dtype));
              auto label = [&] {
                fmt::print("{:<7} {:<5} {:<6} {:>4} {:>6} {:>4}", mode, dt, causal ? "yes" : "no",
                           BH, L, D);
              };
              if (pipelines.size() < 2) {
                const Timing s = median_seconds(a.reps, run);
                label();
                print_rate(flops, s, ceil);
                continue;
              }
              const Alternation alt = alternate(
                  pipelines.size(), a.reps,
                  [&](size_t i) { cpu_bench::set_amx_pipeline(pipelines[i]); }, run);
              for (size_t i = 0; i < pipelines.size(); ++i) {
                label();
                print_rate(flops, alt.medians[i], ceil,
                           fmt::format("  amx pipeline {}, fastest in {} of {} rounds",
                                       pipelines[i], alt.wins[i], a.reps));
              }
            }
          }
        }
      }
    }
  }
}

void run_bench(const BenchArgs& a) {
  std::vector<std::string> grid_modes, linear_modes;
  bool varlen = false, paged = false;
  for (const std::string& mode : split(a.modes)) {
    if (mode == "fwd" || mode == "fwdbwd") {
      grid_modes.push_back(mode);
    } else if (mode == "linear" || mode == "linear-bwd") {
      linear_modes.push_back(mode);
    } else if (mode == "varlen") {
      varlen = true;
    } else if (mode == "paged") {
      paged = true;
    } else {
      throw Error(fmt::format(
          "{}: unknown mode '{}' (fwd, fwdbwd, linear, linear-bwd, varlen, paged)", kCmd, mode));
    }
  }
  const std::vector<int64_t> linear_ms = split_ints("--linear-m", a.linear_m);
  AttentionOptions base;
  base.backend = parse_backend(a.backend);
  base.threads = a.threads;
  if (!a.isa.empty()) cpu_bench::force_isa(a.isa);
  if (!a.tiles.empty() || !a.bwd_tiles.empty()) {
    const auto f = a.tiles.empty() ? std::vector<int64_t>{0, 0} : split_ints("--tiles", a.tiles);
    const auto b =
        a.bwd_tiles.empty() ? std::vector<int64_t>{0, 0} : split_ints("--bwd-tiles", a.bwd_tiles);
    if (f.size() != 2 || b.size() != 2)
      throw Error(fmt::format("{}: --tiles and --bwd-tiles take BQ,BK", kCmd));
    cpu_bench::set_tile_override(f[0], f[1], b[0], b[1]);
  }
  // Each level and key length named is checked now, before any probe or row runs; one level holds
  // for the run.
  split_ints("--decode-lk", a.decode_lk);
  const std::vector<std::string> levels = split(a.decode_prefetch);
  for (const std::string& level : levels) cpu_bench::set_decode_prefetch(level);
  if (levels.size() != 1) cpu_bench::set_decode_prefetch("");
  const std::vector<std::string> pipelines = split(a.amx_pipeline);
  for (const std::string& setting : pipelines) cpu_bench::set_amx_pipeline(setting);
  if (pipelines.size() != 1) cpu_bench::set_amx_pipeline("");
  const int threads = cpu_bench::resolve_threads(a.threads);
  fmt::print("attn bench: backend {}, isa {}, {} threads, median of {} runs\n", a.backend,
             cpu_bench::active_isa(), threads, a.reps);
  fmt::print("cpu: {}\nkernels: f32 on {}, bf16 on {}\ngemm (nn layers): {}\n",
             cpu_bench::describe_cpu(), cpu_bench::kernels_isa(DType::f32),
             cpu_bench::kernels_isa(DType::bf16), nn::gemm_kernels());
  const std::string bf16_isa = cpu_bench::kernels_isa(DType::bf16);
  if (!pipelines.empty() && bf16_isa != "amx" && bf16_isa != "amx-emulated") {
    fmt::print(
        "note: --amx-pipeline changes nothing here: bf16 runs on {}, not on AMX tiles "
        "(--isa amx-emulated runs the emulated ones)\n",
        bf16_isa);
  }
  const Ceilings c = a.no_probes ? Ceilings{} : measure_ceilings(threads);
  run_grid_rows(a, c, base, grid_modes, pipelines);
  if (!linear_modes.empty()) run_linear_rows(a, c, linear_modes, linear_ms);
  if (varlen) run_varlen_rows(a.reps, split(a.dtypes), base, c.fma);
  if (paged) run_paged_rows(a.reps, split(a.dtypes), base, c.read);
  if (!a.no_decode) run_decode_rows(a, c, base);
  cpu_bench::set_tile_override(0, 0, 0, 0);
  cpu_bench::set_decode_prefetch("");
  cpu_bench::set_amx_pipeline("");
  cpu_bench::force_isa("");
}

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench", "time the attention kernels against this machine's measured ceilings");
  sub->add_flag("--quick", args->quick, "a small grid (L 512 and 2048, D 64, BH 8)");
  sub->add_option("--threads", args->threads, "threads (default: ATTN_NUM_THREADS or all cores)");
  sub->add_option("--reps", args->reps, "timed runs per row (the median is printed)");
  sub->add_option("--backend", args->backend, "auto, cpu or reference");
  sub->add_option(
      "--isa", args->isa,
      "force the cpu backend's instruction set: portable, avx2, avx512, avx512bf16, amx, "
      "amx-emulated");
  sub->add_option("--modes", args->modes,
                  "fwd, fwdbwd (the attention grid), linear, linear-bwd (nn::Linear on the MiniLM "
                  "and BERT-base layer shapes), varlen (a ragged batch packed, as separate calls "
                  "and padded), paged (decode over a paged KV cache), comma separated");
  sub->add_option("--dtypes", args->dtypes, "f32, bf16, f16 (comma separated)");
  sub->add_option("--bh", args->bh, "batch x heads values");
  sub->add_option("--L", args->L, "sequence lengths (Lq = Lk)");
  sub->add_option("--D", args->D, "head dims");
  sub->add_option("--linear-m", args->linear_m, "token counts M of the linear rows");
  sub->add_option("--causal", args->causal, "both, yes or no");
  sub->add_flag("--no-decode", args->no_decode, "skip the decode row");
  sub->add_flag("--no-probes", args->no_probes, "skip the ceiling probes");
  sub->add_option("--tiles", args->tiles, "forward tile BQ,BK (cpu backend)");
  sub->add_option("--bwd-tiles", args->bwd_tiles, "backward tile BQ,BK (cpu backend)");
  sub->add_option("--decode-lk", args->decode_lk,
                  "key lengths of the decode rows (default 32768: K and V from memory)");
  sub->add_option("--decode-prefetch", args->decode_prefetch,
                  "cache level decode prefetches K and V into: l1, l2 or none (the hardware's "
                  "prefetchers alone; default: this CPU's); l1,l2,none compares them call by call");
  sub->add_option("--amx-pipeline", args->amx_pipeline,
                  "the AMX forward's tile products pipelined against its softmax: on or off "
                  "(default: off); on,off compares them call by call on every grid row");
  sub->callback([args] {
    if (args->reps < 1)
      throw Error(fmt::format("{}: --reps must be >= 1, got {}", kCmd, args->reps));
    run_bench(*args);
  });
}

const Command reg{"bench", 30, &add_bench_command};

}  // namespace
}  // namespace attn::tools
