#include "contract/packed.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "contract/validate.h"
#include "core/fail.h"

namespace attn::contract {

using detail::fail;

// Options that take another form in a packed batch, refused by name.
void refuse_unpacked_options(const char* fn, const AttentionOptions& o) {
  if (o.key_lengths.defined()) {
    fail(fn, fmt::format("key_lengths ({}) is not taken by the packed entries: give seqused_k",
                         o.key_lengths.shape_str()));
  }
  if (o.mask.defined())
    fail(fn,
         fmt::format("dense masks ({}) are not supported on a packed batch", o.mask.shape_str()));
  if (o.block_layout.layout.defined())
    fail(fn, "block layouts are not supported on a packed batch");
  if (o.return_weights) fail(fn, "return_weights is not supported on a packed batch");
  if (o.mask_grad) fail(fn, "mask_grad is not supported on a packed batch (no dense masks)");
}

// cu_seqlens_x: int32 [B + 1], starting at 0, non-decreasing, ending at the packed length `total`
// of `tensor` (named for the message).
std::vector<int64_t> read_offsets(const char* fn, const char* name, const Tensor& cu, int64_t total,
                                  const char* tensor, const Tensor& t) {
  if (!cu.defined() || cu.dtype() != DType::i32 || cu.dim() != 1 || cu.size(0) < 1) {
    fail(fn, fmt::format("{} must be int32 [B + 1], got {}", name,
                         cu.defined() ? fmt::format("{} with shape {}", dtype_name(cu.dtype()),
                                                    cu.shape_str())
                                      : std::string("nothing")));
  }
  const std::vector<double> vals = cu.to_vector();
  std::vector<int64_t> off(vals.begin(), vals.end());
  if (off[0] != 0) fail(fn, fmt::format("{}[0] = {}, must be 0", name, off[0]));
  for (size_t b = 1; b < off.size(); ++b) {
    if (off[b] < off[b - 1]) {
      fail(fn, fmt::format("{}[{}] = {} is below {}[{}] = {} (offsets must not decrease)", name, b,
                           off[b], name, b - 1, off[b - 1]));
    }
  }
  if (off.back() != total) {
    fail(fn, fmt::format("{}[B = {}] = {} must equal the packed length of {} {}", name,
                         off.size() - 1, off.back(), tensor, t.shape_str()));
  }
  return off;
}

// max_seqlen_x: -1 (not given) or a bound no sequence exceeds.
void check_max_seqlen(const char* fn, const char* name, int64_t bound,
                      const std::vector<int64_t>& cu) {
  if (bound < -1) fail(fn, fmt::format("{} must be -1 (not given) or >= 0, got {}", name, bound));
  if (bound < 0) return;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] - cu[b] > bound) {
      fail(fn,
           fmt::format("{} = {} but sequence {} has length {}", name, bound, b, cu[b + 1] - cu[b]));
    }
  }
}

// ALiBi slopes [Hq] or [B, Hq], finite: the row of each sequence.
std::vector<std::vector<double>> read_alibi(const char* fn, const AttentionOptions& o, int64_t B,
                                            int64_t Hq) {
  if (!o.alibi_slopes.defined()) return {};
  const Tensor& a = o.alibi_slopes;
  const bool per_seq = a.dim() == 2 && a.size(0) == B && a.size(1) == Hq;
  if (!is_floating(a.dtype()) || !(per_seq || (a.dim() == 1 && a.size(0) == Hq))) {
    fail(fn, fmt::format("alibi_slopes must be floating [Hq = {}] or [B = {}, Hq], got {} with "
                         "shape {}",
                         Hq, B, dtype_name(a.dtype()), a.shape_str()));
  }
  const std::vector<double> vals = a.to_vector();
  for (size_t e = 0; e < vals.size(); ++e) {
    if (!std::isfinite(vals[e]))
      fail(fn, fmt::format("alibi_slopes (flat index {}) = {} is not finite", e, vals[e]));
  }
  std::vector<std::vector<double>> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto first = vals.begin() + (per_seq ? b * Hq : 0);
    rows[b].assign(first, first + Hq);
  }
  return rows;
}

void build_sequences(const char* fn, const AttentionOptions& o, const SequenceShapes& shapes,
                     const std::vector<int64_t>& used, Packed& pk) {
  check_scalars(fn, o);
  ForwardProblem base;
  base.B = 1, base.Hq = shapes.Hq, base.Hkv = shapes.Hkv, base.D = shapes.D, base.Dv = shapes.Dv;
  base.group = base.Hq / base.Hkv;
  base.dtype = shapes.dtype;
  resolve_scores(o, base);
  check_sinks(fn, o, base);
  const std::vector<std::vector<double>> alibi = read_alibi(fn, o, pk.B, base.Hq);
  pk.drops_all = o.dropout_p == 1.0;
  base.dropout.p = pk.drops_all ? 0.0 : o.dropout_p;
  base.dropout.seed = o.seed;
  if (!alibi.empty()) base.alibi = alibi[0];
  pk.backend = backend_for(fn, o.backend, base);
  double work = 0.0;
  pk.seqs.clear();
  for (int64_t b = 0; b < pk.B; ++b) {
    ForwardProblem p = base;
    p.Lq = pk.cu_q[b + 1] - pk.cu_q[b], p.Lk = pk.cu_k[b + 1] - pk.cu_k[b];
    check_position_rule(fn, o, p);
    if (!used.empty() && used[b] < p.Lk) p.key_length = {used[b]};
    if (!alibi.empty()) p.alibi = alibi[b];
    p.dropout.batch_base = b;
    work += static_cast<double>(p.Hq) * p.Lq * p.key_length_of(0) * (p.D + p.Dv);
    pk.seqs.push_back(std::move(p));
  }
  pk.threads = o.threads > 0 ? o.threads : threads_for_work(work);
}

}  // namespace attn::contract
