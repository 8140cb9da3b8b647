// The decode kernel of the cpu backend (attention_decode-inl.h: Lq <= 8 query rows per (batch, kv
// head), every query head of a GQA group in one pass over K and V) against the reference backend
// (double), on every instruction set this machine has, each forced in turn: f32 outputs and lse
// within 1e-6; bf16 within twice the error of a plain bf16 implementation (and the bounds of the
// bf16 tests of attention_cpu_test.cc under options); removed keys holding NaN / inf never reach
// the output; 1, 2, 3 and 7 threads bitwise equal in the split-KV and the unsplit schedule; the
// options the kernel leaves to the tiled forward still right at decode shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "attention/attention_cases.h"
#include "backends/cpu/attention_cpu.h"
#include "cpu/cpu_test_util.h"
#include "test_util.h"

namespace attn::test {
namespace {

AttentionResult run(const Case& c, Backend backend, int threads = 1) {
  AttentionOptions o = c.o;
  o.backend = backend;
  o.threads = threads;
  return attention(c.q, c.k, c.v, o);
}

// A decode-shaped spec: one batch entry, q, k, v in [-1, 1).
CaseSpec decode_spec(int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv) {
  CaseSpec s;
  s.batch = {1};
  s.Hq = Hq, s.Hkv = Hkv, s.Lq = Lq, s.Lk = Lk, s.D = D, s.Dv = Dv;
  s.dtype = DType::f32;
  s.value_range = 1.0;
  return s;
}

// ALiBi slopes <= alibi_max: far keys sit at scores near -slope * distance, whose f32 rounding
// (ulp(s) / 2, 2e-6 at s = -50) is the score's, not the kernel's (see attention_cpu_test.cc).
Case make_decode_case(const CaseSpec& s, uint64_t seed, double alibi_max = 0.05) {
  Case c = make_case(s, seed);
  if (c.o.alibi_slopes.defined()) {
    c.o.alibi_slopes = random_tensor({s.Hq}, DType::f64, seed, 0, alibi_max);
  }
  return c;
}

// f32 on the cpu backend (every ISA) against the reference on the same values in f64.
void expect_f32_matches_reference(const CaseSpec& spec, uint64_t seed, double alibi_max = 0.05) {
  SCOPED_TRACE(spec.describe());
  const Case c = make_decode_case(spec, seed, alibi_max);
  const AttentionResult ref = run(to_dtype(c, DType::f64), Backend::reference);
  for_each_isa([&](cpu::Isa) {
    const AttentionResult got = run(c, Backend::cpu);
    ASSERT_EQ(got.out.dtype(), DType::f32);
    EXPECT_LE(rel_error(got.out, ref.out), kTolF32Forward);
    EXPECT_LE(rel_error(got.lse, ref.lse), kTolF32Forward);
  });
}

// Head dims 1 .. 256 (odd, a multiple of every vector width, beyond 8 vectors), Dv != D, key
// counts around the key block of every ISA (15, 16, 17) and long ones that split into chunks (4099
// keys of one kv head: 8 chunks), Lq 1 .. 8, MHA, GQA and MQA groups.
TEST(CpuDecode, ShapesAgainstReference) {
  const int64_t heads[][2] = {{1, 1}, {2, 1}, {3, 3}, {4, 2}, {8, 1}};
  uint64_t seed = 1;
  for (int64_t Lk : {1, 15, 16, 17, 1000, 4099}) {
    for (int64_t D : {1, 59, 64, 128, 256}) {
      const int64_t Lq = 1 + static_cast<int64_t>(seed % 8);
      const auto& hh = heads[seed % 5];
      // Dv: equal to D, a non-multiple of the vector width, and wider than D.
      const int64_t Dv = seed % 3 == 0 ? D : (seed % 3 == 1 ? 37 : D + 72);
      expect_f32_matches_reference(decode_spec(hh[0], hh[1], Lq, Lk, D, Dv), seed);
      ++seed;
    }
  }
  // Every Lq with a GQA group at a fixed shape.
  for (int64_t Lq = 1; Lq <= 8; ++Lq) {
    expect_f32_matches_reference(decode_spec(6, 2, Lq, 203, 64, 40), 100 + Lq);
  }
}

// Causal in both alignments (bottom-right: each of the Lq rows sees one more key; Lq > Lk leaves
// the first rows without keys), windows, key lengths (0 included), ALiBi, softcap, a scale, and all
// at once: every row has its own key range inside a key block.
TEST(CpuDecode, PositionsKeyLengthsAlibiSoftcap) {
  uint64_t seed = 200;
  for (int64_t Lq : {1, 2, 5, 8}) {
    for (Align align : {Align::bottom_right, Align::top_left}) {
      CaseSpec s = decode_spec(4, 2, Lq, 1000, 64, 48);
      s.batch = {3};
      s.align = align;
      s.causal = true;
      expect_f32_matches_reference(s, ++seed);
      s.causal = false;
      s.window = {37, 5};
      expect_f32_matches_reference(s, ++seed);
      s.window = {300, -1};
      s.causal = true;
      s.key_lengths = true;
      expect_f32_matches_reference(s, ++seed);
      s = decode_spec(4, 2, Lq, 1000, 64, 48);
      s.align = align;
      s.alibi = true;
      s.causal = true;
      expect_f32_matches_reference(s, ++seed);
      s.alibi = false;
      s.causal = false;
      s.softcap = 1.5;
      expect_f32_matches_reference(s, ++seed);
      s.softcap = 30.0;
      s.scale = 0.5;
      expect_f32_matches_reference(s, ++seed);
    }
    CaseSpec few = decode_spec(2, 1, Lq, 5, 59, 59);  // Lq > Lk for Lq 8
    few.causal = true;
    expect_f32_matches_reference(few, ++seed);
  }
  CaseSpec all = decode_spec(8, 2, 4, 4099, 128, 96);
  all.batch = {2};
  all.causal = true;
  all.window = {1500, -1};
  all.key_lengths = true;
  all.alibi = true;
  all.softcap = 4.0;
  all.layout = Layout::padded;
  // Slopes <= 0.002: the window keeps keys up to 1500 positions away (scores down to -3).
  expect_f32_matches_reference(all, ++seed, 0.002);
  all.layout = Layout::strided;
  expect_f32_matches_reference(all, ++seed, 0.002);
}

// Split-KV with chunks that no row may use (key length 100 of 4099 keys, a window that starts
// late), and the unsplit schedule (64 or more (batch, kv head) pairs).
TEST(CpuDecode, SplitKvAndManyPairs) {
  CaseSpec s = decode_spec(2, 1, 3, 4099, 64, 64);
  Case c = make_decode_case(s, 300);
  c.o.key_lengths = Tensor::from_vector({1}, {100}, DType::i64);
  const AttentionResult ref = run(to_dtype(c, DType::f64), Backend::reference);
  c.o.window = {50, 0};
  const AttentionResult ref_window = run(to_dtype(c, DType::f64), Backend::reference);
  for_each_isa([&](cpu::Isa) {
    Case k = c;
    k.o.window = {};
    EXPECT_LE(rel_error(run(k, Backend::cpu).out, ref.out), kTolF32Forward);
    EXPECT_LE(rel_error(run(c, Backend::cpu).out, ref_window.out), kTolF32Forward);
  });
  s = decode_spec(16, 16, 2, 77, 32, 32);
  s.batch = {4};
  s.causal = true;
  expect_f32_matches_reference(s, 301);
  s.Hq = 64;  // GQA group of 4, 64 pairs
  expect_f32_matches_reference(s, 302);
}

// A row without any allowed key: out 0, lse -inf (key length 0 for one batch entry; rows before
// the first key under bottom-right causal with Lq > Lk).
TEST(CpuDecode, RowsWithoutKeys) {
  CaseSpec s = decode_spec(2, 2, 3, 40, 16, 16);
  s.batch = {2};
  Case c = make_decode_case(s, 400);
  c.o.key_lengths = Tensor::from_vector({2}, {0, 40}, DType::i64);
  for_each_isa([&](cpu::Isa) {
    const AttentionResult r = run(c, Backend::cpu);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 3; ++i) {
        EXPECT_EQ(r.lse.at({0, h, i}), -std::numeric_limits<double>::infinity());
        for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(r.out.at({0, h, i, d}), 0.0);
        EXPECT_TRUE(std::isfinite(r.lse.at({1, h, i})));
      }
    }
  });
}

// Removed keys hold NaN in k and inf in v, in f32 and bf16, with and without split-KV. Rows i of
// (b, h) may use keys [p(i) - left, min(p(i) + 1, len_b)), p(i) = i + Lk - Lq (bottom-right causal
// with a window). Poisoning every key that no row may use leaves the output bitwise the same;
// poisoning key p(0) + 1 (right of row 0's diagonal, used by rows 1 ..) or p(0) - left (left of
// the window of rows 1 .., used by row 0) makes exactly the rows that use it NaN.
TEST(CpuDecode, RemovedKeysWithNanAndInfNeverReachTheOutput) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t Lq = 6, Hkv = 2, Hq = 4;
  for (int64_t Lk : {203, 4099}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      SCOPED_TRACE(Lk);
      CaseSpec s = decode_spec(Hq, Hkv, Lq, Lk, 59, 40);
      s.batch = {2};
      Case c = to_dtype(make_decode_case(s, 500), dtype);
      const int64_t left = Lk / 3, p0 = Lk - Lq;
      const int64_t len[2] = {Lk - 17, Lk};
      c.o.key_lengths = Tensor::from_vector({2}, {double(len[0]), double(len[1])}, DType::i64);
      c.o.causal = true;
      c.o.window = {left, -1};
      auto poisoned = [&](int64_t extra_key) {
        Case d = c;
        d.k = c.k.clone(), d.v = c.v.clone();
        for (int64_t b = 0; b < 2; ++b) {
          for (int64_t h = 0; h < Hkv; ++h) {
            for (int64_t j = 0; j < Lk; ++j) {
              const bool used_by_some_row = j >= p0 - left && j < len[b];
              if (used_by_some_row && j != extra_key) continue;
              d.k.set({b, h, j, 3}, nan);
              d.v.set({b, h, j, 5}, inf);
            }
          }
        }
        return d;
      };
      // Whether row i of batch entry b uses key j.
      auto uses = [&](int64_t b, int64_t i, int64_t j) {
        return j >= p0 + i - left && j <= p0 + i && j < len[b];
      };
      const AttentionResult ref = run(to_dtype(c, DType::f64), Backend::reference);
      for_each_isa([&](cpu::Isa) {
        const AttentionResult clean = run(c, Backend::cpu);
        EXPECT_LE(rel_error(clean.out, ref.out), dtype == DType::f32 ? kTolF32Forward : 1.0 / 128);
        EXPECT_TRUE(bitwise_equal(clean.out, run(poisoned(-1), Backend::cpu).out));
        for (int64_t extra : {p0 + 1, p0 - left}) {
          SCOPED_TRACE(extra);
          const AttentionResult d = run(poisoned(extra), Backend::cpu);
          for (int64_t b = 0; b < 2; ++b) {
            for (int64_t h = 0; h < Hq; ++h) {
              for (int64_t i = 0; i < Lq; ++i) {
                const Tensor rc =
                    clean.out.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, i, i + 1);
                const Tensor rd = d.out.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, i, i + 1);
                if (uses(b, i, extra)) {
                  EXPECT_TRUE(std::isnan(rd.to_vector()[0])) << b << " " << h << " " << i;
                } else {
                  EXPECT_TRUE(bitwise_equal(rc, rd)) << b << " " << h << " " << i;
                }
              }
            }
          }
        }
      });
    }
  }
}

// The same bits for 1, 2, 3 and 7 threads: split-KV (one kv head, 4099 keys) and unsplit (64
// pairs), f32 and bf16, GQA, several rows with causal ranges.
TEST(CpuDecode, ThreadCountsGiveBitwiseEqualResults) {
  CaseSpec split = decode_spec(4, 1, 3, 4099, 64, 64);
  split.causal = true;
  split.key_lengths = true;
  CaseSpec many = decode_spec(32, 16, 2, 300, 128, 128);
  many.batch = {4};
  many.causal = true;
  for (const CaseSpec& spec : {split, many}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(spec.describe());
      SCOPED_TRACE(dtype_name(dtype));
      const Case c = to_dtype(make_decode_case(spec, 600), dtype);
      for_each_isa([&](cpu::Isa) {
        const AttentionResult one = run(c, Backend::cpu, 1);
        for (int threads : {2, 3, 7}) {
          SCOPED_TRACE(threads);
          const AttentionResult r = run(c, Backend::cpu, threads);
          EXPECT_TRUE(bitwise_equal(one.out, r.out));
          EXPECT_TRUE(bitwise_equal(one.lse, r.lse));
        }
      });
    }
  }
}

// Where the software prefetch puts the next blocks (L1 or L2, chosen per CPU, or nowhere: the
// hardware prefetchers alone) is a hint only: the same bits every way; the override names its
// level and refuses any other.
TEST(CpuDecode, PrefetchLevelChangesNoBit) {
  CaseSpec spec = decode_spec(4, 2, 2, 1000, 128, 128);
  spec.causal = true;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Case c = to_dtype(make_decode_case(spec, 610), dtype);
    cpu::set_decode_prefetch_override("l1");
    EXPECT_EQ(cpu::decode_prefetch_name(), "l1");
    const AttentionResult l1 = run(c, Backend::cpu, 2);
    for (const char* level : {"l2", "none"}) {
      cpu::set_decode_prefetch_override(level);
      EXPECT_EQ(cpu::decode_prefetch_name(), level);
      const AttentionResult other = run(c, Backend::cpu, 2);
      EXPECT_TRUE(bitwise_equal(l1.out, other.out)) << dtype_name(dtype) << " " << level;
      EXPECT_TRUE(bitwise_equal(l1.lse, other.lse)) << dtype_name(dtype) << " " << level;
    }
    cpu::set_decode_prefetch_override("");
  }
  EXPECT_THROW(cpu::set_decode_prefetch_override("l3"), Error);
  std::printf("[ PREFETCH ] decode prefetches into %s on this CPU\n",
              cpu::decode_prefetch_name().c_str());
}

// A plain attention in bf16 (FlashAttention's yardstick): scores and sums in f32 from the bf16
// values, weights rounded to bf16 before P V, the output rounded to bf16. GQA: head h reads kv
// head h / (Hq / Hkv).
Tensor plain_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t Hq = q.size(1), Hkv = k.size(1), Lq = q.size(2), Lk = k.size(2), D = q.size(3),
                Dv = v.size(3);
  const std::vector<double> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  std::vector<double> out(static_cast<size_t>(Hq * Lq * Dv));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto round = [](float x) { return bf16_to_f32(f32_to_bf16(x)); };
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t hk = h / (Hq / Hkv);
    for (int64_t i = 0; i < Lq; ++i) {
      std::vector<float> s(static_cast<size_t>(Lk));
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Lk; ++j) {
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          acc += static_cast<float>(qv[static_cast<size_t>((h * Lq + i) * D + d)]) *
                 static_cast<float>(kv[static_cast<size_t>((hk * Lk + j) * D + d)]);
        }
        s[static_cast<size_t>(j)] = acc * scale;
        mx = std::max(mx, acc * scale);
      }
      float l = 0.0f;
      for (float& x : s) l += (x = std::exp(x - mx));
      for (int64_t c = 0; c < Dv; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < Lk; ++j) {
          acc += round(s[static_cast<size_t>(j)] / l) *
                 static_cast<float>(vv[static_cast<size_t>((hk * Lk + j) * Dv + c)]);
        }
        out[static_cast<size_t>((h * Lq + i) * Dv + c)] = round(acc);
      }
    }
  }
  return Tensor::from_vector({1, Hq, Lq, Dv}, out, DType::bf16);
}

// bf16 inputs: within twice the plain bf16 error without options; under options within the bounds
// of the bf16 tests in attention_cpu_test.cc (out 1/128, lse 1e-5).
TEST(CpuDecode, Bf16WithinTwiceThePlainError) {
  uint64_t seed = 700;
  for (auto [Lq, Lk, D, Dv, Hq, Hkv] :
       {std::array<int64_t, 6>{1, 1000, 128, 128, 2, 2},
        std::array<int64_t, 6>{4, 4099, 64, 40, 4, 1}, std::array<int64_t, 6>{8, 17, 59, 59, 2, 1},
        std::array<int64_t, 6>{2, 1000, 256, 200, 3, 3},
        std::array<int64_t, 6>{1, 15, 1, 1, 1, 1}}) {
    const Case c =
        to_dtype(make_decode_case(decode_spec(Hq, Hkv, Lq, Lk, D, Dv), ++seed), DType::bf16);
    SCOPED_TRACE(fmt::format("Lq {} Lk {} D {} Dv {} Hq {} Hkv {}", Lq, Lk, D, Dv, Hq, Hkv));
    const AttentionResult exact = run(to_dtype(c, DType::f64), Backend::reference);
    const double plain_error = rel_error(plain_bf16(c.q, c.k, c.v), exact.out);
    ASSERT_GT(plain_error, 0.0);
    for_each_isa([&](cpu::Isa) {
      const AttentionResult got = run(c, Backend::cpu);
      EXPECT_EQ(got.out.dtype(), DType::bf16);
      EXPECT_LE(rel_error(got.out, exact.out), 2.0 * plain_error);
      EXPECT_LE(rel_error(got.lse, exact.lse), 1e-5);
    });
  }
  CaseSpec s = decode_spec(8, 2, 5, 4099, 128, 96);
  s.batch = {2};
  s.causal = true;
  s.window = {2000, -1};
  s.key_lengths = true;
  s.alibi = true;
  s.softcap = 4.0;
  const Case c = to_dtype(make_decode_case(s, 750), DType::bf16);
  const AttentionResult exact = run(to_dtype(c, DType::f64), Backend::reference);
  for_each_isa([&](cpu::Isa) {
    const AttentionResult got = run(c, Backend::cpu);
    EXPECT_LE(rel_error(got.out, exact.out), 1.0 / 128);
    EXPECT_LE(rel_error(got.lse, exact.lse), 1e-5);
  });
}

// A NaN in one query row makes that row (out and lse) NaN, as IEEE says, and leaves the other rows
// of its GQA group, which share the pass over K and V, bitwise untouched.
TEST(CpuDecode, NanQueryRowStaysInItsRow) {
  for (int64_t Lk : {300, 4099}) {
    const Case c = make_decode_case(decode_spec(4, 1, 2, Lk, 64, 64), 800);
    Case bad = c;
    bad.q = c.q.clone();
    bad.q.set({0, 2, 1, 10}, std::numeric_limits<double>::quiet_NaN());
    for_each_isa([&](cpu::Isa) {
      const AttentionResult a = run(c, Backend::cpu), d = run(bad, Backend::cpu);
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t i = 0; i < 2; ++i) {
          const Tensor ra = a.out.slice(1, h, h + 1).slice(2, i, i + 1);
          const Tensor rd = d.out.slice(1, h, h + 1).slice(2, i, i + 1);
          if (h == 2 && i == 1) {
            for (double x : rd.to_vector()) EXPECT_TRUE(std::isnan(x));
            EXPECT_TRUE(std::isnan(d.lse.at({0, h, i})));
          } else {
            EXPECT_TRUE(bitwise_equal(ra, rd)) << h << " " << i;
          }
        }
      }
    });
  }
}

// One query row per kv head (multi-head decode, Lq 1) at D = Dv = 64, 96, 128 or 256 takes the kernel's
// one-row loop (Decode::row_blocks) for its whole key blocks: the same operations in the same order
// as the rows of a group, so the row gives the bits it gets as one of two query heads reading one kv
// head (the blocks of R rows), in f32 and bf16, unsplit and split into chunks, with the last block
// whole, partial or alone; with a causal window its first rows take the same loop from the window's
// start. A NaN key or query makes the row NaN.
TEST(CpuDecode, OneRowLoopGivesTheBitsOfTheGroupRows) {
  uint64_t seed = 900;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t D : {64, 96, 128, 256}) {
      for (int64_t Lk : {15, 16, 17, 100, 1000, 4099}) {
        SCOPED_TRACE(fmt::format("{} D {} Lk {}", dtype_name(dt), D, Lk));
        const Case group = to_dtype(make_decode_case(decode_spec(2, 1, 1, Lk, D, D), ++seed), dt);
        Case one = group;
        one.q = group.q.slice(1, 1, 2).contiguous();  // query head 1 alone: group 1, R = 1
        if (Lk == 1000) one.o.window = {300, 0};      // keys 699 .. 999: blocks from key 699
        Case grouped = group;
        grouped.o = one.o;
        for_each_isa([&](cpu::Isa) {
          const AttentionResult a = run(one, Backend::cpu), g = run(grouped, Backend::cpu);
          EXPECT_TRUE(bitwise_equal(a.out, g.out.slice(1, 1, 2)));
          EXPECT_TRUE(bitwise_equal(a.lse, g.lse.slice(1, 1, 2)));
        });
        if (dt == DType::f32) {
          const AttentionResult ref = run(to_dtype(one, DType::f64), Backend::reference);
          for_each_isa([&](cpu::Isa) {
            const AttentionResult got = run(one, Backend::cpu);
            EXPECT_LE(rel_error(got.out, ref.out), kTolF32Forward);
            EXPECT_LE(rel_error(got.lse, ref.lse), kTolF32Forward);
          });
        }
        for (const char* bad : {"k", "q"}) {
          Case nan = one;
          Tensor& t = bad[0] == 'k' ? nan.k : nan.q;
          t = t.clone();
          t.set({0, 0, bad[0] == 'k' ? Lk / 2 : 0, D / 2},
                std::numeric_limits<double>::quiet_NaN());
          if (Lk == 1000) nan.o = AttentionOptions{};  // the NaN key inside the window
          for_each_isa([&](cpu::Isa) {
            const AttentionResult got = run(nan, Backend::cpu);
            for (double x : got.out.to_vector()) EXPECT_TRUE(std::isnan(x)) << bad;
            EXPECT_TRUE(std::isnan(got.lse.at({0, 0, 0}))) << bad;
          });
        }
      }
    }
  }
}

// What the decode kernel leaves to the tiled forward (dense masks, block layouts, dropout, weights)
// is still right at decode shapes.
TEST(CpuDecode, RareOptionsGoToTheTiledForward) {
  CaseSpec s = decode_spec(4, 2, 3, 1000, 64, 64);
  for (MaskType m : {MaskType::keep, MaskType::add}) {
    s.mask = m;
    expect_f32_matches_reference(s, 900);
  }
  s.mask.reset();
  s.block_layout = true;
  s.block_q = 2, s.block_k = 64;
  expect_f32_matches_reference(s, 901);
  s.block_layout = false;
  s.dropout = 0.3;
  expect_f32_matches_reference(s, 902);
  s.dropout = 0.0;
  const Case c = make_decode_case(s, 903);
  AttentionOptions o = c.o;
  o.return_weights = true;
  o.backend = Backend::reference;
  const AttentionResult ref =
      attention(c.q.to(DType::f64), c.k.to(DType::f64), c.v.to(DType::f64), o);
  for_each_isa([&](cpu::Isa) {
    o.backend = Backend::cpu;
    const AttentionResult got = attention(c.q, c.k, c.v, o);
    EXPECT_LE(rel_error(got.out, ref.out), kTolF32Forward);
    EXPECT_LE(rel_error(got.weights, ref.weights), kTolF32Forward);
  });
}

}  // namespace
}  // namespace attn::test
