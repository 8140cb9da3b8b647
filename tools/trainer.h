// The training behind `attn train`, `attn eval` and `attn demo`: a small Transformer encoder (token
// embedding + learned positions + pre-norm encoder layers + a linear head over the vocabulary) trained on a
// synthetic task with AdamW, warm-up + cosine schedule and gradient clipping; held-out evaluation; safetensors
// checkpoints with resume; the data behind the report (curves, per-head attention, entropy).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/nn.h"
#include "attn/viz.h"
#include "tools/tasks.h"

namespace attn::tools {

struct TrainConfig {
  std::string task = "reverse";
  int64_t length = 8;  // symbols per sequence (digits per operand for add)
  int64_t d_model = 64;
  int64_t heads = 2;
  int64_t layers = 2;
  int64_t d_ff = 128;
  double dropout = 0.0;
  int64_t steps = 1000;
  int64_t batch = 64;
  double lr = 3e-3;
  int64_t warmup = 100;
  double weight_decay = 0.01;
  double clip = 1.0;
  uint64_t seed = 1;
  int threads = 0;
  int64_t eval_every = 100;     // steps between held-out evaluations
  int64_t eval_samples = 1000;  // held-out sequences
  std::string checkpoint;  // written every checkpoint_every steps and at the end when non-empty
  int64_t checkpoint_every = 500;
  std::string resume;  // a checkpoint to continue from
  // stop (and checkpoint) after this step, as if interrupted; -1 = run to the end
  int64_t stop_after = -1;
  bool quiet = false;
  // Mixed precision: forwards and backwards in bf16 under nn::Autocast, weights and optimizer in f32.
  bool autocast = false;
};

// Token embedding -> learned positions -> encoder stack (final norm) -> linear head. Causal tasks run the
// encoder with a causal mask (a decoder-only language model); the others attend both ways.
class SequenceModel : public nn::Module {
 public:
  SequenceModel(int64_t vocab, int64_t max_len, const TrainConfig& c, bool causal);
  // ids i64 [B, L] -> logits f32 [B, L, vocab] (bf16 with c.autocast); need_weights keeps every
  // layer's per-head weights.
  Tensor forward(const Tensor& ids, bool need_weights = false);
  void backward(const Tensor& dlogits);

  nn::Embedding embed;
  nn::LearnedPositionalEmbedding pos;
  nn::TransformerEncoder encoder;
  nn::Linear head;

 private:
  bool causal_;
  bool autocast_;
};

struct EvalResult {
  double loss = 0, token_accuracy = 0, sequence_accuracy = 0;
  int64_t sequences = 0;
};

struct TrainResult {
  int64_t steps_done = 0;
  double seconds = 0;  // wall time of the training steps
  double tokens_per_second = 0;
  EvalResult final_eval;
  viz::ReportData report;  // curves, attention of one held-out example, entropy, summary
};

class Trainer {
 public:
  explicit Trainer(TrainConfig config);
  TrainResult run();
  // Accuracy on `n` held-out sequences (a stream of their own, disjoint in seed from training batches).
  EvalResult evaluate(int64_t n);
  const Task& task() const { return *task_; }
  SequenceModel& model() { return *model_; }
  // Per-layer attention of one held-out example, with its tokens, and per-head entropy.
  void attention_of_example(viz::ReportData& report);

  void save_checkpoint(const std::string& path, int64_t step) const;
  // Returns the step the checkpoint was written at.
  int64_t load_checkpoint(const std::string& path);

 private:
  TrainConfig c_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<SequenceModel> model_;
  std::unique_ptr<nn::AdamW> opt_;
};

// A trainer configured from a checkpoint's metadata (for `attn eval`), weights loaded.
std::unique_ptr<Trainer> trainer_from_checkpoint(const std::string& path, int threads);

}  // namespace attn::tools
