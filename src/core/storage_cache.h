// Large tensor buffers are kept for reuse instead of going back to the C library: glibc returns big
// blocks to the kernel (munmap, or trimming the heap top), so every forward of a layer paid first-touch
// page faults on each fresh output (10% of a BERT FeedForward's time at 1024 x 1536 on one Xeon core).
// Buffers of at least 256 KiB are rounded up to a size class (an eighth of a power of two: at most 12.5%
// unused) and, when freed, parked on that class's list while the parked total stays within the budget:
// ATTN_CACHE_MB (MiB; 0 turns the cache off), default 1024. An allocation that fails releases every
// parked buffer and tries once more, so the cache never causes an out-of-memory error. Under
// AddressSanitizer the cache is off (it would hide use-after-free). Thread-safe and fork-safe (the
// lock is taken around fork, so a child never inherits it held).
#pragma once
#include <cstddef>
#include <memory>

namespace attn::detail {

// 64-byte aligned storage of at least `bytes` (> 0) bytes, freed into the cache when the last owner
// drops it; nullptr when the C library has no memory either.
std::shared_ptr<void> allocate_storage(size_t bytes);

// Frees parked buffers (the largest classes first) until at most `keep` bytes stay parked: for a
// caller whose freed temporaries are of sizes nothing will ask for again (a checkpoint's tensors).
void trim_cached_memory(size_t keep);

}  // namespace attn::detail
