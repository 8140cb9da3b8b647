// Per-worker scratch of the cpu kernels (included inside namespace attn::cpu::<isa>, after
// simd-inl.h): one buffer per OS thread, kept between calls (small problems would otherwise spend
// much of their time allocating and zeroing it), cut into the buffers a kernel's plan names.

struct Scratch {
  std::vector<float, AlignedAlloc<float>> buf;
  std::vector<int64_t> band;  // per row block key bounds of a diagonal tile (Band)
  float* at(int64_t offset) { return buf.data() + offset; }
};

// One named buffer of a plan's scratch: `floats` floats from `offset` (a 64-byte boundary), in a
// worker's Scratch or a scratch base pointer.
struct Slot {
  int64_t offset = 0, floats = 0;
  float* in(Scratch& w) const { return w.at(offset); }
  float* in(float* base) const { return base + offset; }
};

// A plan's scratch layout: take(n) reserves n floats (at least one) on a 64-byte boundary and
// returns their slot; total is the size of the whole, in floats.
struct ScratchLayout {
  int64_t total = 0;
  Slot take(int64_t n) {
    const Slot slot{total, std::max<int64_t>(n, 1)};
    total += round_up(slot.floats, 16);
    return slot;
  }
};

// This thread's scratch, grown to at least `floats`. Every buffer is written before it is read.
inline Scratch& worker_scratch(int64_t floats) {
  thread_local Scratch w;
  if (w.buf.size() < static_cast<size_t>(floats)) w.buf.resize(static_cast<size_t>(floats));
  return w;
}
