// attn::linear_attention / linear_attention_backward (include/attn/linear_attention.h): validate
// once, then one task per (batch, head) that walks the keys in order, keeping the running sums
// S [D x Dv] = sum phi(k_j) v_j^T and z [D] = sum phi(k_j) in double.
#include "attn/linear_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "contract/options.h"
#include "core/fail.h"
#include "core/parallel.h"

namespace attn {

namespace {

using detail::fail;

template <class T>
inline double phi(T x) {
  return x > 0 ? static_cast<double>(x) + 1.0 : std::exp(static_cast<double>(x));
}
template <class T>
inline double dphi(T x) {  // d(elu(x) + 1)/dx
  return x > 0 ? 1.0 : std::exp(static_cast<double>(x));
}

// The validated problem: contiguous q, k, v and which keys are used.
struct Problem {
  int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0, group = 1;
  Tensor q, k, v;
  bool causal = false;
  int64_t offset = 0;         // query i sits at key position p(i) = i + offset (causal only)
  std::vector<uint8_t> keep;  // [B * Lk], 1 = use the key; empty = all
  int threads = 0;

  bool kept(int64_t b, int64_t j) const { return keep.empty() || keep[b * Lk + j]; }
  // The keys visible to query i: [0, Lk) (non-causal) or [0, p(i)] clipped to [0, Lk) (causal).
  int64_t visible_end(int64_t i) const {
    return causal ? std::clamp<int64_t>(i + offset + 1, 0, Lk) : Lk;
  }
};

template <class F>
void with_dtype(DType dtype, F&& f) {
  if (dtype == DType::f32) return f(float{});
  return f(double{});  // validate() admits f32 and f64 only
}

void check_qkv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (!t->defined()) fail(fn, fmt::format("{} is undefined", name));
    if (t->dtype() != DType::f32 && t->dtype() != DType::f64) {
      fail(fn, fmt::format("{} must be f32 or f64, got {} with shape {}", name,
                           dtype_name(t->dtype()), t->shape_str()));
    }
    if (t->dim() != 4) {
      fail(fn, fmt::format("{} must be 4-D [B, heads, length, dim], got shape {}", name,
                           t->shape_str()));
    }
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail(fn, fmt::format("q, k and v must share one dtype, got q {} {}, k {} {}, v {} {}",
                         dtype_name(q.dtype()), q.shape_str(), dtype_name(k.dtype()), k.shape_str(),
                         dtype_name(v.dtype()), v.shape_str()));
  }
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0)) {
    fail(fn, fmt::format("q, k and v must have the same batch size, got q {}, k {}, v {}",
                         q.shape_str(), k.shape_str(), v.shape_str()));
  }
  if (k.size(3) != q.size(3)) {
    fail(fn, fmt::format("q and k must have the same head dim, got q {} and k {}", q.shape_str(),
                         k.shape_str()));
  }
  if (v.size(1) != k.size(1) || v.size(2) != k.size(2)) {
    fail(fn, fmt::format("k and v must have the same heads and length, got k {} and v {}",
                         k.shape_str(), v.shape_str()));
  }
  const int64_t Hq = q.size(1), Hkv = k.size(1);
  if (Hq > 0 && (Hkv == 0 || Hq % Hkv != 0)) {
    fail(fn, fmt::format(
                 "the query heads ({}) must be a multiple of the key/value heads ({}): q {}, k {}",
                 Hq, Hkv, q.shape_str(), k.shape_str()));
  }
}

// key_lengths [B] and key_keep [B, Lk] into p.keep (left empty when neither is given).
void check_padding(const char* fn, const LinearAttentionOptions& o, Problem& p) {
  if (o.key_lengths.defined()) {
    std::vector<int64_t> lengths;
    const std::string problem =
        contract::check_key_lengths(o.key_lengths, Shape{p.B}, p.B, p.Lk, &lengths);
    if (!problem.empty()) fail(fn, problem);
    p.keep.assign(static_cast<size_t>(p.B * p.Lk), 1);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t j = lengths[b]; j < p.Lk; ++j) p.keep[b * p.Lk + j] = 0;
  }
  if (o.key_keep.defined()) {
    const Tensor& m = o.key_keep;
    if (m.dtype() != DType::boolean || m.dim() != 2 || m.size(0) != p.B || m.size(1) != p.Lk) {
      fail(fn, fmt::format("key_keep must be bool [B = {}, Lk = {}], got {} with shape {}", p.B,
                           p.Lk, dtype_name(m.dtype()), m.shape_str()));
    }
    const std::vector<double> keep = m.to_vector();
    if (p.keep.empty()) p.keep.assign(keep.size(), 1);
    for (size_t e = 0; e < keep.size(); ++e) p.keep[e] = p.keep[e] && keep[e] != 0.0;
  }
}

Problem validate(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                 const LinearAttentionOptions& o) {
  check_qkv(fn, q, k, v);
  Problem p;
  p.B = q.size(0), p.Hq = q.size(1), p.Hkv = k.size(1), p.Lq = q.size(2), p.Lk = k.size(2);
  p.D = q.size(3), p.Dv = v.size(3);
  p.group = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  checked_numel(q.shape(), fn);
  checked_numel(k.shape(), fn);
  checked_numel(v.shape(), fn);
  checked_numel({p.B, p.Hq, p.Lq, p.Dv}, fn);
  p.causal = o.causal;
  p.offset = o.align == Align::bottom_right ? p.Lk - p.Lq : 0;
  check_padding(fn, o, p);
  const double work = static_cast<double>(p.B) * static_cast<double>(p.Hq) *
                      static_cast<double>(p.Lq + p.Lk) * static_cast<double>(p.D) *
                      static_cast<double>(p.Dv);
  p.threads = o.threads > 0 ? o.threads : threads_for_work(work);  // as attn::attention
  p.q = q.contiguous();
  p.k = k.contiguous();
  p.v = v.contiguous();
  return p;
}

// Key j into the running state: S [D x Dv] += phi(k_j) v_j^T, z [D] += phi(k_j) (kp [Lk x D], vp
// [Lk x Dv] of one head).
template <class T>
void add_key_state(const Problem& d, const T* kp, const T* vp, int64_t j, std::vector<double>& S,
                   std::vector<double>& z) {
  for (int64_t a = 0; a < d.D; ++a) {
    const double fk = phi(kp[j * d.D + a]);
    z[a] += fk;
    for (int64_t c = 0; c < d.Dv; ++c) S[a * d.Dv + c] += fk * vp[j * d.Dv + c];
  }
}

// The running sums over the keys a query row sees, advanced in key order (rows come in order, and
// row i sees keys [0, visible_end(i))): S [D x Dv] = sum phi(k_j) v_j^T, z [D] = sum phi(k_j), kept
// keys only. kp [Lk x D], vp [Lk x Dv]: one kv head of batch b.
template <class T>
struct KeySums {
  const Problem& d;
  int64_t b;
  const T *kp, *vp;
  std::vector<double> S, z;
  int64_t added = 0;  // keys [0, added) are in S and z

  KeySums(const Problem& problem, int64_t batch, const T* k, const T* v)
      : d(problem),
        b(batch),
        kp(k),
        vp(v),
        S(static_cast<size_t>(d.D * d.Dv)),
        z(static_cast<size_t>(d.D)) {}
  // phi(q_i) into fq after taking in the keys row i sees; returns den_i = phi(q_i) . z.
  double row(int64_t i, const T* q_row, std::vector<double>& fq) {
    for (const int64_t end = d.visible_end(i); added < end; ++added) {
      if (d.kept(b, added)) add_key_state(d, kp, vp, added, S, z);
    }
    double den = 0;
    for (int64_t a = 0; a < d.D; ++a) {
      fq[a] = phi(q_row[a]);
      den += fq[a] * z[a];
    }
    return den;
  }
};

template <class T>
void forward(const Problem& d, Tensor& out) {
  parallel_for(d.B * d.Hq, d.threads, [&](int64_t task, int) {
    const int64_t b = task / d.Hq, h = task % d.Hq, hk = h / d.group;
    const T* qp = d.q.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
    const T* kp = d.k.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
    const T* vp = d.v.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
    T* op = out.data_as<T>() + (b * d.Hq + h) * d.Lq * d.Dv;
    KeySums<T> sums(d, b, kp, vp);
    std::vector<double> fq(static_cast<size_t>(d.D));
    for (int64_t i = 0; i < d.Lq; ++i) {
      const double den = sums.row(i, qp + i * d.D, fq);
      for (int64_t c = 0; c < d.Dv; ++c) {
        double num = 0;
        for (int64_t a = 0; a < d.D; ++a) num += fq[a] * sums.S[a * d.Dv + c];
        // No visible key: den == 0 exactly (phi > 0), the row is empty and its output is 0.
        op[i * d.Dv + c] = static_cast<T>(den > 0 ? num / den : 0.0);
      }
    }
  });
}

// dout [B, Hq, Lq, Dv] -> dq, dk, dv (zero-filled by the caller; dk, dv summed over the query heads
// of a group).
template <class T>
void backward(const Problem& d, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  // One task per kv head: its query heads' contributions to dk, dv are summed in a fixed order.
  parallel_for(d.B * d.Hkv, d.threads, [&](int64_t task, int) {
    const int64_t b = task / d.Hkv, hk = task % d.Hkv;
    const T* kp = d.k.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
    const T* vp = d.v.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
    T* dkp = dk.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
    T* dvp = dv.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
    std::vector<double> R(static_cast<size_t>(d.D * d.Dv)), r(static_cast<size_t>(d.D));
    std::vector<double> fq(static_cast<size_t>(d.D)), dnum(static_cast<size_t>(d.Dv));
    std::vector<double> dden_all(static_cast<size_t>(d.Lq)),
        dnum_all(static_cast<size_t>(d.Lq * d.Dv));
    for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h) {
      const T* qp = d.q.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
      const T* gp = dout.data_as<T>() + (b * d.Hq + h) * d.Lq * d.Dv;
      T* dqp = dq.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
      // Pass 1 (forward order): rebuild S_i, z_i; out_i = num_i / den_i.
      //   dnum_i = dout_i / den_i, dden_i = -(dout_i . num_i) / den_i^2,
      //   dphi(q_i) = S_i dnum_i + z_i dden_i
      KeySums<T> sums(d, b, kp, vp);
      const std::vector<double>& S = sums.S;
      const std::vector<double>& z = sums.z;
      for (int64_t i = 0; i < d.Lq; ++i) {
        const double den = sums.row(i, qp + i * d.D, fq);
        double g_dot_num = 0;
        for (int64_t c = 0; c < d.Dv; ++c) {
          double num = 0;
          for (int64_t a = 0; a < d.D; ++a) num += fq[a] * S[a * d.Dv + c];
          g_dot_num += gp[i * d.Dv + c] * num;
        }
        const double dden = den > 0 ? -g_dot_num / (den * den) : 0.0;
        for (int64_t c = 0; c < d.Dv; ++c) dnum[c] = den > 0 ? gp[i * d.Dv + c] / den : 0.0;
        dden_all[i] = dden;
        for (int64_t c = 0; c < d.Dv; ++c) dnum_all[i * d.Dv + c] = dnum[c];
        for (int64_t a = 0; a < d.D; ++a) {
          double dfq = z[a] * dden;
          for (int64_t c = 0; c < d.Dv; ++c) dfq += S[a * d.Dv + c] * dnum[c];
          dqp[i * d.D + a] = static_cast<T>(dfq * dphi(qp[i * d.D + a]));
        }
      }
      // Pass 2 (reverse order): R_j = sum_{i sees j} phi(q_i) dnum_i^T,
      //   r_j = sum_{i sees j} phi(q_i) dden_i; dphi(k_j) = R_j v_j + r_j, dv_j = R_j^T phi(k_j).
      std::fill(R.begin(), R.end(), 0.0);
      std::fill(r.begin(), r.end(), 0.0);
      int64_t next_q = d.Lq - 1;  // queries (next_q, Lq) are in R and r
      auto add_query = [&](int64_t i) {
        for (int64_t a = 0; a < d.D; ++a) {
          const double f = phi(qp[i * d.D + a]);
          r[a] += f * dden_all[i];
          for (int64_t c = 0; c < d.Dv; ++c) R[a * d.Dv + c] += f * dnum_all[i * d.Dv + c];
        }
      };
      if (!d.causal)
        for (; next_q >= 0; --next_q) add_query(next_q);
      for (int64_t j = d.Lk - 1; j >= 0; --j) {
        // causal: query i sees key j when j <= p(i) = i + offset
        for (; next_q >= 0 && next_q + d.offset >= j; --next_q) add_query(next_q);
        if (!d.kept(b, j)) continue;
        for (int64_t a = 0; a < d.D; ++a) {
          double dfk = r[a];
          for (int64_t c = 0; c < d.Dv; ++c) dfk += R[a * d.Dv + c] * vp[j * d.Dv + c];
          dkp[j * d.D + a] = static_cast<T>(dkp[j * d.D + a] + dfk * dphi(kp[j * d.D + a]));
        }
        for (int64_t c = 0; c < d.Dv; ++c) {
          double acc = 0;
          for (int64_t a = 0; a < d.D; ++a) acc += R[a * d.Dv + c] * phi(kp[j * d.D + a]);
          dvp[j * d.Dv + c] = static_cast<T>(dvp[j * d.Dv + c] + acc);
        }
      }
    }
  });
}

}  // namespace

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const LinearAttentionOptions& options) {
  const Problem p = validate("attn::linear_attention", q, k, v, options);
  Tensor out = Tensor::empty({p.B, p.Hq, p.Lq, p.Dv}, q.dtype());
  with_dtype(q.dtype(), [&](auto tag) { forward<decltype(tag)>(p, out); });
  return out;
}

LinearAttentionGrads linear_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v,
                                               const LinearAttentionOptions& options) {
  constexpr const char* fn = "attn::linear_attention_backward";
  const Problem p = validate(fn, q, k, v, options);
  const Shape out_shape{p.B, p.Hq, p.Lq, p.Dv};
  if (!dout.defined() || dout.dtype() != q.dtype() || dout.shape() != out_shape) {
    fail(fn, fmt::format("dout must be {} {} (the output's dtype and shape), got {}",
                         dtype_name(q.dtype()), shape_to_string(out_shape),
                         dout.defined()
                             ? fmt::format("{} {}", dtype_name(dout.dtype()), dout.shape_str())
                             : "undefined"));
  }
  LinearAttentionGrads g{Tensor::zeros(q.shape(), q.dtype()), Tensor::zeros(k.shape(), q.dtype()),
                         Tensor::zeros(v.shape(), q.dtype())};
  const Tensor g_out = dout.contiguous();
  with_dtype(q.dtype(), [&](auto tag) { backward<decltype(tag)>(p, g_out, g.dq, g.dk, g.dv); });
  return g;
}

}  // namespace attn
