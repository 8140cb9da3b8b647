// Measured ceilings, `attn bench`'s yardstick (docs/PERFORMANCE.md, "How it is measured"): fp32 FMA
// throughput of the active instruction set, bf16 dot throughput (VDPBF16PS), AMX bf16 tile
// throughput (TDPBF16PS), copy and read bandwidth (decode only reads). Each runs for a fraction of a second on `threads` threads
// (<= 0: the default count).
#pragma once

#include <ctime>

namespace attn::cpu {

// fp32, the ISA active_isa() picks. per_core_cpu (optional) receives the same throughput per second
// of CPU time per thread: on a machine shared with other jobs it stays near the hardware's figure
// while wall-clock numbers fall.
double probe_fma_gflops(int threads, double* per_core_cpu = nullptr);
double probe_bf16_dot_gflops(int threads,
                             double* per_core_cpu = nullptr);  // 0 without AVX512_BF16
// TDPBF16PS throughput on 4 independent C tiles (0 without usable AMX; the emulation is not timed).
double probe_amx_bf16_gflops(int threads, double* per_core_cpu = nullptr);
double probe_copy_gbps(int threads);  // (bytes read + bytes written) / s over buffers far beyond L3
double probe_read_gbps(int threads);  // bytes read / s (a sum over a buffer far beyond L3)

// CPU seconds used by this process so far (all threads).
inline double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace attn::cpu
