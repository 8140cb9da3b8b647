// Fuzz harness for attn::attention / attn::attention_backward: the input bytes pick a small problem
// (attention_case.h) and, half of the time, one deliberate defect. Invariants checked
// (docs/semantics.md):
//   - a defective call raises attn::Error whose message starts with the entry point's name; nothing
//     else (another exception type, a crash, or silently returning) is allowed;
//   - a valid call succeeds on the reference and the automatic backend, with the documented shapes
//     and dtypes, and the two agree within a dtype-sized tolerance (forward and backward);
//   - the automatic backend gives bitwise equal results for two different thread counts;
//   - weights are exactly 0 on removed keys and rows of allowed keys sum to 1; a row with no
//     allowed key has out = 0, weights = 0, lse = -inf and dq = 0, never NaN; finite inputs give
//     finite outputs;
//   - non-finite values where nothing may reach them change nothing (attention_poison.h);
//   - all of it on the cpu backend's target this CPU picks, or on one forced per case (portable,
//     avx2, avx512bf16 with bf16 on VDPBF16PS, amx-emulated; the violation names it).
// Which keys a row may use is recomputed here from the options, independently of src/contract.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/bench.h"
#include "fuzz/attention_case.h"
#include "fuzz/attention_poison.h"
#include "fuzz/fuzz_input.h"

namespace attn::fuzz {

namespace attention_detail {

// Applies one deliberate defect (chosen by `which`) to a valid case. Returns the entry point that
// must reject it: "attn::attention" or "attn::attention_backward".
inline const char* corrupt(Case& c, int which, ByteReader& in) {
  AttentionOptions& o = c.o;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Rng rng{in.u64()};
  switch (which) {
    case 0:
      c.k = make_input(rng, with(c.batch, {c.Hkv, c.Lk, c.D + 1}), c.dtype, 0);
      break;  // head dim
    case 1:
      c.v = make_input(rng, with(c.batch, {c.Hkv, c.Lk + 1, c.Dv}), c.dtype, 0);
      break;  // length
    case 2:   // Hq not a multiple of Hkv
      c.k = make_input(rng, with(c.batch, {c.Hq + 1, c.Lk, c.D}), c.dtype, 0);
      c.v = make_input(rng, with(c.batch, {c.Hq + 1, c.Lk, c.Dv}), c.dtype, 0);
      break;
    case 3:
      c.k = c.k.to(c.dtype == DType::f32 ? DType::f64 : DType::f32);
      break;  // mixed dtypes
    case 4:
      c.q = make_input(rng, with(c.batch, {c.Hq, c.Lq, c.D}), DType::i32, 0);
      break;
    case 5:  // rank below 3, or ranks that differ
      c.q = in.flag() ? make_input(rng, {c.Lq, c.D}, c.dtype, 0)
                      : make_input(rng, with(c.batch, {1, c.Hq, c.Lq, c.D}), c.dtype, 0);
      break;
    case 6: {  // batch dims differ
      Shape b = c.batch;
      b.insert(b.begin(), 2);
      c.k = make_input(rng, with(b, {c.Hkv, c.Lk, c.D}), c.dtype, 0);
      break;
    }
    case 7:
      o.scale = in.pick({-inf, nan, inf});  // any finite scale is valid
      break;
    case 8:
      o.softcap = in.pick({0.0, -2.0, nan, inf});
      break;
    case 9:
      o.dropout_p = in.pick({1.5, -0.1, nan, 2.0});
      break;
    case 10:
      (in.flag() ? o.window.left : o.window.right) = -2 - in.range(0, 100);
      break;
    case 11: {  // key_lengths out of range or of a wrong dtype / shape
      std::vector<double> kl(static_cast<size_t>(std::max<int64_t>(c.B, 1)), 0.0);
      kl[0] = in.flag() ? -1.0 : static_cast<double>(c.Lk + 1);
      const int kind = static_cast<int>(in.range(0, 2));
      if (kind == 0)
        o.key_lengths = Tensor::from_vector({static_cast<int64_t>(kl.size())}, kl, DType::i64);
      if (kind == 1)
        o.key_lengths = Tensor::from_vector({static_cast<int64_t>(kl.size())}, kl, DType::f32);
      if (kind == 2) o.key_lengths = Tensor::zeros({c.B + 2}, DType::i32);
      break;
    }
    case 12: {  // mask of the wrong dtype for its polarity, or not broadcastable
      if (in.flag()) {
        o.mask_type = in.pick({MaskType::keep, MaskType::drop});
        o.mask = Tensor::zeros({c.Lq, c.Lk}, DType::f32);
      } else {
        o.mask_type = in.pick({MaskType::keep, MaskType::drop, MaskType::add});
        o.mask = Tensor::zeros({c.Lq, c.Lk + 2},
                               o.mask_type == MaskType::add ? DType::f32 : DType::boolean);
      }
      break;
    }
    case 13: {  // alibi: wrong length or non-finite
      const bool wrong_len = in.flag();
      std::vector<double> sl(static_cast<size_t>(c.Hq + (wrong_len ? 1 : 0)), 0.5);
      if (!wrong_len) sl[0] = in.flag() ? nan : inf;
      o.alibi_slopes = Tensor::from_vector({static_cast<int64_t>(sl.size())}, sl, DType::f32);
      break;
    }
    case 14: {  // block layout: bad block sizes or tile grid
      o.block_layout.block_q = in.flag() ? 0 : 1;
      o.block_layout.block_k = o.block_layout.block_q == 0 ? 1 : -in.range(0, 3);
      if (in.flag()) {
        o.block_layout.block_q = 1;
        o.block_layout.block_k = 1;
        o.block_layout.layout = Tensor::zeros({c.Lq + 2, c.Lk}, DType::boolean);
      } else {
        o.block_layout.layout = Tensor::zeros({1, 1}, DType::boolean);
      }
      break;
    }
    case 15:
      o.position_offset = in.flag() ? (int64_t{1} << 61) : std::numeric_limits<int64_t>::min();
      break;
    case 16: {  // the output's element count overflows int64 while q, k, v do not (broadcast views)
      const int64_t m = int64_t{1} << 20;
      c.q = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({m, m, m, 1});
      c.k = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({m, m, 1, 1});
      c.v = Tensor::zeros({1, 1, 1, 1024}, c.dtype).expand({m, m, 1, 1024});
      break;
    }
    case 17: {  // the weights' element count overflows int64 (Lq = Lk = 2^32), weights requested
      const int64_t l = int64_t{1} << 32;
      c.q = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({1, 1, l, 1});
      c.k = Tensor::zeros({1, 1, 1, 1}, c.dtype).expand({1, 1, l, 1});
      c.v = c.k;
      o.return_weights = true;
      break;
    }
    default:
      return "attn::attention_backward";  // the backward's own checks: handled by the caller
  }
  return "attn::attention";
}
inline constexpr int kForwardDefects = 18;  // cases 0..17; the backward defects are separate

// Checks one forward result against the independent mask rule: exact zeros where nothing is
// allowed, weights 0 on removed keys, rows summing to 1, finite values when the inputs are finite.
inline void check_rows(const Case& c, const AttentionResult& r, bool finite_inputs,
                       const char* name) {
  const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector();
  const std::vector<double> w = r.weights.defined() ? r.weights.to_vector() : std::vector<double>{};
  const double sum_tol = static_cast<double>(c.Lk + 1) * (c.dtype == DType::bf16  ? 0x1p-8
                                                          : c.dtype == DType::f16 ? 0x1p-11
                                                                                  : 1e-6);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t i = 0; i < c.Lq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Lq + i;
        int64_t n_allowed = 0;
        double wsum = 0;
        for (int64_t j = 0; j < c.Lk; ++j) {
          const bool ok = c.allowed(b, h, i, j);
          n_allowed += ok;
          if (!w.empty()) {
            const double x = w[static_cast<size_t>(row * c.Lk + j)];
            if (!ok)
              require(x == 0, fmt::format("{}: weight of removed key ({}, {}, {}, {}) is {}", name,
                                          b, h, i, j, x));
            wsum += x;
          }
        }
        const double l = lse[static_cast<size_t>(row)];
        if (n_allowed == 0) {
          require(l == -std::numeric_limits<double>::infinity(),
                  fmt::format("{}: fully masked row ({}, {}, {}) has lse {}", name, b, h, i, l));
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double x = out[static_cast<size_t>(row * c.Dv + e)];
            require(x == 0,
                    fmt::format("{}: fully masked row ({}, {}, {}) has out {}", name, b, h, i, x));
          }
          require(wsum == 0,
                  fmt::format("{}: fully masked row ({}, {}, {}) has weights", name, b, h, i));
        } else if (finite_inputs) {
          require(std::isfinite(l),
                  fmt::format("{}: row ({}, {}, {}) has lse {}", name, b, h, i, l));
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double x = out[static_cast<size_t>(row * c.Dv + e)];
            require(std::isfinite(x),
                    fmt::format("{}: row ({}, {}, {}) has out {}", name, b, h, i, x));
          }
          if (!w.empty()) {
            require(std::fabs(wsum - 1) <= sum_tol,
                    fmt::format("{}: weights of row ({}, {}, {}) sum to {}", name, b, h, i, wsum));
          }
        }
      }
    }
  }
}

inline void check_valid(const Case& c) {
  const Shape out_shape = with(c.batch, {c.Hq, c.Lq, c.Dv}),
              lse_shape = with(c.batch, {c.Hq, c.Lq});
  const DType lse_dtype = c.dtype == DType::f64 ? DType::f64 : DType::f32;
  const AttentionResult ref = forward(c, c.q, c.k, c.v, Backend::reference, c.threads_a);
  const AttentionResult fast = forward(c, c.q, c.k, c.v, Backend::automatic, c.threads_a);
  for (const AttentionResult* r : {&ref, &fast}) {
    require(r->out.shape() == out_shape && r->out.dtype() == c.dtype,
            "out has the wrong shape or dtype");
    require(r->lse.shape() == lse_shape && r->lse.dtype() == lse_dtype,
            "lse has the wrong shape or dtype");
    require(r->weights.defined() == c.o.return_weights,
            "weights returned without being asked or missing");
    if (c.o.return_weights) {
      require(r->weights.shape() == with(c.batch, {c.Hq, c.Lq, c.Lk}),
              "weights have the wrong shape");
    }
  }
  check_rows(c, ref, true, "reference");
  check_rows(c, fast, true, "auto");
  const double tol = tolerance(c.dtype) / (1 - c.o.dropout_p);
  require_close(fast.out, ref.out, tol, "auto vs reference: out");
  require_close(fast.lse, ref.lse, tolerance(c.dtype), "auto vs reference: lse");
  if (c.o.return_weights)
    require_close(fast.weights, ref.weights, tolerance(c.dtype), "auto vs reference: weights");
  check_same(fast, forward(c, c.q, c.k, c.v, Backend::automatic, c.threads_b),
             fmt::format("auto with {} vs {} threads", c.threads_a, c.threads_b));

  const Poisoned poisoned = check_poisoned_forward(c, ref, fast);

  if (!c.backward) return;
  Rng rng{c.seed};
  const Tensor dout = make_input(rng, out_shape, c.dtype, 0);
  AttentionOptions o = c.o;
  o.backend = Backend::reference;
  o.threads = c.threads_a;
  const AttentionGrads gref = attention_backward(dout, c.q, c.k, c.v, ref.out, ref.lse, o);
  o.backend = Backend::automatic;
  const AttentionGrads gfast = attention_backward(dout, c.q, c.k, c.v, fast.out, fast.lse, o);
  o.threads = c.threads_b;
  const AttentionGrads gfast2 = attention_backward(dout, c.q, c.k, c.v, fast.out, fast.lse, o);
  const std::string threads =
      fmt::format("backward with {} vs {} threads", c.threads_a, c.threads_b);
  require(bitwise_equal(gfast.dq, gfast2.dq) && bitwise_equal(gfast.dk, gfast2.dk) &&
              bitwise_equal(gfast.dv, gfast2.dv) && bitwise_equal(gfast.dmask, gfast2.dmask),
          threads + ": gradients differ");
  for (const AttentionGrads* g : {&gref, &gfast}) {
    require(g->dq.shape() == c.q.shape() && g->dk.shape() == c.k.shape() &&
                g->dv.shape() == c.v.shape(),
            "gradients have the wrong shapes");
    require(g->dmask.defined() == c.o.mask_grad, "dmask returned without being asked or missing");
    if (c.o.mask_grad)
      require(g->dmask.shape() == c.o.mask.shape(), "dmask does not have the mask's shape");
    for (const Tensor* t : {&g->dq, &g->dk, &g->dv}) {
      for (double x : t->to_vector())
        require(std::isfinite(x), "a gradient is not finite for finite inputs");
    }
    // dq of a row with no allowed key is 0.
    const std::vector<double> dq = g->dq.contiguous().to_vector();
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Lq; ++i) {
          bool any = false;
          for (int64_t j = 0; j < c.Lk && !any; ++j) any = c.allowed(b, h, i, j);
          if (any) continue;
          for (int64_t e = 0; e < c.D; ++e) {
            const double x = dq[static_cast<size_t>(((b * c.Hq + h) * c.Lq + i) * c.D + e)];
            require(x == 0, fmt::format("dq of fully masked row ({}, {}, {}) is {}", b, h, i, x));
          }
        }
  }
  // Gradients are sums over rows and heads: allow the tolerance per summed term.
  const double gtol = 4 * tolerance(c.dtype) / (1 - c.o.dropout_p);
  require_close(gfast.dq, gref.dq, gtol, "auto vs reference: dq");
  require_close(gfast.dk, gref.dk, gtol, "auto vs reference: dk");
  require_close(gfast.dv, gref.dv, gtol, "auto vs reference: dv");
  if (c.o.mask_grad) require_close(gfast.dmask, gref.dmask, gtol, "auto vs reference: dmask");
  check_poisoned_backward(c, poisoned, dout, gref, gfast);
}

// Calls `fn` expecting attn::Error from `entry`; anything else is a violation.
template <class Fn>
void expect_rejected(const char* entry, const std::string& defect, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    require(starts_with(e.what(), entry),
            fmt::format("{}: the message for {} does not start with the entry point: {}", entry,
                        defect, e.what()));
    return;
  }
  violation(fmt::format("{} accepted a defective call ({})", entry, defect));
}

// Forces a case's target for the automatic backend over one input and restores this CPU's choice
// after, also when an invariant throws. A target this CPU cannot run leaves its choice.
class IsaScope {
 public:
  explicit IsaScope(const std::string& isa, bool amx_pipeline) {
    if (isa.empty()) return;
    try {
      cpu_bench::force_isa(isa);
      name_ = isa;
    } catch (const Error&) {
      return;
    }
    if (amx_pipeline) {
      cpu_bench::set_amx_pipeline("on");
      name_ += " (tile products pipelined)";
    }
  }
  ~IsaScope() {
    cpu_bench::set_amx_pipeline("");
    cpu_bench::force_isa("");
  }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_ = "this CPU's choice";
};

}  // namespace attention_detail

inline void fuzz_attention(const uint8_t* data, size_t size) {
  using namespace attention_detail;
  ByteReader in(data, size);
  const uint8_t mode = in.byte();
  Case c = make_case(in);
  if (mode % 2 == 0) {
    const IsaScope isa(c.isa, c.amx_pipeline);
    try {
      check_valid(c);
    } catch (const Violation& v) {
      violation(fmt::format("[cpu target: {}] {}", isa.name(), v.what()));
    }
    return;
  }
  const int defect = static_cast<int>(in.range(0, kForwardDefects + 2));
  if (defect < kForwardDefects) {
    corrupt(c, defect, in);
    expect_rejected("attn::attention", fmt::format("defect {}", defect), [&] {
      forward(c, c.q, c.k, c.v, in.flag() ? Backend::reference : Backend::automatic, 1);
    });
    return;
  }
  // Backward defects: wrong shapes of dout / out / lse, or mask_grad without an add mask.
  AttentionOptions o = c.o;
  o.dropout_p = 0;
  o.threads = 1;
  const AttentionResult r = attention(c.q, c.k, c.v, o);
  Tensor dout = r.out, out = r.out, lse = r.lse;
  const int which = static_cast<int>(in.range(0, 3));
  if (which == 0) dout = Tensor::zeros(with(c.batch, {c.Hq, c.Lq, c.Dv + 1}), c.dtype);
  if (which == 1) out = Tensor::zeros(with(c.batch, {c.Hq, c.Lq + 1, c.Dv}), c.dtype);
  if (which == 2) lse = Tensor::zeros(with(c.batch, {c.Hq + 1, c.Lq}), DType::f32);
  if (which == 3) {
    o.mask_grad = true;
    if (o.mask.defined() && o.mask_type == MaskType::add) o.mask = Tensor();
  }
  expect_rejected("attn::attention_backward", fmt::format("backward defect {}", which),
                  [&] { attention_backward(dout, c.q, c.k, c.v, out, lse, o); });
}

}  // namespace attn::fuzz
