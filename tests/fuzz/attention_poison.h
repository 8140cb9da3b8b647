// Non-finite values where the contract says nothing may reach them (docs/semantics.md), checked by
// the attention fuzz harness:
//   - NaN/inf written into keys and values that every row removes changes nothing (bitwise);
//   - a NaN in one query row gives a NaN output row (where the row has an allowed key), weights that
//     stay exactly 0 on the keys the row removes, and leaves every other row bitwise equal;
//   - in the backward, that NaN reaches dq of its own row and dk / dv of the keys the row uses, and
//     nothing else: dq of the other rows and dk / dv of the other keys keep their values (dk's
//     element 0, the NaN's own column, is left free: 0 * NaN there is NaN on any backend that
//     multiplies through a removed key).
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

// The NaN query row: row Lq - 1 of (batch 0, head 0), element 0 of its query.
inline bool nan_row_applies(const Case& c) {
  return c.poison == 2 && c.o.dropout_p == 0 && c.B > 0 && c.Lq > 0;
}
inline int64_t nan_row(const Case& c) {
  return c.Lq - 1;
}
inline bool nan_row_uses(const Case& c, int64_t j) {
  return c.allowed(0, 0, nan_row(c), j);
}
inline bool nan_row_has_keys(const Case& c) {
  for (int64_t j = 0; j < c.Lk; ++j)
    if (nan_row_uses(c, j)) return true;
  return false;
}
inline Tensor nan_query(const Case& c) {
  Tensor q = c.q.clone();
  std::vector<int64_t> idx(static_cast<size_t>(q.dim()), 0);
  idx[idx.size() - 2] = nan_row(c);
  q.set(idx, std::numeric_limits<double>::quiet_NaN());
  return q;
}

inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

// Row-major [rows, width] values of (batch 0, head 0) first: element e belongs to the NaN row when
// e / width is the row's index. NaN there where `nan_expected(e % width)`, bitwise equal elsewhere
// (removed keys' weights and the other rows).
template <class NanExpected>
void check_nan_row_values(const Case& c, const Tensor& base, const Tensor& poisoned, int64_t width,
                          NanExpected nan_expected, const std::string& what) {
  const std::vector<double> v0 = base.to_vector(), v1 = poisoned.to_vector();
  for (size_t e = 0; e < v1.size(); ++e) {
    const int64_t col = static_cast<int64_t>(e) % width;
    if (static_cast<int64_t>(e) / width == nan_row(c) && nan_expected(col)) {
      require(std::isnan(v1[e]), fmt::format("{}: NaN query row gave {}", what, v1[e]));
    } else {
      require(same_bits(v0[e], v1[e]),
              fmt::format("{}: a NaN query row changed [{}]: {} -> {}", what, e, v0[e], v1[e]));
    }
  }
}

inline void check_poisoned_forward(const Case& c, const AttentionResult& ref,
                                   const AttentionResult& fast) {
  if (c.poison == 1) {
    Tensor k = c.k, v = c.v;
    if (poison_removed_keys(c, k, v)) {
      check_same(ref, forward(c, c.q, k, v, Backend::reference, c.threads_a),
                 "reference with NaN/inf in removed keys");
      check_same(fast, forward(c, c.q, k, v, Backend::automatic, c.threads_a),
                 "auto with NaN/inf in removed keys");
    }
    return;
  }
  if (!nan_row_applies(c)) return;
  const Tensor q = nan_query(c);
  const bool has_keys = nan_row_has_keys(c);
  for (Backend be : {Backend::reference, Backend::automatic}) {
    const AttentionResult& base = be == Backend::reference ? ref : fast;
    const AttentionResult r = forward(c, q, c.k, c.v, be, c.threads_a);
    const std::string name = backend_name(be);
    check_nan_row_values(
        c, base.out, r.out, c.Dv, [&](int64_t) { return has_keys; }, name + " out");
    if (c.o.return_weights) {
      check_nan_row_values(
          c, base.weights, r.weights, c.Lk, [&](int64_t j) { return nan_row_uses(c, j); },
          name + " weights");
    }
  }
}

// dk / dv ([B, Hkv, Lk, width], logical order): NaN for the keys of (batch 0, kv head 0) that the
// NaN row uses, the base run's value (up to the sign of a zero) elsewhere, except `free_col` of
// batch 0, kv head 0.
inline void check_key_grads(const Case& c, const Tensor& base, const Tensor& poisoned,
                            int64_t width, int64_t free_col, const std::string& what) {
  const std::vector<double> v0 = base.contiguous().to_vector(),
                            v1 = poisoned.contiguous().to_vector();
  for (size_t e = 0; e < v1.size(); ++e) {
    const int64_t col = static_cast<int64_t>(e) % width, key = static_cast<int64_t>(e) / width;
    const bool head0 = key < c.Lk;  // batch 0, kv head 0
    if (head0 && nan_row_uses(c, key)) {
      require(std::isnan(v1[e]),
              fmt::format("{}: key {} used by the NaN row has {}", what, key, v1[e]));
    } else if (!(head0 && col == free_col)) {
      require(v1[e] == v0[e],
              fmt::format("{}: a NaN query row changed [{}]: {} -> {}", what, e, v0[e], v1[e]));
    }
  }
}

inline void check_nan_row_backward(const Case& c, const Tensor& dout, const AttentionGrads& gref,
                                   const AttentionGrads& gfast) {
  if (!nan_row_applies(c)) return;
  const Tensor q = nan_query(c);
  const bool has_keys = nan_row_has_keys(c);
  for (Backend be : {Backend::reference, Backend::automatic}) {
    AttentionOptions o = c.o;
    o.backend = be;
    o.threads = c.threads_a;
    const AttentionResult r = attention(q, c.k, c.v, o);
    const AttentionGrads g = attention_backward(dout, q, c.k, c.v, r.out, r.lse, o);
    const AttentionGrads& base = be == Backend::reference ? gref : gfast;
    const std::string name = backend_name(be);
    const std::vector<double> dq0 = base.dq.contiguous().to_vector(),
                              dq1 = g.dq.contiguous().to_vector();
    for (size_t e = 0; e < dq1.size(); ++e) {
      if (static_cast<int64_t>(e) / c.D == nan_row(c)) {
        require(has_keys ? std::isnan(dq1[e]) : dq1[e] == 0,
                fmt::format("{} dq: the NaN row's dq is {}", name, dq1[e]));
      } else {
        require(dq1[e] == dq0[e], fmt::format("{} dq: a NaN query row changed [{}]: {} -> {}", name,
                                              e, dq0[e], dq1[e]));
      }
    }
    check_key_grads(c, base.dk, g.dk, c.D, 0, name + " dk");
    check_key_grads(c, base.dv, g.dv, c.Dv, -1, name + " dv");
  }
}

}  // namespace attn::fuzz::attention_detail
