// libFuzzer target: see npy_harness.h for the invariants.
#include "fuzz/fuzz_main.h"
#include "fuzz/npy_harness.h"

ATTN_FUZZ_ENTRY(attn::fuzz::fuzz_npy)
