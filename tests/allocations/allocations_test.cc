// Heap allocations of the calls that run per token (a decode step, a small forward, the views and
// checks under them), counted by replacing the global operator new in this program alone (its own
// test binary: the replacement would count every other program's allocations too). A call's fixed
// cost on a 2 us decode step was half malloc and free: 63 allocations per attn::attention call, from
// shapes held in std::vector (docs/PERFORMANCE.md, "A call's fixed cost").
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "attn/attention.h"
#include "attn/tensor.h"
#include "test_util.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// Every form without an alignment argument is replaced, so that news and deletes pair up here: a
// sanitizer's runtime replaces the forms left out, and memory from one side freed by the other is a
// mismatch to it.
void* counted_malloc(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new(std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return counted_malloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return counted_malloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace attn {
namespace {

// operator new calls made by fn() (after one warm-up call: thread pools and caches start once).
template <class Fn>
long allocations_of(Fn&& fn) {
  fn();
  const long before = g_allocations.load();
  fn();
  return g_allocations.load() - before;
}

TEST(Allocations, ShapesAndViewsAllocateNothing) {
  const Tensor t = Tensor::zeros({2, 3, 4, 5}, DType::f32);
  EXPECT_EQ(allocations_of([&] {
              Shape s = t.shape();
              s.insert(s.begin(), 1);
              s.push_back(1);
              Tensor v = t.view({6, 4, 5}).unsqueeze(0).transpose(1, 2).slice(0, 0, 1);
              v = v.expand({3, 4, 6, 5}).as_strided({2, 2}, {1, 1});
              return v.shape() == s;
            }),
            0);
}

// A decode step: the output and lse storage (from the storage cache) and their two shared_ptr
// control blocks at most; 63 when shapes were vectors.
TEST(Allocations, ADecodeStepAllocatesOnlyItsOutputs) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor q = test::random_tensor({1, 12, 1, 64}, dt, 1);
    const Tensor k = test::random_tensor({1, 12, 128, 64}, dt, 2);
    const Tensor v = test::random_tensor({1, 12, 128, 64}, dt, 3);
    AttentionOptions o;
    o.backend = Backend::cpu;
    o.threads = 1;
    EXPECT_LE(allocations_of([&] { return attention(q, k, v, o); }), 4) << dtype_name(dt);
    o.threads = 2;  // a parallel region allocates nothing of its own either
    EXPECT_LE(allocations_of([&] { return attention(q, k, v, o); }), 4) << dtype_name(dt);
  }
}

TEST(Allocations, ASmallForwardAndBackwardStayWithinAFewAllocations) {
  const Tensor q = test::random_tensor({2, 4, 64, 32}, DType::f32, 4);
  const Tensor k = test::random_tensor({2, 4, 64, 32}, DType::f32, 5);
  const Tensor v = test::random_tensor({2, 4, 64, 32}, DType::f32, 6);
  AttentionOptions o;
  o.backend = Backend::cpu;
  o.threads = 1;
  o.window.right = 0;  // causal
  EXPECT_LE(allocations_of([&] { return attention(q, k, v, o); }), 8);
  const AttentionResult r = attention(q, k, v, o);
  EXPECT_LE(allocations_of([&] { return attention_backward(r.out, q, k, v, r.out, r.lse, o); }), 6);
}

}  // namespace
}  // namespace attn
