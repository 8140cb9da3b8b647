// Edge cases of the contract on the reference backend: NaN/inf isolation of removed keys, fully
// masked rows, empty dims, memory layouts, leading batch dims, dropout statistics and determinism,
// the returned weights.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>

#include "attention_cases.h"
#include "contract/dropout.h"

namespace attn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

AttentionResult run(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions o) {
  o.backend = Backend::reference;
  o.return_weights = true;
  return attention(q, k, v, o);
}

// Each way of removing keys 3..5 from every row of a [2, 2, 3, *] problem with Lk = 6 (top-left
// alignment for the position rules: row i <= 2 sits at key position i).
struct Remover {
  std::string name;
  std::function<void(AttentionOptions&)> apply;
};
std::vector<Remover> removers_of_keys_3_to_5() {
  const int64_t Lq = 3, Lk = 6;
  auto column_mask = [=](double removed, double kept, DType dt) {
    std::vector<double> vals;
    for (int64_t i = 0; i < Lq; ++i) {
      for (int64_t j = 0; j < Lk; ++j) vals.push_back(j >= 3 ? removed : kept);
    }
    return Tensor::from_vector({Lq, Lk}, vals, dt);
  };
  return {
      {"window",
       [](AttentionOptions& o) {
         o.window = {1, 0};
         o.align = Align::top_left;
       }},
      {"causal",
       [](AttentionOptions& o) {
         o.causal = true;
         o.align = Align::top_left;
       }},
      {"key_lengths",
       [](AttentionOptions& o) {
         o.key_lengths = Tensor::from_vector({2}, {3, 3}, DType::i64);
       }},
      {"keep",
       [=](AttentionOptions& o) {
         o.mask = column_mask(0, 1, DType::boolean), o.mask_type = MaskType::keep;
       }},
      {"drop",
       [=](AttentionOptions& o) {
         o.mask = column_mask(1, 0, DType::boolean), o.mask_type = MaskType::drop;
       }},
      {"add",
       [=](AttentionOptions& o) {
         o.mask = column_mask(-kInf, 0.25, DType::f64), o.mask_type = MaskType::add;
       }},
      {"block_layout",
       [](AttentionOptions& o) {
         o.block_layout = {Tensor::from_vector({1, 2}, {1, 0}, DType::boolean), 3,
                           3};  // key tile 1 = keys 3..5
       }},
  };
}

TEST(ReferenceEdge, NonFiniteValuesInRemovedKeysHaveNoEffect) {
  for (const Remover& rm : removers_of_keys_3_to_5()) {
    CaseSpec s;
    s.Hq = 2, s.Hkv = 2, s.Lq = 3, s.Lk = 6;
    const Case c = make_case(s, 7);
    AttentionOptions o = c.o;
    rm.apply(o);
    Tensor k2 = c.k.clone(), v2 = c.v.clone();
    k2.slice(2, 3, 4).fill(kNaN);
    k2.slice(2, 4, 5).fill(kInf);
    k2.slice(2, 5, 6).fill(-kInf);
    v2.slice(2, 3, 4).fill(kInf);
    v2.slice(2, 4, 5).fill(kNaN);
    v2.slice(2, 5, 6).fill(-kInf);
    const AttentionResult clean = run(c.q, c.k, c.v, o), dirty = run(c.q, k2, v2, o);
    EXPECT_EQ(max_abs_error(dirty.out, clean.out), 0.0) << rm.name;
    EXPECT_EQ(max_abs_error(dirty.lse, clean.lse), 0.0) << rm.name;
    EXPECT_EQ(max_abs_error(dirty.weights, clean.weights), 0.0) << rm.name;
    EXPECT_TRUE(all_finite(dirty.out)) << rm.name;
    const Tensor G = random_tensor(clean.out.shape(), DType::f64, 3);
    const AttentionGrads gc = attention_backward(G, c.q, c.k, c.v, clean.out, clean.lse, o);
    const AttentionGrads gd = attention_backward(G, c.q, k2, v2, dirty.out, dirty.lse, o);
    EXPECT_EQ(max_abs_error(gd.dq, gc.dq), 0.0) << rm.name;
    EXPECT_EQ(max_abs_error(gd.dk, gc.dk), 0.0) << rm.name;
    EXPECT_EQ(max_abs_error(gd.dv, gc.dv), 0.0) << rm.name;
    EXPECT_TRUE(all_equal(gd.dk.slice(2, 3, 6), 0.0)) << rm.name;
    EXPECT_TRUE(all_equal(gd.dv.slice(2, 3, 6), 0.0)) << rm.name;
    // The keys that remain do matter (the remover did not remove everything).
    EXPECT_GT(max_abs(gd.dk.slice(2, 0, 3)), 0.0) << rm.name;
  }
}

// Each way of masking every key of query row 1 (Lq = 4, Lk = 5, bottom-right).
std::vector<Remover> removers_of_row_1() {
  const int64_t Lq = 4, Lk = 5;
  auto row_mask = [=](double removed, double kept, DType dt) {
    std::vector<double> vals;
    for (int64_t i = 0; i < Lq; ++i) {
      for (int64_t j = 0; j < Lk; ++j) vals.push_back(i == 1 ? removed : kept);
    }
    return Tensor::from_vector({Lq, Lk}, vals, dt);
  };
  return {
      {"keep",
       [=](AttentionOptions& o) {
         o.mask = row_mask(0, 1, DType::boolean), o.mask_type = MaskType::keep;
       }},
      {"drop",
       [=](AttentionOptions& o) {
         o.mask = row_mask(1, 0, DType::boolean), o.mask_type = MaskType::drop;
       }},
      {"add",
       [=](AttentionOptions& o) {
         o.mask = row_mask(-kInf, 0.5, DType::f64), o.mask_type = MaskType::add;
       }},
      {"block_layout",
       [](AttentionOptions& o) {
         o.block_layout = {Tensor::from_vector({4, 1}, {1, 0, 1, 1}, DType::boolean), 1,
                           5};  // query tile 1 off
       }},
  };
}

void expect_row_fully_masked(const AttentionResult& r, const AttentionGrads& g, int64_t row,
                             const std::string& what) {
  for (int64_t b = 0; b < r.out.size(0); ++b) {
    for (int64_t h = 0; h < r.out.size(1); ++h) {
      EXPECT_TRUE(all_equal(r.out.select(0, b).select(0, h).select(0, row), 0.0)) << what;
      EXPECT_EQ(r.lse.at({b, h, row}), -kInf) << what;
      EXPECT_TRUE(all_equal(r.weights.select(0, b).select(0, h).select(0, row), 0.0)) << what;
      EXPECT_TRUE(all_equal(g.dq.select(0, b).select(0, h).select(0, row), 0.0)) << what;
      if (g.dmask.defined() && g.dmask.dim() == 2) {
        EXPECT_TRUE(all_equal(g.dmask.select(0, row), 0.0)) << what;
      }
    }
  }
  EXPECT_TRUE(all_finite(r.out)) << what;
  EXPECT_TRUE(all_finite(g.dq)) << what;
  EXPECT_TRUE(all_finite(g.dk)) << what;
  EXPECT_TRUE(all_finite(g.dv)) << what;
}

TEST(ReferenceEdge, FullyMaskedRows) {
  for (const Remover& rm : removers_of_row_1()) {
    CaseSpec s;
    s.Hq = 2, s.Hkv = 1, s.Lq = 4, s.Lk = 5, s.softcap = 2.0, s.alibi = true, s.dropout = 0.25;
    const Case c = make_case(s, 17);
    AttentionOptions o = c.o;
    rm.apply(o);
    o.mask_grad = o.mask.defined() && o.mask_type == MaskType::add;
    const AttentionResult r = run(c.q, c.k, c.v, o);
    const Tensor G = random_tensor(r.out.shape(), DType::f64, 4);
    const AttentionGrads g = attention_backward(G, c.q, c.k, c.v, r.out, r.lse, o);
    expect_row_fully_masked(r, g, 1, rm.name);
    EXPECT_GT(max_abs(g.dq.select(2, 0)), 0.0) << rm.name;  // other rows do get gradients
    // The gradient of the masked row's inputs is exactly zero: q of that row can change freely.
    Tensor q2 = c.q.clone();
    q2.select(2, 1).fill(123.0);
    EXPECT_EQ(max_abs_error(run(q2, c.k, c.v, o).out, r.out), 0.0) << rm.name;
  }
  // Bottom-right causal with Lq > Lk: rows 0 .. Lq - Lk - 1 sit before the first key.
  CaseSpec s;
  s.Lq = 6, s.Lk = 4, s.causal = true;
  const Case c = make_case(s, 19);
  const AttentionResult r = run(c.q, c.k, c.v, c.o);
  const AttentionGrads g = attention_backward(random_tensor(r.out.shape(), DType::f64, 5), c.q, c.k,
                                              c.v, r.out, r.lse, c.o);
  expect_row_fully_masked(r, g, 0, "causal Lq > Lk row 0");
  expect_row_fully_masked(r, g, 1, "causal Lq > Lk row 1");
  EXPECT_NE(r.lse.at({0, 0, 2}), -kInf);
}

TEST(ReferenceEdge, EmptyKeysGiveZerosAndMinusInfLse) {
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor q = random_tensor({2, 3, 4, 5}, dt, 1);
    const Tensor k = Tensor::empty({2, 3, 0, 5}, dt), v = Tensor::empty({2, 3, 0, 2}, dt);
    AttentionOptions o;
    o.backend = Backend::reference;
    o.return_weights = true;
    o.causal = true;
    const AttentionResult r = attention(q, k, v, o);
    EXPECT_EQ(r.out.shape(), (Shape{2, 3, 4, 2}));
    EXPECT_TRUE(all_equal(r.out, 0.0));
    EXPECT_TRUE(all_equal(r.lse, -kInf));
    EXPECT_EQ(r.weights.shape(), (Shape{2, 3, 4, 0}));
    const AttentionGrads g =
        attention_backward(random_tensor(r.out.shape(), dt, 2), q, k, v, r.out, r.lse, o);
    EXPECT_TRUE(all_equal(g.dq, 0.0));
    EXPECT_EQ(g.dk.shape(), k.shape());
    EXPECT_EQ(g.dv.shape(), v.shape());
  }
}

TEST(ReferenceEdge, OtherEmptyDims) {
  AttentionOptions o;
  o.backend = Backend::reference;
  o.return_weights = true;
  // B = 0, Lq = 0, Hq = 0 (with Hkv = 2): empty outputs; dk / dv exist and are zero where they have
  // elements.
  const std::vector<std::array<Shape, 3>> shapes = {
      {Shape{0, 2, 3, 4}, Shape{0, 1, 5, 4}, Shape{0, 1, 5, 3}},
      {Shape{2, 2, 0, 4}, Shape{2, 1, 5, 4}, Shape{2, 1, 5, 3}},
      {Shape{2, 0, 3, 4}, Shape{2, 2, 5, 4}, Shape{2, 2, 5, 3}},
      {Shape{2, 2, 3, 4}, Shape{2, 1, 5, 4},
       Shape{2, 1, 5, 0}},  // Dv = 0: empty out, lse still defined
  };
  for (const auto& [qs, ks, vs] : shapes) {
    const Tensor q = random_tensor(qs, DType::f64, 1), k = random_tensor(ks, DType::f64, 2);
    const Tensor v = random_tensor(vs, DType::f64, 3);
    const AttentionResult r = attention(q, k, v, o);
    EXPECT_EQ(r.out.shape(), (Shape{qs[0], qs[1], qs[2], vs[3]}));
    const AttentionGrads g =
        attention_backward(Tensor::zeros(r.out.shape(), DType::f64), q, k, v, r.out, r.lse, o);
    EXPECT_TRUE(all_equal(g.dq, 0.0));
    EXPECT_TRUE(all_equal(g.dk, 0.0)) << shape_to_string(qs);
    EXPECT_TRUE(all_equal(g.dv, 0.0)) << shape_to_string(qs);
    if (vs[3] == 0) {
      const AttentionResult full = attention(q, k, random_tensor({2, 1, 5, 3}, DType::f64, 3), o);
      EXPECT_EQ(max_abs_error(r.lse, full.lse), 0.0);  // lse does not depend on v
    }
  }
  // D = 0: every score is 0, so each row averages v over its allowed keys (q.k is an empty sum).
  const Tensor q = Tensor::empty({1, 2, 0}, DType::f64), k = Tensor::empty({1, 3, 0}, DType::f64);
  const Tensor v = Tensor::from_vector({1, 3, 1}, {1.0, 2.0, 6.0}, DType::f64);
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.at({0, 0, 0}), 3.0, 1e-15);
  EXPECT_NEAR(r.lse.at({0, 1}), std::log(3.0), 1e-15);
}

// Every memory layout of q, k, v, masks and the backward's inputs gives bitwise the same answer as
// contiguous tensors (the reference reads through strides in the same order).
TEST(ReferenceEdge, LayoutsAndBroadcastInputsEqualContiguous) {
  CaseSpec s;
  s.Hq = 4, s.Hkv = 2, s.mask = MaskType::add, s.mask_shape = {4, 5, 7}, s.causal = true,
  s.dropout = 0.2;
  const Case c = make_case(s, 23);
  AttentionOptions o = c.o;
  o.mask_grad = true;
  const AttentionResult base = run(c.q, c.k, c.v, o);
  const Tensor G = random_tensor(base.out.shape(), DType::f64, 6);
  const AttentionGrads gbase = attention_backward(G, c.q, c.k, c.v, base.out, base.lse, o);
  for (Layout l : {Layout::padded, Layout::transposed, Layout::strided}) {
    AttentionOptions ol = o;
    ol.mask = with_layout(o.mask, l);
    const Tensor q = with_layout(c.q, l), k = with_layout(c.k, l), v = with_layout(c.v, l);
    const AttentionResult r = run(q, k, v, ol);
    EXPECT_EQ(max_abs_error(r.out, base.out), 0.0) << layout_name(l);
    EXPECT_EQ(max_abs_error(r.lse, base.lse), 0.0) << layout_name(l);
    const AttentionGrads g = attention_backward(with_layout(G, l), q, k, v, with_layout(r.out, l),
                                                with_layout(r.lse, l), ol);
    EXPECT_EQ(max_abs_error(g.dq, gbase.dq), 0.0) << layout_name(l);
    EXPECT_EQ(max_abs_error(g.dk, gbase.dk), 0.0) << layout_name(l);
    EXPECT_EQ(max_abs_error(g.dv, gbase.dv), 0.0) << layout_name(l);
    EXPECT_EQ(max_abs_error(g.dmask, gbase.dmask), 0.0) << layout_name(l);
  }
  // K / V shared by both batch entries through a stride-0 expand equal their materialised copies.
  const Tensor k1 = c.k.slice(0, 0, 1), v1 = c.v.slice(0, 0, 1);
  const Tensor ke = k1.expand(c.k.shape()), ve = v1.expand(c.v.shape());
  EXPECT_EQ(ke.stride(0), 0);
  const AttentionResult a = run(c.q, ke, ve, o), b = run(c.q, ke.contiguous(), ve.contiguous(), o);
  EXPECT_EQ(max_abs_error(a.out, b.out), 0.0);
  const AttentionGrads ga = attention_backward(G, c.q, ke, ve, a.out, a.lse, o);
  const AttentionGrads gb =
      attention_backward(G, c.q, ke.contiguous(), ve.contiguous(), b.out, b.lse, o);
  EXPECT_EQ(max_abs_error(ga.dk, gb.dk), 0.0);
  EXPECT_EQ(max_abs_error(ga.dq, gb.dq), 0.0);
  // A mask given as a transposed view of its [.., Lk, Lq] storage.
  AttentionOptions ot = o;
  ot.mask = o.mask.transpose(1, 2).contiguous().transpose(1, 2);
  EXPECT_FALSE(ot.mask.is_contiguous());
  EXPECT_EQ(max_abs_error(run(c.q, c.k, c.v, ot).out, base.out), 0.0);
}

// [2, 3, H, L, D] with per-(2, 3) key lengths and a mask broadcast over the first batch dim equals
// the flattened [6, H, L, D] problem.
TEST(ReferenceEdge, SeveralLeadingBatchDims) {
  CaseSpec s;
  s.batch = {2, 3}, s.Hq = 2, s.Hkv = 1, s.key_lengths = true, s.mask = MaskType::add,
  s.mask_shape = {3, 1, 5, 7};
  s.alibi = true, s.dropout = 0.1;
  const Case c = make_case(s, 29);
  AttentionOptions o = c.o;
  o.mask_grad = true;
  const AttentionResult r = run(c.q, c.k, c.v, o);
  EXPECT_EQ(r.out.shape(), (Shape{2, 3, 2, 5, 3}));
  EXPECT_EQ(r.lse.shape(), (Shape{2, 3, 2, 5}));

  AttentionOptions of = o;
  of.key_lengths = o.key_lengths.reshape({6});
  of.mask = o.mask.unsqueeze(0).expand({2, 3, 1, 5, 7}).contiguous().view({6, 1, 5, 7});
  const Tensor qf = c.q.reshape({6, 2, 5, 4}), kf = c.k.reshape({6, 1, 7, 4}),
               vf = c.v.reshape({6, 1, 7, 3});
  const AttentionResult rf = run(qf, kf, vf, of);
  EXPECT_EQ(max_abs_error(r.out.reshape({6, 2, 5, 3}), rf.out), 0.0);
  EXPECT_EQ(max_abs_error(r.lse.reshape({6, 2, 5}), rf.lse), 0.0);

  const Tensor G = random_tensor(r.out.shape(), DType::f64, 9);
  const AttentionGrads g = attention_backward(G, c.q, c.k, c.v, r.out, r.lse, o);
  const AttentionGrads gf =
      attention_backward(G.reshape({6, 2, 5, 3}), qf, kf, vf, rf.out, rf.lse, of);
  EXPECT_EQ(max_abs_error(g.dq.reshape({6, 2, 5, 4}), gf.dq), 0.0);
  EXPECT_EQ(max_abs_error(g.dk.reshape({6, 1, 7, 4}), gf.dk), 0.0);
  // d(add mask) comes back in the mask's own shape [3, 1, 5, 7]: the sum over the first batch dim.
  ASSERT_EQ(g.dmask.shape(), (Shape{3, 1, 5, 7}));
  const Tensor dm6 = gf.dmask.view({2, 3, 1, 5, 7});
  Tensor summed = Tensor::zeros({3, 1, 5, 7}, DType::f64);
  for (int64_t a = 0; a < 2; ++a) {
    const std::vector<double> part = dm6.select(0, a).to_vector(), acc = summed.to_vector();
    std::vector<double> sum(acc.size());
    for (size_t e = 0; e < acc.size(); ++e) sum[e] = acc[e] + part[e];
    summed = Tensor::from_vector({3, 1, 5, 7}, sum, DType::f64);
  }
  EXPECT_LE(rel_error(g.dmask, summed), kTolF64);

  // No batch dims at all: [H, L, D] equals [1, H, L, D].
  const Tensor q3 = c.q.select(0, 0).select(0, 0), k3 = c.k.select(0, 0).select(0, 0),
               v3 = c.v.select(0, 0).select(0, 0);
  AttentionOptions o3;
  o3.backend = Backend::reference;
  const AttentionResult r3 = attention(q3, k3, v3, o3),
                        r4 = attention(q3.unsqueeze(0), k3.unsqueeze(0), v3.unsqueeze(0), o3);
  EXPECT_EQ(r3.out.shape(), (Shape{2, 5, 3}));
  EXPECT_EQ(max_abs_error(r3.out, r4.out.select(0, 0)), 0.0);
}

// Batch dims that cannot be merged into one stride, with a size-1 dim between them: [2, 1, 3, H, L,
// D] viewed from storage laid out as [3, 2, H, L, D] (so stride(0) != 3 * stride(2)). Inputs, mask
// and key lengths laid out this way must equal their contiguous copies.
TEST(ReferenceEdge, UnmergeableBatchDimsAroundASizeOneDim) {
  CaseSpec s;
  s.batch = {2, 1, 3}, s.Hq = 2, s.Hkv = 1, s.key_lengths = true, s.mask = MaskType::add,
  s.dropout = 0.2;
  const Case c = make_case(s, 43);
  // [2, 1, 3, ...] values stored as [3, 1, 2, ...] and viewed back: transpose(0, 2) of a contiguous
  // tensor.
  auto scrambled = [](const Tensor& t) {
    Tensor storage = t.transpose(0, 2).contiguous();
    return storage.transpose(0, 2);
  };
  const Tensor q = scrambled(c.q), k = scrambled(c.k), v = scrambled(c.v);
  ASSERT_NE(q.stride(0), q.stride(2) * q.size(2));
  AttentionOptions o = c.o;
  o.mask = scrambled(c.o.mask);
  o.mask_grad = true;
  AttentionOptions oc = c.o;
  oc.mask_grad = true;
  const AttentionResult a = run(q, k, v, o), b = run(c.q, c.k, c.v, oc);
  EXPECT_EQ(max_abs_error(a.out, b.out), 0.0);
  EXPECT_EQ(max_abs_error(a.lse, b.lse), 0.0);
  const Tensor G = random_tensor(b.out.shape(), DType::f64, 10);
  const AttentionGrads ga =
      attention_backward(scrambled(G), q, k, v, scrambled(a.out), scrambled(a.lse), o);
  const AttentionGrads gb = attention_backward(G, c.q, c.k, c.v, b.out, b.lse, oc);
  EXPECT_EQ(max_abs_error(ga.dq, gb.dq), 0.0);
  EXPECT_EQ(max_abs_error(ga.dk, gb.dk), 0.0);
  EXPECT_EQ(max_abs_error(ga.dv, gb.dv), 0.0);
  EXPECT_EQ(max_abs_error(ga.dmask, gb.dmask), 0.0);
}

// Dropout with q = 0 and v = identity (Lk = Dv): out[i][j] = z_ij / (Lk (1 - p)), so out shows the
// pattern.
TEST(ReferenceEdge, DropoutKeepsAboutOneMinusP) {
  const int64_t H = 2, L = 64;
  const double p = 0.3;
  const Tensor q = Tensor::zeros({1, H, L, 4}, DType::f64),
               k = random_tensor({1, H, L, 4}, DType::f64, 1);
  Tensor v = Tensor::zeros({1, H, L, L}, DType::f64);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t j = 0; j < L; ++j) v.set({0, h, j, j}, 1.0);
  }
  AttentionOptions o;
  o.backend = Backend::reference;
  o.dropout_p = p;
  o.seed = 1234;
  const AttentionResult r = attention(q, k, v, o);
  const contract::DropoutRule rule{p, 1234};
  int64_t kept = 0;
  const double kept_value = 1.0 / (static_cast<double>(L) * (1.0 - p));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j < L; ++j) {
        const double x = r.out.at({0, h, i, j});
        const bool keep = rule.keep(0, h, i, j);
        ASSERT_NEAR(x, keep ? kept_value : 0.0, 1e-15) << h << " " << i << " " << j;
        kept += keep;
      }
    }
  }
  // n = 8192 Bernoulli(0.7) draws: the standard deviation of the count is sqrt(n p (1 - p)) = 41.5;
  // allow 5 of them.
  const double n = static_cast<double>(H * L * L);
  EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5.0 * std::sqrt(n * p * (1.0 - p)));
}

TEST(ReferenceEdge, DropoutIsDeterministicPerSeed) {
  CaseSpec s;
  s.Hq = 4, s.Hkv = 2, s.dropout = 0.4, s.Lq = 6, s.Lk = 9;
  const Case c = make_case(s, 37);
  AttentionOptions o = c.o;
  const AttentionResult a = run(c.q, c.k, c.v, o), b = run(c.q, c.k, c.v, o);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(a.weights, b.weights));
  const Tensor G = random_tensor(a.out.shape(), DType::f64, 1);
  EXPECT_TRUE(bitwise_equal(attention_backward(G, c.q, c.k, c.v, a.out, a.lse, o).dk,
                            attention_backward(G, c.q, c.k, c.v, b.out, b.lse, o).dk));
  AttentionOptions o2 = o;
  o2.seed = o.seed + 1;
  const AttentionResult d = run(c.q, c.k, c.v, o2);
  EXPECT_GT(max_abs_error(d.out, a.out), 1e-3);
  EXPECT_TRUE(bitwise_equal(d.weights, a.weights));  // weights are before dropout
  EXPECT_TRUE(bitwise_equal(d.lse, a.lse));
  // p = 0 is exactly no dropout.
  AttentionOptions none = o;
  none.dropout_p = 0.0;
  const AttentionResult n = run(c.q, c.k, c.v, none);
  AttentionOptions none2 = none;
  none2.seed = 99;
  EXPECT_TRUE(bitwise_equal(n.out, run(c.q, c.k, c.v, none2).out));
  EXPECT_GT(max_abs_error(n.out, a.out), 1e-3);
}

TEST(ReferenceEdge, WeightsOnlyWhenAskedInOutputDtype) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    CaseSpec s;
    s.dtype = dt;
    const Case c = make_case(s, 41);
    AttentionOptions o = c.o;
    EXPECT_FALSE(attention(c.q, c.k, c.v, o).weights.defined());
    o.return_weights = true;
    const AttentionResult r = attention(c.q, c.k, c.v, o);
    EXPECT_EQ(r.weights.dtype(), dt);
    EXPECT_EQ(r.weights.shape(), (Shape{2, 2, 5, 7}));
    EXPECT_EQ(r.lse.dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
    EXPECT_EQ(r.out.dtype(), dt);
  }
}

}  // namespace
}  // namespace attn::test
