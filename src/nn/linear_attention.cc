#include "nn/linear_attention.h"

#include <cmath>

#include "core/parallel.h"
#include "nn/ops.h"

namespace attn::nn::detail {

namespace {

template <class T>
inline double phi(T x) {
  return x > 0 ? static_cast<double>(x) + 1.0 : std::exp(static_cast<double>(x));
}
template <class T>
inline double dphi(T x) {  // d(elu(x) + 1)/dx
  return x > 0 ? 1.0 : std::exp(static_cast<double>(x));
}

struct Dims {
  int64_t B, Hq, Hkv, Lq, Lk, D, Dv, group;
};

Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 1};
  d.group = d.Hq / d.Hkv;
  return d;
}

// The keys visible to query i: j in [0, Lk) (non-causal) or [0, min(i, Lk - 1)] (causal, top-left).
inline int64_t visible_end(bool causal, int64_t i, int64_t Lk) {
  return causal ? std::min(i + 1, Lk) : Lk;
}

// Key j into the running state: S [D x Dv] += phi(k_j) v_j^T, z [D] += phi(k_j) (kp [Lk x D], vp
// [Lk x Dv] of one head).
template <class T>
void add_key_state(const Dims& d, const T* kp, const T* vp, int64_t j, std::vector<double>& S,
                   std::vector<double>& z) {
  for (int64_t a = 0; a < d.D; ++a) {
    const double fk = phi(kp[j * d.D + a]);
    z[a] += fk;
    for (int64_t c = 0; c < d.Dv; ++c) S[a * d.Dv + c] += fk * vp[j * d.Dv + c];
  }
}

}  // namespace

Tensor linear_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const std::vector<uint8_t>& key_keep, bool causal, int threads) {
  const Dims d = dims_of(q, k, v);
  Tensor out = Tensor::empty({d.B, d.Hq, d.Lq, d.Dv}, q.dtype());
  dispatch(q.dtype(), "attn::nn::linear_attention_forward", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(d.B * d.Hq, threads, [&](int64_t task, int) {
      const int64_t b = task / d.Hq, h = task % d.Hq, hk = h / d.group;
      const T* qp = q.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
      const T* kp = k.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
      const T* vp = v.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
      T* op = out.data_as<T>() + (b * d.Hq + h) * d.Lq * d.Dv;
      std::vector<double> S(static_cast<size_t>(d.D * d.Dv), 0.0), z(static_cast<size_t>(d.D), 0.0);
      std::vector<double> fq(static_cast<size_t>(d.D));
      int64_t added = 0;  // keys [0, added) are in S and z
      auto add_key = [&](int64_t j) {
        if (key_keep.empty() || key_keep[b * d.Lk + j]) add_key_state(d, kp, vp, j, S, z);
      };
      if (!causal)
        for (; added < d.Lk; ++added) add_key(added);
      for (int64_t i = 0; i < d.Lq; ++i) {
        for (const int64_t end = visible_end(causal, i, d.Lk); added < end; ++added) add_key(added);
        double den = 0;
        for (int64_t a = 0; a < d.D; ++a) {
          fq[a] = phi(qp[i * d.D + a]);
          den += fq[a] * z[a];
        }
        for (int64_t c = 0; c < d.Dv; ++c) {
          double num = 0;
          for (int64_t a = 0; a < d.D; ++a) num += fq[a] * S[a * d.Dv + c];
          // No visible key: den == 0 exactly (phi > 0), the row is empty and its output is 0.
          op[i * d.Dv + c] = static_cast<T>(den > 0 ? num / den : 0.0);
        }
      }
    });
  });
  return out;
}

void linear_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const std::vector<uint8_t>& key_keep, bool causal,
                               int threads, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims d = dims_of(q, k, v);
  dq = Tensor::zeros(q.shape(), q.dtype());
  dk = Tensor::zeros(k.shape(), q.dtype());
  dv = Tensor::zeros(v.shape(), q.dtype());
  dispatch(q.dtype(), "attn::nn::linear_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    // One task per kv head: its query heads' contributions to dk, dv are summed in a fixed order.
    parallel_for(d.B * d.Hkv, threads, [&](int64_t task, int) {
      const int64_t b = task / d.Hkv, hk = task % d.Hkv;
      const T* kp = k.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
      const T* vp = v.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
      T* dkp = dk.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.D;
      T* dvp = dv.data_as<T>() + (b * d.Hkv + hk) * d.Lk * d.Dv;
      auto kept = [&](int64_t j) { return key_keep.empty() || key_keep[b * d.Lk + j]; };
      std::vector<double> S(static_cast<size_t>(d.D * d.Dv)), z(static_cast<size_t>(d.D));
      std::vector<double> R(static_cast<size_t>(d.D * d.Dv)), r(static_cast<size_t>(d.D));
      std::vector<double> fq(static_cast<size_t>(d.D)), dnum(static_cast<size_t>(d.Dv));
      std::vector<double> dden_all(static_cast<size_t>(d.Lq)),
          dnum_all(static_cast<size_t>(d.Lq * d.Dv));
      for (int64_t h = hk * d.group; h < (hk + 1) * d.group; ++h) {
        const T* qp = q.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
        const T* gp = dout.data_as<T>() + (b * d.Hq + h) * d.Lq * d.Dv;
        T* dqp = dq.data_as<T>() + (b * d.Hq + h) * d.Lq * d.D;
        // Pass 1 (forward order): rebuild S_i, z_i; out_i = num_i / den_i.
        //   dnum_i = dout_i / den_i, dden_i = -(dout_i . num_i) / den_i^2, dphi(q_i) = S_i dnum_i +
        //   z_i dden_i
        std::fill(S.begin(), S.end(), 0.0);
        std::fill(z.begin(), z.end(), 0.0);
        int64_t added = 0;
        auto add_key = [&](int64_t j) {
          if (kept(j)) add_key_state(d, kp, vp, j, S, z);
        };
        if (!causal)
          for (; added < d.Lk; ++added) add_key(added);
        for (int64_t i = 0; i < d.Lq; ++i) {
          for (const int64_t end = visible_end(causal, i, d.Lk); added < end; ++added)
            add_key(added);
          double den = 0;
          for (int64_t a = 0; a < d.D; ++a) {
            fq[a] = phi(qp[i * d.D + a]);
            den += fq[a] * z[a];
          }
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
        // Pass 2 (reverse order): R_j = sum_{i sees j} phi(q_i) dnum_i^T, r_j = sum_{i sees j}
        // phi(q_i) dden_i;
        //   dphi(k_j) = R_j v_j + r_j, dv_j = R_j^T phi(k_j).
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
        if (!causal)
          for (; next_q >= 0; --next_q) add_query(next_q);
        for (int64_t j = d.Lk - 1; j >= 0; --j) {
          // causal: query i sees key j when j <= i, i.e. i >= j
          for (; next_q >= 0 && next_q >= j; --next_q) add_query(next_q);
          if (!kept(j)) continue;
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
  });
}

}  // namespace attn::nn::detail
