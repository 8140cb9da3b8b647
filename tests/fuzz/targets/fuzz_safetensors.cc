// libFuzzer target: see safetensors_harness.h for the invariants.
#include "fuzz/fuzz_main.h"
#include "fuzz/safetensors_harness.h"

ATTN_FUZZ_ENTRY(attn::fuzz::fuzz_safetensors)
