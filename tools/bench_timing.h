// Timing for `attn bench`'s rows: the median wall and CPU time of repeated calls after a warm-up.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

#include "attn/bench.h"

namespace attn::tools {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timing {
  double wall = 0, cpu = 0;  // medians, seconds
};

template <class Fn>
Timing median_seconds(int reps, Fn&& fn) {
  fn();  // warm-up: page faults, scratch allocation
  std::vector<double> t, c;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_bench::process_cpu_seconds();
    fn();
    c.push_back(cpu_bench::process_cpu_seconds() - c0);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return {median(t), median(c)};
}

}  // namespace attn::tools
