// The libFuzzer entry point of one harness: a Violation (a broken invariant) is printed and aborts,
// so libFuzzer saves the input as a crash; attn::Error must not escape a harness (each one catches
// the rejections it expects), and any other exception aborts through std::terminate.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "core/parallel.h"
#include "fuzz/fuzz_input.h"

// LLVMFuzzerInitialize runs one parallel region at the harnesses' largest thread count first:
// libomp allocates its per-thread descriptors when a region first uses more threads and keeps them
// for the process's life, which libFuzzer's per-input leak check would report as a leak of that
// input.
#define ATTN_FUZZ_ENTRY(harness)                       \
  extern "C" int LLVMFuzzerInitialize(int*, char***) { \
    attn::parallel_for(8, 8, [](int64_t, int) {});     \
    return 0;                                          \
  }                                                    \
  ATTN_FUZZ_TEST_ONE(harness)

#define ATTN_FUZZ_TEST_ONE(harness)                                          \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {  \
    try {                                                                    \
      harness(data, size);                                                   \
    } catch (const attn::fuzz::Violation& v) {                               \
      std::fprintf(stderr, "attn fuzz: invariant violated: %s\n", v.what()); \
      std::abort();                                                          \
    }                                                                        \
    return 0;                                                                \
  }
