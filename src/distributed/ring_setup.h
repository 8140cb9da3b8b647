// What the ring's three parts share: the setup every rank agrees on (ring_validate.cc), the buffers
// blocks travel in, the pieces of work of one block, and the writers of the results (ring_forward.cc,
// ring_backward.cc).
//
// Shapes on rank r (BH = batch x Hq rows of q, BHkv = batch x Hkv rows of k and v):
//   q_local [..., Hq, Lq_r, D], k_local [..., Hkv, Lk_r, D], v_local [..., Hkv, Lk_r, Dv]
// Block s = the K/V of rank s, packed as K [..., Hkv, Lk_s, D] then V [..., Hkv, Lk_s, Dv] in one
// buffer. Block s stops after hops[s] steps: no rank further on needs it.
#pragma once
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "attn/ring.h"
#include "distributed/ring_comm.h"
#include "distributed/ring_plan.h"

namespace attn::distributed {

constexpr int kTagKV = 101, kTagDKV = 102, kTagHome = 103;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The statistics ring_last_stats() returns on this thread, and the step that
// attn::testing::ring_fail_at_step armed (read once per call: -1 = none).
void record_stats(const RingStats& stats);
int take_fail_step();

inline DType acc_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

// One call's problem, the same on every rank.
struct Setup {
  Plan plan;
  Shape batch;
  int64_t B = 1, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  int64_t BH = 0, BHkv = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> key_lengths;  // global, [B]; empty = none
};

// Validates on every rank and agrees: returns the setup on every rank or throws the same
// attn::Error on every rank. Nothing has been sent yet when it throws. The backward passes dout,
// out and lse; the forward passes none.
Setup collective_setup(const char* fn, const PrivateComm& pc, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& o, RingLayout layout,
                       const Tensor* dout = nullptr, const Tensor* out = nullptr,
                       const Tensor* lse = nullptr);

// A byte buffer for one travelling block.
struct Buffer {
  std::unique_ptr<std::byte[]> bytes;
  size_t size = 0;
  void reserve(size_t n) {
    if (n > static_cast<size_t>(std::numeric_limits<std::ptrdiff_t>::max())) throw std::bad_alloc();
    bytes.reset(new std::byte[n]);  // uninitialised: every use writes before it reads
    size = n;
  }
  std::byte* data() const { return bytes.get(); }
};

Shape with_length(const Shape& batch, int64_t heads, int64_t length, int64_t dim);

// The K and V views of block s inside a buffer holding K then V of `dtype`.
std::pair<Tensor, Tensor> block_views(const Setup& st, const Buffer& buf, int s, DType dtype);
size_t block_bytes(const Setup& st, int s, DType dtype);

// Step t on this rank, which holds block s in `cur`: posts the receive of the next block s_next
// from the left into `next` and the send of block s to the right, each when its block travels on.
// Returns whether this rank holds block s at step t.
bool pass_blocks(const PrivateComm& pc, const Setup& st, int t, int s, int s_next,
                 const Buffer& cur, const Buffer& next, std::vector<MPI_Request>* reqs,
                 RingStats* stats);

// One attention call's worth of work: global rows [i0, i1) against the keys [j0, j1) of a block.
struct Piece {
  int64_t i0, i1, j0, j1;
  int64_t q_local;   // local row of i0
  int64_t k_offset;  // local key index of j0 inside the block
};

// The pieces of rank r against block s: every connected rectangle, long ones cut by rows so that
// MPI can be poked between them (transfers that need progress calls advance during the
// computation).
std::vector<Piece> pieces_of(const Plan& plan, int r, int s);

// The options of one block call: the caller's, with positions and key lengths made local to the
// piece.
AttentionOptions piece_options(const AttentionOptions& o, const Setup& st, const Piece& pc);

// bf16 / f16 blocks are computed in f32 (the contract's accumulation type), so that a block's
// partial result is not rounded to 8 or 11 bits before the merge; K/V still travel in the input
// dtype. f32 and f64 pass as they are.
Tensor in_compute(const Tensor& t);

[[noreturn]] void throw_collective(const std::string& agreed);
std::string injected_failure(const char* fn, int t);

// Reads element e of a contiguous tensor as double.
template <class T>
struct Reader {
  const T* p;
  double operator()(int64_t e) const { return static_cast<double>(p[e]); }
};
struct AnyReader {
  const char* p;
  DType t;
  double operator()(int64_t e) const {
    return load_as_double(p + e * static_cast<int64_t>(dtype_size(t)), t);
  }
};
template <class Fn>
void with_reader(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::f32) {
    fn(Reader<float>{t.data_as<float>()});
  } else if (t.dtype() == DType::f64) {
    fn(Reader<double>{t.data_as<double>()});
  } else {
    fn(AnyReader{static_cast<const char*>(t.data()), t.dtype()});
  }
}

// Writes a [BH, rows, W] array of double (or A) into a new tensor of `shape` and `dtype`.
template <class A>
Tensor to_tensor(const A* acc, const Shape& shape, DType dtype) {
  const int64_t n = checked_numel(shape, "attn::ring_attention");
  Tensor t = Tensor::empty(shape, dtype);
  if (dtype == DType::f32) {
    float* p = t.data_as<float>();
    for (int64_t e = 0; e < n; ++e) p[e] = static_cast<float>(acc[e]);
  } else if (dtype == DType::f64) {
    double* p = t.data_as<double>();
    for (int64_t e = 0; e < n; ++e) p[e] = static_cast<double>(acc[e]);
  } else {
    char* p = static_cast<char*>(t.data());
    const auto step = static_cast<int64_t>(dtype_size(dtype));
    for (int64_t e = 0; e < n; ++e)
      store_from_double(p + e * step, dtype, static_cast<double>(acc[e]));
  }
  return t;
}

}  // namespace attn::distributed
