// Software prefetch of a decode task's next blocks of keys, spread over the work of the current
// block (used by attention_decode-inl.h; the same for every instruction set).
#pragma once

#include <cstdint>

#include "backends/cpu/kernels.h"

namespace attn::cpu {

// The K and V rows of the block of keys kPrefetchBlocks<T> ahead, prefetched a few cache lines at a
// time from inside the inner loops of the block being computed (step(): once per kAheadSteps<T> steps
// of the dot product over D and of P V over the keys), the rest at the end of the block (finish).
// The hardware prefetchers alone held the bf16 decode at ~60% of one core's read bandwidth (their
// streams restart at every page; a block of bf16 rows of D 128 is one page); all of a block's lines
// issued at once (128 for f32 D 128) stalled the core until most had arrived, so that memory and
// arithmetic took turns instead of overlapping (AMD EPYC family 23, 2 threads, 32 heads x 32768
// keys: 14.1 GB/s of K + V in f32 and 10.5 in bf16 with the burst, 16.9 and 16.3 spread out).
// T is the element type of K and V. bf16 one block ahead, f32 two: on a Zen 4 (2 threads, Lk 32768,
// D 128, one process alternating the distance call by call, 12 rounds, twice) bf16 read 20% more
// K + V at one block than at two with 32 heads (33.7-34.0 against 28.0-29.5 GB/s, faster in 12
// of 12 rounds each time), 6-7% more for Lq 4, the same with 8 kv heads; f32 within 2.4% either way; four
// blocks was never better.
template <class T>
inline constexpr int64_t kPrefetchBlocks = sizeof(T) == 2 ? 1 : 2;
// The kernel calls step() once per this many of its inner steps (steps of the dot products over D,
// keys of P V), and the chunk grows to match; T is the element type of K and V. Once per step, the
// test and branches of step() cost more than the loop's own FMAs (in cache, f32 D 128, four rows:
// 108 -> 95 TSC cycles a key per four rows), and from memory every 2nd, 4th or 8th step beat every
// step by 20-30% alike (AMD EPYC family 23, 2 threads, 32 x 32768 keys f32: 14.1-16.6 -> 17.7-21.2
// GB/s in alternating runs). bf16 steps cover twice the elements of f32 ones (pairs), so its chunks
// were twice as large and issued half as often: every 2nd step read 12% more bf16 K + V than every
// 4th on a Zen 4 (medians of 8 alternating runs, 44.9 against 39.9 GB/s; 7 of 8 pairs), while f32
// was 3.5% slower at every 2nd (37.7 against 39.0 GB/s) and 8 lost for both.
template <class T>
inline constexpr int kAheadSteps = sizeof(T) == 2 ? 2 : 4;
// The lines go to L1 (PREFETCHT0) or to L2 (PREFETCHT1), per CPU (decode_prefetch_level()): on a
// Zen 4 (2 threads, 32 heads x 32768 keys, D 128, alternating runs) L2 gave f32 +8-45% over L1 in
// every memory-bandwidth window measured (39.9-42.1 against 32.8-33.2 GB/s of K + V in the
// quietest), bf16 between -9% and +35% depending on the window (docs/PERFORMANCE.md, "Decode
// prefetch"). The family 23 figures above are L1's (L2 not measured there). Or nowhere (none, a
// benchmark's setting): on a Zen 4 (2 threads, 32 heads, D 128, `attn bench --decode-lk
// 256,1024,32768 --decode-prefetch l2,l1,none`) none was 8-10% faster with K and V in the caches
// (Lk 256) and up to 1.6x slower from memory (f32 at Lk 32768); a call cannot tell which it is in
// (a model whose layers' caches add up past the L3 reads each from memory, however small), so L2
// stays.
class AheadLines {
 public:
  explicit AheadLines(PrefetchLevel level) : k_{level}, v_{level} {}
  // The next block: n > 0 rows of K (ldk bytes apart, kbytes each) and of V.
  // Rows that follow each other without a gap (the [B, H, L, D] layout) are one range each, fed
  // by step(); other layouts are fetched row by row in finish().
  void target(const char* k, int64_t ldk, int64_t kbytes, const char* v, int64_t ldv,
              int64_t vbytes, int64_t n) {
    k_.set(k, ldk, kbytes, n);
    v_.set(v, ldv, vbytes, n);
  }
  // No block ahead.
  void clear() {
    k_.set(nullptr, 0, 0, 0);
    v_.set(nullptr, 0, 0, 0);
  }
  // The next chunk of K and of V, while the block has them.
  void step() {
    k_.chunk();
    v_.chunk();
  }
  // What the steps left; then the chunk that spreads a whole block over the steps this block took
  // (the same for every full block of a task).
  void finish() {
    k_.rest();
    v_.rest();
  }

 private:
  struct Range {
    PrefetchLevel level;
    const char *start = nullptr, *at = nullptr, *end = nullptr;  // the contiguous block
    const char* row = nullptr;  // strided rows: all of them in rest()
    int64_t ld = 0, bytes = 0, n = 0;
    int64_t per = 64;  // bytes a step
    // none: an empty range, so chunk() and rest() find nothing to fetch (no test of the level on
    // the kernels' steps).
    void set(const char* r, int64_t ld_, int64_t bytes_, int64_t n_) {
      if (level == PrefetchLevel::none) {
        start = at = end = nullptr, n = 0;
      } else if (ld_ == bytes_) {
        start = at = r, end = r + n_ * bytes_, n = 0;
      } else {
        start = at = end = nullptr, row = r, ld = ld_, bytes = bytes_, n = n_;
      }
    }
    void fetch(const char* line) const {
      if (level == PrefetchLevel::l1) {
        __builtin_prefetch(line, 0, 3);
      } else {
        __builtin_prefetch(line, 0, 2);
      }
    }
    void chunk() {
      if (at >= end) return;
      for (int64_t b = 0; b < per; b += 64) fetch(at + b);
      at += per;
    }
    void rest() {
      if (at < end) {  // the steps did not cover the block: wider chunks from now on
        const int64_t steps = (at - start) / per;
        if (steps > 0) per = ((end - start + steps - 1) / steps + 63) / 64 * 64;
        for (; at < end; at += 64) fetch(at);
      }
      for (; n > 0; --n, row += ld) {
        for (int64_t b = 0; b < bytes; b += 64) fetch(row + b);
      }
    }
  };
  Range k_, v_;
};

}  // namespace attn::cpu
