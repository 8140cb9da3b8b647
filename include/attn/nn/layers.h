// Building blocks: Linear, LayerNorm, Dropout, Embedding, activations, the feed-forward block.
// Shapes: x [..., features]; "..." is any number of leading dims (flattened to rows internally).
// Every module computes in its dtype (f32 for training, f64 for exact gradient checks); inputs of
// another floating dtype are converted on entry. Linear, LayerNorm, Embedding, FeedForward (and
// MultiHeadAttention, the Transformer layers, models::BertModel) also take dtype bf16, for inference:
// bf16 parameters, bf16 inputs and outputs, products accumulated in f32 (on oneDNN's bf16 matmul where
// the CPU has a bf16 dot instruction, else widened to f32 for sgemm: gemm_kernels() says which),
// LayerNorm statistics and activations in f32, each output rounded once to bf16. Their backward
// throws: train f32 modules, in bf16 under autocast (attn/nn/module.h).
#pragma once
#include <cstdint>
#include <string>

#include "attn/nn/module.h"

namespace attn::nn {

enum class Init : uint8_t {
  pytorch_default,  // weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform, a =
                    // sqrt(5))
  xavier_uniform,   // weight ~ U(-b, b), b = sqrt(6 / (fan_in + fan_out)); bias 0
  kaiming_uniform,  // weight ~ U(-b, b), b = sqrt(6 / fan_in) (ReLU gain); bias 0
  kaiming_normal,   // weight ~ N(0, 2 / fan_in); bias 0
};
// Fills a [fan_out, fan_in] weight (any dtype) from the global generator.
void init_weight(Tensor& weight, Init init);
void init_uniform(Tensor& t, double bound);  // U(-bound, bound)
void init_normal(Tensor& t, double stddev);

// While one is alive on this thread, init_weight / init_uniform / init_normal fill zeros and draw
// nothing from the global generator: for building modules whose every
// parameter a checkpoint overwrites next (BertModel::from_pretrained; torch's skip_init).
class SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
};

// The GEMM libraries the nn products run on and their kernels on this CPU, e.g. "f32: oneDNN 2.6.3
// sgemm (ISA avx512_core_bf16); f64: OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... (core Prescott,
// generic)". f32 (every model's compute) runs on oneDNN, which picks kernels from the CPU's feature
// bits: sgemm, and for a Linear product with in_features >= out_features oneDNN's matmul primitive
// where it has a brgemm kernel for f32 (the string then adds ", Linear products with in >= out on
// its matmul (brg:avx512_core)"); f64 (gradient checks) on OpenBLAS. gemm_kernels_generic(): the
// f32 library runs kernels below the CPU's AVX2 / AVX-512 (only when capped, e.g. by
// DNNL_MAX_CPU_ISA); then the string says so and the first product prints a warning to stderr
// once. The string ends with the bf16 products' path ("bf16: oneDNN ... bf16 matmul
// (brg:avx512_core_amx) ..." or "bf16: widened to f32 ...").
std::string gemm_kernels();
bool gemm_kernels_generic();
// Whether the bf16 products run on bf16 instructions (oneDNN's bf16 matmul or attn's tile product:
// true) or are widened to f32 for sgemm (false); chosen once per process (ATTN_BF16_GEMM).
bool gemm_bf16_native();

enum class Activation : uint8_t;  // below, with ActivationLayer

// y = x W^T + b. x [..., in] -> y [..., out]. State: weight [out, in], bias [out]. See gemm_kernels.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32,
         Init init = Init::pytorch_default);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);  // -> dx [..., in]; dW += dy^T x, db += sum dy

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

 private:
  friend class FeedForward;  // runs the product without bias and adds it in the activation's pass
  Tensor product(const Tensor& x, bool add_bias);
  Tensor product_bf16(const Tensor& x, bool add_bias, bool f32_out);
  // bf16 act(x W^T + b) with the activation inside the product (its f32 result never stored); only
  // where bf16_fuses_activation().
  Tensor product_bf16_activated(const Tensor& x, Activation act);
  // bf16 x W^T + b from contiguous f32 rows x [..., in] whose values are bf16 ones (FeedForward's
  // rounded activations, ew::bias_act_round_bf16), the result rounded to bf16.
  Tensor product_bf16_of_rounded(const Tensor& x);
  bool bf16_fuses_activation() const;
  // Under autocast: x W^T (+ b) on bf16 copies of the weight and bias, the result bf16 or f32
  // (f32_out); the rows and the weight copy kept for backward_autocast.
  Tensor product_autocast(const Tensor& x, bool add_bias, bool f32_out);
  // bias_grad = false: the caller summed db already (FeedForward's fused activation backward).
  Tensor backward_autocast(const Tensor& dy, bool bias_grad = true);
  int64_t in_, out_;
  DType dtype_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  void release_cache() override { x_ = w16_ = Tensor(), cast_ = false; }
  Tensor x_;    // cached input [N, in] (bf16 under autocast)
  Tensor w16_;  // autocast: the weight's bf16 copy the forward used
  Shape x_shape_;
  DType x_dtype_ = DType::f32;  // the forward's input dtype (autocast: its gradient's)
  bool cast_ = false;           // the forward ran under autocast
};

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, as PyTorch).
// x [..., d] -> y [..., d]. State: weight [d], bias [d]; bias = false keeps only weight (PyTorch's
// LayerNorm(bias=False)); elementwise_affine = false has neither. The backward reads the forward's x
// and residual again (kept, not copied, as Linear keeps its input): do not change them in place
// between the two.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t d, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     DType dtype = DType::f32);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  // Post-norm residual blocks in one pass: forward_residual(x, r) = forward(x + r) (r of x's shape);
  // backward_sum(dy, dy2) = backward(dy + dy2), the gradient reaching x and r alike.
  Tensor forward_residual(const Tensor& x, const Tensor& residual);
  Tensor backward_sum(const Tensor& dy, const Tensor& dy2);

 private:
  Tensor run_forward(const Tensor& x, const Tensor* residual);
  Tensor run_backward(const Tensor& dy, const Tensor* dy2);
  int64_t d_;
  double eps_;
  DType dtype_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  void release_cache() override { x_ = r_ = stats_ = xhat_ = Tensor(), cast_ = false; }
  // f32: the input rows (and the residual's) as the kernel read them, f32 or bf16, and per row the
  // mean as two floats and rstd: the backward recomputes xhat from them (the forward writes none).
  Tensor x_, r_;
  Tensor stats_;  // [N, 3]
  // f64: xhat [N, d] and rstd [N].
  Tensor xhat_, rstd_;
  Shape shape_;
  // Under autocast the output is bf16 and dx comes back in x's dtype (bf16 rounded once, or f32).
  bool cast_ = false;
  DType x_dtype_ = DType::f32;
};

// Inverted dropout: in training each element is zeroed with probability p and the rest scaled by
// 1 / (1 - p); identity in eval mode or when p == 0. The keep-pattern is Philox(seed, call,
// element), so a run is reproducible from its seed, and backward draws it again instead of keeping
// a mask.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  double p() const { return p_; }

 private:
  void on_seed(uint64_t seed) override;
  void release_cache() override { forwarded_ = false; }
  // y = x * the pattern of (seed, call) in x's dtype (bf16: the product in f32, rounded once).
  Tensor apply(const Tensor& x, uint64_t seed, uint64_t call) const;
  double p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  // The last forward: its draw (seed, call) and element count; dropped_ false when it was the
  // identity.
  uint64_t drawn_seed_ = 0, drawn_call_ = 0;
  int64_t drawn_numel_ = 0;
  bool dropped_ = false;
  DType x_dtype_ = DType::f32;  // dx comes back in it
  bool forwarded_ = false;      // a forward ran and its cache is still here
};

// Lookup: ids (i32/i64) [...] -> [..., dim]. State: weight [num, dim] ~ N(0, 1), padding_idx row
// zero and never updated (as PyTorch).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1,
            DType dtype = DType::f32);
  Tensor forward(const Tensor& ids);
  void backward(const Tensor& dy);  // ids have no gradient
  Parameter& weight() { return *weight_; }

 private:
  void release_cache() override {
    ids_.clear();
    forwarded_ = false;
  }
  int64_t num_, dim_, padding_idx_;
  DType dtype_;
  Parameter* weight_;
  std::vector<int64_t> ids_;  // the last forward's ids, flattened
  bool forwarded_ = false;
};

enum class Activation : uint8_t { relu, gelu, gelu_tanh, silu };
Activation parse_activation(const std::string& name);  // "relu", "gelu", "gelu_tanh", "silu"
const char* activation_name(Activation a);

// Elementwise activation; GELU is x * Phi(x) (erf) or its tanh approximation (PyTorch
// approximate='tanh'); SiLU is x * sigmoid(x) (PyTorch's SiLU, also called swish). f(+inf) = +inf,
// f(-inf) = 0 (-0 for the gated ones), NaN propagates. f32 runs on vectorised kernels accurate to a
// few ulps (src/nn/elementwise.h), f64 on std::erf / std::exp.
class ActivationLayer : public Module {
 public:
  explicit ActivationLayer(Activation kind) : kind_(kind) {}
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);

 private:
  friend class FeedForward;
  // f32 after a product without bias: pre += bias in place (kept for the backward), -> f(pre).
  Tensor forward_biased(const Tensor& pre, const Tensor& bias);
  void release_cache() override { x_ = Tensor(); }
  Activation kind_;
  Tensor x_;
};
class ReLU : public ActivationLayer {
 public:
  ReLU() : ActivationLayer(Activation::relu) {}
};
class GELU : public ActivationLayer {
 public:
  explicit GELU(bool tanh_approximation = false)
      : ActivationLayer(tanh_approximation ? Activation::gelu_tanh : Activation::gelu) {}
};
class SiLU : public ActivationLayer {
 public:
  SiLU() : ActivationLayer(Activation::silu) {}
};

// The Transformer feed-forward block: linear2(dropout(act(linear1(x)))).
// x [..., d_model] -> [..., d_model]. State: linear1.{weight [d_ff, d_model], bias [d_ff]},
// linear2.{weight [d_model, d_ff], bias [d_model]} (PyTorch's names inside Transformer*Layer); no
// bias tensors when bias = false.
class FeedForward : public Module {
 public:
  FeedForward(int64_t d_model, int64_t d_ff, Activation activation = Activation::relu,
              double dropout = 0.0, DType dtype = DType::f32, bool bias = true);
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);

  Linear linear1, linear2;

 private:
  Tensor forward_autocast(const Tensor& x);
  ActivationLayer act_;
  Dropout dropout_;
};

}  // namespace attn::nn
