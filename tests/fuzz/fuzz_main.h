// The libFuzzer entry point of one harness: a Violation (a broken invariant) is printed and aborts,
// so libFuzzer saves the input as a crash; attn::Error must not escape a harness (each one catches
// the rejections it expects), and any other exception aborts through std::terminate.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_input.h"

#define ATTN_FUZZ_ENTRY(harness)                                             \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {  \
    try {                                                                    \
      harness(data, size);                                                   \
    } catch (const attn::fuzz::Violation& v) {                               \
      std::fprintf(stderr, "attn fuzz: invariant violated: %s\n", v.what()); \
      std::abort();                                                          \
    }                                                                        \
    return 0;                                                                \
  }
