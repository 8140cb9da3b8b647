// Checks and rules of the options that more than one entry point applies: attn::attention
// (src/attention.cc) and ring attention (src/distributed/ring_validate.cc), which sees a slice of
// the keys and checks the global bounds later. Messages have no caller's name; callers prefix it.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.h"

namespace attn::contract {

// Where query 0 sits among the keys, p(i) = i + offset: position_offset when given, else by align.
inline int64_t query_offset(const AttentionOptions& o, int64_t Lq, int64_t Lk) {
  if (o.position_offset) return *o.position_offset;
  return o.align == Align::bottom_right ? Lk - Lq : 0;
}

// A window bound as the position rule takes it: one this wide allows every key a real position can
// reach (|offset| < 2^60, lengths far below), so it is unbounded (-1); p - left and p + right + 1
// then stay far inside int64 (a bound near 2^63 overflowed them and removed every key).
inline int64_t window_bound(int64_t bound) {
  constexpr int64_t kWide = int64_t{1} << 62;
  return bound >= kWide ? -1 : bound;
}

// The window's right bound with causal applied (causal is the window (-1, 0)); -1 = unbounded.
inline int64_t right_bound(const AttentionOptions& o, int64_t right) {
  if (!o.causal) return right;
  return right < 0 ? 0 : std::min<int64_t>(right, 0);
}

inline std::string key_length_outside(size_t b, double value, int64_t Lk) {
  return fmt::format("key_lengths[{}] = {} is outside [0, Lk = {}]", b, value, Lk);
}

// key_lengths: i32 or i64, the batch dims' shape (or [B], or one value when B = 1), each value in
// [0, Lk] (Lk < 0: only >= 0, for a caller that checks the upper bound itself). Returns "" and the
// values in *lengths, or the message.
inline std::string check_key_lengths(const Tensor& kl, const Shape& batch, int64_t B, int64_t Lk,
                                     std::vector<int64_t>* lengths) {
  lengths->clear();
  if (kl.dtype() != DType::i32 && kl.dtype() != DType::i64) {
    return fmt::format("key_lengths must be i32 or i64, got {} with shape {}",
                       dtype_name(kl.dtype()), kl.shape_str());
  }
  const bool shape_ok =
      kl.shape() == batch || (kl.dim() == 1 && kl.size(0) == B) || (B == 1 && kl.numel() == 1);
  if (!shape_ok) {
    return fmt::format("key_lengths of shape {} must have the batch dims' shape {} (or [{}])",
                       kl.shape_str(), shape_to_string(batch), B);
  }
  const std::vector<double> vals = kl.to_vector();
  lengths->resize(vals.size());
  for (size_t b = 0; b < vals.size(); ++b) {
    if (vals[b] < 0 && Lk < 0) return fmt::format("key_lengths[{}] = {} is < 0", b, vals[b]);
    if (vals[b] < 0 || (Lk >= 0 && vals[b] > static_cast<double>(Lk))) {
      return key_length_outside(b, vals[b], Lk);
    }
    (*lengths)[b] = static_cast<int64_t>(vals[b]);
  }
  return {};
}

}  // namespace attn::contract
