// The schedule of ring attention, computed identically on every rank from the gathered lengths and
// the options: which rows and keys of each (query segment, key segment) pair the position rule can
// connect, and how far each rank's K/V block has to travel.
//
// Global positions: query i (of Lq) sits at key position p(i) = i + offset. Key j is allowed when
// p(i) - left <= j <= p(i) + right (a side of -1 is unbounded; causal already folded into right)
// and j < key_limit (the largest key length of the batch; rows of shorter batch entries are trimmed
// by the attention call itself through key_lengths).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attn/ring.h"

namespace attn::distributed {

// Global rows [i0, i1) x global keys [j0, j1): the smallest rectangle of a segment pair that holds
// every allowed (i, j). Outside it nothing is allowed, so rows outside contribute nothing from this
// block.
struct Box {
  int64_t i0 = 0, i1 = 0, j0 = 0, j1 = 0;
  bool empty() const { return i0 >= i1 || j0 >= j1; }
};

struct PositionBounds {
  int64_t offset = 0;
  int64_t left = -1, right = -1;
  int64_t key_limit = 0;
};

// Rows and keys of q segment [qs, qe) x k segment [ks, ke) that the rule connects. The allowed
// range of row i, [p(i) - left, p(i) + right + 1), moves right by one per row, so the rows that
// meet [ks, ke) are one interval and their keys lie between the first row's low end and the last
// row's high end.
inline Box connect(const PositionBounds& b, int64_t qs, int64_t qe, int64_t ks, int64_t ke) {
  Box box;
  ke = std::min(ke, b.key_limit);
  if (qs >= qe || ks >= ke) return box;
  int64_t i0 = qs, i1 = qe;
  if (b.right >= 0) i0 = std::max(i0, ks - b.offset - b.right);  // p(i) + right >= ks
  if (b.left >= 0) i1 = std::min(i1, ke - b.offset + b.left);    // p(i) - left < ke
  if (i0 >= i1) return box;
  int64_t j0 = ks, j1 = ke;
  if (b.left >= 0) j0 = std::max(j0, i0 + b.offset - b.left);
  if (b.right >= 0) j1 = std::min(j1, i1 - 1 + b.offset + b.right + 1);
  if (j0 >= j1) return box;
  return {i0, i1, j0, j1};
}

struct Plan {
  int P = 1;
  PositionBounds bounds;
  std::vector<std::vector<RingSegment>> q_segs, k_segs;  // [rank][segment]
  std::vector<int64_t> q_len, k_len;                     // local lengths per rank
  // hops[s]: block s (the K/V of rank s) is used up to rank s + hops[s] (mod P); it travels hops[s]
  // steps and no further (under a causal or window mask blocks stop early).
  std::vector<int> hops;
  std::vector<std::vector<char>> needs;  // needs[r][s]: rank r's queries meet some key of block s

  bool need(int r, int s) const { return needs[r][s] != 0; }
};

inline Plan make_plan(const PositionBounds& bounds, std::vector<std::vector<RingSegment>> q_segs,
                      std::vector<std::vector<RingSegment>> k_segs) {
  Plan plan;
  plan.P = static_cast<int>(q_segs.size());
  plan.bounds = bounds;
  plan.q_segs = std::move(q_segs);
  plan.k_segs = std::move(k_segs);
  const int P = plan.P;
  plan.q_len.assign(P, 0);
  plan.k_len.assign(P, 0);
  for (int r = 0; r < P; ++r) {
    for (const RingSegment& s : plan.q_segs[r]) plan.q_len[r] += s.length;
    for (const RingSegment& s : plan.k_segs[r]) plan.k_len[r] += s.length;
  }
  plan.needs.assign(P, std::vector<char>(P, 0));
  for (int r = 0; r < P; ++r) {
    for (int s = 0; s < P; ++s) {
      for (const RingSegment& qs : plan.q_segs[r]) {
        for (const RingSegment& ks : plan.k_segs[s]) {
          if (!connect(bounds, qs.start, qs.start + qs.length, ks.start, ks.start + ks.length)
                   .empty()) {
            plan.needs[r][s] = 1;
          }
        }
      }
    }
  }
  plan.hops.assign(P, 0);
  for (int s = 0; s < P; ++s) {
    for (int u = 1; u < P; ++u) {
      if (plan.needs[(s + u) % P][s]) plan.hops[s] = u;
    }
  }
  return plan;
}

}  // namespace attn::distributed
