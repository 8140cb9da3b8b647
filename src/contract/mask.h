// Which keys a query may use: the position rule (causal, window, alignment) and key lengths, shared by
// every backend, forward and backward. Causal is the window (unbounded, 0); one alignment rule for both.
//
// Query i sits at key position p(i) = i + offset, offset = Lk - Lq (bottom-right) or 0 (top-left).
// Key j is allowed by the rule when p(i) - left <= j <= p(i) + right (an unbounded side is -1) and
// j < key_length. Dense masks, block layouts and -inf biases remove further keys; see problem.h.
#pragma once
#include <algorithm>
#include <cstdint>

namespace attn::contract {

struct PositionRule {
  int64_t Lq = 0, Lk = 0;
  int64_t offset = 0;  // p(i) = i + offset
  int64_t left = -1;   // -1: unbounded
  int64_t right = -1;  // -1: unbounded; causal folds to min(right, 0)

  int64_t pos(int64_t i) const { return i + offset; }

  // Allowed keys of row i as the half-open range [lo, hi) (empty when lo >= hi), given the key length of
  // this batch entry (Lk when there is none). lo and hi are non-decreasing in i.
  void key_range(int64_t i, int64_t key_length, int64_t* lo, int64_t* hi) const {
    const int64_t p = pos(i);
    int64_t a = left < 0 ? 0 : p - left;
    int64_t b = right < 0 ? key_length : p + right + 1;
    a = std::clamp<int64_t>(a, 0, key_length);
    b = std::clamp<int64_t>(b, 0, key_length);
    *lo = a;
    *hi = std::max(a, b);
  }

  bool allowed(int64_t i, int64_t j, int64_t key_length) const {
    int64_t lo, hi;
    key_range(i, key_length, &lo, &hi);
    return j >= lo && j < hi;
  }
};

// How a tile of rows [i0, i1) x keys [j0, j1) stands under the rule: every (i, j) allowed (full, no
// per-element masking needed), none allowed (empty, skip it), or some (partial). Uses the monotonicity of
// lo and hi in i; "partial" may be returned for a tile that happens to be empty.
enum class TileKind { empty, partial, full };

inline TileKind classify_tile(const PositionRule& rule, int64_t key_length, int64_t i0, int64_t i1,
                              int64_t j0, int64_t j1) {
  if (i0 >= i1 || j0 >= j1) return TileKind::empty;
  int64_t lo_first, hi_first, lo_last, hi_last;
  rule.key_range(i0, key_length, &lo_first, &hi_first);
  rule.key_range(i1 - 1, key_length, &lo_last, &hi_last);
  if (hi_last <= j0 || lo_first >= j1) return TileKind::empty;
  // Every row's range covers [j0, j1): the largest lo is the last row's, the smallest hi the first row's.
  if (lo_last <= j0 && hi_first >= j1 && lo_first < hi_first && lo_last < hi_last)
    return TileKind::full;
  return TileKind::partial;
}

}  // namespace attn::contract
