// The cpu backend against the reference backend (double) over a matrix of awkward shapes and every
// option of the contract, on every instruction set this machine has (each one forced in turn): f32
// outputs within 1e-6 and gradients within 1e-5 of max |reference|; thread counts 1, 2, 3, 7
// bitwise equal; dropout keep-patterns bitwise equal to the contract's.
#include "backends/cpu/attention_cpu.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <random>

#include "attention/attention_cases.h"
#include "backends/cpu/kernels.h"
#include "contract/dropout.h"
#include "cpu/cpu_test_util.h"
#include "test_util.h"

namespace attn::test {
namespace {

CaseSpec awkward() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 3, s.Hkv = 3, s.Lq = 113, s.Lk = 203, s.D = 59, s.Dv = 59;
  return s;
}

TEST(CpuBackend, AutoPicksCpuForFloat32And16BitTypes) {
  EXPECT_EQ(resolve_backend(Backend::automatic, DType::f32), Backend::cpu);
  EXPECT_EQ(resolve_backend(Backend::automatic, DType::bf16), Backend::cpu);
  EXPECT_EQ(resolve_backend(Backend::automatic, DType::f16), Backend::cpu);
  EXPECT_EQ(resolve_backend(Backend::automatic, DType::f64), Backend::reference);
}

TEST(CpuBackend, IsaControl) {
  const auto isas = cpu::available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), cpu::Isa::portable);
  EXPECT_THROW(cpu::parse_isa("sse9"), Error);
  for (cpu::Isa isa : isas) {
    cpu::force_isa(isa);
    EXPECT_EQ(cpu::active_isa(), isa);
    // A forced target runs every dtype, bf16 included.
    EXPECT_EQ(cpu::isa_for(DType::bf16), isa);
    EXPECT_EQ(cpu::parse_isa(cpu::isa_name(isa)), isa);
  }
  cpu::force_isa(std::nullopt);
  // The emulation is never the default; the default is the best target there is.
  EXPECT_NE(cpu::active_isa(), cpu::Isa::amx_emulated);
  EXPECT_EQ(cpu::active_isa(),
            isas.back() == cpu::Isa::amx_emulated ? isas[isas.size() - 2] : isas.back());
  EXPECT_EQ(cpu::isa_for(DType::f32), cpu::active_isa());
}

// bf16 leaves avx512bf16 only for avx512 (VDPBF16PS measured at half the FMA rate or less), and
// says so in the benchmark's header.
TEST(CpuBackend, Bf16KernelsChosenPerCpu) {
  const cpu::Isa chosen = cpu::isa_for(DType::bf16);
  std::printf("[ KERNELS  ] bf16 on %s (default target %s)\n", cpu::isa_name(chosen),
              cpu::isa_name(cpu::active_isa()));
  if (cpu::active_isa() == cpu::Isa::avx512bf16) {
    EXPECT_TRUE(chosen == cpu::Isa::avx512bf16 || chosen == cpu::Isa::avx512);
  } else {
    EXPECT_EQ(chosen, cpu::active_isa());
  }
}

// awkward() itself is the conformance case tiles_awkward (tests/cases/attention_cases.txt).
// Every bf16 result the kernels write (out, the gradients, the weights) goes through store_row: whole
// vectors, then a tail element by element. Both must give attn::f32_to_bf16's bits: nearest even
// (ties both ways), denormals kept (not flushed as VCVTNEPS2BF16 would), NaN made quiet, overflow to
// inf; 16 x 40 + 7 values so that every target has a tail.
TEST(CpuBackend, Bf16ResultsRoundAsF32ToBf16OnEveryTarget) {
  std::mt19937 rng(5);
  std::vector<float> x;
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00008000u, 0x00018000u,
                        0x80000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                        0xff800000u, 0x7f800001u, 0xffc00000u, 0x00000000u, 0x80000000u}) {
    x.push_back(std::bit_cast<float>(bits));
  }
  std::uniform_int_distribution<uint32_t> any;
  while (x.size() < 16 * 40 + 7) x.push_back(std::bit_cast<float>(any(rng)));
  for (cpu::Isa isa : cpu::available_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    std::vector<uint16_t> y(x.size());
    cpu::kernels_of(isa).store_bf16_row(x.data(), static_cast<int64_t>(x.size()), y.data());
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += y[i] != f32_to_bf16(x[i]);
    EXPECT_EQ(differ, 0) << "of " << x.size();
  }
}

TEST(CpuBackend, PlainAwkwardShapes) {
  CaseSpec s = awkward();
  s.batch = {1};
  s.Hq = s.Hkv = 2, s.Lq = 300, s.Lk = 300, s.D = 64, s.Dv = 64;  // several tiles both ways
  expect_matches_reference(s, 2);
}

// Long key rows: the f32 sums of P V over many keys must stay within the 1e-6 bound. Each key
// tile's P V is summed on its own before it meets O (3.6e-7 and 4.8e-7 here); one running sum over
// every key drifted to 1.6e-6 and 1.7e-6. Few rows, so split-KV runs too; then more rows, so it
// does not.
TEST(CpuBackend, LongKeyRowsKeepTheF32Bound) {
  CaseSpec s;
  s.batch = {1};
  s.Hq = s.Hkv = 1, s.Lq = 20, s.Lk = 12000, s.D = 64, s.Dv = 64;
  expect_matches_reference(s, 21);
  s.Lq = 200, s.Lk = 6000;
  expect_matches_reference(s, 22);
}

TEST(CpuBackend, CausalBothAlignmentsAndWindows) {
  for (Align align : {Align::bottom_right, Align::top_left}) {
    CaseSpec s = awkward();
    s.causal = true;
    s.align = align;
    expect_matches_reference(s, 3);
    std::swap(s.Lq, s.Lk);  // Lq > Lk: bottom-right leaves the first rows without keys
    expect_matches_reference(s, 4);
    s = awkward();
    s.align = align;
    s.window = {37, 5};
    expect_matches_reference(s, 5);
    s.causal = true;
    s.window = {-1, 300};
    expect_matches_reference(s, 6);
  }
}

TEST(CpuBackend, KeyLengthsAndDenseMasksOfEveryPolarity) {
  CaseSpec s = awkward();
  s.key_lengths = true;
  expect_matches_reference(s, 7);
  for (MaskType m : {MaskType::keep, MaskType::drop, MaskType::add}) {
    s = awkward();
    s.mask = m;
    expect_matches_reference(s, 8);
    s.mask_shape = {s.Lq, s.Lk};  // broadcast over batch and heads
    expect_matches_reference(s, 9);
    s.mask_shape = {s.Hq, 1, s.Lk};  // broadcast over rows
    expect_matches_reference(s, 10);
  }
}

TEST(CpuBackend, BlockLayoutAlibiSoftcap) {
  CaseSpec s = awkward();
  s.block_layout = true;
  s.block_q = 32, s.block_k = 48;  // 7 x 5 tiles: the conformance case tiles_awkward_block_layout
  expect_matches_reference(s, 11);
  s = awkward();
  s.alibi = true;
  s.causal = true;
  expect_matches_reference(s, 13);
  s = awkward();
  s.softcap = 1.5;
  expect_matches_reference(s, 14);
  s.softcap = 30.0;
  s.scale = 0.5;  // scores up to ~5: ulp(s) / 2 stays near 2e-7
  expect_matches_reference(s, 15);
}

TEST(CpuBackend, GqaHeadDimsAndLayouts) {
  CaseSpec s = awkward();
  s.Hq = 6, s.Hkv = 2;
  expect_matches_reference(s, 16);
  s.Hkv = 1;
  s.Dv = 37;
  expect_matches_reference(s, 17);
  for (auto [D, Dv] :
       {std::pair{1, 1}, std::pair{3, 130}, std::pair{80, 96}, std::pair{512, 512}}) {
    s = awkward();
    s.batch = {1};
    s.Hq = s.Hkv = 1;
    s.Lq = 23, s.Lk = 301;
    s.D = D, s.Dv = Dv;
    expect_matches_reference(s, 18 + D);
  }
  for (Layout l : {Layout::padded, Layout::transposed, Layout::strided}) {
    s = awkward();
    s.layout = l;
    s.causal = true;
    expect_matches_reference(s, 30);
  }
}

TEST(CpuBackend, DecodeAndSplitKv) {
  CaseSpec s = awkward();
  s.batch = {1};
  s.Hq = 2, s.Hkv = 1, s.Lq = 1, s.Lk = 1500, s.D = 64, s.Dv = 64;
  expect_matches_reference(s, 31);
  s.Lq = 5;
  s.causal = true;
  s.key_lengths = true;
  expect_matches_reference(s, 32);
  s.Lk = 0;
  s.key_lengths = false;
  expect_matches_reference(s, 33);
}

// Any finite scale is valid (torch's rule): 0 gives uniform weights over the allowed keys and a
// negative scale flips the scores, so the row max of the raw products is no longer the max of the
// scores (the kernel folds the scale into exp only for scale > 0). Tiled, decode and split-KV.
TEST(CpuBackend, ZeroAndNegativeScales) {
  for (double scale : {0.0, -0.8}) {
    SCOPED_TRACE(scale);
    CaseSpec s = awkward();
    s.scale = scale;
    expect_matches_reference(s, 36);
    s.causal = true, s.key_lengths = true, s.softcap = 3.0;
    expect_matches_reference(s, 37);
    CaseSpec d = awkward();
    d.scale = scale;
    d.batch = {1};
    d.Hq = 2, d.Hkv = 1, d.Lq = 1, d.Lk = 1500, d.D = 64, d.Dv = 64;
    expect_matches_reference(d, 38);
  }
}

// dropout_p = 1 drops every weight: out and every gradient are 0 (torch's dropout at p = 1), while
// lse and the returned weights (taken before dropout) are those without dropout.
TEST(CpuBackend, DropoutOfOneGivesZeros) {
  CaseSpec s = awkward();
  s.dtype = DType::f32;
  s.mask = MaskType::add;
  Case c = make_case(s, 39);
  Case none = c;
  c.o.dropout_p = 1.0;
  const Tensor dout = random_tensor({2, 3, s.Lq, s.Dv}, DType::f32, 40, -1, 1);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend_name(backend));
    const CpuRun base = run_backend(none, backend, dout);
    const CpuRun r = run_backend(c, backend, dout);
    EXPECT_EQ(max_abs(r.fwd.out), 0.0);
    EXPECT_TRUE(bitwise_equal(r.fwd.lse, base.fwd.lse));
    EXPECT_TRUE(bitwise_equal(r.fwd.weights, base.fwd.weights));
    for (const Tensor* g : {&r.grads.dq, &r.grads.dk, &r.grads.dv, &r.grads.dmask}) {
      EXPECT_EQ(max_abs(*g), 0.0);
    }
  }
}

// Every option at once at awkward sizes is the conformance case tiles_awkward_everything, dropout
// alone and with causal + GQA are dropout and tiles_awkward_causal_dropout (CpuConformance runs
// them); here many small random problems with random options.
TEST(CpuBackend, RandomProblemsWithRandomOptions) {
  for (uint64_t seed = 100; seed < 140; ++seed) expect_matches_reference(random_spec(seed), seed);
}

// Removed keys may hold NaN / inf in k and v: they must not touch any output or gradient.
// On every ISA: poisoned (inf / NaN in removed keys) gives bitwise the outputs, weights and dq of
// clean, and a finite dk.
void expect_poison_has_no_effect(const Case& clean_case, const Case& poisoned, const Tensor& dout) {
  for_each_isa([&](cpu::Isa) {
    const CpuRun clean = run_backend(clean_case, Backend::cpu, dout);
    const CpuRun dirty = run_backend(poisoned, Backend::cpu, dout);
    EXPECT_TRUE(bitwise_equal(clean.fwd.out, dirty.fwd.out));
    EXPECT_TRUE(bitwise_equal(clean.fwd.weights, dirty.fwd.weights));
    EXPECT_TRUE(bitwise_equal(clean.grads.dq, dirty.grads.dq));
    EXPECT_TRUE(all_finite(dirty.grads.dk));
    EXPECT_TRUE(all_finite(dirty.grads.dv));
    if (dirty.grads.dmask.defined()) {
      EXPECT_TRUE(bitwise_equal(clean.grads.dmask, dirty.grads.dmask));
    }
  });
}

// The score options each poison test runs under: every term between q.k and the softmax (softcap,
// ALiBi, an additive mask) and dropout after it, each on its own. A removed key's score is inf or
// NaN, and each of these touches it: softcap's backward multiplies by 1 - tanh^2 of it.
enum class ScoreOption { none, softcap, alibi, add_mask, dropout };
constexpr ScoreOption kScoreOptions[] = {ScoreOption::none, ScoreOption::softcap,
                                         ScoreOption::alibi, ScoreOption::add_mask,
                                         ScoreOption::dropout};

const char* score_option_name(ScoreOption o) {
  constexpr const char* names[] = {"none", "softcap", "alibi", "add mask", "dropout"};
  return names[static_cast<int>(o)];
}

// `removed` [Lk]: keys that the case's own rule removes (an add mask then removes them by -inf
// instead, in place of a drop mask); every other key gets a finite bias.
void apply_score_option(Case& c, ScoreOption option, int64_t Hq, int64_t Lk,
                        const std::vector<bool>& removed, uint64_t seed) {
  switch (option) {
    case ScoreOption::none:
      break;
    case ScoreOption::softcap:
      c.o.softcap = 5.0;
      break;
    case ScoreOption::alibi:
      c.o.alibi_slopes = random_tensor({Hq}, DType::f64, seed, 0.0, 0.5);
      break;
    case ScoreOption::add_mask: {
      Rng rng(seed);
      std::vector<double> bias(static_cast<size_t>(Lk));
      for (int64_t j = 0; j < Lk; ++j) {
        bias[static_cast<size_t>(j)] = removed[static_cast<size_t>(j)]
                                           ? -std::numeric_limits<double>::infinity()
                                           : rng.uniform(-2, 2);
      }
      c.o.mask = Tensor::from_vector({Lk}, bias, DType::f32);
      c.o.mask_type = MaskType::add;
      break;
    }
    case ScoreOption::dropout:
      c.o.dropout_p = 0.2;
      c.o.seed = seed;
      break;
  }
}

TEST(CpuBackend, NonFiniteValuesInRemovedKeysHaveNoEffect) {
  for (DType dtype : {DType::f32, DType::bf16}) {  // bf16: the VDPBF16PS path where there is one
    for (ScoreOption option : kScoreOptions) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), score_option_name(option)));
      CaseSpec s = awkward();
      s.dtype = dtype;
      s.causal = true;
      s.align = Align::top_left;
      Case c = make_case(s, 40);
      // Keys >= 150 are removed by the key lengths; poison them.
      c.o.key_lengths = Tensor::from_vector({2}, {150, 150}, DType::i64);
      apply_score_option(c, option, s.Hq, s.Lk, std::vector<bool>(static_cast<size_t>(s.Lk)), 44);
      Case poisoned = c;
      poisoned.k = c.k.clone(), poisoned.v = c.v.clone();
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 3; ++h) {
          for (int64_t j = 150; j < s.Lk; ++j) {
            poisoned.k.set({b, h, j, 3}, std::numeric_limits<double>::quiet_NaN());
            poisoned.k.set({b, h, j, 4}, std::numeric_limits<double>::infinity());
            poisoned.v.set({b, h, j, 5}, std::numeric_limits<double>::infinity());
          }
        }
      }
      const Tensor dout = random_tensor({2, 3, s.Lq, s.Dv}, dtype, 41, -1, 1);
      expect_poison_has_no_effect(c, poisoned, dout);
    }
  }
}

// The case, small: q [1,1,3,4], k [1,1,5,4] with key 4 all inf, key lengths [4], softcap 5
// (causal or not): the removed key's score is tanh(inf) in the forward and its 1 - tanh^2 must not
// reach dq or its own dk as 0 * NaN.
TEST(CpuBackend, SoftcapGradientsIgnoreAnInfiniteRemovedKey) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(fmt::format("{} causal {}", dtype_name(dtype), causal));
      Tensor q = random_tensor({1, 1, 3, 4}, dtype, 60, -1, 1);
      Tensor k = random_tensor({1, 1, 5, 4}, dtype, 61, -1, 1);
      Tensor v = random_tensor({1, 1, 5, 4}, dtype, 62, -1, 1);
      for (int64_t e = 0; e < 4; ++e) k.set({0, 0, 4, e}, std::numeric_limits<double>::infinity());
      AttentionOptions o;
      o.softcap = 5.0;
      o.causal = causal;
      o.key_lengths = Tensor::from_vector({1}, {4}, DType::i64);
      o.threads = 1;
      const Tensor dout = random_tensor({1, 1, 3, 4}, dtype, 63, -1, 1);
      for_each_isa([&](cpu::Isa) {
        o.backend = Backend::cpu;
        const AttentionResult r = attention(q, k, v, o);
        const AttentionGrads g = attention_backward(dout, q, k, v, r.out, r.lse, o);
        EXPECT_TRUE(all_finite(g.dq));
        EXPECT_TRUE(all_finite(g.dk));
        EXPECT_TRUE(all_finite(g.dv));
      });
    }
  }
}

// A NaN in a query row makes that row's LSE NaN: its NaN reaches the dK and dV of the keys the row
// uses, and nothing else; the weights of every removed key stay 0. P was recomputed as exp(s - lse),
// NaN for removed keys too (exp(-inf - NaN)): the whole tile's dK / dV and weights went NaN.
TEST(CpuBackend, ANanQueryRowReachesOnlyTheKeysItUses) {
  constexpr int64_t Lq = 3, Lk = 300, D = 24, kWin = 40;
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor q = random_tensor({1, 1, Lq, D}, dtype, 70, -1, 1);
    const Tensor k = random_tensor({1, 1, Lk, D}, dtype, 71, -1, 1);
    const Tensor v = random_tensor({1, 1, Lk, D}, dtype, 72, -1, 1);
    q.set({0, 0, 1, 7}, std::numeric_limits<double>::quiet_NaN());
    AttentionOptions o;
    o.backend = Backend::cpu;
    o.causal = true;  // bottom-right: row i sits at p = Lk - Lq + i and uses keys [p - 40, p]
    o.window = {kWin, 0};
    o.return_weights = true;
    const Tensor dout = random_tensor({1, 1, Lq, D}, dtype, 73, -1, 1);
    for_each_isa([&](cpu::Isa) {
      const AttentionResult r = attention(q, k, v, o);
      const AttentionGrads g = attention_backward(dout, q, k, v, r.out, r.lse, o);
      const int64_t p_nan = Lk - Lq + 1;
      for (int64_t j = 0; j < Lk; ++j) {
        const bool used_by_nan_row = j >= p_nan - kWin && j <= p_nan;
        EXPECT_EQ(std::isnan(g.dk.at({0, 0, j, 0})), used_by_nan_row) << "dk of key " << j;
        EXPECT_EQ(std::isnan(g.dv.at({0, 0, j, 0})), used_by_nan_row) << "dv of key " << j;
        for (int64_t i = 0; i < Lq; ++i) {
          const int64_t pi = Lk - Lq + i;
          if (j < pi - kWin || j > pi) {
            EXPECT_EQ(r.weights.at({0, 0, i, j}), 0.0) << i << ", " << j;
          }
        }
      }
    });
  }
}

// Keys that a mask removes sit inside the tiles the kernel runs (key lengths above are cut off
// before any tile): their inf / NaN must not change a bit of the other keys' result either. On
// the VDPBF16PS path such a tile once fell back to f32 products, which differ from bf16 ones.
TEST(CpuBackend, NonFiniteValuesInMaskedKeysHaveNoEffect) {
  const std::vector<int64_t> masked_keys = {0, 20, 77, 101, 202};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (ScoreOption option : kScoreOptions) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), score_option_name(option)));
      CaseSpec s = awkward();
      s.dtype = dtype;
      Case c = make_case(s, 42);
      std::vector<bool> removed(static_cast<size_t>(s.Lk), false);
      std::vector<double> drop(static_cast<size_t>(s.Lk), 0.0);
      for (int64_t j : masked_keys) removed[static_cast<size_t>(j)] = true;
      for (int64_t j : masked_keys) drop[static_cast<size_t>(j)] = 1.0;
      c.o.mask = Tensor::from_vector({s.Lk}, drop, DType::boolean);
      c.o.mask_type = MaskType::drop;
      apply_score_option(c, option, s.Hq, s.Lk, removed, 45);
      Case poisoned = c;
      poisoned.k = c.k.clone(), poisoned.v = c.v.clone();
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 3; ++h) {
          for (int64_t j : masked_keys) {
            for (int64_t e = 0; e < s.D; ++e) {
              poisoned.k.set({b, h, j, e}, e % 2 ? std::numeric_limits<double>::quiet_NaN()
                                                 : -std::numeric_limits<double>::infinity());
              poisoned.v.set({b, h, j, e}, e % 2 ? std::numeric_limits<double>::infinity()
                                                 : std::numeric_limits<double>::quiet_NaN());
            }
          }
        }
      }
      const Tensor dout = random_tensor({2, 3, s.Lq, s.Dv}, dtype, 43, -1, 1);
      expect_poison_has_no_effect(c, poisoned, dout);
    }
  }
}

// The same result for 1, 2, 3 and 7 threads, bit for bit, in both the row-tiled and the split-KV
// paths.
TEST(CpuBackend, ThreadCountsGiveBitwiseEqualResults) {
  CaseSpec many = awkward();
  many.causal = true;
  many.dropout = 0.1;
  many.Hq = 4, many.Hkv = 2;
  CaseSpec few = many;  // one (batch, head): split-KV forward, chunked backward
  few.batch = {1};
  few.Hq = few.Hkv = 1;
  few.Lq = 40, few.Lk = 1100;
  for (const CaseSpec& spec : {many, few}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      CaseSpec s = spec;
      s.dtype = dtype;
      const Case c = make_case(s, 50);
      const Tensor dout = random_tensor(cat(s.batch, {s.Hq, s.Lq, s.Dv}), dtype, 51, -1, 1);
      for_each_isa([&](cpu::Isa) {
        const CpuRun one = run_backend(c, Backend::cpu, dout, 1);
        for (int threads : {2, 3, 7}) {
          SCOPED_TRACE(threads);
          const CpuRun r = run_backend(c, Backend::cpu, dout, threads);
          EXPECT_TRUE(bitwise_equal(one.fwd.out, r.fwd.out));
          EXPECT_TRUE(bitwise_equal(one.fwd.lse, r.fwd.lse));
          EXPECT_TRUE(bitwise_equal(one.grads.dq, r.grads.dq));
          EXPECT_TRUE(bitwise_equal(one.grads.dk, r.grads.dk));
          EXPECT_TRUE(bitwise_equal(one.grads.dv, r.grads.dv));
        }
      });
    }
  }
}

// The keep-pattern, read off the output: with v = one-hot rows (Dv = Lk), out[i][j] = P_ij kept_ij
// / (1-p).
// bf16 gradients: on the avx512bf16 target all five backward products run on VDPBF16PS with P and
// dS rounded to bf16; elsewhere bf16 inputs are computed in f32. Each ISA's dq, dk, dv (rounded to
// bf16) against the double reference on the same values must be within twice the error of the
// portable target's (f32 arithmetic, one rounding to bf16 at the end: stricter than a plain bf16
// backward, which also rounds S, P, dP and dS).
TEST(CpuBackend, Bf16GradientsWithinTwiceTheF32PathError) {
  std::vector<CaseSpec> specs;
  CaseSpec s = awkward();
  specs.push_back(s);
  s.causal = true, s.align = Align::top_left;
  s.Hq = 4, s.Hkv = 2, s.Dv = 40, s.D = 64;
  specs.push_back(s);
  s.window = {150, -1};
  s.key_lengths = true;
  s.mask = MaskType::add;
  s.mask_shape = {1, 4, 113, 203};
  s.softcap = 4.0;
  s.dropout = 0.2;
  s.layout = Layout::padded;
  s.D = 33;
  specs.push_back(s);
  CaseSpec wide = awkward();  // 64 < D <= 128: the pairs backward's 96 x 192 tiles, two key tiles
  wide.D = 96, wide.Dv = 80, wide.causal = true;
  specs.push_back(wide);
  uint64_t seed = 400;
  for (CaseSpec spec : specs) {
    spec.dtype = DType::bf16;
    spec.value_range = 1.0;
    SCOPED_TRACE(spec.describe());
    const Case c = make_case(spec, ++seed);
    const Tensor dout =
        random_tensor(cat(spec.batch, {spec.Hq, spec.Lq, spec.Dv}), DType::bf16, seed, -1, 1);
    const CpuRun ref =
        run_backend(to_dtype(c, DType::f64), Backend::reference, dout.to(DType::f64));
    cpu::force_isa(cpu::Isa::portable);
    const CpuRun plain = run_backend(c, Backend::cpu, dout);
    const double e_dq = rel_error(plain.grads.dq, ref.grads.dq);
    const double e_dk = rel_error(plain.grads.dk, ref.grads.dk);
    const double e_dv = rel_error(plain.grads.dv, ref.grads.dv);
    ASSERT_GT(std::min({e_dq, e_dk, e_dv}), 0.0);
    for_each_isa([&](cpu::Isa) {
      const CpuRun got = run_backend(c, Backend::cpu, dout);
      EXPECT_EQ(got.grads.dq.dtype(), DType::bf16);
      EXPECT_LE(rel_error(got.grads.dq, ref.grads.dq), 2.0 * e_dq);
      EXPECT_LE(rel_error(got.grads.dk, ref.grads.dk), 2.0 * e_dk);
      EXPECT_LE(rel_error(got.grads.dv, ref.grads.dv), 2.0 * e_dv);
    });
  }
}

// A forward task runs up to four query tiles that share each packed key tile; how many depends
// on the thread count. Small tiles (8 x 32) make many tiles per head, so each option meets groups
// of 4 (one thread), 2 (seven threads) and 1 (64 threads): every result must match the reference
// and be bitwise equal across the three, as every row's arithmetic is that of a one-tile task.
// Query rows the forward reads where they are (f32, and bf16 pairs with an even D): a broadcast
// view (stride 0 along L, which must be copied), a transposed and a padded layout, and odd D (bf16:
// copied), each with the bits of a contiguous copy, on every ISA (the first tile, a band and the
// split-KV decode alike: causal, Lq 1 and 200 against Lk 300).
TEST(CpuBackend, QueriesReadInPlaceGiveTheBitsOfACopy) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t D : {32, 33}) {
      for (int64_t Lq : {1, 200}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D " << D << " Lq " << Lq);
        const Tensor k = random_tensor({2, 2, 300, D}, dtype, 71);
        const Tensor v = random_tensor({2, 2, 300, D}, dtype, 72);
        const Tensor q1 = random_tensor({2, 2, 1, D}, dtype, 73);
        const Tensor qs = random_tensor({2, 2, Lq, D}, dtype, 74);
        const std::vector<Tensor> views = {q1.expand({2, 2, Lq, D}),
                                           with_layout(qs, Layout::transposed),
                                           with_layout(qs, Layout::padded)};
        AttentionOptions o;
        o.backend = Backend::cpu;
        o.causal = true;
        for_each_isa([&](cpu::Isa isa) {
          for (const Tensor& q : views) {
            const Tensor want = attention(q.contiguous(), k, v, o).out;
            EXPECT_TRUE(bitwise_equal(attention(q, k, v, o).out, want))
                << cpu::isa_name(isa) << " strides " << q.stride(2) << ", " << q.stride(3);
          }
        });
      }
    }
  }
}

// Every operand of the forward and the backward as a broadcast view (stride 0 along L, or along
// the heads) gives the bits of its contiguous copy: out, lse, dq, dk and dv, on every ISA (tiles,
// decode, and the backward's in-place reads).
TEST(CpuBackend, BroadcastOperandsGiveTheBitsOfCopies) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t Lq : {1, 130}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " Lq " << Lq);
      const int64_t Lk = 150, D = 32;
      auto broadcast = [&](int64_t L, uint64_t seed, int dim) {
        Shape one = {1, 2, L, D};
        one[static_cast<size_t>(dim)] = 1;
        return random_tensor(one, dtype, seed).expand({1, 2, L, D});
      };
      AttentionOptions o;
      o.backend = Backend::cpu;
      o.causal = true;
      for (int which = 0; which < 4; ++which) {
        for (int dim : {1, 2}) {
          Tensor q = random_tensor({1, 2, Lq, D}, dtype, 81),
                 k = random_tensor({1, 2, Lk, D}, dtype, 82),
                 v = random_tensor({1, 2, Lk, D}, dtype, 83),
                 dout = random_tensor({1, 2, Lq, D}, dtype, 84);
          Tensor* t[] = {&q, &k, &v, &dout};
          *t[which] = broadcast(t[which]->size(2), 85, dim);
          for_each_isa([&](cpu::Isa isa) {
            const AttentionResult got = attention(q, k, v, o);
            const AttentionResult want =
                attention(q.contiguous(), k.contiguous(), v.contiguous(), o);
            const AttentionGrads g = attention_backward(dout, q, k, v, got.out, got.lse, o);
            const AttentionGrads w =
                attention_backward(dout.contiguous(), q.contiguous(), k.contiguous(),
                                   v.contiguous(), want.out, want.lse, o);
            const std::string at = std::string(cpu::isa_name(isa)) + " operand " +
                                   std::to_string(which) + " broadcast along dim " +
                                   std::to_string(dim);
            EXPECT_TRUE(bitwise_equal(got.out, want.out)) << at;
            EXPECT_TRUE(bitwise_equal(got.lse, want.lse)) << at;
            EXPECT_TRUE(bitwise_equal(g.dq, w.dq)) << at;
            EXPECT_TRUE(bitwise_equal(g.dk, w.dk)) << at;
            EXPECT_TRUE(bitwise_equal(g.dv, w.dv)) << at;
          });
        }
      }
    }
  }
}

TEST(CpuBackend, QueryTileGroupsChangeNothing) {
  cpu::set_tile_override(8, 32, 0, 0);
  std::vector<CaseSpec> specs;
  CaseSpec base = awkward();
  base.Lq = 71, base.Lk = 150;
  for (Align align : {Align::top_left, Align::bottom_right}) {
    CaseSpec s = base;
    s.causal = true, s.align = align;
    specs.push_back(s);
  }
  CaseSpec window = base;
  window.window = {20, 5};
  specs.push_back(window);
  CaseSpec masked = base;
  masked.mask = MaskType::keep, masked.key_lengths = true, masked.alibi = true;
  specs.push_back(masked);
  CaseSpec blocks = base;
  blocks.block_layout = true, blocks.block_q = 16, blocks.block_k = 24, blocks.dropout = 0.2;
  specs.push_back(blocks);
  for (const CaseSpec& spec : specs) {
    expect_matches_reference(spec, 60, /*alibi_max=*/0.05);  // see expect_matches_reference
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      CaseSpec s = spec;
      s.dtype = dtype;
      SCOPED_TRACE(s.describe());
      const Case c = make_case(s, 61);
      AttentionOptions o = c.o;
      o.backend = Backend::cpu;
      for_each_isa([&](cpu::Isa) {
        o.threads = 1;
        const AttentionResult four = attention(c.q, c.k, c.v, o);
        for (int threads : {7, 64}) {
          o.threads = threads;
          const AttentionResult r = attention(c.q, c.k, c.v, o);
          EXPECT_TRUE(bitwise_equal(four.out, r.out)) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(four.lse, r.lse)) << threads << " threads";
        }
      });
    }
  }
  cpu::set_tile_override(0, 0, 0, 0);
}

void keep_pattern_is_the_contracts(int64_t Lk) {
  SCOPED_TRACE("Lk " + std::to_string(Lk));
  const int64_t Lq = 37;
  std::vector<double> eye(static_cast<size_t>(Lk * Lk), 0.0);
  for (int64_t j = 0; j < Lk; ++j) eye[static_cast<size_t>(j * Lk + j)] = 1.0;
  Case c;
  c.q = random_tensor({2, 2, Lq, 16}, DType::f32, 60, -1, 1);
  c.k = random_tensor({2, 2, Lk, 16}, DType::f32, 61, -1, 1);
  c.v = Tensor::from_vector({1, 1, Lk, Lk}, eye, DType::f32).expand({2, 2, Lk, Lk});
  c.o.dropout_p = 0.4;
  c.o.seed = 12345;
  contract::DropoutRule rule{0.4, 12345};
  for_each_isa([&](cpu::Isa) {
    AttentionOptions o = c.o;
    o.backend = Backend::cpu;
    const AttentionResult r = attention(c.q, c.k, c.v, o);
    int64_t dropped = 0;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < Lq; ++i) {
          for (int64_t j = 0; j < Lk; ++j) {
            const bool kept = r.out.at({b, h, i, j}) != 0.0;
            ASSERT_EQ(kept, rule.keep(b, h, i, j)) << b << " " << h << " " << i << " " << j;
            dropped += !kept;
          }
        }
      }
    }
    EXPECT_GT(dropped, 0);
  });
}

// Lk 70: one key tile and a partial step of 64 draws; 300: several key tiles (j0 > 0), the AVX-512
// generator's 64-key steps and their tails.
TEST(CpuBackend, DropoutKeepPatternIsTheContractsBitForBit) {
  for (const int64_t Lk : {70, 300}) keep_pattern_is_the_contracts(Lk);
}

// A plain attention computing in `dtype` (FlashAttention's yardstick for 16-bit types): scores and
// sums in f32 from the dtype's values, the weights P rounded to the dtype before P V, the output
// rounded to the dtype.
Tensor plain_attention_in(const Tensor& q, const Tensor& k, const Tensor& v, DType dtype) {
  const int64_t H = q.size(1), Lq = q.size(2), Lk = k.size(2), D = q.size(3), Dv = v.size(3);
  Tensor out = Tensor::empty({1, H, Lq, Dv}, dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto round = [&](float x) {
    return static_cast<float>(Tensor::full({1}, static_cast<double>(x), dtype).at({0}));
  };
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < Lq; ++i) {
      std::vector<float> s(static_cast<size_t>(Lk));
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Lk; ++j) {
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          acc += static_cast<float>(q.at({0, h, i, d})) * static_cast<float>(k.at({0, h, j, d}));
        }
        s[static_cast<size_t>(j)] = acc * scale;
        mx = std::max(mx, acc * scale);
      }
      float l = 0.0f;
      for (float& x : s) l += (x = std::exp(x - mx));
      for (int64_t c = 0; c < Dv; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < Lk; ++j) {
          acc += round(s[static_cast<size_t>(j)] / l) * static_cast<float>(v.at({0, h, j, c}));
        }
        out.set({0, h, i, c}, acc);
      }
    }
  }
  return out;
}

// bf16 and f16 inputs: the output's error against double is at most twice that of the plain
// implementation in the same precision.
TEST(CpuBackend, SixteenBitInputsWithinTwiceThePlainError) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor q = random_tensor({1, 2, 37, 59}, dtype, 70, -1, 1);
    const Tensor k = random_tensor({1, 2, 53, 59}, dtype, 71, -1, 1);
    const Tensor v = random_tensor({1, 2, 53, 40}, dtype, 72, -1, 1);
    AttentionOptions ref_o;
    ref_o.backend = Backend::reference;
    const Tensor exact = attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), ref_o).out;
    const double plain_error = rel_error(plain_attention_in(q, k, v, dtype), exact);
    ASSERT_GT(plain_error, 0.0);
    for_each_isa([&](cpu::Isa) {
      AttentionOptions o;
      o.backend = Backend::cpu;
      const Tensor out = attention(q, k, v, o).out;
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_LE(rel_error(out, exact), 2.0 * plain_error);
    });
  }
}

// bf16 inputs with the options of the contract (the avx512bf16 target runs both products on
// VDPBF16PS with P rounded to bf16; the others convert to f32): outputs and weights against the
// reference on the same bf16 values in double. The bound is the bf16 output quantum: a removed key
// that leaked in, a wrong alibi distance or a missed dropout would cost far more than 2^-8.
TEST(CpuBackend, Bf16InputsWithEveryOption) {
  std::vector<CaseSpec> specs;
  CaseSpec s = awkward();
  specs.push_back(s);
  s.causal = true;
  s.align = Align::top_left;
  s.Hq = 4, s.Hkv = 2, s.Dv = 40;
  specs.push_back(s);
  s.window = {150, -1};
  s.key_lengths = true;
  s.mask = MaskType::add;
  s.mask_shape = {1, 4, 113, 203};
  s.block_layout = true;
  s.block_q = 16, s.block_k = 64;
  s.alibi = true;
  s.softcap = 4.0;
  s.dropout = 0.2;
  s.layout = Layout::padded;
  specs.push_back(s);
  for (uint64_t seed = 200; seed < 215; ++seed) specs.push_back(random_spec(seed, 40));
  uint64_t seed = 300;
  for (CaseSpec spec : specs) {
    spec.dtype = DType::bf16;
    spec.value_range = 1.0;
    SCOPED_TRACE(spec.describe());
    Case c = make_case(spec, ++seed);
    if (c.o.alibi_slopes.defined()) {
      c.o.alibi_slopes = random_tensor({spec.Hq}, DType::f64, seed, 0.0, 0.05);
    }
    AttentionOptions ro = c.o;
    ro.backend = Backend::reference;
    ro.return_weights = true;
    const AttentionResult ref =
        attention(c.q.to(DType::f64), c.k.to(DType::f64), c.v.to(DType::f64), ro);
    for_each_isa([&](cpu::Isa) {
      AttentionOptions o = c.o;
      o.backend = Backend::cpu;
      o.return_weights = true;
      const AttentionResult got = attention(c.q, c.k, c.v, o);
      EXPECT_LE(rel_error(got.out, ref.out), 1.0 / 128);
      EXPECT_LE(rel_error(got.weights, ref.weights), 1.0 / 128);
      EXPECT_LE(rel_error(got.lse, ref.lse), 1e-5);
    });
  }
}

}  // namespace
}  // namespace attn::test
