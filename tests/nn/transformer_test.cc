// Transformer layers and stacks: gradients in double for both norm orders and activations, decoder
// with causal + padding masks, checkpointing, bf16 activations, the tutorials' integration check,
// save/load, and a two-layer encoder that learns a small task.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::gradcheck;
using testing::GradProblem;
using testing::random_tensor;
using testing::rel_error;

TransformerLayerOptions small_f64(bool norm_first, Activation act, bool batch_first = true) {
  TransformerLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 12;
  o.dropout = 0.2;
  o.activation = act;
  o.batch_first = batch_first;
  o.norm_first = norm_first;
  o.dtype = DType::f64;
  return o;
}

// Random LayerNorm affine parameters (PyTorch starts them at 1 and 0, which hides bugs).
void randomise(Module& m, uint64_t seed) {
  for (auto& p : m.named_parameters()) {
    if (p.name.find("norm") != std::string::npos || p.name.find("bias") != std::string::npos) {
      const bool weight = p.name.find("weight") != std::string::npos;
      p.value.copy_from(random_tensor(p.value.shape(), seed++, DType::f64, weight ? 0.5 : -0.5,
                                      weight ? 1.5 : 0.5));
    }
  }
}

TEST(TransformerEncoderLayer, StateDictNamesAsPyTorch) {
  TransformerEncoderLayer l(
      TransformerLayerOptions{.d_model = 16, .nhead = 4, .dim_feedforward = 32});
  std::vector<std::string> names;
  for (auto& p : l.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  TransformerDecoder d(TransformerLayerOptions{.d_model = 16, .nhead = 4, .dim_feedforward = 32}, 2,
                       true);
  const auto dp = d.named_parameters();
  EXPECT_EQ(dp[4].name, "layers.0.multihead_attn.in_proj_weight");
  EXPECT_EQ(dp.back().name, "norm.bias");
  EXPECT_EQ(dp.size(), 2u * 18u + 2u);
}

TEST(TransformerLayers, BiasFalseDropsEveryBiasAsPyTorch) {
  // torch.nn.TransformerEncoderLayer(16, 4, 32, bias=False).state_dict() keys, and the decoder's.
  TransformerLayerOptions o{.d_model = 16, .nhead = 4, .dim_feedforward = 32, .bias = false};
  TransformerEncoderLayer l(o);
  std::vector<std::string> names;
  for (auto& p : l.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"self_attn.in_proj_weight",
                                             "self_attn.out_proj.weight", "linear1.weight",
                                             "linear2.weight", "norm1.weight", "norm2.weight"}));
  TransformerDecoderLayer d(o);
  names.clear();
  for (auto& p : d.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "self_attn.in_proj_weight", "self_attn.out_proj.weight",
                "multihead_attn.in_proj_weight", "multihead_attn.out_proj.weight", "linear1.weight",
                "linear2.weight", "norm1.weight", "norm2.weight", "norm3.weight"}));
  // The stacks' final norm follows (torch.nn.Transformer(bias=False) builds LayerNorm(bias=False)).
  TransformerEncoder enc(o, 1, /*final_norm=*/true);
  EXPECT_EQ(enc.named_parameters().back().name, "norm.weight");
  TransformerDecoder dec(o, 1, /*final_norm=*/true);
  EXPECT_EQ(dec.named_parameters().back().name, "norm.weight");
}

TEST(TransformerLayers, BiasFalseGradcheckBothNormOrders) {
  for (bool norm_first : {false, true}) {
    SCOPED_TRACE(norm_first);
    TransformerLayerOptions o = small_f64(norm_first, Activation::silu);
    o.bias = false;
    manual_seed(25);
    TransformerEncoderLayer enc(o);
    randomise(enc, 600);
    GradProblem p;
    p.inputs = {{"src", random_tensor({2, 5, 8}, 37)}};
    p.module = &enc;
    p.forward = [&] {
      enc.manual_seed(4);
      return enc.forward(p.inputs[0].second, {.is_causal = true});
    };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{enc.backward(dy)}; };
    gradcheck(p);

    TransformerDecoderLayer dec(o);
    randomise(dec, 700);
    GradProblem q;
    q.inputs = {{"tgt", random_tensor({2, 4, 8}, 38)}, {"memory", random_tensor({2, 6, 8}, 39)}};
    q.module = &dec;
    q.forward = [&] {
      dec.manual_seed(6);
      return dec.forward(q.inputs[0].second, q.inputs[1].second, {.tgt_is_causal = true});
    };
    q.backward = [&](const Tensor& dy) {
      DecoderGrads g = dec.backward(dy);
      return std::vector<Tensor>{g.dtgt, g.dmemory};
    };
    gradcheck(q);
  }
}

TEST(TransformerEncoderLayer, GradcheckNormOrdersActivationsMasksDropout) {
  for (bool norm_first : {false, true}) {
    for (Activation act : {Activation::relu, Activation::gelu}) {
      SCOPED_TRACE(std::string(norm_first ? "norm_first " : "post-norm ") + activation_name(act));
      manual_seed(20);
      TransformerEncoderLayer l(
          small_f64(norm_first, act, /*batch_first=*/act == Activation::gelu));
      randomise(l, 100);
      Tensor kpm = Tensor::zeros({2, 5}, DType::boolean);
      kpm.set({1, 3}, 1);
      kpm.set({1, 4}, 1);
      const Shape xs = act == Activation::gelu ? Shape{2, 5, 8} : Shape{5, 2, 8};
      GradProblem p;
      p.inputs = {{"src", random_tensor(xs, 30)}};
      p.module = &l;
      p.forward = [&] {
        l.manual_seed(4);  // same dropout patterns on every evaluation
        return l.forward(p.inputs[0].second, {.src_key_padding_mask = kpm});
      };
      p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{l.backward(dy)}; };
      gradcheck(p);
    }
  }
}

TEST(TransformerEncoderLayer, GradcheckExtensions) {
  // GQA + RoPE, linear attention, T5 bias inside the layer.
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    TransformerLayerOptions o = small_f64(variant == 1, Activation::gelu);
    o.dropout = 0.0;
    if (variant == 0) o.num_kv_heads = 1, o.position = PositionScheme::rope;
    if (variant == 1) o.attention = AttentionKind::linear;
    if (variant == 2) o.position = PositionScheme::t5, o.num_buckets = 4, o.max_distance = 8;
    manual_seed(21);
    TransformerEncoderLayer l(o);
    randomise(l, 200);
    GradProblem p;
    p.inputs = {{"src", random_tensor({2, 5, 8}, 31)}};
    p.module = &l;
    p.forward = [&] { return l.forward(p.inputs[0].second, {.is_causal = variant == 1}); };
    p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{l.backward(dy)}; };
    gradcheck(p);
  }
}

TEST(TransformerEncoder, StackWithFinalNormGradcheck) {
  manual_seed(22);
  TransformerEncoder enc(small_f64(true, Activation::relu), 2, /*final_norm=*/true);
  randomise(enc, 300);
  GradProblem p;
  p.inputs = {{"src", random_tensor({2, 4, 8}, 32)}};
  p.module = &enc;
  p.forward = [&] {
    enc.manual_seed(5);
    return enc.forward(p.inputs[0].second, {.mask = look_ahead_mask(4)});
  };
  p.backward = [&](const Tensor& dy) { return std::vector<Tensor>{enc.backward(dy)}; };
  gradcheck(p, 7, 12);
}

TEST(TransformerDecoderLayer, GradcheckCausalPaddingBothNormOrders) {
  for (bool norm_first : {false, true}) {
    SCOPED_TRACE(norm_first);
    manual_seed(23);
    TransformerDecoderLayer l(small_f64(norm_first, Activation::relu, /*batch_first=*/norm_first));
    randomise(l, 400);
    const int64_t B = 2, Lt = 4, Lm = 6;
    DecoderMasks m;
    m.tgt_is_causal = true;
    m.tgt_key_padding_mask = Tensor::zeros({B, Lt}, DType::boolean);
    m.tgt_key_padding_mask.set({0, 3}, 1);
    m.memory_key_padding_mask = Tensor::zeros({B, Lm}, DType::boolean);
    m.memory_key_padding_mask.set({1, 5}, 1);
    m.memory_key_padding_mask.set({1, 4}, 1);
    auto shape = [&](int64_t L) { return norm_first ? Shape{B, L, 8} : Shape{L, B, 8}; };
    GradProblem p;
    p.inputs = {{"tgt", random_tensor(shape(Lt), 33)}, {"memory", random_tensor(shape(Lm), 34)}};
    p.module = &l;
    p.forward = [&] {
      l.manual_seed(6);
      return l.forward(p.inputs[0].second, p.inputs[1].second, m);
    };
    p.backward = [&](const Tensor& dy) {
      DecoderGrads g = l.backward(dy);
      return std::vector<Tensor>{g.dtgt, g.dmemory};
    };
    gradcheck(p);
  }
}

TEST(TransformerDecoder, StackGradcheck) {
  manual_seed(24);
  TransformerDecoder dec(small_f64(false, Activation::gelu), 2, true);
  randomise(dec, 500);
  dec.eval();
  GradProblem p;
  p.inputs = {{"tgt", random_tensor({2, 3, 8}, 35)}, {"memory", random_tensor({2, 4, 8}, 36)}};
  p.module = &dec;
  p.forward = [&] {
    return dec.forward(p.inputs[0].second, p.inputs[1].second, {.tgt_is_causal = true});
  };
  p.backward = [&](const Tensor& dy) {
    DecoderGrads g = dec.backward(dy);
    return std::vector<Tensor>{g.dtgt, g.dmemory};
  };
  gradcheck(p, 7, 10);
}

TEST(TransformerEncoderLayer, CheckpointingGivesTheSameGradients) {
  for (bool norm_first : {false, true}) {
    manual_seed(25);
    TransformerEncoderLayer a(small_f64(norm_first, Activation::gelu));
    TransformerEncoderLayer b(small_f64(norm_first, Activation::gelu));
    b.load_state_dict(a.state_dict());
    b.set_checkpoint(true);
    a.manual_seed(77);
    b.manual_seed(77);
    const Tensor x = random_tensor({2, 5, 8}, 37);
    const Tensor dy = random_tensor({2, 5, 8}, 38);
    a.zero_grad();
    b.zero_grad();
    const Tensor ya = a.forward(x), yb = b.forward(x);
    EXPECT_EQ(ya.to_vector(), yb.to_vector());
    // The checkpointed layer dropped its activations: its sublayers have nothing cached.
    EXPECT_THROW(b.self_attn.backward(dy), Error);
    const Tensor dxa = a.backward(dy), dxb = b.backward(dy);
    EXPECT_EQ(dxa.to_vector(), dxb.to_vector());
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(pa[i].grad.to_vector(), pb[i].grad.to_vector()) << pa[i].name;
  }
}

TEST(TransformerEncoder, Bf16ActivationsStayCloseToF32) {
  TransformerLayerOptions o{
      .d_model = 32, .nhead = 4, .dim_feedforward = 64, .dropout = 0.0, .batch_first = true};
  manual_seed(26);
  TransformerEncoder f32(o, 2);
  o.checkpoint = true;  // the bf16 stack also checkpoints: its layers keep only their bf16 inputs
  TransformerEncoder bf16(o, 2, false, DType::bf16);
  bf16.load_state_dict(f32.state_dict());
  const Tensor x = random_tensor({2, 6, 32}, 39, DType::f32);
  const Tensor y32 = f32.forward(x), y16 = bf16.forward(x);
  EXPECT_EQ(y16.dtype(), DType::bf16);
  // bf16 keeps 8 bits: a few units of 2^-8 relative after two layers, and it does differ from f32.
  const double err = rel_error(y16, y32);
  EXPECT_LT(err, 3e-2);
  EXPECT_GT(err, 1e-6);
  f32.zero_grad();
  bf16.zero_grad();
  const Tensor dy = random_tensor({2, 6, 32}, 40, DType::f32);
  f32.backward(dy);
  bf16.backward(dy);
  const auto p32 = f32.named_parameters(), p16 = bf16.named_parameters();
  for (size_t i = 0; i < p32.size(); ++i) {
    EXPECT_EQ(p16[i].grad.dtype(), DType::f32);
    EXPECT_LT(rel_error(p16[i].grad, p32[i].grad), 0.1) << p32[i].name;
  }
}

// The tutorials' integration check: batch 4, length 10, d_model 512, 8 heads, d_ff 2048, the last
// two positions padded.
TEST(TransformerEncoderLayer, TutorialIntegrationCheck) {
  manual_seed(27);
  TransformerEncoderLayer l(TransformerLayerOptions{
      .d_model = 512, .nhead = 8, .dim_feedforward = 2048, .dropout = 0.1, .batch_first = true});
  const Tensor x = random_tensor({4, 10, 512}, 41, DType::f32);
  Tensor kpm = Tensor::zeros({4, 10}, DType::boolean);
  for (int64_t b = 0; b < 4; ++b) kpm.set({b, 8}, 1), kpm.set({b, 9}, 1);
  const Tensor y = l.forward(x, {.src_key_padding_mask = kpm});
  ASSERT_EQ(y.shape(), x.shape());
  EXPECT_GT(rel_error(y, x), 1e-2);
  for (double v : y.to_vector()) ASSERT_TRUE(std::isfinite(v));
  l.zero_grad();
  const Tensor dx = l.backward(random_tensor({4, 10, 512}, 42, DType::f32));
  for (double v : dx.to_vector()) ASSERT_TRUE(std::isfinite(v));
  for (auto& p : l.named_parameters()) {
    double norm = 0;
    for (double v : p.grad.to_vector()) {
      ASSERT_TRUE(std::isfinite(v)) << p.name;
      norm += v * v;
    }
    EXPECT_GT(norm, 0.0) << p.name << " got no gradient";
  }
}

TEST(TransformerEncoder, SaveLoadSafetensorsRoundTrip) {
  TransformerLayerOptions o{.d_model = 16, .nhead = 2, .dim_feedforward = 24, .batch_first = true};
  manual_seed(28);
  TransformerEncoder a(o, 2, true), b(o, 2, true);
  const std::string path = ::testing::TempDir() + "/attn_nn_encoder.safetensors";
  a.save(path, {{"format", "pt"}});
  b.load(path);
  a.eval();
  b.eval();
  const Tensor x = random_tensor({1, 3, 16}, 43, DType::f32);
  EXPECT_EQ(a.forward(x).to_vector(), b.forward(x).to_vector());
  // A malformed file is refused with attn::Error (header length past the end of the file).
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    const unsigned char junk[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    std::fwrite(junk, 1, sizeof junk, f);
    std::fclose(f);
  }
  EXPECT_THROW(b.load(path), Error);
  std::filesystem::remove(path);
}

TEST(Container, GroupsModulesUnderPrefixes) {
  Embedding emb(5, 4);
  Linear head(4, 5);
  Container model;
  model.add("embed", emb).add("head", head);
  std::vector<std::string> names;
  for (auto& p : model.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed.weight", "head.weight", "head.bias"}));
  model.eval();
  EXPECT_FALSE(head.is_training());
}

TEST(Init, PyTorchDefaultXavierAndKaimingBounds) {
  manual_seed(30);
  Linear def(100, 50), kaiming(100, 50, true, DType::f32, Init::kaiming_uniform);
  MultiHeadAttention mha(20, 4);
  auto bound = [](const Tensor& t) { return testing::max_abs(t); };
  EXPECT_LE(bound(def.weight().value), 0.1);  // 1 / sqrt(100)
  EXPECT_GT(bound(def.weight().value), 0.095);
  EXPECT_LE(bound(kaiming.weight().value), std::sqrt(6.0 / 100));
  EXPECT_GT(bound(kaiming.weight().value), 0.95 * std::sqrt(6.0 / 100));
  EXPECT_EQ(bound(kaiming.bias()->value), 0.0);
  const auto mp = mha.named_parameters();
  EXPECT_LE(bound(mp[0].value), std::sqrt(6.0 / (20 + 60)));  // xavier on in_proj_weight [60, 20]
  EXPECT_GT(bound(mp[0].value), 0.9 * std::sqrt(6.0 / (20 + 60)));
  EXPECT_EQ(bound(mp[1].value), 0.0);  // in_proj_bias
  EXPECT_EQ(bound(mp[3].value), 0.0);  // out_proj.bias
}

// A two-layer encoder fits a small task: predict, at each position, the token at the mirrored
// position (sequence reversal), vocab 8, length 6. Embedding -> positions -> encoder -> Linear ->
// cross-entropy.
TEST(TransformerEncoder, TwoLayersLearnSequenceReversal) {
  manual_seed(29);
  const int64_t V = 8, L = 6, D = 32, B = 16;
  Embedding emb(V, D);
  LearnedPositionalEmbedding pos(L, D, true);
  TransformerEncoder enc(TransformerLayerOptions{.d_model = D,
                                                 .nhead = 4,
                                                 .dim_feedforward = 64,
                                                 .dropout = 0.0,
                                                 .batch_first = true,
                                                 .norm_first = true},
                         2, true);
  Linear head(D, V);
  std::vector<NamedParameter> params;
  for (Module* m : std::vector<Module*>{&emb, &pos, &enc, &head})
    for (auto& p : m->named_parameters()) params.push_back(p);
  AdamW opt(params, 3e-3, 0.9, 0.98, 1e-9, 0.0);
  const WarmupCosine sched{.base_lr = 3e-3, .warmup_steps = 20, .total_steps = 300, .min_lr = 1e-4};
  test::Rng rng(5);
  double loss = 0;
  for (int64_t step = 0; step < 300; ++step) {
    std::vector<double> ids(B * L), tgt(B * L);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) ids[b * L + l] = static_cast<double>(rng.integer(0, V - 1));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) tgt[b * L + l] = ids[b * L + (L - 1 - l)];
    const Tensor x = Tensor::from_vector({B, L}, ids, DType::i64),
                 t = Tensor::from_vector({B, L}, tgt, DType::i64);
    opt.zero_grad();
    const Tensor logits = head.forward(enc.forward(pos.forward(emb.forward(x))));
    const CrossEntropyResult ce = cross_entropy(logits, t);
    loss = ce.loss;
    if (std::getenv("ATTN_NN_VERBOSE") && step % 25 == 0)
      std::printf("step %ld loss %.4f\n", (long)step, loss);
    emb.backward(pos.backward(enc.backward(head.backward(ce.dlogits))));
    clip_grad_norm(params, 1.0);
    opt.set_lr(sched(step));
    opt.step();
  }
  EXPECT_LT(loss, 0.05) << "final loss";
}

}  // namespace
}  // namespace attn::nn
