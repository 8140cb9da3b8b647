// fork() after a threaded call: the child must run attn (libgomp's pool does not survive a fork;
// without care a child's first parallel region waits forever for threads that are not there, which
// hung DataLoader workers). A hang in the child ends it by SIGALRM, so the test fails, never hangs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "attn/attention.h"
#include "core/parallel.h"
#include "test_util.h"

namespace attn::test {
namespace {

struct Problem {
  Tensor q = random_tensor({2, 4, 192, 32}, DType::f32, 1, -1, 1);
  Tensor k = random_tensor({2, 4, 256, 32}, DType::f32, 2, -1, 1);
  Tensor v = random_tensor({2, 4, 256, 32}, DType::f32, 3, -1, 1);
  Tensor dout = random_tensor({2, 4, 192, 32}, DType::f32, 4, -1, 1);
  AttentionOptions o;
  Problem() {
    o.backend = Backend::cpu;
    o.causal = true;
    o.threads = 2;
  }
};

// Runs `child` in a forked child with a time limit; returns its exit status (-signal if killed).
template <class Fn>
int run_in_child(Fn&& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    int code = 4;
    try {
      code = child();
    } catch (...) {
      code = 5;
    }
    _exit(code);
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST(Fork, ChildOfAThreadedCallRunsAttention) {
  const Problem p;
  // A team of two threads runs in the parent first.
  std::atomic<int> ran{0};
  parallel_for(8, 2, [&](int64_t, int) { ran.fetch_add(1); });
  ASSERT_EQ(ran.load(), 8);
  const AttentionResult fwd = attention(p.q, p.k, p.v, p.o);
  const AttentionGrads grads = attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, p.o);
  EXPECT_FALSE(forked_without_pool());
  const int status = run_in_child([&] {
    const AttentionResult c = attention(p.q, p.k, p.v, p.o);
    const AttentionGrads g = attention_backward(p.dout, p.q, p.k, p.v, c.out, c.lse, p.o);
    // Results do not depend on the thread count, so the child's are bitwise the parent's.
    const bool same = bitwise_equal(c.out, fwd.out) && bitwise_equal(g.dq, grads.dq) &&
                      bitwise_equal(g.dk, grads.dk) && bitwise_equal(g.dv, grads.dv);
    return same ? (forked_without_pool() ? 0 : 2) : 3;
  });
  EXPECT_EQ(status, 0)
      << "0: ran and matched; 2: matched but the child kept its pool; 3: differed; "
         "-14: hung (SIGALRM)";
  // The parent keeps its threads.
  EXPECT_FALSE(forked_without_pool());
  EXPECT_EQ(resolve_threads(2), 2);
}

}  // namespace
}  // namespace attn::test
