// Measured ceilings of this machine, the yardstick of `attn bench` (DESIGN.md, "Performance
// model"): fp32 FMA throughput of the active instruction set, bf16 dot throughput (VDPBF16PS), copy
// bandwidth. Each runs for a fraction of a second on `threads` threads (<= 0: the default count).
#pragma once

namespace attn::cpu {

double probe_fma_gflops(int threads);       // fp32, the ISA active_isa() picks
double probe_bf16_dot_gflops(int threads);  // 0 when the processor has no AVX512_BF16
double probe_copy_gbps(int threads);  // (bytes read + bytes written) / s over buffers far beyond L3

}  // namespace attn::cpu
