// `attn bench --modes varlen`: a ragged batch packed (attention_varlen), against the same sequences
// as separate attention() calls and padded to the longest with key lengths.
#pragma once
#include <string>
#include <vector>

#include "attn/attention.h"

namespace attn::tools {

// The rows for each dtype named, forward and forward + backward; fma_gflops (0: not measured) is
// the fp32 FMA ceiling the GFLOP/s are set against.
void run_varlen_rows(int reps, const std::vector<std::string>& dtypes, const AttentionOptions& base,
                     double fma_gflops);

}  // namespace attn::tools
