// Non-finite values where the contract says nothing may reach them (docs/semantics.md), checked by
// the attention fuzz harness:
//   - NaN/inf written into keys and values that every row removes changes nothing (bitwise);
//   - a NaN in one query row (poison 2), or NaN / inf in one key's k and v that some rows use and
//     others remove (poison 3), makes exactly the "poisoned" rows NaN: the query row (when it has an
//     allowed key), or every row that uses the key. Their weights are NaN on the keys they use and
//     stay exactly 0 on the keys they remove; every other row is bitwise equal;
//   - in the backward, the NaN reaches dq of the poisoned rows and dk / dv of the keys they use, and
//     nothing else: dq of the other rows and dk / dv of the other keys keep their values (for a NaN
//     query, dk's element 0, the NaN's own column, is left free: 0 * NaN there is NaN on any
//     backend that multiplies through a removed key).
#pragma once
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "fuzz/attention_case.h"
#include "fuzz/fuzz_input.h"

namespace attn::fuzz::attention_detail {

// NaN/inf into every key/value row that no query row may use (a removed key never touches the
// output). Returns false when there is no such key.
inline bool poison_removed_keys(const Case& c, Tensor& k, Tensor& v) {
  k = k.clone();
  v = v.clone();
  bool any = false;
  const int64_t group = c.Hq / c.Hkv;
  for (int64_t b = 0; b < c.B; ++b) {
    const std::vector<int64_t> bi = unflatten(b, c.batch);
    for (int64_t hk = 0; hk < c.Hkv; ++hk) {
      for (int64_t j = 0; j < c.Lk; ++j) {
        bool used = false;
        for (int64_t h = hk * group; h < (hk + 1) * group && !used; ++h)
          for (int64_t i = 0; i < c.Lq && !used; ++i) used = c.allowed(b, h, i, j);
        if (used) continue;
        any = true;
        std::vector<int64_t> idx = bi;
        idx.insert(idx.end(), {hk, j, 0});
        for (int64_t e = 0; e < c.D; ++e) {
          idx.back() = e;
          k.set(idx, e % 2 ? std::numeric_limits<double>::quiet_NaN()
                           : -std::numeric_limits<double>::infinity());
        }
        for (int64_t e = 0; e < c.Dv; ++e) {
          idx.back() = e;
          v.set(idx, e % 2 ? std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::quiet_NaN());
        }
      }
    }
  }
  return any;
}

// The NaN rows of poison 2 and 3 (dropout off: a dropped key would still poison the row's max).
// Poison 2: row Lq - 1 of (batch 0, head 0) gets a NaN in element 0 of its query. Poison 3 (the
// case's seed picks it over poison 1 half of the time): key `key` of (batch 0, kv head 0) gets
// NaN in k and NaN / inf in v.
struct NanRows {
  const Case& c;
  int kind = 0;  // 0: not this case, 2: a NaN query row, 3: a NaN key
  int64_t key = 0;

  explicit NanRows(const Case& cs) : c(cs) {
    if (c.o.dropout_p != 0 || c.B == 0) return;
    if (c.poison == 2 && c.Lq > 0 && c.Hq > 0) kind = 2;
    if (c.poison == 1 && (c.seed & 1) && c.Lk > 0 && c.Hkv > 0 && c.D > 0) {
      kind = 3;
      key = static_cast<int64_t>((c.seed >> 1) % static_cast<uint64_t>(c.Lk));
    }
  }
  int64_t group() const { return c.Hq / c.Hkv; }
  bool uses_any_key(int64_t h, int64_t i) const {
    for (int64_t j = 0; j < c.Lk; ++j)
      if (c.allowed(0, h, i, j)) return true;
    return false;
  }
  // Whether row i of (batch 0, head h) is NaN: it reads the NaN.
  bool row(int64_t h, int64_t i) const {
    if (kind == 2) return h == 0 && i == c.Lq - 1 && uses_any_key(h, i);
    return kind == 3 && h < group() && c.allowed(0, h, i, key);
  }
  // Whether key j of (batch 0, kv head 0) gets NaN in dk / dv: a NaN row uses it.
  bool key_grad(int64_t j) const {
    const int64_t heads = kind == 2 ? 1 : group();
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < c.Lq; ++i)
        if (row(h, i) && c.allowed(0, h, i, j)) return true;
    return false;
  }
  // The inputs with the NaN written in.
  void poison(Tensor& q, Tensor& k, Tensor& v) const {
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    if (kind == 2) {
      q = q.clone();
      std::vector<int64_t> idx(static_cast<size_t>(q.dim()), 0);
      idx[idx.size() - 2] = c.Lq - 1;
      q.set(idx, nan);
      return;
    }
    k = k.clone();
    v = v.clone();
    std::vector<int64_t> idx(static_cast<size_t>(k.dim()), 0);
    idx[idx.size() - 2] = key;
    for (int64_t e = 0; e < c.D; ++e) idx.back() = e, k.set(idx, nan);
    for (int64_t e = 0; e < c.Dv; ++e)
      idx.back() = e, v.set(idx, e % 2 ? std::numeric_limits<double>::infinity() : nan);
  }
};

inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

// Per-row values [B, Hq, Lq, width] (logical order): NaN where the row is a NaN row and
// `nan_at(h, i, col)`, the base run's bits elsewhere (removed keys' weights and the other rows);
// `exact` false: the base run's value up to the sign of a zero (sums with a 0 term).
template <class NanAt>
void check_rows_values(const NanRows& n, const Tensor& base, const Tensor& poisoned, int64_t width,
                       NanAt nan_at, bool exact, const std::string& what) {
  const Case& c = n.c;
  const std::vector<double> v0 = base.contiguous().to_vector(),
                            v1 = poisoned.contiguous().to_vector();
  for (size_t e = 0; e < v1.size(); ++e) {
    const int64_t r = static_cast<int64_t>(e) / width, col = static_cast<int64_t>(e) % width;
    const int64_t b = r / (c.Hq * c.Lq), h = r / c.Lq % c.Hq, i = r % c.Lq;
    if (b == 0 && n.row(h, i) && nan_at(h, i, col)) {
      require(std::isnan(v1[e]),
              fmt::format("{}: row ({}, {}) reads a NaN but [{}] is {}", what, h, i, col, v1[e]));
    } else {
      require(exact ? same_bits(v0[e], v1[e]) : v0[e] == v1[e],
              fmt::format("{}: a NaN elsewhere changed [{}] (head {}, row {}): {} -> {}", what, e,
                          h, i, v0[e], v1[e]));
    }
  }
}

// The inputs of a NaN-row case with the NaN written in, and their forward on each backend (index 0
// reference, 1 automatic): the backward check reuses them instead of running the forward again.
struct Poisoned {
  Tensor q, k, v;
  AttentionResult r[2];
};

inline Poisoned check_poisoned_forward(const Case& c, const AttentionResult& ref,
                                       const AttentionResult& fast) {
  const NanRows n(c);
  if (c.poison == 1 && n.kind == 0) {
    Tensor k = c.k, v = c.v;
    if (poison_removed_keys(c, k, v)) {
      check_same(ref, forward(c, c.q, k, v, Backend::reference, c.threads_a),
                 "reference with NaN/inf in removed keys");
      check_same(fast, forward(c, c.q, k, v, Backend::automatic, c.threads_a),
                 "auto with NaN/inf in removed keys");
    }
    return {};
  }
  if (n.kind == 0) return {};
  Poisoned p{c.q, c.k, c.v, {}};
  n.poison(p.q, p.k, p.v);
  const std::string what = n.kind == 2 ? "a NaN query row" : "a NaN key";
  for (Backend be : {Backend::reference, Backend::automatic}) {
    const AttentionResult& base = be == Backend::reference ? ref : fast;
    const AttentionResult& r = p.r[be == Backend::reference ? 0 : 1] =
        forward(c, p.q, p.k, p.v, be, c.threads_a);
    const std::string name = fmt::format("{} with {}", backend_name(be), what);
    auto whole_row = [](int64_t, int64_t, int64_t) { return true; };
    check_rows_values(n, base.out, r.out, c.Dv, whole_row, true, name + ": out");
    check_rows_values(n, base.lse, r.lse, 1, whole_row, true, name + ": lse");
    if (c.o.return_weights) {
      auto used = [&](int64_t h, int64_t i, int64_t j) { return c.allowed(0, h, i, j); };
      check_rows_values(n, base.weights, r.weights, c.Lk, used, true, name + ": weights");
    }
  }
  return p;
}

// dk / dv ([B, Hkv, Lk, width], logical order): NaN for the keys of (batch 0, kv head 0) that a NaN
// row uses, the base run's value (up to the sign of a zero) elsewhere, except `free_col` of batch
// 0, kv head 0.
inline void check_key_grads(const NanRows& n, const Tensor& base, const Tensor& poisoned,
                            int64_t width, int64_t free_col, const std::string& what) {
  const std::vector<double> v0 = base.contiguous().to_vector(),
                            v1 = poisoned.contiguous().to_vector();
  for (size_t e = 0; e < v1.size(); ++e) {
    const int64_t col = static_cast<int64_t>(e) % width, key = static_cast<int64_t>(e) / width;
    const bool head0 = key < n.c.Lk;  // batch 0, kv head 0
    if (head0 && n.key_grad(key)) {
      require(std::isnan(v1[e]),
              fmt::format("{}: key {} used by a NaN row has {}", what, key, v1[e]));
    } else if (!(head0 && col == free_col)) {
      require(v1[e] == v0[e],
              fmt::format("{}: a NaN elsewhere changed [{}]: {} -> {}", what, e, v0[e], v1[e]));
    }
  }
}

inline void check_poisoned_backward(const Case& c, const Poisoned& p, const Tensor& dout,
                                    const AttentionGrads& gref, const AttentionGrads& gfast) {
  const NanRows n(c);
  if (n.kind == 0) return;
  const std::string what = n.kind == 2 ? "a NaN query row" : "a NaN key";
  for (Backend be : {Backend::reference, Backend::automatic}) {
    AttentionOptions o = c.o;
    o.backend = be;
    o.threads = c.threads_a;
    const AttentionResult& r = p.r[be == Backend::reference ? 0 : 1];
    const AttentionGrads g = attention_backward(dout, p.q, p.k, p.v, r.out, r.lse, o);
    const AttentionGrads& base = be == Backend::reference ? gref : gfast;
    const std::string name = fmt::format("{} with {}", backend_name(be), what);
    auto whole_row = [](int64_t, int64_t, int64_t) { return true; };
    check_rows_values(n, base.dq, g.dq, c.D, whole_row, false, name + ": dq");
    check_key_grads(n, base.dk, g.dk, c.D, n.kind == 2 ? 0 : -1, name + ": dk");
    check_key_grads(n, base.dv, g.dv, c.Dv, -1, name + ": dv");
  }
}

}  // namespace attn::fuzz::attention_detail
