// Autocast (mixed-precision training, attn/nn/module.h): the backward's bf16 products against double
// on every stored layout; f32 modules under autocast against the bf16 modules (forward) and against
// double references of the same bf16 values (backward); gradients of whole layers against their f32
// selves; the mode's scope (per forward, kept by the backward, ignored by f64, position schemes in
// f32).
#include <gtest/gtest.h>

#include "attn/nn.h"
#include "attn/threads.h"
#include "nn/bf16.h"
#include "nn/nn_test_util.h"
#include "nn/ops.h"
#include "test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;
using testing::rel_error;

constexpr double kBf16Eps = 1.0 / 256;

const char* path() {
  return detail::bf16_gemm_native() ? "onednn" : "f32";
}

// x as double values of its bf16 rounding (what the bf16 products read).
std::vector<double> rounded(const Tensor& x) {
  return x.to(DType::bf16).to_vector();
}

// c = op(a) op(b) (+ c0) in double on the stored layouts of product_bf16.
std::vector<double> reference_product(const std::vector<double>& a, bool a_km,
                                      const std::vector<double>& b, bool b_nk, int64_t M, int64_t N,
                                      int64_t K, const std::vector<double>* c0) {
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = c0 ? (*c0)[m * N + n] : 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += a[a_km ? k * M + m : m * K + k] * b[b_nk ? n * K + k : k * N + n];
      c[m * N + n] = s;
    }
  }
  return c;
}

TEST(Autocast, ProductsOnEveryLayoutAgreeWithDouble) {
  const int64_t M = 37, N = 45, K = 131;
  for (bool a_km : {false, true}) {
    for (bool b_nk : {false, true}) {
      for (int out : {0, 1, 2}) {  // f32, bf16, f32 accumulated
        const Tensor a = random_tensor({M * K}, 1, DType::bf16),
                     b = random_tensor({K * N}, 2, DType::bf16),
                     c0 = random_tensor({M * N}, 3, DType::f32);
        Tensor c = out == 1 ? Tensor::empty({M * N}, DType::bf16) : c0.clone();
        detail::product_bf16({.M = M,
                              .N = N,
                              .K = K,
                              .a = a.data_as<uint16_t>(),
                              .a_km = a_km,
                              .b = b.data_as<uint16_t>(),
                              .b_nk = b_nk,
                              .c32 = out == 1 ? nullptr : c.data_as<float>(),
                              .c16 = out == 1 ? c.data_as<uint16_t>() : nullptr,
                              .accumulate = out == 2});
        const std::vector<double> c0v = c0.to_vector();
        const std::vector<double> want = reference_product(a.to_vector(), a_km, b.to_vector(), b_nk,
                                                           M, N, K, out == 2 ? &c0v : nullptr);
        const std::vector<double> got = c.to_vector();
        for (size_t i = 0; i < got.size(); ++i) {
          // f32 accumulation over K terms of magnitude <= 1, plus one bf16 rounding for c16.
          const double tol = K * 1.2e-7 * 2 + (out == 1 ? kBf16Eps * std::abs(want[i]) : 0.0);
          ASSERT_NEAR(got[i], want[i], tol)
              << path() << " a_km " << a_km << " b_nk " << b_nk << " out " << out << " at " << i;
        }
      }
    }
  }
}

// Under autocast an f32 Linear computes what the bf16 Linear computes on its weights' bf16 copies,
// bit for bit; its backward gives dx = dy W, dW += dy^T x, db += sum dy on the bf16 values (f32
// accumulation), dx in the input's dtype; a second backward accumulates; the parameters stay f32.
TEST(Autocast, LinearForwardIsTheBf16LinearAndBackwardIsExactUpToF32Accumulation) {
  manual_seed(3);
  const int64_t in = 67, out = 45, rows = 33;
  Linear l32(in, out, true, DType::f32), l16(in, out, true, DType::bf16);
  l16.load_state_dict(l32.state_dict());
  for (DType xt : {DType::bf16, DType::f32}) {
    const Tensor x = random_tensor({3, 11, in}, 4, xt);
    Tensor y;
    {
      const Autocast on;
      y = l32.forward(x);
    }
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_TRUE(test::bitwise_equal(y, l16.forward(x))) << path();
    EXPECT_EQ(l32.weight().value.dtype(), DType::f32);
    // The backward runs outside autocast, as torch's does: the forward's mode decides.
    const Tensor dy = random_tensor({3, 11, out}, 5, DType::f32);
    l32.zero_grad();
    const Tensor dx = l32.backward(dy);
    EXPECT_EQ(dx.dtype(), xt);
    EXPECT_EQ(dx.shape(), x.shape());
    const std::vector<double> xr = rounded(x), dyr = rounded(dy), w = rounded(l32.weight().value);
    const std::vector<double> dx_want =
        reference_product(dyr, false, w, false, rows, in, out, nullptr);
    const std::vector<double> dw_want =
        reference_product(dyr, true, xr, false, out, in, rows, nullptr);
    const std::vector<double> dx_got = dx.to_vector(), dw_got = l32.weight().grad.to_vector();
    for (size_t i = 0; i < dx_got.size(); ++i) {
      ASSERT_NEAR(dx_got[i], dx_want[i],
                  out * 3e-7 + (xt == DType::bf16 ? kBf16Eps * std::abs(dx_want[i]) : 0.0))
          << i;
    }
    for (size_t i = 0; i < dw_got.size(); ++i) ASSERT_NEAR(dw_got[i], dw_want[i], rows * 3e-7) << i;
    // db from dy before its rounding (f32 sums of the f32 gradient).
    const std::vector<double> dyv = dy.to_vector(), db = l32.bias()->grad.to_vector();
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t n = 0; n < rows; ++n) s += dyv[n * out + o];
      ASSERT_NEAR(db[o], s, rows * 1e-7) << o;
    }
    // Accumulates: a second forward + backward doubles the gradient.
    {
      const Autocast on;
      l32.forward(x);
    }
    l32.backward(dy);
    const std::vector<double> dw2 = l32.weight().grad.to_vector();
    for (size_t i = 0; i < dw2.size(); ++i)
      ASSERT_NEAR(dw2[i], 2 * dw_got[i], rows * 6e-7) << "dW accumulates, at " << i;
  }
}

// Under autocast an f32 LayerNorm is the bf16 LayerNorm (bit for bit, on bf16-valued weights: its f32
// weights are read as they are) and keeps f32 statistics; its backward is the f32 module's backward of
// the same bf16 inputs, dx rounded once to the input's dtype.
TEST(Autocast, LayerNormOutputsBf16AndBacksOffTheSameStatistics) {
  manual_seed(7);
  LayerNorm n32(83, 1e-5, true, true, DType::f32), n16(83, 1e-5, true, true, DType::bf16),
      ref(83, 1e-5, true, true, DType::f32);
  n16.load_state_dict({{"weight", random_tensor({83}, 8, DType::f32)},
                       {"bias", random_tensor({83}, 9, DType::f32)}});
  n32.load_state_dict(n16.state_dict());
  ref.load_state_dict(n16.state_dict());
  const Tensor x = random_tensor({5, 83}, 10, DType::bf16, -3, 5),
               r = random_tensor({5, 83}, 11, DType::f32);
  Tensor y;
  {
    const Autocast on;
    y = n32.forward_residual(x, r);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(y, n16.forward_residual(x, r)));
  const Tensor dy = random_tensor({5, 83}, 12, DType::bf16), dy2 = random_tensor({5, 83}, 13);
  const Tensor dx = n32.backward_sum(dy, dy2);
  EXPECT_EQ(dx.dtype(), DType::bf16);
  ref.forward_residual(x, r);
  const Tensor dx_ref = ref.backward_sum(dy.to(DType::f32), dy2.to(DType::f32));
  EXPECT_TRUE(test::bitwise_equal(dx, dx_ref.to(DType::bf16)));
  EXPECT_TRUE(test::bitwise_equal(n32.named_parameters()[0].grad, ref.named_parameters()[0].grad));
}

// bf16 through Dropout: the f32 pattern and product, rounded once; the backward scales alike and
// returns bf16.
TEST(Autocast, DropoutTakesBf16) {
  Dropout d32(0.3), d16(0.3);
  d32.manual_seed(5);
  d16.manual_seed(5);
  const Tensor x = random_tensor({7, 19}, 14, DType::bf16);
  const Tensor y16 = d16.forward(x), y32 = d32.forward(x.to(DType::f32));
  EXPECT_EQ(y16.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(y16, y32.to(DType::bf16)));
  EXPECT_GT(testing::max_abs(y16), 1.0);  // scaled by 1 / 0.7 somewhere
  const Tensor dx = d16.backward(x);
  EXPECT_EQ(dx.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(dx, y16));
}

TransformerLayerOptions layer_options(bool norm_first, Activation act) {
  TransformerLayerOptions o;
  o.d_model = 48;
  o.nhead = 4;
  o.dim_feedforward = 96;
  o.dropout = 0.0;
  o.activation = act;
  o.batch_first = true;
  o.norm_first = norm_first;
  return o;
}

// Every gradient of an encoder layer trained under autocast against the same layer in f32: within
// bf16's error (a few roundings on the way), and not the f32 gradients themselves (the rounding
// happens). The input's gradient comes back in its dtype.
TEST(Autocast, EncoderLayerGradientsAreWithinBf16OfF32) {
  for (bool norm_first : {false, true}) {
    manual_seed(11);
    TransformerEncoderLayer e(layer_options(norm_first, Activation::gelu));
    const Tensor x = random_tensor({3, 13, 48}, 12, DType::f32);
    const Tensor dy = random_tensor({3, 13, 48}, 13, DType::f32);
    EncoderMasks m;
    m.src_key_padding_mask = Tensor::zeros({3, 13}, DType::boolean);
    for (int j = 9; j < 13; ++j) m.src_key_padding_mask.data_as<bool>()[2 * 13 + j] = true;
    e.zero_grad();
    const Tensor y32 = e.forward(x, m);
    const Tensor dx32 = e.backward(dy);
    std::vector<Tensor> g32;
    for (const auto& p : e.named_parameters()) g32.push_back(p.grad.clone());
    e.zero_grad();
    Tensor y16;
    {
      const Autocast on;
      y16 = e.forward(x, m);
    }
    const Tensor dx16 = e.backward(dy);
    EXPECT_EQ(y16.dtype(), norm_first ? DType::f32 : DType::bf16);  // f32 x + bf16 sublayers: f32
    EXPECT_EQ(dx16.dtype(), DType::f32);
    EXPECT_LE(rel_error(y16, y32), 8 * kBf16Eps);
    EXPECT_LE(rel_error(dx16, dx32), 8 * kBf16Eps) << "norm_first " << norm_first;
    EXPECT_GT(rel_error(dx16, dx32), 1e-4);
    size_t i = 0;
    for (const auto& p : e.named_parameters()) {
      const double err = rel_error(p.grad, g32[i++]);
      EXPECT_LE(err, 8 * kBf16Eps) << p.name << " norm_first " << norm_first;
      // (The last bias before the output sums the f32 dy itself: exact.)
      if (p.name.ends_with("weight")) {
        EXPECT_GT(err, 1e-5) << p.name << " ran in f32";
      }
      EXPECT_EQ(p.value.dtype(), DType::f32);
    }
  }
}

// A decoder layer (causal self-attention, cross-attention to a memory, both norm orders) under
// autocast: its tgt and memory gradients and every parameter's within bf16 of f32.
TEST(Autocast, DecoderLayerGradientsAreWithinBf16OfF32) {
  for (bool norm_first : {false, true}) {
    manual_seed(31);
    TransformerDecoderLayer d(layer_options(norm_first, Activation::gelu));
    const Tensor tgt = random_tensor({2, 9, 48}, 32, DType::f32),
                 mem = random_tensor({2, 14, 48}, 33, DType::bf16),
                 dy = random_tensor({2, 9, 48}, 34, DType::f32);
    DecoderMasks m;
    m.tgt_is_causal = true;
    d.forward(tgt, mem, m);
    const DecoderGrads g32 = d.backward(dy);
    std::vector<Tensor> p32;
    for (const auto& p : d.named_parameters()) p32.push_back(p.grad.clone());
    d.zero_grad();
    {
      const Autocast on;
      d.forward(tgt, mem, m);
    }
    const DecoderGrads g16 = d.backward(dy);
    EXPECT_EQ(g16.dtgt.dtype(), DType::f32);
    EXPECT_EQ(g16.dmemory.dtype(), DType::bf16);
    EXPECT_LE(rel_error(g16.dtgt, g32.dtgt), 8 * kBf16Eps) << "norm_first " << norm_first;
    EXPECT_LE(rel_error(g16.dmemory, g32.dmemory), 8 * kBf16Eps) << "norm_first " << norm_first;
    EXPECT_GT(rel_error(g16.dmemory, g32.dmemory), 1e-4);
    size_t i = 0;
    for (const auto& p : d.named_parameters()) {
      EXPECT_LE(rel_error(p.grad, p32[i++]), 8 * kBf16Eps)
          << p.name << " norm_first " << norm_first;
    }
  }
}

// The thread count changes no bit of an autocast step (outputs and every gradient), as in f32.
TEST(Autocast, ThreadCountChangesNoBit) {
  std::vector<std::vector<double>> runs[2];
  for (int t = 0; t < 2; ++t) {
    set_num_threads(t == 0 ? 1 : 3);
    manual_seed(29);
    TransformerEncoderLayer e(layer_options(false, Activation::gelu));
    // 1200 rows: several row chunks and threads in every pass (the FFN backward has 4 bias chunks).
    const Tensor x = random_tensor({8, 150, 48}, 30, DType::f32);
    Tensor y;
    {
      const Autocast on;
      y = e.forward(x);
    }
    runs[t].push_back(y.to_vector());
    runs[t].push_back(e.backward(x).to_vector());
    for (const auto& p : e.named_parameters()) runs[t].push_back(p.grad.to_vector());
  }
  set_num_threads(0);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "tensor " << i;
}

// A bf16 input stays bf16 through a post-norm layer, and its gradient comes back in bf16;
// activation checkpointing replays the forward under autocast too (the same gradients).
TEST(Autocast, Bf16InputsAndCheckpointing) {
  manual_seed(17);
  TransformerEncoderLayer plain(layer_options(false, Activation::relu)),
      ckpt(layer_options(false, Activation::relu));
  ckpt.load_state_dict(plain.state_dict());
  ckpt.set_checkpoint(true);
  const Tensor x = random_tensor({2, 9, 48}, 18, DType::bf16);
  const Tensor dy = random_tensor({2, 9, 48}, 19, DType::bf16);
  Tensor y1, y2;
  {
    const Autocast on;
    y1 = plain.forward(x);
    y2 = ckpt.forward(x);
  }
  EXPECT_EQ(y1.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(y1, y2));
  const Tensor dx1 = plain.backward(dy), dx2 = ckpt.backward(dy);
  EXPECT_EQ(dx1.dtype(), DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(dx1, dx2));
  const auto p1 = plain.named_parameters(), p2 = ckpt.named_parameters();
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(p1[i].grad, p2[i].grad)) << p1[i].name;
}

// Cross-attention (separate query and key / value) and grouped heads under autocast: every gradient
// within bf16 of f32.
TEST(Autocast, CrossAttentionGradientsAreWithinBf16OfF32) {
  manual_seed(23);
  MultiHeadAttentionOptions o;
  o.embed_dim = 32;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.kdim = 24;
  o.vdim = 40;
  o.batch_first = true;
  MultiHeadAttention mha(o);
  const Tensor q = random_tensor({2, 7, 32}, 24, DType::f32),
               k = random_tensor({2, 11, 24}, 25, DType::f32),
               v = random_tensor({2, 11, 40}, 26, DType::bf16),
               dout = random_tensor({2, 7, 32}, 27);
  AttentionMasks m;
  m.is_causal = true;
  mha.forward(q, k, v, m);
  const MhaGrads g32 = mha.backward(dout);
  std::vector<Tensor> p32;
  for (const auto& p : mha.named_parameters()) p32.push_back(p.grad.clone());
  mha.zero_grad();
  {
    const Autocast on;
    EXPECT_EQ(mha.forward(q, k, v, m).output.dtype(), DType::bf16);
  }
  const MhaGrads g16 = mha.backward(dout);
  EXPECT_EQ(g16.dquery.dtype(), DType::f32);
  EXPECT_EQ(g16.dvalue.dtype(), DType::bf16);
  EXPECT_LE(rel_error(g16.dquery, g32.dquery), 8 * kBf16Eps);
  EXPECT_LE(rel_error(g16.dkey, g32.dkey), 8 * kBf16Eps);
  EXPECT_LE(rel_error(g16.dvalue, g32.dvalue), 8 * kBf16Eps);
  size_t i = 0;
  for (const auto& p : mha.named_parameters())
    EXPECT_LE(rel_error(p.grad, p32[i++]), 8 * kBf16Eps) << p.name;
}

// What autocast leaves alone: f64 modules, position schemes bf16 does not run (f32 output, out_proj
// included), and a forward outside the guard; under no_grad it keeps nothing.
TEST(Autocast, ScopeOfTheMode) {
  EXPECT_FALSE(autocast_enabled());
  {
    const Autocast on;
    EXPECT_TRUE(autocast_enabled());
    {
      const Autocast off(false);
      EXPECT_FALSE(autocast_enabled());
    }
    EXPECT_TRUE(autocast_enabled());
  }
  EXPECT_FALSE(autocast_enabled());
  Linear l64(8, 4, true, DType::f64), l32(8, 4);
  MultiHeadAttentionOptions o;
  o.embed_dim = 16;
  o.num_heads = 2;
  o.position = PositionScheme::rope;
  o.batch_first = true;
  MultiHeadAttention rope(o);
  const Tensor x = random_tensor({3, 8}, 30, DType::f32);
  const Autocast on;
  EXPECT_EQ(l64.forward(x).dtype(), DType::f64);
  const Tensor xr = random_tensor({2, 5, 16}, 31, DType::f32);
  const Tensor yr = rope.forward(xr, xr, xr).output;
  EXPECT_EQ(yr.dtype(), DType::f32);
  EXPECT_EQ(rope.backward_self(yr).dtype(), DType::f32);
  {
    const NoGradGuard no_grad;
    EXPECT_EQ(l32.forward(x).dtype(), DType::bf16);
  }
  EXPECT_THROW(l32.backward(Tensor::zeros({3, 4}, DType::f32)), Error);
}

}  // namespace
}  // namespace attn::nn
