// How many threads attn's kernels use. A call's own `threads` option wins; otherwise the number set here,
// else the environment variable ATTN_NUM_THREADS, else every core.
#pragma once

namespace attn {

void set_num_threads(int n);  // n <= 0 restores the default
int default_num_threads();

}  // namespace attn
