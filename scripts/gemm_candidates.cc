// sgemm candidates for attn's nn layer shapes, in one process, interleaved:
//   OpenBLAS as loaded, OpenBLAS with OPENBLAS_CORETYPE=SkylakeX / Cooperlake (separate copies of the
//   library, each dlopen'ed after setenv so its load-time constructor reads the variable), BLIS,
//   oneDNN dnnl_sgemm and the oneDNN matmul primitive.
// Not part of the build (it needs libblis-dev and libdnnl-dev; x86-64 with AVX2 + FMA, AVX-512 used
// where the CPU has it: the FMA probe's width and the OpenBLAS core types that need it):
//   g++ -O2 -std=c++20 -march=native -fopenmp -Isrc scripts/gemm_candidates.cc -o /tmp/gc -ldnnl -ldl
//   /tmp/gc [rounds=5] [threads: 0 = 1 and 2] [ms of sleep between candidates=15]
// Prints CSV: GFLOP/s (median of the rounds) per candidate and shape. The OpenBLAS copies are written
// to /tmp/gemmbench/. Between candidates it sleeps so the previous library's threads stop spinning
// (OpenBLAS's pthreads spin ~0.1 s after a call: use 200 ms for 2-thread runs).
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nn/dnnl_isa.h"  // -Isrc

using clk = std::chrono::steady_clock;

struct Shape {
  int M, N, K;
  bool tb;  // B is [N, K] (weights [out, in]) when true, [K, N] otherwise
};

struct Candidate {
  std::string name, info;
  std::function<void(int threads)> set_threads;
  std::function<void(const Shape&, const float*, const float*, float*)> run;
};

static void* must_dlopen(const char* path, int flags) {
  void* h = dlopen(path, flags);
  if (!h) {
    std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    std::exit(1);
  }
  return h;
}

template <class F>
static F sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) {
    std::fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}

static const char* const kOpenblasPthread =
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so";
static const char* const kOpenblasOpenmp =
    "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblasp-r0.3.21.so";

// cblas enums (row major 101, no trans 111, trans 112)
using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                               int, float, float*, int);

static Candidate openblas(const char* coretype, const char* lib = kOpenblasPthread) {
  std::string path = lib;
  if (coretype) {
    std::system("mkdir -p /tmp/gemmbench");
    path = std::string("/tmp/gemmbench/libopenblas_") + coretype + ".so";
    std::string cmd = std::string("cp ") + lib + " " + path;
    if (std::system(cmd.c_str()) != 0) std::exit(1);
    setenv("OPENBLAS_CORETYPE", coretype, 1);
  }
  void* h = must_dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  unsetenv("OPENBLAS_CORETYPE");
  auto corename = sym<char* (*)()>(h, "openblas_get_corename");
  auto config = sym<char* (*)()>(h, "openblas_get_config");
  auto setn = sym<void (*)(int)>(h, "openblas_set_num_threads");
  auto sgemm = sym<cblas_sgemm_t>(h, "cblas_sgemm");
  Candidate c;
  c.name = coretype                 ? std::string("OpenBLAS CORETYPE=") + coretype
           : lib == kOpenblasOpenmp ? "OpenBLAS linked"
                                    : "OpenBLAS default";
  c.info = std::string(config()) + " core " + corename();
  c.set_threads = [setn](int t) { setn(t); };
  c.run = [sgemm](const Shape& s, const float* A, const float* B, float* C) {
    sgemm(101, 111, s.tb ? 112 : 111, s.M, s.N, s.K, 1.f, A, s.K, B, s.tb ? s.K : s.N, 0.f, C, s.N);
  };
  return c;
}

static Candidate blis() {
  void* h = must_dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                        RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  auto arch_id = sym<int (*)()>(h, "bli_arch_query_id");
  auto arch_str = sym<char* (*)(int)>(h, "bli_arch_string");
  auto version = sym<char* (*)()>(h, "bli_info_get_version_str");
  auto setn = sym<void (*)(long)>(h, "bli_thread_set_num_threads");
  using bli_sgemm_t = void (*)(int, int, long, long, long, const float*, const float*, long, long,
                               const float*, long, long, const float*, float*, long, long);
  auto sgemm = sym<bli_sgemm_t>(h, "bli_sgemm");
  Candidate c;
  c.name = "BLIS";
  c.info = std::string("BLIS ") + version() + " arch " + arch_str(arch_id());
  c.set_threads = [setn](int t) { setn(t); };
  c.run = [sgemm](const Shape& s, const float* A, const float* B, float* C) {
    const float one = 1.f, zero = 0.f;
    // row-major A [M,K]: rs K, cs 1. B [N,K] transposed: op(B) = B^T, B itself is [N,K] (rs K cs 1)
    const int BLIS_TRANSPOSE = 0x8;
    if (s.tb)
      sgemm(0, BLIS_TRANSPOSE, s.M, s.N, s.K, &one, A, s.K, 1, B, s.K, 1, &zero, C, s.N, 1);
    else
      sgemm(0, 0, s.M, s.N, s.K, &one, A, s.K, 1, B, s.N, 1, &zero, C, s.N, 1);
  };
  return c;
}

static std::string dnnl_info() {
  const dnnl_version_t* v = dnnl_version();
  char buf[200];
  std::snprintf(buf, sizeof buf, "oneDNN %d.%d.%d (%s) cpu_runtime %d isa %s", v->major, v->minor,
                v->patch, v->hash, v->cpu_runtime,
                attn::nn::detail::dnnl_isa_name(dnnl_get_effective_cpu_isa()));
  return buf;
}

static Candidate onednn_sgemm() {
  Candidate c;
  c.name = "oneDNN sgemm";
  c.info = dnnl_info();
  c.set_threads = [](int t) { omp_set_num_threads(t); };
  c.run = [](const Shape& s, const float* A, const float* B, float* C) {
    dnnl_sgemm('N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.f, A, s.K, B, s.tb ? s.K : s.N, 0.f, C, s.N);
  };
  return c;
}

static Candidate onednn_matmul() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream strm(eng);
  struct Key {
    int M, N, K, threads;
    bool tb;
    bool operator<(const Key& o) const {
      return std::tie(M, N, K, threads, tb) < std::tie(o.M, o.N, o.K, o.threads, o.tb);
    }
  };
  static std::map<Key, dnnl::matmul> cache;
  Candidate c;
  c.name = "oneDNN matmul";
  c.info = dnnl_info();
  c.set_threads = [](int t) { omp_set_num_threads(t); };
  c.run = [](const Shape& s, const float* A, const float* B, float* C) {
    using dt = dnnl::memory::data_type;
    dnnl::memory::desc a({s.M, s.K}, dt::f32, dnnl::memory::dims{s.K, 1});
    dnnl::memory::desc b({s.K, s.N}, dt::f32,
                         s.tb ? dnnl::memory::dims{1, s.K} : dnnl::memory::dims{s.N, 1});
    dnnl::memory::desc cd({s.M, s.N}, dt::f32, dnnl::memory::dims{s.N, 1});
    Key k{s.M, s.N, s.K, omp_get_max_threads(), s.tb};  // a primitive keeps its team size
    auto it = cache.find(k);
    if (it == cache.end()) {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, cd), eng);
      it = cache.emplace(k, dnnl::matmul(pd)).first;
    }
    dnnl::memory am(a, eng, const_cast<float*>(A)), bm(b, eng, const_cast<float*>(B)),
        cm(cd, eng, C);
    it->second.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    strm.wait();
  };
  return c;
}

// f32 FMA ceiling: 12 independent FMA chains per thread on the widest registers the CPU has (zmm with
// AVX-512, else ymm), inline asm so nothing is folded; the registers start at zero (garbage in them may
// be denormal and take microcode assists).
#define FMA_ZERO(R)                                                                   \
  "vxorps %%" R "0,%%" R "0,%%" R                                                     \
  "0\n\t"                                                                             \
  "vmovaps %%" R "0,%%" R "1\n\tvmovaps %%" R "0,%%" R "2\n\tvmovaps %%" R "0,%%" R   \
  "3\n\t"                                                                             \
  "vmovaps %%" R "0,%%" R "4\n\tvmovaps %%" R "0,%%" R "5\n\tvmovaps %%" R "0,%%" R   \
  "6\n\t"                                                                             \
  "vmovaps %%" R "0,%%" R "7\n\tvmovaps %%" R "0,%%" R "8\n\tvmovaps %%" R "0,%%" R   \
  "9\n\t"                                                                             \
  "vmovaps %%" R "0,%%" R "10\n\tvmovaps %%" R "0,%%" R "11\n\tvmovaps %%" R "0,%%" R \
  "12\n\t"                                                                            \
  "vmovaps %%" R "0,%%" R "13\n\t"
#define FMA_ONE(R, N) "vfmadd231ps %%" R "12, %%" R "13, %%" R #N "\n\t"
#define FMA_12(R)                                                                     \
  FMA_ONE(R, 0)                                                                       \
  FMA_ONE(R, 1)                                                                       \
  FMA_ONE(R, 2) FMA_ONE(R, 3) FMA_ONE(R, 4) FMA_ONE(R, 5) FMA_ONE(R, 6) FMA_ONE(R, 7) \
      FMA_ONE(R, 8) FMA_ONE(R, 9) FMA_ONE(R, 10) FMA_ONE(R, 11)
#define FMA_CLOBBERS                                                                       \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13"

template <bool kZmm>
static void fma_chains(long iters) {
  if constexpr (kZmm) {
    asm volatile(FMA_ZERO("zmm")::: FMA_CLOBBERS);
    for (long it = 0; it < iters; ++it) asm volatile(FMA_12("zmm")::: FMA_CLOBBERS);
  } else {
    asm volatile(FMA_ZERO("ymm")::: FMA_CLOBBERS);
    for (long it = 0; it < iters; ++it) asm volatile(FMA_12("ymm")::: FMA_CLOBBERS);
  }
}

static bool has_avx512() {
  return __builtin_cpu_supports("avx512f");
}

static double fma_ceiling(int threads) {
  const long iters = 50'000'000;
  const bool zmm = has_avx512();
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = clk::now();
#pragma omp parallel num_threads(threads)
    {
      if (zmm) {
        fma_chains<true>(iters);
      } else {
        fma_chains<false>(iters);
      }
    }
    const double sec = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::max(best, 2.0 * (zmm ? 16 : 8) * 12 * iters * threads / sec / 1e9);
  }
  return best;
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int only_threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const int sleep_ms = argc > 3 ? std::atoi(argv[3]) : 15;
  std::vector<Candidate> cands;
  const bool pthreads = access(kOpenblasPthread, R_OK) == 0;  // libopenblas0-pthread, if installed
  if (pthreads) cands.push_back(openblas(nullptr));
  cands.push_back(openblas(nullptr, kOpenblasOpenmp));
  if (pthreads && has_avx512()) {  // OpenBLAS's AVX-512 cores, forced (0.3.21: no Emerald Rapids)
    cands.push_back(openblas("SkylakeX"));
    cands.push_back(openblas("Cooperlake"));
  }
  cands.push_back(blis());
  cands.push_back(onednn_sgemm());
  cands.push_back(onednn_matmul());
  for (auto& c : cands) std::printf("# %-26s %s\n", c.name.c_str(), c.info.c_str());
  std::printf("# f32 FMA ceiling: 1 thread %.1f GFLOP/s, 2 threads %.1f GFLOP/s\n", fma_ceiling(1),
              fma_ceiling(2));

  std::vector<std::pair<int, int>> nk = {{384, 384}, {1152, 384}, {1536, 384}, {384, 1536},
                                         {768, 768}, {2304, 768}, {3072, 768}, {768, 3072}};
  std::vector<int> Ms = {128, 512, 2048, 4096};  // 4096: a batch of 32 x 128 tokens
  const size_t maxe = 4096 * 3072;
  std::vector<float> A(maxe), B(maxe), C(maxe), R(maxe);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);

  // Correctness across candidates on one awkward shape.
  {
    Shape s{37, 45, 29, true};
    cands[0].set_threads(1);
    cands[0].run(s, A.data(), B.data(), R.data());
    for (auto& c : cands) {
      std::fill(C.begin(), C.end(), 0.f);
      c.set_threads(2);
      c.run(s, A.data(), B.data(), C.data());
      double err = 0;
      for (int i = 0; i < s.M * s.N; ++i) err = std::max(err, (double)std::fabs(C[i] - R[i]));
      std::printf("# check %-26s max |diff| vs the first candidate %.2e\n", c.name.c_str(), err);
    }
  }

  std::printf("threads,trans,M,N,K");
  for (auto& c : cands) std::printf(",%s", c.name.c_str());
  std::printf("\n");
  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    for (auto& c : cands) c.set_threads(threads);
    for (bool tb : {true, false}) {
      for (int M : Ms) {
        for (auto [N, K] : nk) {
          Shape s{M, N, K, tb};
          const double flop = 2.0 * M * N * K;
          // reps so that one measurement takes ~40 ms at 100 GFLOP/s
          const int reps = std::max(1, (int)(4e9 / flop));
          std::vector<std::vector<double>> gf(cands.size());
          for (auto& c : cands) c.run(s, A.data(), B.data(), C.data());  // warm-up
          for (int r = 0; r < rounds; ++r) {
            for (size_t ci = 0; ci < cands.size(); ++ci) {
              std::this_thread::sleep_for(
                  std::chrono::milliseconds(sleep_ms));  // let other pools sleep
              auto t0 = clk::now();
              for (int i = 0; i < reps; ++i) cands[ci].run(s, A.data(), B.data(), C.data());
              const double sec = std::chrono::duration<double>(clk::now() - t0).count();
              gf[ci].push_back(flop * reps / sec / 1e9);
            }
          }
          std::printf("%d,%s,%d,%d,%d", threads, tb ? "NT" : "NN", M, N, K);
          for (auto& v : gf) {
            std::sort(v.begin(), v.end());
            std::printf(",%.1f", v[v.size() / 2]);
          }
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
}
