// The cache of large tensor buffers (attn/memory.h): a freed buffer of a size class is handed to
// the next tensor of that class, the budget bounds what is held, releasing gives it all back, and
// reused memory carries nothing over into zeros(). Off under AddressSanitizer.
#include "attn/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attn/tensor.h"

namespace attn {
namespace {

constexpr int64_t kMiBFloats = int64_t{1} << 18;  // 1 MiB of f32

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheOff = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kCacheOff = true;
#else
constexpr bool kCacheOff = false;
#endif
#else
constexpr bool kCacheOff = false;
#endif

// Restores the budget a test changed.
struct Budget {
  size_t saved = cached_memory_limit();
  explicit Budget(size_t bytes) { set_cached_memory_limit(bytes); }
  ~Budget() { set_cached_memory_limit(saved); }
};

TEST(MemoryCache, ReusesAFreedBufferOfTheSameClass) {
  const Budget budget(size_t{64} << 20);
  release_cached_memory();
  const void* first;
  {
    const Tensor a = Tensor::empty({kMiBFloats}, DType::f32);
    first = a.data();
  }
  if (kCacheOff) {
    EXPECT_EQ(cached_memory_bytes(), 0u);
    return;
  }
  EXPECT_EQ(cached_memory_bytes(), size_t{1} << 20);
  // A slightly smaller tensor falls in the same class (1 MiB rounds in steps of 128 KiB).
  const Tensor b = Tensor::empty({kMiBFloats - 1000}, DType::f32);
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(cached_memory_bytes(), 0u);
}

TEST(MemoryCache, BudgetBoundsWhatIsHeldAndReleaseGivesItBack) {
  const Budget budget(size_t{2} << 20);
  release_cached_memory();
  {
    std::vector<Tensor> t;
    for (int i = 0; i < 3; ++i) t.push_back(Tensor::empty({kMiBFloats}, DType::f32));
  }
  EXPECT_EQ(cached_memory_bytes(), kCacheOff ? 0u : size_t{2} << 20);  // the third was freed
  EXPECT_EQ(release_cached_memory(), kCacheOff ? 0u : size_t{2} << 20);
  EXPECT_EQ(cached_memory_bytes(), 0u);
  {
    const Tensor small = Tensor::empty({1000}, DType::f32);  // below 256 KiB: never held
  }
  EXPECT_EQ(cached_memory_bytes(), 0u);
  set_cached_memory_limit(0);
  { const Tensor off = Tensor::empty({kMiBFloats}, DType::f32); }
  EXPECT_EQ(cached_memory_bytes(), 0u);
}

TEST(MemoryCache, ReusedMemoryStartsAsZerosWhenAskedFor) {
  const Budget budget(size_t{64} << 20);
  {
    Tensor ones = Tensor::empty({kMiBFloats}, DType::f32);
    float* p = ones.data_as<float>();
    for (int64_t i = 0; i < kMiBFloats; ++i) p[i] = 1.0f;
  }
  const Tensor z = Tensor::zeros({kMiBFloats}, DType::f32);
  const float* p = z.data_as<float>();
  for (int64_t i = 0; i < kMiBFloats; ++i) ASSERT_EQ(p[i], 0.0f) << i;
}

}  // namespace
}  // namespace attn
