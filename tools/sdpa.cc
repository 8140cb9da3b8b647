// `attn sdpa`: scaled dot-product attention on .npy files, forward and (with --dout) backward.
//
//   attn sdpa --q Q.npy --k K.npy --v V.npy --out OUT.npy
//             [--lse LSE.npy] [--weights W.npy]
//             [--mask M.npy --mask-type keep|drop|add] [--key-lengths LENS.npy]
//             [--causal] [--align bottom-right|top-left] [--window LEFT,RIGHT]
//             [--scale S] [--softcap C] [--alibi SLOPES.npy] [--dropout P --seed N]
//             [--dout DOUT.npy --dq DQ.npy --dk DK.npy --dv DV.npy]
//             [--backend auto|reference|cpu] [--dtype f64|f32|bf16|f16] [--threads N]
//   attn sdpa --example DIR   (writes a small random problem into DIR and runs on it)
//
// q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv] are f32 or f64; --dtype is the
// compute type (default f32) and the inputs are converted to it; outputs are f64 for f64 and f32
// otherwise. Every input is read and every result computed before any output is written; the
// outputs then go to temporary names that are renamed at the end, so that a failure leaves no
// output file behind. Flag values are taken as strings and checked here, so that every bad value is
// a one-line attn::Error.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "attn/io.h"
#include "attn/options.h"
#include "attn/tensor.h"
#include "tools/attention_flags.h"
#include "tools/command.h"

namespace attn::tools {
namespace {

constexpr const char* kCmd = "attn sdpa";

struct SdpaArgs {
  std::string q, k, v, out, lse, weights;
  AttentionFlags options;  // every attention option's flag (tools/attention_flags.h)
  std::string dout, dq, dk, dv;
  std::string dtype = "f32";
  std::string example;
};

[[noreturn]] void fail(const std::string& msg) {
  throw Error(fmt::format("{}: {}", kCmd, msg));
}

// Reads an input .npy and checks that its dtype is one of `allowed` (names the flag and file
// otherwise).
Tensor read_input(const char* flag, const std::string& path, std::initializer_list<DType> allowed,
                  const char* expected) {
  Tensor t = read_npy(path);
  for (DType d : allowed)
    if (t.dtype() == d) return t;
  fail(fmt::format("{} '{}' must be {}, got {} with shape {}", flag, path, expected,
                   dtype_name(t.dtype()), t.shape_str()));
}

Tensor read_float_input(const char* flag, const std::string& path) {
  return read_input(flag, path, {DType::f32, DType::f64}, "f32 or f64");
}

// Writes every (path, tensor) or none: each goes to a temporary name next to its target first, and
// the renames happen only once all are written. On failure, temporaries and already renamed outputs
// are removed.
void write_all_or_nothing(const std::vector<std::pair<std::string, Tensor>>& outputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> temps, done;
  auto cleanup = [&] {
    std::error_code ec;
    for (const auto& t : temps) fs::remove(t, ec);
    for (const auto& d : done) fs::remove(d, ec);
  };
  try {
    for (const auto& [path, tensor] : outputs) {
      const fs::path p(path);
      const std::string tmp =
          (p.parent_path() /
           fmt::format(".{}.sdpa-{}.tmp", p.filename().string(), static_cast<long>(::getpid())))
              .string();
      temps.push_back(tmp);
      try {
        write_npy(tmp, tensor);
      } catch (const Error& e) {
        fail(fmt::format("cannot write '{}': {}", path, e.what()));
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::error_code ec;
      fs::rename(temps[i], outputs[i].first, ec);
      if (ec) fail(fmt::format("cannot write '{}': {}", outputs[i].first, ec.message()));
      done.push_back(outputs[i].first);
      temps[i].clear();
    }
  } catch (...) {
    cleanup();
    throw;
  }
}

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

// A small random problem for --example: GQA (4 query heads over 2 kv heads), Lq != Lk, and a keep
// mask that hides a few keys per row (every row keeps its diagonal key).
std::vector<std::pair<std::string, std::string>> write_example(const std::string& dir,
                                                               SdpaArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(fmt::format("--example: cannot create the folder '{}': {}", dir, ec.message()));
  std::mt19937_64 rng(20240601);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto randn = [&](const Shape& shape) {
    std::vector<double> vals(static_cast<size_t>(checked_numel(shape, kCmd)));
    for (double& x : vals) x = normal(rng);
    return Tensor::from_vector(shape, vals, DType::f32);
  };
  const int64_t B = 2, Hq = 4, Hkv = 2, Lq = 16, Lk = 24, D = 32;
  const Tensor q = randn({B, Hq, Lq, D}), k = randn({B, Hkv, Lk, D}), v = randn({B, Hkv, Lk, D});
  std::vector<double> keep(static_cast<size_t>(Lq * Lk));
  for (int64_t i = 0; i < Lq; ++i) {
    for (int64_t j = 0; j < Lk; ++j)
      keep[static_cast<size_t>(i * Lk + j)] = j == i + Lk - Lq || rng() % 5 != 0;
  }
  const Tensor mask = Tensor::from_vector({1, 1, Lq, Lk}, keep, DType::boolean);
  const fs::path d(dir);
  a.q = (d / "q.npy").string();
  a.k = (d / "k.npy").string();
  a.v = (d / "v.npy").string();
  a.options["mask"] = (d / "mask.npy").string();
  a.options["mask_type"] = "keep";
  if (a.out.empty()) a.out = (d / "out.npy").string();
  if (a.lse.empty()) a.lse = (d / "lse.npy").string();
  write_npy(a.q, q);
  write_npy(a.k, k);
  write_npy(a.v, v);
  write_npy(a.options["mask"], mask);
  return {{a.q, q.shape_str() + " f32 (queries)"},
          {a.k, k.shape_str() + " f32 (keys, 2 kv heads for 4 query heads)"},
          {a.v, v.shape_str() + " f32 (values)"},
          {a.options["mask"], mask.shape_str() + " bool keep mask (true = may attend)"}};
}

void check_distinct_outputs(const std::vector<std::pair<const char*, std::string>>& outs) {
  namespace fs = std::filesystem;
  for (size_t i = 0; i < outs.size(); ++i) {
    for (size_t j = i + 1; j < outs.size(); ++j) {
      if (outs[i].second.empty() || outs[j].second.empty()) continue;
      if (fs::path(outs[i].second).lexically_normal() ==
          fs::path(outs[j].second).lexically_normal()) {
        fail(fmt::format("{} and {} name the same file '{}'", outs[i].first, outs[j].first,
                         outs[i].second));
      }
    }
  }
}

// The command line alone, before anything is read: the required flags, the flags that need each
// other, distinct outputs.
void check_flags(const SdpaArgs& a, bool backward) {
  for (auto [flag, value] : {std::pair{"--q", &a.q}, std::pair{"--k", &a.k}, std::pair{"--v", &a.v},
                             std::pair{"--out", &a.out}}) {
    if (value->empty())
      fail(fmt::format("{} is required (attn sdpa --help lists the flags)", flag));
  }
  if (backward && (a.dq.empty() || a.dk.empty() || a.dv.empty())) {
    fail("--dout needs --dq, --dk and --dv (where to write the gradients)");
  }
  if (!backward && (!a.dq.empty() || !a.dk.empty() || !a.dv.empty())) {
    fail("--dq, --dk and --dv need --dout (the gradient of the output)");
  }
  if (!a.options["mask"].empty() && a.options["mask_type"].empty()) {
    fail(
        "--mask needs --mask-type keep|drop|add (keep: true = may attend; drop: true = masked; "
        "add: added)");
  }
  if (a.options["mask"].empty() && !a.options["mask_type"].empty())
    fail("--mask-type needs --mask");
  check_distinct_outputs({{"--out", a.out},
                          {"--lse", a.lse},
                          {"--weights", a.weights},
                          {"--dq", a.dq},
                          {"--dk", a.dk},
                          {"--dv", a.dv}});
}

// The options and the compute dtype from the flags' strings.
AttentionOptions parse_options(const SdpaArgs& a, DType* dtype_out) {
  try {
    *dtype_out = parse_dtype(a.dtype);
  } catch (const Error& e) {
    fail(e.what());
  }
  AttentionOptions o = parse_attention_flags(kCmd, a.options);
  o.return_weights = !a.weights.empty();
  return o;
}

// q, k, v and dout in the compute dtype; the mask, key lengths and ALiBi slopes into o.
struct SdpaInputs {
  Tensor q, k, v, dout;
};
SdpaInputs read_inputs(const SdpaArgs& a, DType dtype, bool backward, AttentionOptions& o) {
  const Tensor q = read_float_input("--q", a.q).to(dtype);
  const Tensor k = read_float_input("--k", a.k).to(dtype);
  const Tensor v = read_float_input("--v", a.v).to(dtype);
  const AttentionFlags& f = a.options;
  if (!f["mask"].empty()) {
    if (o.mask_type == MaskType::add) {
      // Added to scores accumulated in fp32 or better: f32 unless the computation is f64.
      o.mask =
          read_float_input("--mask", f["mask"]).to(dtype == DType::f64 ? DType::f64 : DType::f32);
    } else {
      o.mask =
          read_input("--mask", f["mask"], {DType::boolean}, "bool for --mask-type keep or drop");
    }
  }
  if (!f["key_lengths"].empty()) {
    o.key_lengths =
        read_input("--key-lengths", f["key_lengths"], {DType::i32, DType::i64}, "i32 or i64");
  }
  if (!f["alibi_slopes"].empty()) o.alibi_slopes = read_float_input("--alibi", f["alibi_slopes"]);
  if (!f["sinks"].empty()) o.sinks = read_float_input("--sinks", f["sinks"]);
  Tensor dout;
  if (backward) dout = read_float_input("--dout", a.dout).to(dtype);
  return {q, k, v, dout};
}

void run_sdpa(SdpaArgs a) {
  std::vector<std::pair<std::string, std::string>> example_files;
  if (!a.example.empty()) {
    if (!a.q.empty() || !a.k.empty() || !a.v.empty() || !a.options["mask"].empty()) {
      fail("--example writes its own --q, --k, --v and --mask; do not pass them");
    }
    example_files = write_example(a.example, a);
  }
  // Flags first: nothing is read before the command line is known to be consistent.
  const bool backward = !a.dout.empty();
  check_flags(a, backward);
  DType dtype = DType::f32;
  AttentionOptions o = parse_options(a, &dtype);
  const SdpaInputs in = read_inputs(a, dtype, backward, o);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;

  const Timer fwd_timer;
  const AttentionResult r = attention(q, k, v, o);
  const double fwd_ms = fwd_timer.ms();
  AttentionGrads g;
  double bwd_ms = 0;
  if (backward) {
    const Timer bwd_timer;
    g = attention_backward(dout, q, k, v, r.out, r.lse, o);
    bwd_ms = bwd_timer.ms();
  }

  const DType out_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  auto as_out = [&](const Tensor& t) { return t.dtype() == out_dtype ? t : t.to(out_dtype); };
  std::vector<std::pair<std::string, Tensor>> outputs = {{a.out, as_out(r.out)}};
  if (!a.lse.empty()) outputs.emplace_back(a.lse, as_out(r.lse));
  if (!a.weights.empty()) outputs.emplace_back(a.weights, as_out(r.weights));
  if (backward) {
    outputs.emplace_back(a.dq, as_out(g.dq));
    outputs.emplace_back(a.dk, as_out(g.dk));
    outputs.emplace_back(a.dv, as_out(g.dv));
  }
  write_all_or_nothing(outputs);

  for (const auto& [path, what] : example_files)
    std::printf("wrote %s %s\n", path.c_str(), what.c_str());
  const Backend used = resolve_backend(o.backend, dtype);
  std::printf("sdpa: q %s, k %s, v %s -> out %s | backend %s, dtype %s | forward %.3f ms",
              q.shape_str().c_str(), k.shape_str().c_str(), v.shape_str().c_str(),
              r.out.shape_str().c_str(), backend_name(used), dtype_name(dtype), fwd_ms);
  if (backward) std::printf(", backward %.3f ms", bwd_ms);
  std::printf("\n");
  for (const auto& [path, t] : outputs)
    std::printf("wrote %s %s %s\n", path.c_str(), t.shape_str().c_str(), dtype_name(t.dtype()));
  if (!a.example.empty()) {
    std::printf(
        "the same run by hand: attn sdpa --q %s --k %s --v %s --mask %s --mask-type keep --out %s "
        "--lse %s\n",
        a.q.c_str(), a.k.c_str(), a.v.c_str(), a.options["mask"].c_str(), a.out.c_str(),
        a.lse.c_str());
  }
}

void add_sdpa_command(CLI::App& app) {
  auto args = std::make_shared<SdpaArgs>();
  CLI::App* sub = app.add_subcommand(
      "sdpa",
      "scaled dot-product attention on .npy files: q [..., Hq, Lq, D], k [..., Hkv, Lk, D], "
      "v [..., Hkv, Lk, Dv] -> out [..., Hq, Lq, Dv]");
  SdpaArgs& a = *args;
  sub->add_option("--q", a.q, "queries .npy [..., Hq, Lq, D] (f32 or f64)");
  sub->add_option("--k", a.k, "keys .npy [..., Hkv, Lk, D]");
  sub->add_option("--v", a.v, "values .npy [..., Hkv, Lk, Dv]");
  sub->add_option("--out", a.out, "output .npy [..., Hq, Lq, Dv]");
  sub->add_option("--lse", a.lse,
                  "also write the log-sum-exp [..., Hq, Lq] (natural log; -inf on empty rows)");
  sub->add_option("--weights", a.weights, option_info("return_weights").help);
  add_attention_flags(sub, a.options);
  sub->add_option("--dout", a.dout, "gradient of the output .npy: also run the backward");
  sub->add_option("--dq", a.dq, "where to write dq (with --dout)");
  sub->add_option("--dk", a.dk, "where to write dk (with --dout)");
  sub->add_option("--dv", a.dv, "where to write dv (with --dout)");
  sub->add_option("--dtype", a.dtype, "compute dtype f64 | f32 | bf16 | f16 (default f32)");
  sub->add_option("--example", a.example,
                  "write a small random q, k, v, mask into this folder and run on it");
  sub->callback([args] { run_sdpa(*args); });
}

const Command reg{"sdpa", 10, &add_sdpa_command};

}  // namespace
}  // namespace attn::tools
