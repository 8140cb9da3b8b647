// Synthetic sequence tasks for `attn train` and `attn demo`, generated on the fly from a seed (no
// downloads). Every task yields token ids and per-position targets; positions whose target is
// kIgnore carry no loss. A sequence counts as correct when every scored position is predicted right.
//
//   reverse  (bidirectional)  x = a b c d          targets = d c b a          (anti-diagonal attention)
//   sort     (bidirectional)  x = c a d b          targets = a b c d
//   copy     (causal LM)      x = a b c d | a b c  targets from '|' on = a b c d (the next token)
//   add      (causal LM)      x = 3 2 1 + 6 5 4 =  targets = the digits of 123 + 456 (least significant first)
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace attn::tools {

inline constexpr int64_t kIgnore = -100;

struct Batch {
  int64_t batch = 0, length = 0;
  std::vector<int64_t> ids;      // [batch, length]
  std::vector<int64_t> targets;  // [batch, length], kIgnore where there is no loss
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual bool causal() const = 0;  // causal language model (true) or bidirectional encoder (false)
  virtual int64_t vocab_size() const = 0;
  virtual int64_t length() const = 0;  // tokens per sequence
  virtual std::string token(int64_t id) const = 0;
  // One example: ids and targets of length(), drawn from rng.
  virtual void sample(std::mt19937_64& rng, int64_t* ids, int64_t* targets) const = 0;

  Batch batch(std::mt19937_64& rng, int64_t n) const;
};

// `size` is the number of symbols (reverse, sort, copy) or digits per operand (add).
std::unique_ptr<Task> make_task(const std::string& name, int64_t size);
std::vector<std::string> task_names();

}  // namespace attn::tools
