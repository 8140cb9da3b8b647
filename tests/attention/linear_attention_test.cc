// attn::linear_attention / linear_attention_backward (include/attn/linear_attention.h): values
// against the O(L^2) formula in double, gradients by finite differences in f64, f32 against f64,
// padding (key_lengths, key_keep, empty rows), layouts and thread counts, and every rejection.
#include "attn/linear_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/expect_error.h"
#include "test_util.h"

namespace attn::test {
namespace {

struct Shape4 {
  int64_t B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 6, D = 3, Dv = 4;
};

struct Problem {
  Tensor q, k, v, dout;
};

// Values in [-2, 2]: both branches of phi (x > 0 and x <= 0) are taken often.
Problem make_problem(const Shape4& s, DType dt, uint64_t seed) {
  return {random_tensor({s.B, s.Hq, s.Lq, s.D}, dt, seed, -2.0, 2.0),
          random_tensor({s.B, s.Hkv, s.Lk, s.D}, dt, seed + 1, -2.0, 2.0),
          random_tensor({s.B, s.Hkv, s.Lk, s.Dv}, dt, seed + 2, -1.0, 1.0),
          random_tensor({s.B, s.Hq, s.Lq, s.Dv}, dt, seed + 3, -1.0, 1.0)};
}

// The feature map written differently from the library's: elu(x) + 1 with elu(x) = expm1(x), x <= 0.
double phi_formula(double x) {
  return (x > 0 ? x : std::expm1(x)) + 1.0;
}

// The keys used, [B][Lk], from the options (true when neither padding option is given).
std::vector<std::vector<bool>> used_keys(const LinearAttentionOptions& o, int64_t B, int64_t Lk) {
  std::vector<std::vector<bool>> used(B, std::vector<bool>(Lk, true));
  const std::vector<double> len =
      o.key_lengths.defined() ? o.key_lengths.to_vector() : std::vector<double>();
  const std::vector<double> keep =
      o.key_keep.defined() ? o.key_keep.to_vector() : std::vector<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Lk; ++j) {
      if (!len.empty() && j >= static_cast<int64_t>(len[b])) used[b][j] = false;
      if (!keep.empty() && keep[b * Lk + j] == 0.0) used[b][j] = false;
    }
  return used;
}

// out[b, h, i] = sum_{j in K(i)} (phi(q_i) . phi(k_j)) v_j / sum_{j in K(i)} phi(q_i) . phi(k_j),
// 0 when K(i) is empty; K(i) = the used keys with j <= p(i) under causal. Quadratic, in double.
Tensor formula(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
               const LinearAttentionOptions& o) {
  const int64_t B = q_in.size(0), Hq = q_in.size(1), Lq = q_in.size(2), D = q_in.size(3);
  const int64_t Hkv = k_in.size(1), Lk = k_in.size(2), Dv = v_in.size(3);
  const std::vector<double> q = q_in.to_vector(), k = k_in.to_vector(), v = v_in.to_vector();
  const auto used = used_keys(o, B, Lk);
  const int64_t offset = o.align == Align::bottom_right ? Lk - Lq : 0;
  Tensor out = Tensor::zeros({B, Hq, Lq, Dv}, DType::f64);
  double* op = out.data_as<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < Lq; ++i) {
        double den = 0;
        std::vector<double> num(Dv, 0.0);
        for (int64_t j = 0; j < Lk; ++j) {
          if (!used[b][j] || (o.causal && j > i + offset)) continue;
          double w = 0;
          for (int64_t a = 0; a < D; ++a) {
            w += phi_formula(q[((b * Hq + h) * Lq + i) * D + a]) *
                 phi_formula(k[((b * Hkv + hk) * Lk + j) * D + a]);
          }
          den += w;
          for (int64_t c = 0; c < Dv; ++c) num[c] += w * v[((b * Hkv + hk) * Lk + j) * Dv + c];
        }
        for (int64_t c = 0; c < Dv; ++c)
          op[((b * Hq + h) * Lq + i) * Dv + c] = den > 0 ? num[c] / den : 0.0;
      }
    }
  return out;
}

std::string describe(const Shape4& s, const LinearAttentionOptions& o) {
  return "B " + std::to_string(s.B) + " Hq " + std::to_string(s.Hq) + " Hkv " +
         std::to_string(s.Hkv) + " Lq " + std::to_string(s.Lq) + " Lk " + std::to_string(s.Lk) +
         " D " + std::to_string(s.D) + " Dv " + std::to_string(s.Dv) +
         (o.causal ? (o.align == Align::top_left ? " causal top-left" : " causal bottom-right")
                   : "") +
         (o.key_lengths.defined() ? " key_lengths" : "") +
         (o.key_keep.defined() ? " key_keep" : "");
}

// The shapes every option runs on: square, Lq < Lk, Lq > Lk (the two alignments differ), MHA and
// GQA / MQA groups, Dv != D.
std::vector<Shape4> shapes() {
  return {
      {2, 4, 2, 5, 5, 3, 4}, {2, 4, 2, 4, 7, 3, 2}, {1, 3, 1, 7, 4, 2, 5}, {3, 2, 2, 6, 6, 4, 3}};
}

std::vector<LinearAttentionOptions> option_sets(const Shape4& s) {
  std::vector<LinearAttentionOptions> sets;
  for (bool causal : {false, true})
    for (Align a : {Align::bottom_right, Align::top_left}) {
      if (!causal && a == Align::top_left) continue;  // align matters under causal only
      LinearAttentionOptions o;
      o.causal = causal, o.align = a;
      sets.push_back(o);
      // Padding: random keys dropped, and lengths Lk - 2, then 0 (no key at all) and Lk.
      LinearAttentionOptions p = o;
      p.key_keep = random_bool({s.B, s.Lk}, 0.7, 11);
      sets.push_back(p);
      std::vector<double> len;
      for (int64_t b = 0; b < s.B; ++b) len.push_back(b == 0 ? s.Lk - 2 : b == 1 ? 0 : s.Lk);
      LinearAttentionOptions l = o;
      l.key_lengths = Tensor::from_vector({s.B}, len, DType::i64);
      sets.push_back(l);
      l.key_keep = p.key_keep;  // both: a key is used when both keep it
      sets.push_back(l);
    }
  return sets;
}

TEST(LinearAttention, ValuesMatchTheFormula) {
  for (const Shape4& s : shapes())
    for (const LinearAttentionOptions& o : option_sets(s)) {
      const Problem p = make_problem(s, DType::f64, 5);
      const Tensor out = linear_attention(p.q, p.k, p.v, o);
      ASSERT_EQ(out.dtype(), DType::f64);
      const Tensor expect = formula(p.q, p.k, p.v, o);
      EXPECT_GT(max_abs(expect), 0.0) << describe(s, o);
      EXPECT_LE(rel_error(out, expect), kTolF64) << describe(s, o);
    }
}

// L = <G, out>: dL/dq, dk, dv against central differences, every element.
TEST(LinearAttention, GradientsMatchFiniteDifferences) {
  for (const Shape4& s : shapes())
    for (const LinearAttentionOptions& o : option_sets(s)) {
      const Problem p = make_problem(s, DType::f64, 7);
      const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, p.k, p.v, o);
      auto loss = [&](const std::vector<Tensor>& in) {
        return dot_all(linear_attention(in[0], in[1], in[2], o), p.dout);
      };
      const GradcheckReport rep = gradcheck(loss, {p.q, p.k, p.v}, {g.dq, g.dk, g.dv});
      EXPECT_EQ(rep.checked, p.q.numel() + p.k.numel() + p.v.numel());
      EXPECT_GT(rep.max_abs_grad, 0.0) << describe(s, o);
      EXPECT_LE(rep.relative(), kGradcheckTol) << describe(s, o) << "\nworst: " << rep.worst;
    }
}

// f32 inputs compute in double and round once: within the f32 bounds of the f64 result on the same
// (rounded) values.
TEST(LinearAttention, F32MatchesF64) {
  for (const Shape4& s : shapes())
    for (const LinearAttentionOptions& o : option_sets(s)) {
      const Problem p = make_problem(s, DType::f32, 9);
      const Tensor out = linear_attention(p.q, p.k, p.v, o);
      ASSERT_EQ(out.dtype(), DType::f32);
      EXPECT_LE(rel_error(out, linear_attention(to_f64(p.q), to_f64(p.k), to_f64(p.v), o)),
                kTolF32Forward)
          << describe(s, o);
      const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, p.k, p.v, o);
      const LinearAttentionGrads g64 =
          linear_attention_backward(to_f64(p.dout), to_f64(p.q), to_f64(p.k), to_f64(p.v), o);
      ASSERT_EQ(g.dq.dtype(), DType::f32);
      EXPECT_LE(rel_error(g.dq, g64.dq), kTolF32Grad) << describe(s, o);
      EXPECT_LE(rel_error(g.dk, g64.dk), kTolF32Grad) << describe(s, o);
      EXPECT_LE(rel_error(g.dv, g64.dv), kTolF32Grad) << describe(s, o);
    }
}

// A batch row with no usable key (key_lengths 0, or key_keep all false) gives out 0 and zero
// gradients, and the other batch rows are what they are alone.
TEST(LinearAttention, FullyPaddedBatchRowGivesZeros) {
  const Shape4 s{3, 4, 2, 5, 6, 3, 4};
  const Problem p = make_problem(s, DType::f64, 13);
  for (bool causal : {false, true}) {
    LinearAttentionOptions by_len, by_keep;
    by_len.causal = by_keep.causal = causal;
    by_len.key_lengths = Tensor::from_vector({3}, {6, 0, 4}, DType::i32);
    std::vector<double> keep(3 * 6, 1.0);
    for (int j = 0; j < 6; ++j) keep[6 + j] = 0.0;
    for (int j = 4; j < 6; ++j) keep[12 + j] = 0.0;
    by_keep.key_keep = Tensor::from_vector({3, 6}, keep, DType::boolean);
    const Tensor out = linear_attention(p.q, p.k, p.v, by_len);
    EXPECT_TRUE(bitwise_equal(out, linear_attention(p.q, p.k, p.v, by_keep)));
    EXPECT_TRUE(all_equal(out.slice(0, 1, 2), 0.0));
    EXPECT_GT(max_abs(out.slice(0, 0, 1)), 0.0);
    const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, p.k, p.v, by_len);
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) {
      EXPECT_TRUE(all_equal(t->slice(0, 1, 2), 0.0));
      EXPECT_GT(max_abs(t->slice(0, 2, 3)), 0.0);
    }
    // Batch 2 alone with its first 4 keys: the same values.
    LinearAttentionOptions alone;
    alone.causal = causal;
    const Tensor k2 = p.k.slice(0, 2, 3).slice(2, 0, 4), v2 = p.v.slice(0, 2, 3).slice(2, 0, 4);
    if (!causal) {  // (bottom-right causal moves with Lk)
      EXPECT_LE(rel_error(out.slice(0, 2, 3), linear_attention(p.q.slice(0, 2, 3), k2, v2, alone)),
                kTolF64);
    }
  }
}

// Rows before the first key (causal bottom-right with Lq > Lk) and Lk == 0 are empty: zeros.
TEST(LinearAttention, RowsWithoutKeysGiveZeros) {
  const Shape4 s{1, 2, 1, 6, 3, 2, 2};
  const Problem p = make_problem(s, DType::f64, 17);
  LinearAttentionOptions o;
  o.causal = true;  // bottom-right: query i sits at i - 3, queries 0..2 see no key
  const Tensor out = linear_attention(p.q, p.k, p.v, o);
  EXPECT_TRUE(all_equal(out.slice(2, 0, 3), 0.0));
  EXPECT_GT(max_abs(out.slice(2, 3, 4)), 0.0);
  const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, p.k, p.v, o);
  EXPECT_TRUE(all_equal(g.dq.slice(2, 0, 3), 0.0));

  const Tensor k0 = Tensor::zeros({1, 1, 0, 2}, DType::f64),
               v0 = Tensor::zeros({1, 1, 0, 2}, DType::f64);
  for (bool causal : {false, true}) {
    o.causal = causal;
    const Tensor empty = linear_attention(p.q, k0, v0, o);
    EXPECT_EQ(empty.shape(), (Shape{1, 2, 6, 2}));
    EXPECT_TRUE(all_equal(empty, 0.0));
    EXPECT_TRUE(all_equal(linear_attention_backward(p.dout, p.q, k0, v0, o).dq, 0.0));
  }
  // No heads at all: empty results, no division by Hkv = 0.
  const Tensor q0 = Tensor::zeros({2, 0, 3, 2}, DType::f32),
               kv0 = Tensor::zeros({2, 0, 4, 2}, DType::f32);
  EXPECT_EQ(linear_attention(q0, kv0, kv0).shape(), (Shape{2, 0, 3, 2}));
  EXPECT_EQ(linear_attention_backward(q0, q0, kv0, kv0).dk.shape(), kv0.shape());
}

// A padded key never touches the results, even when its key or value is NaN.
TEST(LinearAttention, PaddedKeysAreSkippedNotMultipliedByZero) {
  const Shape4 s{2, 2, 2, 4, 5, 3, 3};
  const Problem p = make_problem(s, DType::f64, 19);
  LinearAttentionOptions o;
  o.key_lengths = Tensor::from_vector({2}, {3, 5}, DType::i64);
  Tensor k = p.k.clone(), v = p.v.clone();
  k.slice(0, 0, 1).slice(2, 3, 5).copy_from(
      Tensor::full({1, 2, 2, 3}, std::numeric_limits<double>::quiet_NaN(), DType::f64));
  v.slice(0, 0, 1).slice(2, 4, 5).copy_from(
      Tensor::full({1, 2, 1, 3}, std::numeric_limits<double>::infinity(), DType::f64));
  EXPECT_TRUE(bitwise_equal(linear_attention(p.q, k, v, o), linear_attention(p.q, p.k, p.v, o)));
  const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, k, v, o);
  EXPECT_TRUE(all_finite(g.dq) && all_finite(g.dk) && all_finite(g.dv));
  EXPECT_TRUE(bitwise_equal(g.dq, linear_attention_backward(p.dout, p.q, p.k, p.v, o).dq));
}

// Any layout gives the contiguous result bit for bit, and so does any thread count.
TEST(LinearAttention, LayoutsAndThreadsDoNotChangeTheBits) {
  const Shape4 s{2, 4, 2, 9, 7, 5, 3};
  const Problem p = make_problem(s, DType::f32, 23);
  LinearAttentionOptions o;
  o.causal = true;
  o.key_keep = random_bool({2, 7}, 0.8, 3);
  o.threads = 1;
  const Tensor out = linear_attention(p.q, p.k, p.v, o);
  const LinearAttentionGrads g = linear_attention_backward(p.dout, p.q, p.k, p.v, o);
  for (Layout l : {Layout::padded, Layout::transposed, Layout::strided}) {
    const Tensor q = with_layout(p.q, l), k = with_layout(p.k, l), v = with_layout(p.v, l);
    const Tensor dout = with_layout(p.dout, l);
    EXPECT_TRUE(bitwise_equal(linear_attention(q, k, v, o), out)) << layout_name(l);
    const LinearAttentionGrads gl = linear_attention_backward(dout, q, k, v, o);
    EXPECT_TRUE(bitwise_equal(gl.dq, g.dq) && bitwise_equal(gl.dk, g.dk) &&
                bitwise_equal(gl.dv, g.dv))
        << layout_name(l);
  }
  o.threads = 3;
  EXPECT_TRUE(bitwise_equal(linear_attention(p.q, p.k, p.v, o), out));
  EXPECT_TRUE(bitwise_equal(linear_attention_backward(p.dout, p.q, p.k, p.v, o).dk, g.dk));
}

// Forward and backward share the validation: each case goes through both.
void expect_both(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& o,
                 std::initializer_list<std::string> parts) {
  expect_error([&] { linear_attention(q, k, v, o); }, "attn::linear_attention", parts);
  const Tensor dout = Tensor::zeros({2, 4, 3, 7}, DType::f32);
  expect_error([&] { linear_attention_backward(dout, q, k, v, o); },
               "attn::linear_attention_backward", parts);
}

TEST(LinearAttention, RejectsBadArgumentsNamingThem) {
  const Tensor q = random_tensor({2, 4, 3, 5}, DType::f32, 1);
  const Tensor k = random_tensor({2, 2, 6, 5}, DType::f32, 2);
  const Tensor v = random_tensor({2, 2, 6, 7}, DType::f32, 3);
  const LinearAttentionOptions none;
  expect_both(Tensor(), k, v, none, {"q is undefined"});
  expect_both(q, k, Tensor(), none, {"v is undefined"});
  expect_both(q.to(DType::bf16), k, v, none, {"q must be f32 or f64", "bf16", "[2, 4, 3, 5]"});
  expect_both(q, k.to(DType::i32), v, none, {"k must be f32 or f64", "i32", "[2, 2, 6, 5]"});
  expect_both(q, k.to(DType::f64), v, none, {"share one dtype", "q f32 [2, 4, 3, 5]", "k f64"});
  expect_both(q.view({8, 3, 5}), k, v, none, {"q must be 4-D", "[8, 3, 5]"});
  expect_both(q, k, v.unsqueeze(0), none, {"v must be 4-D", "[1, 2, 2, 6, 7]"});
  expect_both(q, k.slice(0, 0, 1), v.slice(0, 0, 1), none,
              {"leading batch dims", "q [2, 4, 3, 5]", "k [1, 2, 6, 5]"});
  expect_both(q, k.slice(3, 0, 4), v, none, {"same head dim", "q [2, 4, 3, 5]", "k [2, 2, 6, 4]"});
  expect_both(q, k, v.slice(2, 0, 5), none, {"k and v", "k [2, 2, 6, 5]", "v [2, 2, 5, 7]"});
  expect_both(q, k.slice(1, 0, 1).expand({2, 3, 6, 5}), v.slice(1, 0, 1).expand({2, 3, 6, 7}), none,
              {"query heads (4)", "key/value heads (3)", "q [2, 4, 3, 5]", "k [2, 3, 6, 5]"});
  expect_both(q, k.slice(1, 0, 0), v.slice(1, 0, 0), none, {"key/value heads (0)"});

  LinearAttentionOptions o;
  o.key_lengths = Tensor::from_vector({2}, {3, 4}, DType::f32);
  expect_both(q, k, v, o, {"key_lengths must be i32 or i64", "f32", "[2]"});
  o.key_lengths = Tensor::from_vector({3}, {3, 4, 5}, DType::i64);
  expect_both(q, k, v, o, {"key_lengths of shape [3]", "[2]"});
  o.key_lengths = Tensor::from_vector({2}, {3, 7}, DType::i64);
  expect_both(q, k, v, o, {"key_lengths[1] = 7", "[0, Lk = 6]"});
  o.key_lengths = Tensor::from_vector({2}, {-1, 2}, DType::i32);
  expect_both(q, k, v, o, {"key_lengths[0] = -1"});
  o.key_lengths = Tensor();
  o.key_keep = Tensor::full({2, 6}, 1.0, DType::f32);
  expect_both(q, k, v, o, {"key_keep must be bool [B = 2, Lk = 6]", "f32 with shape [2, 6]"});
  o.key_keep = Tensor::full({2, 5}, 1.0, DType::boolean);
  expect_both(q, k, v, o, {"key_keep must be bool [B = 2, Lk = 6]", "bool with shape [2, 5]"});
  o.key_keep = Tensor::full({2, 1, 6}, 1.0, DType::boolean);
  expect_both(q, k, v, o, {"key_keep", "[2, 1, 6]"});

  const char* bwd = "attn::linear_attention_backward";
  expect_error([&] { linear_attention_backward(Tensor(), q, k, v); }, bwd,
               {"dout must be f32 [2, 4, 3, 7]", "undefined"});
  expect_error(
      [&] {
        linear_attention_backward(Tensor::zeros({2, 4, 3, 5}, DType::f32), q, k, v);
      },
      bwd, {"dout must be f32 [2, 4, 3, 7]", "got f32 [2, 4, 3, 5]"});
  expect_error(
      [&] {
        linear_attention_backward(Tensor::zeros({2, 4, 3, 7}, DType::f64), q, k, v);
      },
      bwd, {"dout must be f32 [2, 4, 3, 7]", "got f64 [2, 4, 3, 7]"});
}

}  // namespace
}  // namespace attn::test
