// libFuzzer target: see attention_harness.h for the invariants.
#include "fuzz/attention_harness.h"
#include "fuzz/fuzz_main.h"

ATTN_FUZZ_ENTRY(attn::fuzz::fuzz_attention)
