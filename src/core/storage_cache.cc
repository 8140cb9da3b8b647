// The size-class cache of large tensor buffers (storage_cache.h, attn/memory.h).
#include "core/storage_cache.h"

#include <pthread.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "attn/memory.h"

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_CACHE_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_CACHE_UNDER_ASAN 1
#endif
#endif

namespace attn {
namespace {

constexpr size_t kSmallest = size_t{256} << 10;  // below this glibc's own free lists serve well
constexpr size_t kDefaultMiB = 1024;

// bytes rounded up to a multiple of an eighth of its power of two (>= kSmallest).
size_t size_class(size_t bytes) {
  size_t top = kSmallest;
  while (top <= bytes / 2) top <<= 1;  // top <= bytes < 2 top
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

size_t budget_from_env() {
#ifdef ATTN_CACHE_UNDER_ASAN
  return 0;
#else
  const char* env = std::getenv("ATTN_CACHE_MB");
  if (!env || !*env) return kDefaultMiB << 20;
  char* end = nullptr;
  const unsigned long long mib = std::strtoull(env, &end, 10);
  if (*end != '\0') return kDefaultMiB << 20;  // not a number: the default, as for unset
  return static_cast<size_t>(mib) << 20;
#endif
}

class Cache {
 public:
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= cls;
    return p;
  }
  // Parks p (of class cls) when the budget allows, else frees it.
  void give(void* p, size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_ + cls <= limit_) {
        free_[cls].push_back(p);
        held_ += cls;
        return;
      }
    }
    std::free(p);
  }
  // Frees parked buffers until at most `keep` bytes stay held; returns the bytes freed.
  size_t trim(size_t keep) {
    std::vector<void*> out;
    size_t freed = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend() && held_ > keep; ++it) {
        while (!it->second.empty() && held_ > keep) {
          out.push_back(it->second.back());
          it->second.pop_back();
          held_ -= it->first;
          freed += it->first;
        }
      }
    }
    for (void* p : out) std::free(p);
    return freed;
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  size_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }
  void set_limit(size_t bytes) {
#ifdef ATTN_CACHE_UNDER_ASAN
    bytes = 0;  // stays off
#endif
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
    }
    trim(bytes);
  }
  // Around fork: the child must not inherit the lock held by a thread that does not exist there.
  void lock() {
    mu_.lock();
  }
  void unlock() {
    mu_.unlock();
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> parked buffers
  size_t held_ = 0;
  size_t limit_ = budget_from_env();
};

// Never destroyed: buffers can be freed by static destructors after main returns.
Cache& cache() {
  static Cache* c = [] {
    auto* made = new Cache;
    pthread_atfork([] { cache().lock(); }, [] { cache().unlock(); }, [] { cache().unlock(); });
    return made;
  }();
  return *c;
}

}  // namespace

namespace detail {

std::shared_ptr<void> allocate_storage(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < kSmallest || cache().limit() == 0) {
    void* p = std::aligned_alloc(64, rounded);
    if (!p) return nullptr;
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  const size_t cls = size_class(rounded);
  void* p = cache().take(cls);
  if (!p) p = std::aligned_alloc(64, cls);
  if (!p) {
    cache().trim(0);
    p = std::aligned_alloc(64, cls);
    if (!p) return nullptr;
  }
  return std::shared_ptr<void>(p, [cls](void* q) { cache().give(q, cls); });
}

CheckpointLoadScope::CheckpointLoadScope() : parked_before_(cache().held()) {}
CheckpointLoadScope::~CheckpointLoadScope() {
  cache().trim(parked_before_);
}

}  // namespace detail

size_t cached_memory_bytes() {
  return cache().held();
}
size_t release_cached_memory() {
  return cache().trim(0);
}
void set_cached_memory_limit(size_t bytes) {
  cache().set_limit(bytes);
}
size_t cached_memory_limit() {
  return cache().limit();
}

}  // namespace attn
