#include "core/parallel.h"

#include <pthread.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

namespace attn {

namespace {
std::atomic<int> g_threads{0};

// fork() copies only the calling thread: in a child of a process whose OpenMP pool had started,
// libgomp still counts the parent's pool threads and a new parallel region waits for them forever.
// Such a child runs every loop on its own thread (torch's DataLoader workers run single-threaded
// too). A child of a process that never started a team keeps its threads.
std::atomic<bool> g_team_started{false};
std::atomic<bool> g_pool_lost{false};

void on_fork_in_child() {
  if (g_team_started.load(std::memory_order_relaxed)) g_pool_lost.store(true);
}

const int g_fork_handler = pthread_atfork(nullptr, nullptr, on_fork_in_child);
}  // namespace

void note_team_started() {
  if (!g_team_started.load(std::memory_order_relaxed)) g_team_started.store(true);
}

bool forked_without_pool() {
  return g_pool_lost.load(std::memory_order_relaxed);
}

void set_num_threads(int n) {
  g_threads.store(n > 0 ? n : 0);
}

int default_num_threads() {
  (void)g_fork_handler;
  if (forked_without_pool()) return 1;
  const int set = g_threads.load();
  if (set > 0) return set;
  if (const char* env = std::getenv("ATTN_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v <= 4096) return static_cast<int>(v);
  }
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

int resolve_threads(int requested) {
  if (forked_without_pool()) return 1;
  return requested > 0 ? requested : default_num_threads();
}

int threads_for_work(double multiply_adds) {
  if (!(multiply_adds >= kTeamMinWork)) return 1;  // also NaN
  const double by_work = std::floor(multiply_adds / kWorkPerThread);
  const int most = default_num_threads();
  return by_work >= most ? most : static_cast<int>(by_work);
}

}  // namespace attn
