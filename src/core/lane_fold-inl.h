// Lane sums of a whole set of vectors at once, for dot products kept in vector lanes
// (src/nn/elementwise_dot_linear-inl.h, src/backends/cpu/dot_linear_bf16-inl.h): given N vectors of
// N float lanes (a GCC vector type V), fold_lanes leaves in v[0] lane j = the sum of v[j]'s lanes,
// in one fixed order (pairwise halves: lane i + lane i + N/2, then the same on the halves, ...), the
// same for every vector whatever its place in the set. N - 1 shuffle-and-add steps for N sums.
//
// Included inside a per-ISA namespace after its target pragma (no include guard, no headers): each
// instruction set's namespace gets its own copy.

// Lane p of one fold of a and b, which hold N / S items of S lanes each: item t of the result is
// item t of a (t < N / S) or item t - N / S of b, its S / 2 lanes the sums of the item's two halves
// (upper: the index of the second half's lane).
template <int N, int S>
constexpr int fold_lane(int p, bool upper) {
  const int half = S / 2, per = N / S, t = p / half;
  return (t < per ? 0 : N) + (t % per) * S + p % half + (upper ? half : 0);
}
template <int N, int S, class V, int... P>
inline V fold_pair(V a, V b, std::integer_sequence<int, P...>) {
  return __builtin_shufflevector(a, b, fold_lane<N, S>(P, false)...) +
         __builtin_shufflevector(a, b, fold_lane<N, S>(P, true)...);
}
// v [0, C) hold items of S lanes, folded pairwise level by level (C = S = N to start).
template <int S, int C, class V>
inline void fold_level(V* v) {
  constexpr int N = sizeof(V) / sizeof(float);
  for (int i = 0; i < C / 2; ++i)
    v[i] = fold_pair<N, S>(v[2 * i], v[2 * i + 1], std::make_integer_sequence<int, N>{});
  if constexpr (S > 2) fold_level<S / 2, C / 2>(v);
}
template <class V>
inline V fold_lanes(V* v) {
  constexpr int N = sizeof(V) / sizeof(float);
  fold_level<N, N>(v);
  return v[0];
}
