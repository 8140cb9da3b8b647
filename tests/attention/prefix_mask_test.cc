// A bool mask that only pads the ends of the keys (per batch entry, the same for every head and
// query row: right-padded batches) runs as key lengths (src/attention.cc, fold_prefix_mask): the
// results must be those of the key lengths bit for bit and those of the same mask materialised per
// head and row (which stays a dense mask) to rounding, forward and backward, on both backends;
// masks with a gap, or per-row masks, keep their meaning; the user's own key lengths still apply.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_run.h"
#include "attn/attention.h"
#include "test_util.h"

namespace attn {
namespace {

using test::random_tensor;
using test::rel_error;

constexpr int64_t B = 4, H = 2, Lq = 5, Lk = 37, D = 16;

// The mask allowing keys j < len[b] in polarity t (keep: true; drop: false; add: 0, removed keys
// -inf, f32) as [B, 1, 1, Lk] (a broadcast view when attention sees it) or materialised as a
// contiguous [B, H, Lq, Lk].
Tensor prefix_mask(const std::vector<int64_t>& len, MaskType t, bool materialised) {
  Tensor m = Tensor::zeros({B, 1, 1, Lk}, t == MaskType::add ? DType::f32 : DType::boolean);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Lk; ++j) {
      const bool allowed = j < len[b];
      m.set({b, 0, 0, j}, t == MaskType::add    ? (allowed ? 0.0 : -INFINITY)
                          : t == MaskType::keep ? (allowed ? 1.0 : 0.0)
                                                : (allowed ? 0.0 : 1.0));
    }
  return materialised ? m.expand({B, H, Lq, Lk}).contiguous() : m;
}

using Outputs = test::FwdBwd;

Outputs run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
            AttentionOptions o) {
  o.return_weights = true;
  Outputs r;
  r.fwd = attention(q, k, v, o);
  o.return_weights = false;
  r.grads = attention_backward(dout, q, k, v, r.fwd.out, r.fwd.lse, o);
  return r;
}

void expect_close(const Outputs& a, const Outputs& b, double tol, const std::string& what) {
  EXPECT_LT(rel_error(a.fwd.out, b.fwd.out), tol) << what << ": out";
  EXPECT_LT(rel_error(a.fwd.weights, b.fwd.weights), tol) << what << ": weights";
  EXPECT_LT(rel_error(a.grads.dq, b.grads.dq), 10 * tol) << what << ": dq";
  EXPECT_LT(rel_error(a.grads.dk, b.grads.dk), 10 * tol) << what << ": dk";
  EXPECT_LT(rel_error(a.grads.dv, b.grads.dv), 10 * tol) << what << ": dv";
}

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs inputs(DType dt, uint64_t seed) {
  return {random_tensor({B, H, Lq, D}, dt, seed), random_tensor({B, H, Lk, D}, dt, seed + 1),
          random_tensor({B, H, Lk, D}, dt, seed + 2), random_tensor({B, H, Lq, D}, dt, seed + 3)};
}

// Lengths with a full row, an empty row, a single key and one inside the last tile.
const std::vector<int64_t> kLengths = {29, Lk, 0, 1};

TEST(PrefixMask, EqualsKeyLengthsAndTheDenseMask) {
  for (const Backend backend : {Backend::reference, Backend::cpu}) {
    for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
      if ((backend == Backend::reference) != (dt == DType::f64) && dt != DType::f32) continue;
      for (const bool causal : {false, true}) {
        const Inputs in = inputs(dt, 11);
        AttentionOptions base;
        base.backend = backend;
        base.causal = causal;
        AttentionOptions by_len = base;
        by_len.key_lengths = Tensor::from_vector({B}, {29, Lk, 0, 1}, DType::i64);
        const Outputs lengths = run(in.q, in.k, in.v, in.dout, by_len);
        for (const MaskType type : {MaskType::keep, MaskType::drop, MaskType::add}) {
          const std::string what = std::string(backend == Backend::cpu ? "cpu " : "reference ") +
                                   dtype_name(dt) + (causal ? " causal " : " ") +
                                   mask_type_name(type);
          AttentionOptions o = base;
          o.mask_type = type;
          o.mask = prefix_mask(kLengths, type, false);
          const Outputs folded = run(in.q, in.k, in.v, in.dout, o);
          test::expect_bitwise_equal(folded, lengths, what + " vs key_lengths");
          o.mask = prefix_mask(kLengths, type, true);
          const Outputs dense = run(in.q, in.k, in.v, in.dout, o);
          const double tol = dt == DType::f64 ? 1e-13 : dt == DType::f32 ? 1e-6 : 2e-2;
          expect_close(folded, dense, tol, what + " vs the dense mask");
        }
      }
    }
  }
}

// A removed key is skipped, never multiplied by zero (docs/semantics.md): NaN in the padded keys and
// values does not reach the output through the folded mask either.
TEST(PrefixMask, PaddedKeysAreNeverRead) {
  Inputs in = inputs(DType::f32, 12);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = kLengths[b]; j < Lk; ++j)
        for (int64_t d = 0; d < D; ++d) in.k.set({b, h, j, d}, NAN), in.v.set({b, h, j, d}, NAN);
  for (const Backend backend : {Backend::reference, Backend::cpu}) {
    AttentionOptions o;
    o.backend = backend;
    o.mask = prefix_mask(kLengths, MaskType::keep, false);
    const AttentionResult r = attention(in.q, in.k, in.v, o);
    EXPECT_TRUE(test::all_finite(r.out)) << (backend == Backend::cpu ? "cpu" : "reference");
  }
}

// The smaller of the user's key lengths and the mask's prefix applies.
TEST(PrefixMask, CombinesWithTheUsersKeyLengths) {
  const Inputs in = inputs(DType::f32, 13);
  AttentionOptions both;
  both.backend = Backend::cpu;
  both.mask = prefix_mask(kLengths, MaskType::keep, false);
  both.key_lengths = Tensor::from_vector({B}, {31, 20, 5, 1}, DType::i32);
  AttentionOptions by_len;
  by_len.backend = Backend::cpu;
  by_len.key_lengths = Tensor::from_vector({B}, {29, 20, 0, 1}, DType::i64);
  test::expect_bitwise_equal(run(in.q, in.k, in.v, in.dout, both),
                             run(in.q, in.k, in.v, in.dout, by_len), "mask and key_lengths");
}

// Masks that are not a prefix per batch entry keep their meaning: a gap in one row, a mask that
// differs between query rows.
TEST(PrefixMask, OtherMasksStayMasks) {
  const Inputs in = inputs(DType::f32, 14);
  Tensor gap = prefix_mask(kLengths, MaskType::keep, false);
  gap.set({0, 0, 0, 3}, 0.0);
  Tensor per_row = prefix_mask(kLengths, MaskType::keep, true);
  per_row.set({0, 1, 2, 0}, 0.0);
  for (const Tensor& m : {gap, per_row}) {
    AttentionOptions o;
    o.mask = m;
    o.backend = Backend::cpu;
    const Outputs cpu = run(in.q, in.k, in.v, in.dout, o);
    o.backend = Backend::reference;
    const Outputs ref = run(in.q, in.k, in.v, in.dout, o);
    expect_close(cpu, ref, 1e-6, "mask " + m.shape_str());
    // The removed key really is removed: its weight is 0 where the prefix would allow it. The
    // keys after the gap stay allowed (both backends share the fold, so comparing them cannot
    // catch a gap folded into a short length).
    if (m.size(1) == 1) {
      EXPECT_EQ(cpu.fwd.weights.at({0, 0, 0, 3}), 0.0);
      EXPECT_GT(cpu.fwd.weights.at({0, 0, 0, 4}), 0.0);
      EXPECT_GT(ref.fwd.weights.at({0, 0, 0, kLengths[0] - 1}), 0.0);
    } else {
      EXPECT_EQ(cpu.fwd.weights.at({0, 1, 2, 0}), 0.0);
    }
  }
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// An add mask with a finite bias for the padding (HF's finfo(float32).min) is not removal: a row
// whose every key carries it still averages over all of them (uniform weights), where key lengths
// would give 0. It must stay a mask. A folded add mask still gets its gradient (d(score) of a
// skipped key is 0, as of a removed one).
TEST(PrefixMask, FiniteBiasesAndMaskGradientsStayMasks) {
  const Inputs in = inputs(DType::f32, 15);
  Tensor m = prefix_mask(kLengths, MaskType::add, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = kLengths[b]; j < Lk; ++j) m.set({b, 0, 0, j}, -3.4028234663852886e38);
  AttentionOptions o;
  o.backend = Backend::cpu;
  o.mask_type = MaskType::add;
  o.mask = m;
  o.return_weights = true;
  const AttentionResult r = attention(in.q, in.k, in.v, o);
  for (int64_t j = 0; j < Lk; ++j) EXPECT_NEAR(r.weights.at({2, 0, 0, j}), 1.0 / Lk, 1e-6);
  o.mask = prefix_mask(kLengths, MaskType::add, false);
  o.return_weights = false;
  o.mask_grad = true;
  const AttentionResult f = attention(in.q, in.k, in.v, o);
  const AttentionGrads g = attention_backward(in.dout, in.q, in.k, in.v, f.out, f.lse, o);
  ASSERT_TRUE(g.dmask.defined());
  EXPECT_EQ(g.dmask.shape(), (Shape{B, 1, 1, Lk}));
  o.backend = Backend::reference;
  const AttentionResult fr = attention(in.q, in.k, in.v, o);
  const AttentionGrads gr = attention_backward(in.dout, in.q, in.k, in.v, fr.out, fr.lse, o);
  EXPECT_LT(rel_error(g.dmask, gr.dmask), 1e-5);
}

}  // namespace
}  // namespace attn
