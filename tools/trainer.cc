#include "tools/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "attn/io.h"
#include "attn/threads.h"
#include "tools/progress.h"

namespace attn::tools {

namespace {

// Independent, reproducible random streams: training batch `step`, the held-out set, the example.
std::mt19937_64 stream(uint64_t seed, uint64_t purpose, uint64_t index) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(purpose), static_cast<uint32_t>(index),
                    static_cast<uint32_t>(index >> 32)};
  return std::mt19937_64(seq);
}
constexpr uint64_t kTrainStream = 1, kHeldOutStream = 2, kExampleStream = 3;

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t b, int64_t l) {
  Tensor t = Tensor::empty({b, l}, DType::i64);
  std::copy(v.begin(), v.end(), t.data_as<int64_t>());
  return t;
}

nn::TransformerLayerOptions layer_options(const TrainConfig& c) {
  nn::TransformerLayerOptions o;
  o.d_model = c.d_model;
  o.nhead = c.heads;
  o.dim_feedforward = c.d_ff;
  o.dropout = c.dropout;
  o.activation = nn::Activation::gelu;
  o.batch_first = true;
  o.norm_first = true;
  return o;
}

// Token and sequence accuracy of logits [B, L, V] against targets (kIgnore positions skipped).
struct Hits {
  int64_t tokens = 0, tokens_right = 0, seqs = 0, seqs_right = 0;
};
Hits count_hits(const Tensor& logits_in, const Batch& b) {
  Hits h;
  const Tensor logits = logits_in.to(DType::f32);  // bf16 under autocast
  const int64_t V = logits.size(-1);
  const float* p = logits.data_as<float>();
  for (int64_t s = 0; s < b.batch; ++s) {
    bool all = true;
    for (int64_t i = 0; i < b.length; ++i) {
      const int64_t t = b.targets[s * b.length + i];
      if (t == kIgnore) continue;
      const float* row = p + (s * b.length + i) * V;
      const int64_t arg = std::max_element(row, row + V) - row;
      ++h.tokens;
      if (arg == t) {
        ++h.tokens_right;
      } else {
        all = false;
      }
    }
    ++h.seqs;
    h.seqs_right += all ? 1 : 0;
  }
  return h;
}

}  // namespace

SequenceModel::SequenceModel(int64_t vocab, int64_t max_len, const TrainConfig& c, bool causal)
    : embed(vocab, c.d_model),
      pos(max_len, c.d_model, /*batch_first=*/true, /*scale=*/1.0, DType::f32, /*init_std=*/1.0),
      encoder(layer_options(c), c.layers, /*final_norm=*/true),
      head(c.d_model, vocab),
      causal_(causal),
      autocast_(c.autocast) {
  register_module("embed", embed);
  register_module("pos", pos);
  register_module("encoder", encoder);
  register_module("head", head);
}

Tensor SequenceModel::forward(const Tensor& ids, bool need_weights) {
  const nn::Autocast scope(autocast_);
  nn::EncoderMasks masks;
  masks.is_causal = causal_;
  masks.need_weights = need_weights;
  Tensor x = pos.forward(embed.forward(ids));
  return head.forward(encoder.forward(x, masks));
}

void SequenceModel::backward(const Tensor& dlogits) {
  embed.backward(pos.backward(encoder.backward(head.backward(dlogits))));
}

Trainer::Trainer(TrainConfig config) : c_(std::move(config)) {
  if (c_.steps < 0 || c_.batch < 1 || c_.d_model < 1 || c_.heads < 1 || c_.layers < 1 ||
      c_.d_ff < 1) {
    throw Error(fmt::format(
        "attn train: sizes must be positive (steps {}, batch {}, d_model {}, heads {}, layers {}, "
        "d_ff {})",
        c_.steps, c_.batch, c_.d_model, c_.heads, c_.layers, c_.d_ff));
  }
  if (c_.d_model % c_.heads != 0) {
    throw Error(
        fmt::format("attn train: d_model {} must be a multiple of heads {}", c_.d_model, c_.heads));
  }
  if (!(c_.lr > 0) || !std::isfinite(c_.lr))
    throw Error(fmt::format("attn train: --lr must be > 0, got {}", c_.lr));
  if (c_.eval_every < 1 || c_.checkpoint_every < 1 || c_.eval_samples < 1) {
    throw Error(
        fmt::format("attn train: --eval-every ({}), --checkpoint-every ({}) and --eval-samples "
                    "({}) must be >= 1",
                    c_.eval_every, c_.checkpoint_every, c_.eval_samples));
  }
  if (c_.threads > 0) set_num_threads(c_.threads);
  task_ = make_task(c_.task, c_.length);
  nn::manual_seed(c_.seed);
  model_ =
      std::make_unique<SequenceModel>(task_->vocab_size(), task_->length(), c_, task_->causal());
  model_->manual_seed(c_.seed);
  opt_ = std::make_unique<nn::AdamW>(model_->named_parameters(), c_.lr, 0.9, 0.98, 1e-9,
                                     c_.weight_decay);
}

EvalResult Trainer::evaluate(int64_t n) {
  const bool was_training = model_->is_training();
  model_->eval();
  std::mt19937_64 rng = stream(c_.seed, kHeldOutStream, 0);
  EvalResult r;
  Hits total;
  double loss_sum = 0;
  int64_t loss_count = 0;
  for (int64_t done = 0; done < n;) {
    const int64_t b = std::min<int64_t>(256, n - done);
    const Batch batch = task_->batch(rng, b);
    const Tensor logits = model_->forward(ids_tensor(batch.ids, b, batch.length));
    const auto ce = nn::cross_entropy(logits, ids_tensor(batch.targets, b, batch.length), kIgnore);
    loss_sum += ce.loss * static_cast<double>(ce.count);
    loss_count += ce.count;
    const Hits h = count_hits(logits, batch);
    total.tokens += h.tokens, total.tokens_right += h.tokens_right;
    total.seqs += h.seqs, total.seqs_right += h.seqs_right;
    done += b;
  }
  model_->free_cache();
  model_->train(was_training);
  r.loss = loss_count ? loss_sum / static_cast<double>(loss_count) : 0.0;
  r.token_accuracy =
      total.tokens ? static_cast<double>(total.tokens_right) / static_cast<double>(total.tokens)
                   : 0;
  r.sequence_accuracy =
      total.seqs ? static_cast<double>(total.seqs_right) / static_cast<double>(total.seqs) : 0;
  r.sequences = total.seqs;
  return r;
}

void Trainer::attention_of_example(viz::ReportData& report) {
  const bool was_training = model_->is_training();
  model_->eval();
  std::mt19937_64 rng = stream(c_.seed, kExampleStream, 0);
  const Batch b = task_->batch(rng, 1);
  model_->forward(ids_tensor(b.ids, 1, b.length), /*need_weights=*/true);
  std::vector<std::string> tokens;
  for (int64_t id : b.ids) tokens.push_back(task_->token(id));
  for (int64_t l = 0; l < model_->encoder.num_layers(); ++l) {
    // [H, L, L]
    const Tensor w = model_->encoder.layer(l).attention_weights().select(0, 0).to(DType::f32);
    viz::LayerAttention la;
    la.name = fmt::format("layer {}", l);
    la.weights = w;
    la.q_tokens = tokens;
    la.k_tokens = tokens;
    report.layers.push_back(la);
    viz::HeadEntropy e;
    e.layer = la.name;
    e.nats = viz::mean_row_entropy(w);
    e.max_nats = std::log(static_cast<double>(b.length));
    report.entropy.push_back(e);
  }
  model_->free_cache();
  model_->train(was_training);
}

TrainResult Trainer::run() {
  TrainResult res;
  int64_t start = 0;
  if (!c_.resume.empty()) start = load_checkpoint(c_.resume);
  const nn::WarmupCosine schedule{c_.lr, c_.warmup, std::max<int64_t>(c_.steps, 1), c_.lr * 0.05};
  const auto params = model_->named_parameters();
  ProgressBar bar(c_.steps, stderr, 5.0);
  auto& series = res.report.series;
  double seconds = 0;
  int64_t tokens = 0;
  double smooth_loss = NAN, smooth_acc = NAN;
  int64_t end = c_.steps;
  model_->train();
  for (int64_t step = start; step < c_.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::mt19937_64 rng = stream(c_.seed, kTrainStream, static_cast<uint64_t>(step));
    const Batch batch = task_->batch(rng, c_.batch);
    opt_->set_lr(schedule(step));
    const Tensor logits = model_->forward(ids_tensor(batch.ids, batch.batch, batch.length));
    const auto ce =
        nn::cross_entropy(logits, ids_tensor(batch.targets, batch.batch, batch.length), kIgnore);
    model_->zero_grad();
    model_->backward(ce.dlogits);
    const double gnorm = nn::clip_grad_norm(params, c_.clip);
    opt_->step();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens += batch.batch * batch.length;

    const Hits h = count_hits(logits, batch);
    const double acc = static_cast<double>(h.seqs_right) / static_cast<double>(h.seqs);
    smooth_loss = std::isnan(smooth_loss) ? ce.loss : 0.9 * smooth_loss + 0.1 * ce.loss;
    smooth_acc = std::isnan(smooth_acc) ? acc : 0.9 * smooth_acc + 0.1 * acc;
    const double s = static_cast<double>(step + 1);
    series["loss/train"].push_back({s, ce.loss});
    series["accuracy/train (sequences)"].push_back({s, acc});
    series["grad norm"].push_back({s, gnorm});
    series["learning rate"].push_back({s, schedule(step)});
    if (!std::isfinite(ce.loss) || !std::isfinite(gnorm)) {
      throw Error(fmt::format(
          "attn train: training diverged at step {} (loss {}, gradient norm {}); try a lower --lr",
          step + 1, ce.loss, gnorm));
    }
    if ((step + 1) % c_.eval_every == 0 || step + 1 == c_.steps) {
      const EvalResult e = evaluate(std::min<int64_t>(c_.eval_samples, 500));
      series["loss/held-out"].push_back({s, e.loss});
      series["accuracy/held-out (sequences)"].push_back({s, e.sequence_accuracy});
    }
    const bool stop = c_.stop_after >= 0 && step + 1 >= c_.stop_after;
    if (!c_.checkpoint.empty() &&
        ((step + 1) % c_.checkpoint_every == 0 || step + 1 == c_.steps || stop)) {
      save_checkpoint(c_.checkpoint, step + 1);
    }
    if (!c_.quiet) {
      bar.update(step + 1, static_cast<double>(tokens) / std::max(seconds, 1e-9),
                 fmt::format("loss {:.4f}  acc {:.3f}", smooth_loss, smooth_acc));
    }
    if (stop) {
      end = step + 1;
      break;
    }
  }
  if (!c_.quiet) bar.finish();
  res.steps_done = end - start;
  res.seconds = seconds;
  res.tokens_per_second = static_cast<double>(tokens) / std::max(seconds, 1e-9);
  res.final_eval = evaluate(c_.eval_samples);
  attention_of_example(res.report);

  auto& sum = res.report.summary;
  sum.push_back(
      {"task", fmt::format("{} (length {}, {})", c_.task, c_.length,
                           task_->causal() ? "causal language model" : "bidirectional encoder")});
  sum.push_back(
      {"model", fmt::format("{} layers, d_model {}, {} heads, d_ff {}, {} parameters", c_.layers,
                            c_.d_model, c_.heads, c_.d_ff, model_->num_parameters())});
  sum.push_back({"training", fmt::format("{} steps of {} sequences, AdamW lr {}, seed {}", c_.steps,
                                         c_.batch, c_.lr, c_.seed)});
  sum.push_back(
      {"training time", fmt::format("{} ({:.0f} tokens/s, {} threads)", format_duration(seconds),
                                    res.tokens_per_second, default_num_threads())});
  sum.push_back({"held-out loss", fmt::format("{:.4f}", res.final_eval.loss)});
  sum.push_back({"held-out token accuracy", fmt::format("{:.4f}", res.final_eval.token_accuracy)});
  sum.push_back({"held-out accuracy",
                 fmt::format("{:.4f} of {} sequences (exact match)",
                             res.final_eval.sequence_accuracy, res.final_eval.sequences)});
  return res;
}

void Trainer::save_checkpoint(const std::string& path, int64_t step) const {
  std::map<std::string, std::string> meta = {
      {"format", "attn-train-1"},
      {"task", c_.task},
      {"length", std::to_string(c_.length)},
      {"d_model", std::to_string(c_.d_model)},
      {"heads", std::to_string(c_.heads)},
      {"layers", std::to_string(c_.layers)},
      {"d_ff", std::to_string(c_.d_ff)},
      {"dropout", fmt::format("{}", c_.dropout)},
      {"seed", std::to_string(c_.seed)},
      {"step", std::to_string(step)},
      {"autocast", c_.autocast ? "bf16" : "off"},
  };
  TensorList tensors = model_->state_dict();
  for (auto& [name, t] : opt_->state_dict()) tensors.push_back({"optimizer." + name, t});
  write_safetensors(path, tensors, meta);
}

int64_t Trainer::load_checkpoint(const std::string& path) {
  std::map<std::string, std::string> meta;
  const TensorList all = read_safetensors(path, &meta);
  if (meta["format"] != "attn-train-1") {
    throw Error(fmt::format("attn train: {} is not an attn training checkpoint", path));
  }
  auto expect = [&](const char* key, const std::string& want) {
    if (meta[key] != want) {
      throw Error(fmt::format("attn train: checkpoint {} has {} = '{}', this run has '{}'", path,
                              key, meta[key], want));
    }
  };
  expect("task", c_.task);
  expect("length", std::to_string(c_.length));
  expect("d_model", std::to_string(c_.d_model));
  expect("heads", std::to_string(c_.heads));
  expect("layers", std::to_string(c_.layers));
  expect("d_ff", std::to_string(c_.d_ff));
  TensorList model_part, opt_part;
  for (const auto& [name, t] : all) {
    if (name.rfind("optimizer.", 0) == 0) {
      opt_part.push_back({name.substr(10), t});
    } else {
      model_part.push_back({name, t});
    }
  }
  model_->load_state_dict(model_part, /*strict=*/true);
  if (!opt_part.empty()) opt_->load_state_dict(opt_part);
  return std::stoll(meta["step"]);
}

std::unique_ptr<Trainer> trainer_from_checkpoint(const std::string& path, int threads) {
  std::map<std::string, std::string> meta;
  read_safetensors(path, &meta);
  if (meta["format"] != "attn-train-1") {
    throw Error(fmt::format("attn eval: {} is not an attn training checkpoint", path));
  }
  TrainConfig c;
  try {
    c.task = meta.at("task");
    c.length = std::stoll(meta.at("length"));
    c.d_model = std::stoll(meta.at("d_model"));
    c.heads = std::stoll(meta.at("heads"));
    c.layers = std::stoll(meta.at("layers"));
    c.d_ff = std::stoll(meta.at("d_ff"));
    c.seed = std::stoull(meta.at("seed"));
  } catch (const std::exception&) {
    throw Error(fmt::format("attn eval: checkpoint {} has incomplete or malformed metadata", path));
  }
  c.threads = threads;
  auto t = std::make_unique<Trainer>(c);
  t->load_checkpoint(path);
  return t;
}

}  // namespace attn::tools
