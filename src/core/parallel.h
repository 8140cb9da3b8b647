// The one parallel loop of attn: parallel_for(n_tasks, fn(task, worker)). Tasks are handed out
// dynamically; `worker` in [0, num_workers) picks per-thread scratch. Results must not depend on which
// worker ran a task (kernels reduce in a fixed order), so any thread count gives bitwise equal output.
#pragma once
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "attn/threads.h"

namespace attn {

// Threads used by a call that asked for `requested` (<= 0: default_num_threads(), see attn/threads.h);
// 1 in a child forked after an OpenMP team ran (see parallel.cc).
int resolve_threads(int requested);

// The threads of a call of `multiply_adds` that asked for no thread count: one below
// kTeamMinWork (waking a team costs more than it saves), else one per kWorkPerThread, at most
// default_num_threads(). Results never depend on the thread count.
// Measured on a Zen 4 (2 threads, decode steps of 12 heads x D 64 and 32 heads x D 128, alternated
// in one process): 2 threads beat 1 from 2^17 multiply-adds on, back to back (25.4 -> 16.6 us at
// 2^17), between small torch ops (11-12 rounds of 12) and after a 5 ms torch op or 5 ms idle (10 of
// 10, 5 of 6); at 2^16 they lost after the long op (3 of 10). One thread per 2^16 keeps a 2^17 call
// from waking every core of a large machine.
inline constexpr double kTeamMinWork = 1 << 17;
inline constexpr double kWorkPerThread = 1 << 16;
int threads_for_work(double multiply_adds);

// Called before each OpenMP team starts; a fork after it leaves the child single-threaded.
void note_team_started();
// Whether this process is such a child.
bool forked_without_pool();

// A library on the OpenMP runtime (oneDNN in src/nn) takes its team size from the calling thread's
// omp_get_max_threads(): set to n for one call and restored, so the caller's setting is untouched.
class OmpThreadsFor {
 public:
  explicit OmpThreadsFor(int n) : saved_(omp_get_max_threads()) {
    if (n != saved_) omp_set_num_threads(n);
  }
  ~OmpThreadsFor() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  OmpThreadsFor(const OmpThreadsFor&) = delete;
  OmpThreadsFor& operator=(const OmpThreadsFor&) = delete;

 private:
  int saved_;
};

// Tasks in groups of `per_group` whose results one step combines once all of them are done (split-KV
// partials merged per row task): finish(g) is true for exactly one call per group, the one that
// finishes its last task, and that task may then read what the others wrote (acquire-release).
// The combine step runs inside the same parallel_for instead of a second one: each parallel region
// wakes the team, ~50 us per region under a passive wait policy. Which thread combines does not
// change the result when the combine reads the parts in a fixed order.
class GroupCountdown {
 public:
  GroupCountdown(int64_t groups, int64_t per_group)
      : left_(std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(groups))) {
    for (int64_t g = 0; g < groups; ++g) left_[static_cast<size_t>(g)].store(per_group);
  }
  bool finish(int64_t group) {
    return left_[static_cast<size_t>(group)].fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

 private:
  std::unique_ptr<std::atomic<int64_t>[]> left_;
};

template <class Fn>
void parallel_for(int64_t n_tasks, int threads, Fn&& fn) {
  if (n_tasks <= 0) return;
  threads = resolve_threads(threads);
  if (threads > n_tasks) threads = static_cast<int>(n_tasks);
  if (threads <= 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  // Exceptions must not escape an OpenMP region: keep the first one and rethrow after the loop.
  std::exception_ptr error;
  std::mutex error_mutex;
  note_team_started();
#pragma omp parallel num_threads(threads)
  {
    const int worker = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tasks; ++t) {
      try {
        fn(t, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace attn
