#include "core/parallel.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace attn {

namespace {
std::atomic<int> g_threads{0};
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0); }

int default_num_threads() {
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

int resolve_threads(int requested) { return requested > 0 ? requested : default_num_threads(); }

}  // namespace attn
