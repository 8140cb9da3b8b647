// `attn ring`: ring attention over MPI ranks (include/attn/ring.h), run under mpirun. Compiled only
// where attn::ring is built (-DATTN_WITH_MPI=ON, or AUTO with MPI found: tools/CMakeLists.txt).
//
//   mpirun -np P attn ring --q Q.npy --k K.npy --v V.npy --out OUT.npy [--lse LSE.npy]
//          [--causal] [--align bottom-right|top-left] [--window LEFT,RIGHT] [--scale S] [--softcap
//          C]
//          [--key-lengths LENS.npy] [--layout contiguous|zigzag] [--dtype f32|f64] [--backend B]
//          [--threads N]
//          [--dout DOUT.npy --dq DQ.npy --dk DK.npy --dv DV.npy] [--check]
//   mpirun -np P attn ring --bench --length L [--batch B --heads H --kv-heads HKV --dim D]
//   [--causal]
//          [--layout zigzag] [--repeat N] [--backward]
//
// File mode: every rank reads the whole .npy files (a shared folder), keeps its slice of the
// sequence, runs the ring, and rank 0 writes the gathered results. --check also runs the
// single-process attn::attention on rank 0 and fails when the results differ by more than 1e-5
// relative. Bench mode: every rank makes random inputs for its own slice and prints (rank 0) the
// ring's time next to the times of its parts (one local block, one ring shift of a K/V block),
// which docs/DISTRIBUTED.md compares with its model.
#include "attn/ring.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/io.h"
#include "tools/attention_flags.h"
#include "tools/command.h"

namespace attn::tools {
namespace {

constexpr const char* kCmd = "attn ring";

struct RingArgs {
  std::string q, k, v, out, lse, dout, dq, dk, dv;
  // attn sdpa's flags for the options a ring supports (tools/attention_flags.h)
  AttentionFlags options;
  bool check = false, bench = false, backward = false;
  std::string layout = "contiguous", dtype = "f32";
  int repeat = 5;
  int64_t batch = 1, heads = 8, kv_heads = 0, length = 4096, dim = 64;
};

// The options' flags a ring takes: those ring attention applies (attn/options.h's RingUse; no dense
// masks or dropout, ring_validate.cc says why), of the tensors only --key-lengths (the one this
// command reads).
bool ring_takes(const OptionInfo& info) {
  return info.ring != RingUse::none &&
         (!field_as<Tensor>(info) || std::string_view(info.name) == "key_lengths");
}

// MPI for the duration of the subcommand; finalised even when an error propagates.
struct MpiSession {
  bool owner = false;
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init(nullptr, nullptr);
      owner = true;
    }
  }
  ~MpiSession() {
    if (owner) MPI_Finalize();
  }
};

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// Collective: throws the same attn::Error on every rank when any rank failed (lowest failing rank's
// message).
void agree(const std::string& local_error) {
  constexpr int kLen = 400;
  std::vector<char> mine(kLen, 0);
  std::memcpy(mine.data(), local_error.data(), std::min<size_t>(local_error.size(), kLen - 1));
  std::vector<char> all(static_cast<size_t>(kLen) * size_of(), 0);
  MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < size_of(); ++r) {
    const char* m = all.data() + static_cast<size_t>(r) * kLen;
    if (m[0] != '\0') {
      throw Error(fmt::format("{}: rank {} of {}: {}", kCmd, r, size_of(),
                              std::string(m, strnlen(m, kLen))));
    }
  }
}

AttentionOptions make_options(const RingArgs& a) {
  return parse_attention_flags(kCmd, a.options);
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    if (std::isinf(x[e]) || std::isinf(y[e])) {
      if (x[e] != y[e]) return INFINITY;
      continue;
    }
    num = std::max(num, std::abs(x[e] - y[e]));
    den = std::max(den, std::abs(y[e]));
  }
  return den > 0 ? num / den : num;
}

void run_files(const RingArgs& a) {
  const int r = rank_of(), P = size_of();
  if (a.q.empty() || a.k.empty() || a.v.empty() || a.out.empty()) {
    throw Error(fmt::format("{}: --q, --k, --v and --out are required (or --bench)", kCmd));
  }
  const bool backward = !a.dout.empty();
  if (backward && (a.dq.empty() || a.dk.empty() || a.dv.empty())) {
    throw Error(fmt::format("{}: --dout needs --dq, --dk and --dv", kCmd));
  }
  const RingLayout layout = parse_ring_layout(a.layout);
  const DType dtype = parse_dtype(a.dtype);
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw Error(fmt::format("{}: --dtype must be f32 or f64, got {}", kCmd, a.dtype));
  }
  AttentionOptions o = make_options(a);

  // Read and slice on every rank; a rank that cannot read its files stops every rank.
  Tensor q, k, v, dout, q_l, k_l, v_l, dout_l;
  std::string error;
  try {
    q = read_npy(a.q).to(dtype);
    k = read_npy(a.k).to(dtype);
    v = read_npy(a.v).to(dtype);
    if (!a.options["key_lengths"].empty()) o.key_lengths = read_npy(a.options["key_lengths"]);
    if (backward) dout = read_npy(a.dout).to(dtype);
    for (const Tensor* t : {&q, &k, &v}) {
      if (t->dim() < 3)
        throw Error(fmt::format("q, k and v need rank >= 3, got {}", t->shape_str()));
    }
    q_l = ring_shard(q, r, P, layout);
    k_l = ring_shard(k, r, P, layout);
    v_l = ring_shard(v, r, P, layout);
    if (backward) dout_l = ring_shard(dout, r, P, layout);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error);

  const AttentionResult res = ring_attention(q_l, k_l, v_l, o, MPI_COMM_WORLD, layout);
  const Tensor out = ring_gather(res.out, layout, MPI_COMM_WORLD);
  const Tensor lse = ring_gather(res.lse, layout, MPI_COMM_WORLD, -1);
  Tensor dq, dk, dv;
  if (backward) {
    const AttentionGrads g =
        ring_attention_backward(dout_l, q_l, k_l, v_l, res.out, res.lse, o, MPI_COMM_WORLD, layout);
    dq = ring_gather(g.dq, layout, MPI_COMM_WORLD);
    dk = ring_gather(g.dk, layout, MPI_COMM_WORLD);
    dv = ring_gather(g.dv, layout, MPI_COMM_WORLD);
  }

  error.clear();
  if (r == 0) {
    try {
      write_npy(a.out, out);
      if (!a.lse.empty()) write_npy(a.lse, lse);
      if (backward) {
        write_npy(a.dq, dq);
        write_npy(a.dk, dk);
        write_npy(a.dv, dv);
      }
      if (a.check) {
        const AttentionResult one = attention(q, k, v, o);
        double worst = std::max(max_rel(out, one.out), max_rel(lse, one.lse));
        if (backward) {
          const AttentionGrads g = attention_backward(dout, q, k, v, one.out, one.lse, o);
          worst = std::max({worst, max_rel(dq, g.dq), max_rel(dk, g.dk), max_rel(dv, g.dv)});
        }
        std::printf(
            "attn ring: %d ranks (%s), largest difference from one process: %.3g relative\n", P,
            ring_layout_name(layout), worst);
        if (!(worst <= 1e-5))
          error = fmt::format("--check: the ring differs from one process by {:.3g}", worst);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error);
}

// Bench mode: random inputs of the rank's own slice; rank 0 prints one line of key=value pairs.
void run_bench(const RingArgs& a) {
  const int r = rank_of(), P = size_of();
  const RingLayout layout = parse_ring_layout(a.layout);
  const DType dtype = parse_dtype(a.dtype);
  const int64_t Hkv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  if (a.length < P || a.heads <= 0 || a.dim <= 0 || a.batch <= 0 || a.repeat <= 0) {
    throw Error(fmt::format(
        "{}: --bench needs --length >= ranks, --heads, --dim, --batch and --repeat > 0", kCmd));
  }
  const AttentionOptions o = make_options(a);
  int64_t Lr = 0;
  for (const RingSegment& s : ring_segments(a.length, r, P, layout)) Lr += s.length;
  std::mt19937_64 gen(1234 + r);
  std::normal_distribution<double> nd;
  auto random = [&](Shape shape) {
    std::vector<double> x(static_cast<size_t>(checked_numel(shape, kCmd)));
    for (double& e : x) e = nd(gen);
    return Tensor::from_vector(shape, x, dtype);
  };
  const Tensor q = random({a.batch, a.heads, Lr, a.dim}), k = random({a.batch, Hkv, Lr, a.dim}),
               v = random({a.batch, Hkv, Lr, a.dim}), dout = random({a.batch, a.heads, Lr, a.dim});

  auto timed = [&](auto&& fn) {  // the slowest rank's time of the fastest of `repeat` runs, in ms
    double best = INFINITY;
    for (int i = 0; i < a.repeat; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      double slowest = 0;
      MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = std::min(best, slowest);
    }
    return best;
  };
  // The last run's split (slowest rank): computing with transfers in flight, and waiting for them.
  auto split = [](double* compute, double* wait, double* sent) {
    const RingStats st = ring_last_stats();
    const double mine[3] = {st.compute_ms, st.wait_ms, static_cast<double>(st.bytes_sent)};
    double all[3] = {0, 0, 0};
    MPI_Allreduce(mine, all, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *compute = all[0];
    *wait = all[1];
    *sent = all[2];
  };
  AttentionResult res;
  double fwd_c = 0, fwd_w = 0, fwd_b = 0, bwd_c = 0, bwd_w = 0, bwd_b = 0, bwd = 0;
  const double fwd = timed([&] { res = ring_attention(q, k, v, o, MPI_COMM_WORLD, layout); });
  split(&fwd_c, &fwd_w, &fwd_b);
  if (a.backward) {
    bwd = timed([&] {
      ring_attention_backward(dout, q, k, v, res.out, res.lse, o, MPI_COMM_WORLD, layout);
    });
    split(&bwd_c, &bwd_w, &bwd_b);
  }
  // The parts: one full local block (every rank's queries against its own keys, no mask), and one
  // ring shift of a K/V block (MPI_Sendrecv to the right, from the left, no computation).
  AttentionOptions full = o;
  full.causal = false;
  full.window = {};
  full.position_offset.reset();
  const double block = timed([&] { (void)attention(q, k, v, full); });
  const size_t bytes = static_cast<size_t>(k.numel() + v.numel()) * k.itemsize();
  std::vector<char> send_buf(bytes, 1), recv_buf(bytes);
  const double shift = timed([&] {
    // In pieces of at most 1 GiB (MPI counts are ints).
    for (size_t off = 0; off < bytes; off += size_t{1} << 30) {
      const int n = static_cast<int>(std::min(bytes - off, size_t{1} << 30));
      MPI_Sendrecv(send_buf.data() + off, n, MPI_BYTE, (r + 1) % P, 7, recv_buf.data() + off, n,
                   MPI_BYTE, (r + P - 1) % P, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  });
  if (r == 0) {
    std::printf(
        "ranks=%d layout=%s causal=%d B=%lld H=%lld Hkv=%lld L=%lld L_rank=%lld D=%lld dtype=%s "
        "ring_fwd_ms=%.3f fwd_compute_ms=%.3f fwd_wait_ms=%.3f fwd_sent_MB=%.3f ring_bwd_ms=%.3f "
        "bwd_compute_ms=%.3f bwd_wait_ms=%.3f bwd_sent_MB=%.3f block_fwd_ms=%.3f shift_ms=%.3f "
        "block_bytes=%zu shift_GBps=%.3f block_GFLOPs=%.2f\n",
        P, ring_layout_name(layout), a.options.is_on("causal") ? 1 : 0,
        static_cast<long long>(a.batch), static_cast<long long>(a.heads),
        static_cast<long long>(Hkv), static_cast<long long>(a.length), static_cast<long long>(Lr),
        static_cast<long long>(a.dim), dtype_name(dtype), fwd, fwd_c, fwd_w, fwd_b / 1e6, bwd,
        bwd_c, bwd_w, bwd_b / 1e6, block, shift, bytes, static_cast<double>(bytes) / shift / 1e6,
        4.0 * static_cast<double>(a.batch * a.heads * Lr * Lr * a.dim) / block / 1e6);
  }
}

void run_ring(const RingArgs& a) {
  MpiSession session;
  if (a.bench) {
    run_bench(a);
  } else {
    run_files(a);
  }
}

void add_ring_command(CLI::App& app) {
  auto args = std::make_shared<RingArgs>();
  RingArgs& a = *args;
  CLI::App* sub = app.add_subcommand(
      "ring",
      "ring attention across MPI ranks (run under mpirun): the sequence split over the ranks");
  sub->add_option("--q", a.q, "queries .npy [..., Hq, Lq, D] (every rank reads it)");
  sub->add_option("--k", a.k, "keys .npy [..., Hkv, Lk, D]");
  sub->add_option("--v", a.v, "values .npy [..., Hkv, Lk, Dv]");
  sub->add_option("--out", a.out, "output .npy [..., Hq, Lq, Dv] (written by rank 0)");
  sub->add_option("--lse", a.lse, "also write the log-sum-exp [..., Hq, Lq]");
  add_attention_flags(sub, a.options, ring_takes);
  sub->add_option("--layout", a.layout, "contiguous (default) | zigzag (balances causal work)");
  sub->add_option("--dtype", a.dtype, "compute dtype f32 | f64 (default f32)");
  sub->add_option("--dout", a.dout, "gradient of the output .npy: also run the backward");
  sub->add_option("--dq", a.dq, "where to write dq (with --dout)");
  sub->add_option("--dk", a.dk, "where to write dk (with --dout)");
  sub->add_option("--dv", a.dv, "where to write dv (with --dout)");
  sub->add_flag("--check", a.check, "compare with one process on rank 0; fail above 1e-5 relative");
  sub->add_flag("--bench", a.bench, "time random inputs instead of reading files");
  sub->add_option("--length", a.length, "bench: global sequence length (default 4096)");
  sub->add_option("--batch", a.batch, "bench: batch (default 1)");
  sub->add_option("--heads", a.heads, "bench: query heads (default 8)");
  sub->add_option("--kv-heads", a.kv_heads, "bench: key/value heads (default = heads)");
  sub->add_option("--dim", a.dim, "bench: head dim (default 64)");
  sub->add_option("--repeat", a.repeat, "bench: runs; the fastest is reported (default 5)");
  sub->add_flag("--backward", a.backward, "bench: also time the backward");
  sub->callback([args] { run_ring(*args); });
}

const Command reg{"ring", 60, &add_ring_command};

}  // namespace
}  // namespace attn::tools
