#include "tools/tasks.h"

#include <fmt/format.h>

#include <algorithm>

#include "attn/error.h"

namespace attn::tools {

Batch Task::batch(std::mt19937_64& rng, int64_t n) const {
  Batch b;
  b.batch = n;
  b.length = length();
  b.ids.resize(static_cast<size_t>(n * b.length));
  b.targets.resize(b.ids.size());
  for (int64_t i = 0; i < n; ++i) sample(rng, &b.ids[i * b.length], &b.targets[i * b.length]);
  return b;
}

namespace {

// Symbols 'a', 'b', ... as tokens 0 .. symbols-1.
std::string letter(int64_t id) {
  return std::string(1, static_cast<char>('a' + id));
}

// Bidirectional tasks over sequences of `length` symbols drawn uniformly from kSymbols letters; the
// targets are a function of the whole sequence (its reverse, its sorted order).
class SymbolTask : public Task {
 public:
  explicit SymbolTask(int64_t length) : n_(length) {}
  bool causal() const override { return false; }
  int64_t vocab_size() const override { return kSymbols; }
  int64_t length() const override { return n_; }
  std::string token(int64_t id) const override { return letter(id); }
  void sample(std::mt19937_64& rng, int64_t* ids, int64_t* targets) const override {
    std::uniform_int_distribution<int64_t> sym(0, kSymbols - 1);
    for (int64_t i = 0; i < n_; ++i) ids[i] = sym(rng);
    make_targets(ids, targets);
  }

 protected:
  virtual void make_targets(const int64_t* ids, int64_t* targets) const = 0;
  static constexpr int64_t kSymbols = 16;
  int64_t n_;
};

class Reverse : public SymbolTask {
 public:
  using SymbolTask::SymbolTask;
  std::string name() const override { return "reverse"; }

 private:
  void make_targets(const int64_t* ids, int64_t* targets) const override {
    for (int64_t i = 0; i < n_; ++i) targets[i] = ids[n_ - 1 - i];
  }
};

class Sort : public SymbolTask {
 public:
  using SymbolTask::SymbolTask;
  std::string name() const override { return "sort"; }

 private:
  void make_targets(const int64_t* ids, int64_t* targets) const override {
    std::copy(ids, ids + n_, targets);
    std::sort(targets, targets + n_);
  }
};

// ids = s_0 .. s_{n-1} SEP s_0 .. s_{n-2}; the targets at SEP and after are s_0 .. s_{n-1}: each position of
// the second half predicts the next token of the copy.
class Copy : public Task {
 public:
  explicit Copy(int64_t n) : n_(n) {}
  std::string name() const override { return "copy"; }
  bool causal() const override { return true; }
  int64_t vocab_size() const override { return kSymbols + 1; }
  int64_t length() const override { return 2 * n_; }
  std::string token(int64_t id) const override { return id == kSymbols ? "|" : letter(id); }
  void sample(std::mt19937_64& rng, int64_t* ids, int64_t* targets) const override {
    std::uniform_int_distribution<int64_t> sym(0, kSymbols - 1);
    std::vector<int64_t> s(static_cast<size_t>(n_));
    for (auto& x : s) x = sym(rng);
    for (int64_t i = 0; i < n_; ++i) ids[i] = s[i], targets[i] = kIgnore;
    ids[n_] = kSymbols;
    for (int64_t i = 0; i + 1 < n_; ++i) ids[n_ + 1 + i] = s[i];
    for (int64_t i = 0; i < n_; ++i) targets[n_ + i] = s[i];
  }

 private:
  static constexpr int64_t kSymbols = 16;
  int64_t n_;
};

// Digits least significant first: a (n digits) '+' b (n digits) '=' c (n + 1 digits, the last predicted
// token has no successor in the input). ids = a + b = c_0 .. c_{n-1}; targets from '=' on are c_0 .. c_n.
class Add : public Task {
 public:
  explicit Add(int64_t digits) : n_(digits) {}
  std::string name() const override { return "add"; }
  bool causal() const override { return true; }
  int64_t vocab_size() const override { return 12; }
  int64_t length() const override { return 3 * n_ + 2; }
  std::string token(int64_t id) const override {
    if (id == kPlus) return "+";
    if (id == kEq) return "=";
    return std::to_string(id);
  }
  void sample(std::mt19937_64& rng, int64_t* ids, int64_t* targets) const override {
    std::uniform_int_distribution<int64_t> digit(0, 9);
    std::vector<int64_t> a(n_), b(n_), c(n_ + 1);
    for (int64_t i = 0; i < n_; ++i) a[i] = digit(rng), b[i] = digit(rng);
    int64_t carry = 0;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t s = a[i] + b[i] + carry;
      c[i] = s % 10;
      carry = s / 10;
    }
    c[n_] = carry;
    int64_t p = 0;
    for (int64_t i = 0; i < n_; ++i) ids[p++] = a[i];
    ids[p++] = kPlus;
    for (int64_t i = 0; i < n_; ++i) ids[p++] = b[i];
    ids[p++] = kEq;
    for (int64_t i = 0; i < n_; ++i) ids[p++] = c[i];
    for (int64_t i = 0; i < 2 * n_ + 1; ++i) targets[i] = kIgnore;
    for (int64_t i = 0; i <= n_; ++i) targets[2 * n_ + 1 + i] = c[i];
  }

 private:
  static constexpr int64_t kPlus = 10, kEq = 11;
  int64_t n_;
};

}  // namespace

std::vector<std::string> task_names() {
  return {"reverse", "sort", "copy", "add"};
}

std::unique_ptr<Task> make_task(const std::string& name, int64_t size) {
  if (size < 1 || size > 256)
    throw Error(fmt::format("attn train: --length must be in [1, 256], got {}", size));
  if (name == "reverse") return std::make_unique<Reverse>(size);
  if (name == "sort") return std::make_unique<Sort>(size);
  if (name == "copy") return std::make_unique<Copy>(size);
  if (name == "add") return std::make_unique<Add>(size);
  throw Error(
      fmt::format("attn train: unknown task '{}' (expected reverse, sort, copy or add)", name));
}

}  // namespace attn::tools
