// libFuzzer target: see checkpoint_harness.h for the invariants.
#include "fuzz/checkpoint_harness.h"
#include "fuzz/fuzz_main.h"

ATTN_FUZZ_ENTRY(attn::fuzz::fuzz_checkpoint)
