// attn keeps large tensor buffers (>= 256 KiB) it has freed for reuse, so that a forward run again
// does not fault fresh pages in (see src/core/storage_cache.h). The budget is ATTN_CACHE_MB
// (MiB, default 1024; 0 turns the cache off) until set here.
#pragma once
#include <cstddef>

namespace attn {

// Bytes held in freed buffers waiting for reuse.
size_t cached_memory_bytes();
// Gives every held buffer back to the C library; returns the bytes released.
size_t release_cached_memory();
// The most bytes held at once (0: none; buffers over it are freed at once). Releases what is over.
void set_cached_memory_limit(size_t bytes);
size_t cached_memory_limit();

}  // namespace attn
