// `attn bench --modes paged`: decode over a paged KV cache against the same keys contiguous.
#pragma once
#include <string>
#include <vector>

#include "attn/attention.h"

namespace attn::tools {

// The rows for each dtype named; read_gbps (0: not measured) is the read probe of this run.
void run_paged_rows(int reps, const std::vector<std::string>& dtypes, const AttentionOptions& base,
                    double read_gbps);

}  // namespace attn::tools
