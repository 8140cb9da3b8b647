// libFuzzer target: see packed_harness.h for the invariants.
#include "fuzz/fuzz_main.h"
#include "fuzz/packed_harness.h"

ATTN_FUZZ_ENTRY(attn::fuzz::fuzz_packed)
