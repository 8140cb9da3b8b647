// Resources: an allocation that cannot succeed becomes attn::Error (never std::bad_alloc, an abort
// or a hang), and attention needs no memory proportional to Lq x Lk unless the weights are asked
// for.
//
// Absurd sizes cost nothing to build: a broadcast view (stride 0) of a one-element buffer can claim
// any shape, so q can say Lq = 2^40 while holding 16 bytes. Sizes stay below the int64 overflow
// that validation rejects on its own (those are the fuzzer's), so what is tested is the allocation
// itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <new>
#include <string>

#include "attn/attention.h"
#include "test_util.h"

// Under AddressSanitizer a failed allocation must return null (as without it) instead of aborting:
// this is what lets Tensor::empty turn it into attn::Error. (Ignored without ASan.)
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}

// ASan and TSan report a failed operator new as fatal even with allocator_may_return_null (only
// malloc and aligned_alloc return null): tests of std::bad_alloc run in the plain builds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTN_TEST_FATAL_NEW 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTN_TEST_FATAL_NEW 1
#endif
#endif

namespace attn {
namespace {

constexpr int64_t kHuge = int64_t{1} << 40;

// Expects attn::Error from `fn`, starting with "attn::" (the entry point or the allocation that
// failed).
template <class Fn>
void expect_clean_failure(Fn&& fn, const char* what) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("attn::", 0), 0u) << what << ": " << e.what();
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << typeid(e).name()
                  << " instead of attn::Error: " << e.what();
    return;
  }
  ADD_FAILURE() << what << ": did not fail";
}

TEST(Resources, AbsurdOutputIsAnError) {
  // out = [1, 1, 2^40, 4] f32 = 16 TiB.
  const Tensor q = Tensor::zeros({1, 1, 1, 4}, DType::f32).expand({1, 1, kHuge, 4});
  const Tensor k = test::random_tensor({1, 1, 3, 4}, DType::f32, 1);
  const Tensor v = test::random_tensor({1, 1, 3, 4}, DType::f32, 2);
  for (Backend b : {Backend::reference, Backend::automatic}) {
    AttentionOptions o;
    o.backend = b;
    expect_clean_failure([&] { attention(q, k, v, o); }, "Lq = 2^40");
  }
}

TEST(Resources, AbsurdWeightsAreAnError) {
  // weights = [1, 1, 2^21, 2^21] f32 = 16 TiB; out alone (2^21 x 4 floats) would fit.
  const int64_t L = int64_t{1} << 21;
  const Tensor q = Tensor::zeros({1, 1, 1, 4}, DType::f32).expand({1, 1, L, 4});
  const Tensor k = Tensor::zeros({1, 1, 1, 4}, DType::f32).expand({1, 1, L, 4});
  AttentionOptions o;
  o.return_weights = true;
  expect_clean_failure([&] { attention(q, k, k, o); }, "weights of 2^21 x 2^21");
}

// Options whose validation reads one value per batch entry or head (key lengths, ALiBi slopes):
// with 2^40 of them (a broadcast view) the copy cannot be allocated, even when the output is empty
// (Lq = 0).
TEST(Resources, AbsurdBatchOfKeyLengthsIsAnError) {
#ifdef ATTN_TEST_FATAL_NEW
  GTEST_SKIP() << "a sanitizer aborts on a failed operator new; the release build runs this test";
#endif
  const Tensor q = Tensor::zeros({1, 1, 0, 4}, DType::f32).expand({kHuge, 1, 0, 4});
  const Tensor k = Tensor::zeros({1, 1, 2, 4}, DType::f32).expand({kHuge, 1, 2, 4});
  AttentionOptions o;
  o.key_lengths = Tensor::zeros({1}, DType::i64).expand({kHuge});
  expect_clean_failure([&] { attention(q, k, k, o); }, "2^40 key lengths");
  AttentionOptions a;
  const Tensor qh = Tensor::zeros({1, 1, 0, 4}, DType::f32).expand({1, kHuge, 0, 4});
  const Tensor kh = Tensor::zeros({1, 1, 2, 4}, DType::f32).expand({1, kHuge, 2, 4});
  a.alibi_slopes = Tensor::zeros({1}, DType::f32).expand({kHuge});
  expect_clean_failure([&] { attention(qh, kh, kh, a); }, "2^40 ALiBi slopes");
}

// Peak resident memory of this process, in bytes, since the last reset_peak_rss() (Linux: VmHWM).
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
int64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
// Writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  return static_cast<bool>(f);
}

// Peak RSS growth while `fn` runs. RSS counts every way of getting memory (malloc, aligned_alloc,
// operator new, mmap, OpenMP's thread stacks), so no allocation can hide from it, unlike an
// allocator hook; the price is noise of a few MiB, far below the Lq x Lk bytes looked for.
template <class Fn>
int64_t peak_growth(Fn&& fn) {
  if (!reset_peak_rss()) return -1;
  const int64_t before = current_rss_bytes();
  fn();
  return peak_rss_bytes() - before;
}

// Lq = Lk = 2048: the scores of one head are 2048^2 floats = 16 MiB (32 MiB in double); q, k, v,
// out and their gradients are 2048 x 4 floats = 32 KiB each, and the measured noise is about 200
// KiB. Forward and backward must stay below 1/4 of one score matrix (the first backward also
// allocates its per-thread tile scratch: about 2 MiB under ASan); returning the weights must show
// one (the control: the measurement sees what it looks for).
TEST(Resources, NoScoreMatrixWithoutWeights) {
  const int64_t L = 2048, D = 4;
  const int64_t score_bytes = L * L * 4;
  const Tensor q = test::random_tensor({1, 1, L, D}, DType::f32, 11);
  const Tensor k = test::random_tensor({1, 1, L, D}, DType::f32, 12);
  const Tensor v = test::random_tensor({1, 1, L, D}, DType::f32, 13);
  const Tensor dout = test::random_tensor({1, 1, L, D}, DType::f32, 14);
  AttentionOptions o;
  o.causal = true;
  o.threads = 2;
  attention(q.slice(2, 0, 64), k.slice(2, 0, 64), v.slice(2, 0, 64), o);  // warm up thread pools

  for (Backend b : {Backend::automatic, Backend::reference}) {
    o.backend = b;
    AttentionResult r;
    const int64_t fwd = peak_growth([&] { r = attention(q, k, v, o); });
    ASSERT_GE(fwd, 0) << "cannot reset the peak RSS through /proc/self/clear_refs";
    EXPECT_LT(fwd, score_bytes / 4)
        << backend_name(b) << " forward grew the peak RSS by " << fwd << " bytes";
    const int64_t bwd = peak_growth([&] { attention_backward(dout, q, k, v, r.out, r.lse, o); });
    EXPECT_LT(bwd, score_bytes / 4)
        << backend_name(b) << " backward grew the peak RSS by " << bwd << " bytes";
  }
  // The control: asking for the weights costs one score matrix.
  o.backend = Backend::automatic;
  o.return_weights = true;
  const int64_t with_weights = peak_growth([&] { attention(q, k, v, o); });
  EXPECT_GE(with_weights, score_bytes * 9 / 10)
      << "the measurement missed a " << score_bytes << "-byte allocation";
}

}  // namespace
}  // namespace attn
