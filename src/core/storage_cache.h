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

// For the life of a checkpoint load: what its temporaries park in the cache (the file's tensors,
// their converted copies: sizes no forward asks for) is given back when it ends, the largest
// classes first, down to what was parked before, so that it does not crowd the model's own buffers
// out of the budget (a BERT-base f32 load left 850 MB of a 1 GiB budget, and each forward then
// page-faulted 33-46 thousand of its buffers afresh). Declare it before the temporaries.
class CheckpointLoadScope {
 public:
  CheckpointLoadScope();
  ~CheckpointLoadScope();
  CheckpointLoadScope(const CheckpointLoadScope&) = delete;
  CheckpointLoadScope& operator=(const CheckpointLoadScope&) = delete;

 private:
  size_t parked_before_;
};

}  // namespace attn::detail
