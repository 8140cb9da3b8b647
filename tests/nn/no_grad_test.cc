// Gradient mode (NoGradGuard): forwards under it give the same bits, keep nothing for a backward
// (measured through the buffer cache: freeing the modules' caches afterwards gives nothing back),
// every backward then refuses, and the mode is per thread and restored by the guard.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "attn/memory.h"
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using testing::random_tensor;

// FFN activations [512, 256] f32 of 512 KiB: over the smallest buffer the cache keeps (256 KiB).
TransformerLayerOptions layer_f32() {
  return TransformerLayerOptions{.d_model = 64,
                                 .nhead = 4,
                                 .dim_feedforward = 256,
                                 .dropout = 0.0,
                                 .activation = Activation::gelu,
                                 .batch_first = true};
}

// The bytes free_cache() gives back to the buffer cache: what the last forward kept for a backward.
size_t bytes_kept_by(Module& m) {
  const size_t before = cached_memory_bytes();
  m.free_cache();
  return cached_memory_bytes() - before;
}

void expect_refuses(const std::function<void()>& backward) {
  try {
    backward();
    ADD_FAILURE() << "the backward ran after a forward under NoGradGuard";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradients disabled"), std::string::npos) << e.what();
  }
}

TEST(NoGrad, StackKeepsNothingAndGivesTheSameBits) {
  manual_seed(41);
  TransformerEncoder enc(layer_f32(), 2, true);
  enc.eval();
  const Tensor x = random_tensor({4, 128, 64}, 42, DType::f32);
  // The buffer cache is off under AddressSanitizer (which must see every free): there the memory
  // checks cannot look, and the bits and refusals are checked alone.
  const bool cache_on = cached_memory_limit() > 0;
  std::printf("[ NO GRAD  ] memory checked through the buffer cache: %s\n",
              cache_on ? "yes" : "no");
  release_cached_memory();
  const Tensor with_grad = enc.forward(x).clone();
  const size_t kept_with_grad = bytes_kept_by(enc);
  if (cache_on) {
    EXPECT_GT(kept_with_grad, 0u);  // the control: with gradients, activations are kept
  }
  Tensor without;
  {
    const NoGradGuard no_grad;
    EXPECT_FALSE(grad_enabled());
    without = enc.forward(x);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_EQ(with_grad.to_vector(), without.to_vector());
  expect_refuses([&] { enc.backward(without); });
  EXPECT_EQ(bytes_kept_by(enc), 0u);  // also 0 with the cache off, where it proves nothing
  // Gradients on again: the next forward and backward run as ever.
  enc.forward(x);
  EXPECT_NO_THROW(enc.backward(without));
}

TEST(NoGrad, EveryCachingModuleRefusesItsBackward) {
  manual_seed(43);
  const Tensor x = random_tensor({3, 5, 16}, 44, DType::f32);
  Linear lin(16, 8);
  LayerNorm norm(16);
  Dropout drop(0.5);  // training: the forward draws a pattern, which the backward would need
  GELU gelu;
  FeedForward ff(16, 32, Activation::gelu);
  MultiHeadAttention mha(16, 4, 0.0, true);
  Embedding emb(10, 4);
  LearnedPositionalEmbedding pos(8, 16, true);
  const Tensor ids = Tensor::from_vector({2}, {1, 7}, DType::i64);
  {
    const NoGradGuard no_grad;
    lin.forward(x), norm.forward(x), drop.forward(x), gelu.forward(x), ff.forward(x);
    mha.forward_self(x), emb.forward(ids), pos.forward(x, 2);
  }
  expect_refuses([&] { lin.backward(random_tensor({3, 5, 8}, 45, DType::f32)); });
  expect_refuses([&] { norm.backward(x); });
  expect_refuses([&] { drop.backward(x); });
  expect_refuses([&] { gelu.backward(x); });
  expect_refuses([&] { ff.backward(x); });
  expect_refuses([&] { mha.backward_self(x); });
  expect_refuses([&] { emb.backward(random_tensor({2, 4}, 46, DType::f32)); });
  expect_refuses([&] { pos.backward(x); });  // it took the no-grad forward's offset before
}

TEST(NoGrad, IsPerThreadAndGuardsNest) {
  const NoGradGuard outer;
  bool other_thread = false;
  std::thread([&] { other_thread = grad_enabled(); }).join();
  EXPECT_TRUE(other_thread);
  {
    const NoGradGuard inner;
    EXPECT_FALSE(grad_enabled());
  }
  EXPECT_FALSE(grad_enabled());  // the inner guard restored the outer's mode, not "on"
}

}  // namespace
}  // namespace attn::nn
