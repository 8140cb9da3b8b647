// Properties of the contract, checked on the reference backend: each test states an identity that
// must hold exactly (up to f64 rounding) whatever the implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_cases.h"

namespace attn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

AttentionResult run(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o) {
  o.backend = Backend::reference;
  o.return_weights = true;
  return attention(q, k, v, o);
}

void expect_same_result(const AttentionResult& a, const AttentionResult& b,
                        const std::string& what) {
  EXPECT_LE(rel_error(a.out, b.out), kTolF64) << what;
  EXPECT_LE(max_abs_error(a.lse, b.lse), kTolF64 * std::max(1.0, max_abs(b.lse))) << what;
  if (a.weights.defined() && b.weights.defined()) {
    EXPECT_LE(max_abs_error(a.weights, b.weights), kTolF64) << what;
  }
}

TEST(ReferenceProperties, WeightRowsSumToOne) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const CaseSpec s = random_spec(seed);
    const Case c = make_case(s, seed);
    const AttentionResult r = run_reference(c);
    const Tensor w = r.weights.contiguous();
    const Tensor lse = r.lse.contiguous();
    const std::vector<double> wv = w.to_vector(), lv = lse.to_vector();
    for (size_t row = 0; row < lv.size(); ++row) {
      double sum = 0.0;
      for (int64_t j = 0; j < s.Lk; ++j) {
        const double x = wv[row * s.Lk + j];
        ASSERT_GE(x, 0.0);
        sum += x;
      }
      // A row with an allowed key sums to 1 (less the sink's share exp(sink - lse), which has no
      // column); a fully masked row (lse -inf, or lse = the sink) sums to 0.
      const int64_t h = static_cast<int64_t>(row / s.Lq) % s.Hq;
      const double sink_share =
          c.o.sinks.defined() ? std::exp(c.o.sinks.to_vector()[h] - lv[row]) : 0.0;
      if (lv[row] == -kInf) {
        EXPECT_EQ(sum, 0.0) << s.describe();
      } else {
        EXPECT_NEAR(sum, 1.0 - sink_share, 1e-13) << s.describe();
      }
    }
  }
}

// Without dropout out = weights @ v (per head, with GQA's kv head).
TEST(ReferenceProperties, OutputIsWeightsTimesValues) {
  CaseSpec s;
  s.Hq = 4, s.Hkv = 2, s.mask = MaskType::keep;
  const Case c = make_case(s, 5);
  const AttentionResult r = run_reference(c);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      for (int64_t i = 0; i < s.Lq; ++i) {
        for (int64_t d = 0; d < s.Dv; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < s.Lk; ++j)
            acc += r.weights.at({b, h, i, j}) * c.v.at({b, h / 2, j, d});
          EXPECT_NEAR(r.out.at({b, h, i, d}), acc, 1e-13);
        }
      }
    }
  }
}

// Changing k and v of keys j > p(i) changes nothing in causal row i (both alignments).
TEST(ReferenceProperties, CausalRowsIgnoreFutureKeys) {
  for (Align align : {Align::bottom_right, Align::top_left}) {
    CaseSpec s;
    s.Lq = 5, s.Lk = 8, s.causal = true, s.align = align;
    const Case c = make_case(s, 11);
    const AttentionResult base = run(c.q, c.k, c.v, c.o);
    const int64_t offset = align == Align::bottom_right ? s.Lk - s.Lq : 0;
    for (int64_t i = 0; i < s.Lq; ++i) {
      // Replace every key after p(i) with other random values.
      Tensor k2 = c.k.clone(), v2 = c.v.clone();
      const Tensor noise_k = random_tensor(k2.shape(), DType::f64, 100 + i, -5, 5);
      const Tensor noise_v = random_tensor(v2.shape(), DType::f64, 200 + i, -5, 5);
      const int64_t first_future = i + offset + 1;
      if (first_future >= s.Lk) continue;
      k2.slice(2, first_future, s.Lk).copy_from(noise_k.slice(2, first_future, s.Lk));
      v2.slice(2, first_future, s.Lk).copy_from(noise_v.slice(2, first_future, s.Lk));
      const AttentionResult changed = run(c.q, k2, v2, c.o);
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < s.Hq; ++h) {
          for (int64_t d = 0; d < s.Dv; ++d)
            EXPECT_EQ(changed.out.at({b, h, i, d}), base.out.at({b, h, i, d}));
          EXPECT_EQ(changed.lse.at({b, h, i}), base.lse.at({b, h, i}));
        }
      }
      // ... while a later row that sees those keys does change (the test can fail).
      if (i + 1 < s.Lq) {
        EXPECT_NE(changed.out.at({0, 0, s.Lq - 1, 0}), base.out.at({0, 0, s.Lq - 1, 0}));
      }
    }
  }
}

// Permuting keys and values together (and the key axis of a dense mask) leaves out and lse
// unchanged and permutes the weights' columns.
TEST(ReferenceProperties, PermutingKeysChangesNothing) {
  CaseSpec s;
  s.Lk = 7, s.mask = MaskType::add, s.softcap = 2.0;
  const Case c = make_case(s, 21);
  const std::vector<int64_t> perm = {3, 6, 0, 5, 1, 4, 2};  // new key j is old key perm[j]
  Tensor k2 = c.k.clone(), v2 = c.v.clone(), m2 = c.o.mask.clone();
  for (int64_t j = 0; j < s.Lk; ++j) {
    k2.select(2, j).copy_from(c.k.select(2, perm[j]));
    v2.select(2, j).copy_from(c.v.select(2, perm[j]));
    m2.select(3, j).copy_from(c.o.mask.select(3, perm[j]));
  }
  AttentionOptions o2 = c.o;
  o2.mask = m2;
  const AttentionResult a = run(c.q, c.k, c.v, c.o), b = run(c.q, k2, v2, o2);
  expect_same_result({a.out, a.lse, {}}, {b.out, b.lse, {}}, "permuted keys");
  for (int64_t j = 0; j < s.Lk; ++j) {
    EXPECT_LE(max_abs_error(b.weights.select(3, j), a.weights.select(3, perm[j])), 1e-15);
  }
}

// GQA: Hq = 6 query heads over Hkv = 2 kv heads equals the same problem with K/V repeated to 6
// heads (head h reads kv head h / 3); the gradients of the repeated K/V summed over each group
// equal dk / dv.
TEST(ReferenceProperties, GqaEqualsRepeatedKv) {
  CaseSpec s;
  s.Hq = 6, s.Hkv = 2, s.causal = true, s.alibi = true, s.dropout = 0.2;
  const Case c = make_case(s, 31);
  const Shape rep_k = {2, 6, s.Lk, s.D}, rep_v = {2, 6, s.Lk, s.Dv};
  // [B, Hkv, Lk, D] -> [B, Hkv, 3, Lk, D] (stride 0) -> [B, 6, Lk, D]
  const Tensor k6 = c.k.unsqueeze(2).expand({2, 2, 3, s.Lk, s.D}).contiguous().view(rep_k);
  const Tensor v6 = c.v.unsqueeze(2).expand({2, 2, 3, s.Lk, s.Dv}).contiguous().view(rep_v);
  const AttentionResult a = run(c.q, c.k, c.v, c.o), b = run(c.q, k6, v6, c.o);
  expect_same_result(a, b, "GQA");

  const Tensor G = random_tensor(a.out.shape(), DType::f64, 5);
  const AttentionGrads ga = attention_backward(G, c.q, c.k, c.v, a.out, a.lse, c.o);
  const AttentionGrads gb = attention_backward(G, c.q, k6, v6, b.out, b.lse, c.o);
  EXPECT_LE(rel_error(ga.dq, gb.dq), kTolF64);
  Tensor dk_sum = Tensor::zeros(c.k.shape(), DType::f64),
         dv_sum = Tensor::zeros(c.v.shape(), DType::f64);
  for (int64_t b_ = 0; b_ < 2; ++b_) {
    for (int64_t h = 0; h < 6; ++h) {
      for (int64_t j = 0; j < s.Lk; ++j) {
        for (int64_t d = 0; d < s.D; ++d) {
          dk_sum.set({b_, h / 3, j, d}, dk_sum.at({b_, h / 3, j, d}) + gb.dk.at({b_, h, j, d}));
        }
        for (int64_t d = 0; d < s.Dv; ++d) {
          dv_sum.set({b_, h / 3, j, d}, dv_sum.at({b_, h / 3, j, d}) + gb.dv.at({b_, h, j, d}));
        }
      }
    }
  }
  EXPECT_LE(rel_error(ga.dk, dk_sum), kTolF64);
  EXPECT_LE(rel_error(ga.dv, dv_sum), kTolF64);
}

// The drop mask [B, 1, 1, Lk] with true at j >= len[b].
Tensor lengths_as_drop_mask(const std::vector<int64_t>& lens, int64_t Lk) {
  std::vector<double> vals;
  for (int64_t len : lens) {
    for (int64_t j = 0; j < Lk; ++j) vals.push_back(j >= len ? 1.0 : 0.0);
  }
  return Tensor::from_vector({static_cast<int64_t>(lens.size()), 1, 1, Lk}, vals, DType::boolean);
}

TEST(ReferenceProperties, KeyLengthsEqualDropMask) {
  CaseSpec s;
  s.batch = {3}, s.Lk = 6;
  const Case c = make_case(s, 41);
  const std::vector<int64_t> lens = {6, 2, 0};  // full, partial, none (fully masked rows)
  AttentionOptions a = c.o, b = c.o;
  a.key_lengths = Tensor::from_vector({3}, {6, 2, 0}, DType::i32);
  b.mask = lengths_as_drop_mask(lens, s.Lk);
  b.mask_type = MaskType::drop;
  const AttentionResult ra = run(c.q, c.k, c.v, a), rb = run(c.q, c.k, c.v, b);
  expect_same_result(ra, rb, "key lengths vs drop mask");
  EXPECT_EQ(ra.lse.at({2, 0, 0}), -kInf);
  const Tensor G = random_tensor(ra.out.shape(), DType::f64, 6);
  const AttentionGrads ga = attention_backward(G, c.q, c.k, c.v, ra.out, ra.lse, a);
  const AttentionGrads gb = attention_backward(G, c.q, c.k, c.v, rb.out, rb.lse, b);
  EXPECT_LE(rel_error(ga.dq, gb.dq), kTolF64);
  EXPECT_LE(rel_error(ga.dk, gb.dk), kTolF64);
  EXPECT_LE(rel_error(ga.dv, gb.dv), kTolF64);
}

TEST(ReferenceProperties, CausalIsWindowUnboundedZero) {
  for (Align align : {Align::bottom_right, Align::top_left}) {
    CaseSpec s;
    s.Lq = 6, s.Lk = 4, s.align = align;  // Lq > Lk: bottom-right has fully masked first rows
    const Case c = make_case(s, 51);
    AttentionOptions a = c.o, b = c.o, w = c.o;
    a.causal = true;
    b.window = {-1, 0};
    w.causal = true;
    w.window = {-1, 2};  // causal folds the right bound to min(2, 0) = 0
    const AttentionResult ra = run(c.q, c.k, c.v, a);
    expect_same_result(ra, run(c.q, c.k, c.v, b), "causal vs window(-1, 0)");
    expect_same_result(ra, run(c.q, c.k, c.v, w), "causal + window(-1, 2)");
  }
}

// Bottom-right puts query i at p(i) = i + Lk - Lq: it equals top-left on queries padded in front
// with Lk - Lq extra rows, keeping the last Lq rows. Holds for causal, windows and ALiBi at once.
TEST(ReferenceProperties, BottomRightIsTopLeftShiftedByLkMinusLq) {
  CaseSpec s;
  s.Lq = 3, s.Lk = 7, s.causal = true, s.window = {3, -1}, s.alibi = true;
  const Case c = make_case(s, 61);
  const int64_t off = s.Lk - s.Lq;
  Tensor q_padded = random_tensor({2, s.Hq, s.Lk, s.D}, DType::f64, 62);
  q_padded.slice(2, off, s.Lk).copy_from(c.q);
  AttentionOptions tl = c.o;
  tl.align = Align::top_left;
  const AttentionResult br = run(c.q, c.k, c.v, c.o);
  const AttentionResult full = run(q_padded, c.k, c.v, tl);
  EXPECT_LE(max_abs_error(br.out, full.out.slice(2, off, s.Lk)), 1e-15);
  EXPECT_LE(max_abs_error(br.lse, full.lse.slice(2, off, s.Lk)), 1e-15);
  EXPECT_LE(max_abs_error(br.weights, full.weights.slice(2, off, s.Lk)), 1e-15);
  // And the two alignments do differ on the unpadded problem.
  EXPECT_GT(max_abs_error(br.out, run(c.q, c.k, c.v, tl).out), 1e-3);
}

// A block layout equals the dense keep mask that repeats each tile's flag over its block_q x
// block_k cells (tiles at the edges cut off).
TEST(ReferenceProperties, BlockLayoutEqualsDenseMask) {
  CaseSpec s;
  s.Lq = 7, s.Lk = 8, s.block_layout = true, s.block_q = 3, s.block_k = 3;
  const Case c = make_case(s, 71);
  const Tensor& layout = c.o.block_layout.layout;  // [2, Hq, 3, 3]
  Tensor dense = Tensor::zeros({2, s.Hq, s.Lq, s.Lk}, DType::boolean);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      for (int64_t i = 0; i < s.Lq; ++i) {
        for (int64_t j = 0; j < s.Lk; ++j) dense.set({b, h, i, j}, layout.at({b, h, i / 3, j / 3}));
      }
    }
  }
  AttentionOptions m = c.o;
  m.block_layout = {};
  m.mask = dense;
  m.mask_type = MaskType::keep;
  const AttentionResult a = run(c.q, c.k, c.v, c.o), b = run(c.q, c.k, c.v, m);
  expect_same_result(a, b, "block layout vs dense mask");
  const Tensor G = random_tensor(a.out.shape(), DType::f64, 7);
  const AttentionGrads ga = attention_backward(G, c.q, c.k, c.v, a.out, a.lse, c.o);
  const AttentionGrads gb = attention_backward(G, c.q, c.k, c.v, b.out, b.lse, m);
  EXPECT_LE(rel_error(ga.dk, gb.dk), kTolF64);
  // A broadcast layout ([3, 3], shared by every batch and head) works the same way.
  AttentionOptions shared = c.o;
  shared.block_layout.layout = layout.select(0, 1).select(0, 1);
  Tensor dense_shared = Tensor::zeros({s.Lq, s.Lk}, DType::boolean);
  for (int64_t i = 0; i < s.Lq; ++i) {
    for (int64_t j = 0; j < s.Lk; ++j) dense_shared.set({i, j}, layout.at({1, 1, i / 3, j / 3}));
  }
  m.mask = dense_shared;
  expect_same_result(run(c.q, c.k, c.v, shared), run(c.q, c.k, c.v, m), "broadcast block layout");
}

// One boolean pattern three ways: keep = M, drop = !M, add = 0 where M else -inf.
TEST(ReferenceProperties, KeepDropAndAddMasksAgree) {
  CaseSpec s;
  s.Lq = 5, s.Lk = 6, s.softcap = 1.0, s.alibi = true;
  const Case c = make_case(s, 81);
  const Tensor keep = random_bool({2, 1, s.Lq, s.Lk}, 0.6, 82);
  Tensor drop = Tensor::empty(keep.shape(), DType::boolean),
         add = Tensor::empty(keep.shape(), DType::f64);
  const std::vector<double> kv = keep.to_vector();
  std::vector<double> dv(kv.size()), av(kv.size());
  for (size_t e = 0; e < kv.size(); ++e) {
    dv[e] = kv[e] != 0.0 ? 0.0 : 1.0;
    av[e] = kv[e] != 0.0 ? 0.0 : -kInf;
  }
  drop = Tensor::from_vector(keep.shape(), dv, DType::boolean);
  add = Tensor::from_vector(keep.shape(), av, DType::f64);
  AttentionOptions ok = c.o, od = c.o, oa = c.o;
  ok.mask = keep, ok.mask_type = MaskType::keep;
  od.mask = drop, od.mask_type = MaskType::drop;
  oa.mask = add, oa.mask_type = MaskType::add;
  const AttentionResult rk = run(c.q, c.k, c.v, ok);
  expect_same_result(rk, run(c.q, c.k, c.v, od), "keep vs drop");
  expect_same_result(rk, run(c.q, c.k, c.v, oa), "keep vs add");
  // And the mask does something: without it the result differs.
  EXPECT_GT(max_abs_error(rk.out, run(c.q, c.k, c.v, c.o).out), 1e-3);
}

// Results do not depend on the thread count, bitwise (forward and backward).
TEST(ReferenceProperties, ThreadCountDoesNotChangeBits) {
  CaseSpec s;
  s.Hq = 4, s.Hkv = 2, s.dropout = 0.3, s.mask = MaskType::add, s.causal = true;
  Case c = make_case(s, 91);
  AttentionOptions one = c.o, three = c.o;
  one.threads = 1;
  three.threads = 3;
  one.mask_grad = three.mask_grad = true;
  const AttentionResult a = run(c.q, c.k, c.v, one), b = run(c.q, c.k, c.v, three);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  const Tensor G = random_tensor(a.out.shape(), DType::f64, 8);
  const AttentionGrads ga = attention_backward(G, c.q, c.k, c.v, a.out, a.lse, one);
  const AttentionGrads gb = attention_backward(G, c.q, c.k, c.v, b.out, b.lse, three);
  EXPECT_TRUE(bitwise_equal(ga.dq, gb.dq));
  EXPECT_TRUE(bitwise_equal(ga.dk, gb.dk));
  EXPECT_TRUE(bitwise_equal(ga.dv, gb.dv));
  EXPECT_TRUE(bitwise_equal(ga.dmask, gb.dmask));
}

}  // namespace
}  // namespace attn::test
