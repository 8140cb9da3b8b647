// How a global sequence is split across the ranks of a ring (RingLayout), and the copies between a
// global tensor and its per-rank slices.
#include <fmt/format.h>

#include <cstring>

#include "attn/ring.h"
#include "distributed/ring_comm.h"

namespace attn {

RingLayout parse_ring_layout(const std::string& name) {
  if (name == "contiguous") return RingLayout::contiguous;
  if (name == "zigzag") return RingLayout::zigzag;
  throw Error(fmt::format(
      "attn::parse_ring_layout: unknown layout '{}' (expected contiguous or zigzag)", name));
}

const char* ring_layout_name(RingLayout layout) {
  return layout == RingLayout::zigzag ? "zigzag" : "contiguous";
}

std::vector<RingSegment> ring_segments(int64_t length, int rank, int world, RingLayout layout) {
  if (world < 1 || rank < 0 || rank >= world || length < 0) {
    throw Error(fmt::format(
        "attn::ring_segments: need 0 <= rank < world and length >= 0, got rank {}, world {}, "
        "length {}",
        rank, world, length));
  }
  // Chunk c of n: [floor(c L / n), floor((c + 1) L / n)); sizes differ by at most one. Computed as
  // c (L / n) + c (L % n) / n so that c L cannot overflow.
  auto bound = [length](int64_t c, int64_t n) { return c * (length / n) + c * (length % n) / n; };
  std::vector<RingSegment> segs;
  if (layout == RingLayout::contiguous) {
    const int64_t a = bound(rank, world), b = bound(rank + 1, world);
    segs.push_back({a, b - a, 0});
  } else {
    const int64_t n = 2 * int64_t{world};
    const int64_t first = rank, second = n - 1 - rank;
    const int64_t a0 = bound(first, n), a1 = bound(first + 1, n);
    const int64_t b0 = bound(second, n), b1 = bound(second + 1, n);
    segs.push_back({a0, a1 - a0, 0});
    segs.push_back({b0, b1 - b0, a1 - a0});
  }
  return segs;
}

namespace {
int normalize_dim(const char* fn, const Tensor& t, int dim) {
  const int d = dim < 0 ? dim + t.dim() : dim;
  if (d < 0 || d >= t.dim()) {
    throw Error(
        fmt::format("{}: dim {} is out of range for a tensor of shape {}", fn, dim, t.shape_str()));
  }
  return d;
}
}  // namespace

Tensor ring_shard(const Tensor& full, int rank, int world, RingLayout layout, int dim) {
  constexpr const char* fn = "attn::ring_shard";
  if (!full.defined()) throw Error(fmt::format("{}: the tensor is undefined", fn));
  const int d = normalize_dim(fn, full, dim);
  const std::vector<RingSegment> segs = ring_segments(full.size(d), rank, world, layout);
  Shape shape = full.shape();
  shape[d] = 0;
  for (const RingSegment& s : segs) shape[d] += s.length;
  Tensor local = Tensor::empty(shape, full.dtype());
  for (const RingSegment& s : segs) {
    if (s.length == 0) continue;
    local.slice(d, s.local, s.local + s.length)
        .copy_from(full.slice(d, s.start, s.start + s.length));
  }
  return local;
}

Tensor ring_gather(const Tensor& local, RingLayout layout, MPI_Comm comm, int dim) {
  constexpr const char* fn = "attn::ring_gather";
  distributed::check_communicator(fn, comm);
  distributed::PrivateComm pc(comm);
  const int P = pc.size();

  // Every rank's dtype and shape, so that all ranks reach the same verdict and the same global
  // shape.
  struct ShapeRecord {
    int32_t defined, dtype, ndim, dim;
    int64_t shape[kMaxDims];
  };
  ShapeRecord mine{};
  mine.defined = local.defined() ? 1 : 0;
  if (local.defined()) {
    mine.dtype = static_cast<int32_t>(local.dtype());
    mine.ndim = local.dim();
    mine.dim = dim < 0 ? dim + local.dim() : dim;
    for (int i = 0; i < local.dim(); ++i) mine.shape[i] = local.size(i);
  }
  std::vector<ShapeRecord> all(P);
  MPI_Allgather(&mine, sizeof(ShapeRecord), MPI_BYTE, all.data(), sizeof(ShapeRecord), MPI_BYTE,
                pc.get());
  std::string error;
  for (int r = 0; r < P && error.empty(); ++r) {
    const ShapeRecord& a = all[r];
    if (!a.defined) {
      error = fmt::format("{}: the tensor of rank {} is undefined", fn, r);
    } else if (a.dim < 0 || a.dim >= a.ndim) {
      error = fmt::format("{}: dim {} is out of range for the rank-{} tensor of rank {}", fn, dim,
                          a.ndim, r);
    } else if (a.ndim != all[0].ndim || a.dtype != all[0].dtype || a.dim != all[0].dim) {
      error = fmt::format("{}: ranks 0 and {} hold tensors of different ranks or dtypes", fn, r);
    } else {
      for (int i = 0; i < a.ndim; ++i) {
        if (i != a.dim && a.shape[i] != all[0].shape[i]) {
          error = fmt::format("{}: ranks 0 and {} disagree on dim {} ({} vs {})", fn, r, i,
                              all[0].shape[i], a.shape[i]);
        }
      }
    }
  }
  if (!error.empty()) throw Error(error);
  const int d = all[0].dim;
  const DType dtype = static_cast<DType>(all[0].dtype);
  int64_t total = 0;
  for (int r = 0; r < P; ++r) total += all[r].shape[d];

  // The segments of each rank: actual lengths in rank order (contiguous) or the zigzag chunks of
  // `total`.
  std::vector<std::vector<RingSegment>> segs(P);
  int64_t start = 0;
  for (int r = 0; r < P; ++r) {
    if (layout == RingLayout::contiguous) {
      segs[r] = {{start, all[r].shape[d], 0}};
      start += all[r].shape[d];
    } else {
      segs[r] = ring_segments(total, r, P, layout);
      const int64_t want = segs[r][0].length + segs[r][1].length;
      if (want != all[r].shape[d]) {
        throw Error(fmt::format(
            "{}: rank {} holds {} positions, but the zigzag layout of {} positions over {} ranks "
            "gives it {}",
            fn, r, all[r].shape[d], total, P, want));
      }
    }
  }

  Shape full_shape(all[0].shape, all[0].shape + all[0].ndim);
  full_shape[d] = total;
  Tensor full = Tensor::empty(full_shape, dtype);
  const Tensor mine_c = local.contiguous();
  for (int r = 0; r < P; ++r) {
    Shape shape(all[r].shape, all[r].shape + all[r].ndim);
    Tensor piece = r == pc.rank() ? mine_c : Tensor::empty(shape, dtype);
    distributed::bcast_bytes(piece.data(), static_cast<size_t>(piece.numel()) * piece.itemsize(), r,
                             pc.get());
    for (const RingSegment& s : segs[r]) {
      if (s.length == 0) continue;
      full.slice(d, s.start, s.start + s.length)
          .copy_from(piece.slice(d, s.local, s.local + s.length));
    }
  }
  return full;
}

}  // namespace attn
