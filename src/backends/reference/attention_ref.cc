// The reference backend: the contract (docs/semantics.md) written out one row at a time, in double.
//
// forward:
//   s_ij = scale * q_i.k_j; s = c * tanh(s / c) (softcap); s -= slope[h] * |p(i) - j| (ALiBi);
//   s += m_ij (add mask). Keys removed by the position rule, key lengths, keep/drop masks, the
//   block layout or an add mask of -inf are skipped: their q.k is never formed, their v never used.
//   P_ij = exp(s_ij - max_i) / sum_i, lse_i = max_i + log(sum_i), where with a sink logit
//   sink_h the max and the sum include it (sum_i += exp(sink_h - max_i)) and it has no value,
//   out_i = sum_j P_ij z_ij v_j with z_ij = keep(b, h, i, j) / (1 - p) under dropout, else 1.
// backward:
//   P_ij = exp(s_ij - lse_i) from the forward's LSE; D_i = dO_i.O_i; dP_ij = z_ij dO_i.v_j;
//   dS_ij = P_ij (dP_ij - D_i) (= d(add mask)); through softcap
//   dS'_ij = dS_ij (1 - tanh^2(raw_ij / c)) with raw_ij = scale * q_i.k_j;
//   dq_i = scale sum_j dS'_ij k_j, dk_j = scale sum_i dS'_ij q_i, dv_j = sum_i P_ij z_ij dO_i,
//   with dk and dv summed over the query heads of a GQA group. With dW = dL/dweights (the weights
//   returned before dropout): dS_ij += P_ij (dW_ij - sum_j P_ij dW_ij), the softmax's backward.
//   A sink's weight P_i,sink = exp(sink_h - lse_i) has dP = 0 (no value): dsink_h = -sum_i
//   P_i,sink (D_i + sum_j P_ij dW_ij).
//
// Speed is not a goal, but each task first copies the rows it reads into double matrices (through
// load_as_double, so any dtype and any strides work) instead of converting inside the inner loops.
// The forward runs one task per (batch, query head), the backward one per (batch, kv head) so that
// a task owns its dk / dv rows and no two tasks write the same element.
#include "backends/reference/attention_ref.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/parallel.h"

namespace attn::reference {

namespace {

using contract::BackwardProblem;
using contract::ForwardProblem;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Address of element (b, h, i, d) of a 4-D view; the strides are in elements.
char* address(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  const Shape& st = t.strides();
  const int64_t offset = b * st[0] + h * st[1] + i * st[2] + d * st[3];
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(t.itemsize());
}
double get(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  return load_as_double(address(t, b, h, i, d), t.dtype());
}
void put(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d, double value) {
  store_from_double(address(t, b, h, i, d), t.dtype(), value);
}
// lse is a 3-D view [B, Hq, Lq].
char* lse_address(const Tensor& t, int64_t b, int64_t h, int64_t i) {
  const Shape& st = t.strides();
  const int64_t offset = b * st[0] + h * st[1] + i * st[2];
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(t.itemsize());
}

// Rows [0, rows) of head (b, h) of a 4-D view as a row-major [rows, cols] matrix of doubles.
// Copying a removed key's NaN is harmless: nothing computes with it.
std::vector<double> load_rows(const Tensor& t, int64_t b, int64_t h, int64_t rows, int64_t cols) {
  std::vector<double> m(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t d = 0; d < cols; ++d) m[i * cols + d] = get(t, b, h, i, d);
  }
  return m;
}

// The scores of one query row (b, h, i) over all Lk keys. allowed[j] == false: the key is removed
// and s[j], cap_slope[j] are meaningless (never read). cap_slope[j] = d(capped score) / d(raw
// score) = 1 - tanh^2.
struct RowScores {
  std::vector<char> allowed;
  std::vector<double> s;
  std::vector<double> cap_slope;
  bool any = false;  // at least one allowed key with a score above -inf
  double max = kNegInf;
};

// Every rule of the contract except the add mask's -inf, which row_scores() checks before computing
// q.k.
bool key_allowed(const ForwardProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!p.rule.allowed(i, j, p.key_length_of(b))) return false;
  if (p.mask.defined() && p.mask_type != MaskType::add) {
    const bool flag = get(p.mask, b, h, i, j) != 0.0;
    if (p.mask_type == MaskType::keep ? !flag : flag) return false;
  }
  if (p.block_layout.defined() && get(p.block_layout, b, h, i / p.block_q, j / p.block_k) == 0.0)
    return false;
  return true;
}

// q_row: [D] the query; K: [Lk, D] the keys of its kv head.
void row_scores(const ForwardProblem& p, int64_t b, int64_t h, int64_t i, const double* q_row,
                const std::vector<double>& K, RowScores* r) {
  r->allowed.assign(p.Lk, 0);
  r->s.assign(p.Lk, 0.0);
  r->cap_slope.assign(p.Lk, 1.0);
  r->any = false;
  r->max = kNegInf;
  for (int64_t j = 0; j < p.Lk; ++j) {
    if (!key_allowed(p, b, h, i, j)) continue;
    double add = 0.0;
    if (p.mask.defined() && p.mask_type == MaskType::add) {
      add = get(p.mask, b, h, i, j);
      if (add == kNegInf) continue;  // -inf removes the key: q.k (perhaps NaN) must not be formed
    }
    double dot = 0.0;
    for (int64_t d = 0; d < p.D; ++d) dot += q_row[d] * K[j * p.D + d];
    double s = p.scale * dot;
    if (p.softcap > 0.0) {
      const double t = std::tanh(s / p.softcap);
      s = p.softcap * t;
      r->cap_slope[j] = 1.0 - t * t;
    }
    if (!p.alibi.empty()) s -= p.alibi[h] * static_cast<double>(std::llabs(p.rule.pos(i) - j));
    s += add;
    r->allowed[j] = 1;
    r->s[j] = s;
    if (s > r->max || std::isnan(s))
      r->max = s;  // a NaN score stays the max: the row is NaN (IEEE)
  }
  // A row whose allowed scores are all -inf (or that has none) has max == -inf and is treated as
  // fully masked; a NaN max is not a masked row (docs/semantics.md: NaN in q or an allowed k
  // propagates).
  r->any = !(r->max == kNegInf);
}

// One (batch, query head): rows i = 0 .. Lq-1.
void forward_head(const ForwardProblem& p, int64_t b, int64_t h) {
  const int64_t kvh = h / p.group;
  const double keep_scale = p.dropout.active() ? p.dropout.keep_scale() : 1.0;
  const std::vector<double> Q = load_rows(p.q, b, h, p.Lq, p.D);     // [Lq, D]
  const std::vector<double> K = load_rows(p.k, b, kvh, p.Lk, p.D);   // [Lk, D]
  const std::vector<double> V = load_rows(p.v, b, kvh, p.Lk, p.Dv);  // [Lk, Dv]
  const bool sink = !p.sinks.empty();
  const double sink_logit = sink ? p.sinks[h] : kNegInf;
  RowScores r;
  std::vector<double> prob(p.Lk), acc(p.Dv);
  for (int64_t i = 0; i < p.Lq; ++i) {
    row_scores(p, b, h, i, Q.data() + i * p.D, K, &r);
    std::fill(prob.begin(), prob.end(), 0.0);
    std::fill(acc.begin(), acc.end(), 0.0);
    double lse = kNegInf;
    if (r.any || sink) {
      // The max over the allowed scores and the sink: finite or NaN here (r.any or a sink), so
      // s - max never evaluates -inf - -inf; removed keys are skipped.
      const double max = std::isnan(r.max) ? r.max : std::max(r.max, sink_logit);
      double sum = sink ? std::exp(sink_logit - max) : 0.0;
      for (int64_t j = 0; j < p.Lk; ++j) {
        if (r.allowed[j]) sum += std::exp(r.s[j] - max);
      }
      lse = max + std::log(sum);
      for (int64_t j = 0; j < p.Lk; ++j) {
        if (!r.allowed[j]) continue;
        prob[j] = std::exp(r.s[j] - max) / sum;
        // exp underflow: contributes nothing (and an inf v must not make NaN)
        if (prob[j] == 0.0) continue;
        double w = prob[j];
        if (p.dropout.active()) w = p.dropout.keep(b, h, i, j) ? w * keep_scale : 0.0;
        if (w == 0.0) continue;  // a dropped weight removes v_j entirely, like a mask
        for (int64_t d = 0; d < p.Dv; ++d) acc[d] += w * V[j * p.Dv + d];
      }
    }
    for (int64_t d = 0; d < p.Dv; ++d) put(p.out, b, h, i, d, acc[d]);
    store_from_double(lse_address(p.lse, b, h, i), p.lse.dtype(), lse);
    if (p.weights.defined()) {
      for (int64_t j = 0; j < p.Lk; ++j) put(p.weights, b, h, i, j, prob[j]);
    }
  }
}

// One (batch, kv head): every query head of its group, every row; owns dk / dv of this kv head and
// dq / dscores of the group's query heads.
void backward_kv_head(const BackwardProblem& p, int64_t b, int64_t kvh) {
  const double keep_scale = p.dropout.active() ? p.dropout.keep_scale() : 1.0;
  const std::vector<double> K = load_rows(p.k, b, kvh, p.Lk, p.D);   // [Lk, D]
  const std::vector<double> V = load_rows(p.v, b, kvh, p.Lk, p.Dv);  // [Lk, Dv]
  std::vector<double> dk(p.Lk * p.D, 0.0), dv(p.Lk * p.Dv, 0.0), dq(p.D), ds(p.Lk), dout(p.Dv);
  const bool sink = !p.sinks.empty();
  RowScores r;
  for (int64_t h = kvh * p.group; h < (kvh + 1) * p.group; ++h) {
    const std::vector<double> Q = load_rows(p.q, b, h, p.Lq, p.D);  // [Lq, D]
    double dsink = 0.0;
    for (int64_t i = 0; i < p.Lq; ++i) {
      const double* q_row = Q.data() + i * p.D;
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(ds.begin(), ds.end(), 0.0);
      const double lse = load_as_double(lse_address(p.lse, b, h, i), p.lse.dtype());
      row_scores(p, b, h, i, q_row, K, &r);
      // A fully masked row (lse == -inf, no allowed key) contributes no gradient at all: dO_i is
      // not even read.
      // (with a sink, a row without allowed keys has lse = the sink, out 0, and no gradient)
      if ((r.any || sink) && !(lse == kNegInf)) {  // a NaN lse (NaN row) propagates
        double delta = 0.0;                        // D_i = dO_i . O_i
        for (int64_t d = 0; d < p.Dv; ++d) {
          dout[d] = get(p.dout, b, h, i, d);
          delta += dout[d] * get(p.out, b, h, i, d);
        }
        // The returned weights' gradient dW: dS_ij += P_ij (dW_ij - wdot), wdot = sum_j P_ij dW_ij.
        double wdot = 0.0;
        if (p.dweights.defined()) {
          for (int64_t j = 0; j < p.Lk; ++j) {
            if (!r.allowed[j]) continue;
            const double prob = std::exp(r.s[j] - lse);
            if (prob != 0.0) wdot += prob * get(p.dweights, b, h, i, j);
          }
        }
        for (int64_t j = 0; j < p.Lk; ++j) {
          if (!r.allowed[j]) continue;
          const double prob = std::exp(r.s[j] - lse);  // lse is finite: no -inf - -inf
          if (prob == 0.0) continue;
          const double z =
              p.dropout.active() ? (p.dropout.keep(b, h, i, j) ? keep_scale : 0.0) : 1.0;
          double dp = 0.0;  // dP_ij = z_ij dO_i . v_j
          if (z != 0.0) {
            for (int64_t d = 0; d < p.Dv; ++d) dp += dout[d] * V[j * p.Dv + d];
            dp *= z;
            // dv_j += P_ij z_ij dO_i   (from out_i = sum_j P_ij z_ij v_j)
            for (int64_t d = 0; d < p.Dv; ++d) dv[j * p.Dv + d] += prob * z * dout[d];
          }
          ds[j] = prob * (dp - delta);  // d(add mask) = dS: the mask is added after softcap
          if (p.dweights.defined()) ds[j] += prob * (get(p.dweights, b, h, i, j) - wdot);
          const double ds_raw = ds[j] * r.cap_slope[j];  // back through s = c * tanh(s_raw / c)
          // s_raw = scale * q_i . k_j
          for (int64_t d = 0; d < p.D; ++d) {
            dq[d] += p.scale * ds_raw * K[j * p.D + d];
            dk[j * p.D + d] += p.scale * ds_raw * q_row[d];
          }
        }
        if (sink) dsink -= std::exp(p.sinks[h] - lse) * (delta + wdot);
      }
      for (int64_t d = 0; d < p.D; ++d) put(p.dq, b, h, i, d, dq[d]);
      if (p.dscores.defined()) {
        for (int64_t j = 0; j < p.Lk; ++j) put(p.dscores, b, h, i, j, ds[j]);
      }
    }
    if (p.dsinks.defined()) p.dsinks.data_as<double>()[b * p.Hq + h] = dsink;
  }
  for (int64_t j = 0; j < p.Lk; ++j) {
    for (int64_t d = 0; d < p.D; ++d) put(p.dk, b, kvh, j, d, dk[j * p.D + d]);
    for (int64_t d = 0; d < p.Dv; ++d) put(p.dv, b, kvh, j, d, dv[j * p.Dv + d]);
  }
}

}  // namespace

void forward(const ForwardProblem& p) {
  assert(p.Hkv == 0 || p.Hq == p.Hkv * p.group);
  parallel_for(p.B * p.Hq, p.threads,
               [&](int64_t task, int) { forward_head(p, task / p.Hq, task % p.Hq); });
}

void backward(const BackwardProblem& p) {
  assert(p.Hkv == 0 || p.Hq == p.Hkv * p.group);
  parallel_for(p.B * p.Hkv, p.threads,
               [&](int64_t task, int) { backward_kv_head(p, task / p.Hkv, task % p.Hkv); });
}

}  // namespace attn::reference
