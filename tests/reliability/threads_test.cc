// The thread count of a call that asks for none (core/parallel.h, threads_for_work): one thread for
// a small call (waking a team costs more than it saves), then one per share of work, at most the
// default. Results never depend on it (Determinism.*, CpuDecode.ThreadCountsGiveBitwiseEqualResults).
#include "attn/threads.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/parallel.h"

namespace attn::test {
namespace {

// Sets attn's default thread count for one test, then restores it.
class DefaultThreads {
 public:
  explicit DefaultThreads(int n) { set_num_threads(n); }
  ~DefaultThreads() { set_num_threads(0); }
};

TEST(Threads, SmallCallsRunOnOneThreadLargerOnesOnePerShareOfWork) {
  const DefaultThreads eight(8);
  EXPECT_EQ(threads_for_work(0.0), 1);
  EXPECT_EQ(threads_for_work(kTeamMinWork - 1.0), 1);
  EXPECT_EQ(threads_for_work(std::numeric_limits<double>::quiet_NaN()), 1);
  EXPECT_EQ(threads_for_work(kTeamMinWork), static_cast<int>(kTeamMinWork / kWorkPerThread));
  EXPECT_EQ(threads_for_work(3.5 * kWorkPerThread), 3);
  EXPECT_EQ(threads_for_work(8.0 * kWorkPerThread), 8);
  EXPECT_EQ(threads_for_work(1e15), 8);
  EXPECT_EQ(threads_for_work(std::numeric_limits<double>::infinity()), 8);
  int last = 1;
  for (double w = 1.0; w < 1e9; w *= 1.37) {
    const int t = threads_for_work(w);
    EXPECT_GE(t, last) << w;
    EXPECT_LE(t, 8) << w;
    last = t;
  }
}

TEST(Threads, OneDefaultThreadIsOneThreadForAnyWork) {
  const DefaultThreads one(1);
  for (double w : {0.0, kTeamMinWork, 1e9, 1e15}) EXPECT_EQ(threads_for_work(w), 1) << w;
}

}  // namespace
}  // namespace attn::test
