// Per-worker scratch of the cpu kernels (included inside namespace attn::cpu::<isa>, after
// simd-inl.h): one buffer per OS thread, kept between calls (small problems would otherwise spend
// much of their time allocating and zeroing it), cut into the buffers a kernel's plan names.

struct Scratch {
  std::vector<float, AlignedAlloc<float>> buf;
  std::vector<int64_t> band;  // per row block key bounds of a diagonal tile (Band)
  float* at(int64_t offset) { return buf.data() + offset; }
};

// A plan's scratch layout: take(n) reserves n floats (at least one) on a 64-byte boundary and
// returns their offset; total is the size of the whole, in floats.
struct ScratchLayout {
  int64_t total = 0;
  int64_t take(int64_t n) {
    const int64_t at = total;
    total += round_up(std::max<int64_t>(n, 1), 16);
    return at;
  }
};

// This thread's scratch, grown to at least `floats`. Every buffer is written before it is read.
inline Scratch& worker_scratch(int64_t floats) {
  thread_local Scratch w;
  if (w.buf.size() < static_cast<size_t>(floats)) w.buf.resize(static_cast<size_t>(floats));
  return w;
}
