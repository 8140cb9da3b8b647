// The reference backend's linear attention (attention_ref.h): one task per (batch, head) that walks the
// keys in order, keeping the running sums S [D x Dv] = sum phi(k_j) v_j^T and z [D] = sum phi(k_j) in
// double, stored in the inputs' dtype. It is linear attention's only backend: in double it is as fast as
// the O(L D Dv) recurrence allows without a second, approximate path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/reference/attention_ref.h"
#include "core/parallel.h"

namespace attn::reference {

namespace {

template <class T>
inline double phi(T x) {
  return x > 0 ? static_cast<double>(x) + 1.0 : std::exp(static_cast<double>(x));
}
template <class T>
inline double dphi(T x) {  // d(elu(x) + 1)/dx
  return x > 0 ? 1.0 : std::exp(static_cast<double>(x));
}

template <class F>
void with_dtype(DType dtype, F&& f) {
  if (dtype == DType::f32) return f(float{});
  return f(double{});  // validate() admits f32 and f64 only
}

// Key j into the running state: S [D x Dv] += phi(k_j) v_j^T, z [D] += phi(k_j) (kp [Lk x D], vp
// [Lk x Dv] of one head).
template <class T>
void add_key_state(const contract::LinearProblem& d, const T* kp, const T* vp, int64_t j,
                   std::vector<double>& S, std::vector<double>& z) {
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
  const contract::LinearProblem& d;
  int64_t b;
  const T *kp, *vp;
  std::vector<double> S, z;
  int64_t added = 0;  // keys [0, added) are in S and z

  KeySums(const contract::LinearProblem& problem, int64_t batch, const T* k, const T* v)
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
void forward(const contract::LinearProblem& d, const Tensor& out) {
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
void backward(const contract::LinearBackwardProblem& d) {
  const Tensor &dout = d.dout, &dq = d.dq, &dk = d.dk, &dv = d.dv;
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

void linear_forward(const contract::LinearProblem& p, const Tensor& out) {
  with_dtype(p.q.dtype(), [&](auto tag) { forward<decltype(tag)>(p, out); });
}

void linear_backward(const contract::LinearBackwardProblem& p) {
  with_dtype(p.q.dtype(), [&](auto tag) { backward<decltype(tag)>(p); });
}

}  // namespace attn::reference
