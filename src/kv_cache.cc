// attn::KVCache and attn::write_kv_slots (attn/kv_cache.h). Blocks are counted by the sequences that
// hold them; a block is written only by a sequence that holds it alone (a shared partial block is
// copied first). append() plans every sequence's blocks before it writes anything, so a refused
// append (bad argument, pool exhausted) leaves the cache as it was.
#include "attn/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "contract/packed.h"
#include "core/fail.h"

namespace attn {

namespace {

using detail::fail;

// The pools' geometry: [num_blocks, block_size, Hkv, D] and [.., Dv], one floating dtype, or int8
// with f32 scale pools [num_blocks, block_size, Hkv] (contiguous).
void check_pools(const char* fn, const Tensor& k, const Tensor& v, const Tensor& ks,
                 const Tensor& vs) {
  const bool ok = k.defined() && v.defined() && k.dim() == 4 && v.dim() == 4 &&
                  (is_floating(k.dtype()) || k.dtype() == DType::i8) && v.dtype() == k.dtype() &&
                  k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2) &&
                  k.size(0) > 0 && k.size(1) > 0 && k.size(2) > 0 && k.size(0) < (int64_t{1} << 31);
  if (!ok) {
    fail(fn,
         fmt::format("k_pages and v_pages must be [num_blocks, block_size, Hkv, D] pools of one "
                     "floating or int8 dtype and geometry (num_blocks < 2^31), got {} {} and {} {}",
                     k.defined() ? dtype_name(k.dtype()) : "nothing", k.shape_str(),
                     v.defined() ? dtype_name(v.dtype()) : "nothing", v.shape_str()));
  }
  const bool quantized = k.dtype() == DType::i8;
  const Shape want = {k.size(0), k.size(1), k.size(2)};
  for (const auto& [name, t] : {std::pair{"k_scales", &ks}, std::pair{"v_scales", &vs}}) {
    if (!quantized && t->defined())
      fail(fn, fmt::format("{} belongs to int8 pools; these are {}", name, dtype_name(k.dtype())));
    if (quantized &&
        (!t->defined() || t->dtype() != DType::f32 || t->shape() != want || !t->is_contiguous())) {
      fail(fn, fmt::format("int8 pools need {} f32 [num_blocks, block_size, Hkv] = {}, contiguous, "
                           "got {}",
                           name, shape_to_string(want),
                           t->defined() ? dtype_name(t->dtype()) + std::string(" ") + t->shape_str()
                                        : std::string("nothing")));
    }
  }
}

// Tokens' rows k [n, Hkv, D] and v [n, Hkv, Dv] for pools k_pages / v_pages: their heads and head
// dims, and their dtype (the pools'; any floating dtype for int8 pools, which quantize them).
void check_rows(const char* fn, const Tensor& k_pages, const Tensor& v_pages, const Tensor& k,
                const Tensor& v) {
  const DType pool = k_pages.dtype();
  auto dtype_ok = [&](const Tensor& x) {
    return pool == DType::i8
               ? x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16
               : x.dtype() == pool;
  };
  const bool ok = k.defined() && v.defined() && k.dim() == 3 && v.dim() == 3 && dtype_ok(k) &&
                  v.dtype() == k.dtype() && k.size(0) == v.size(0) &&
                  k.size(1) == k_pages.size(2) && k.size(2) == k_pages.size(3) &&
                  v.size(1) == v_pages.size(2) && v.size(2) == v_pages.size(3);
  if (!ok) {
    fail(fn,
         fmt::format("k and v must be [n, Hkv = {}, D = {}] and [n, Hkv, Dv = {}] of {}, got k {} "
                     "{} and v {} {}",
                     k_pages.size(2), k_pages.size(3), v_pages.size(3),
                     pool == DType::i8 ? std::string("one of f32, bf16, f16 (quantized to int8)")
                                       : std::string("the cache's dtype ") + dtype_name(pool),
                     k.defined() ? dtype_name(k.dtype()) : "nothing", k.shape_str(),
                     v.defined() ? dtype_name(v.dtype()) : "nothing", v.shape_str()));
  }
}

// Row `offset` of block `block` of a contiguous pool [num_blocks, block_size, ...].
char* slot_address(const Tensor& pages, int64_t block, int64_t offset) {
  const int64_t row =
      pages.numel() / (pages.size(0) * pages.size(1)) * static_cast<int64_t>(pages.itemsize());
  return static_cast<char*>(pages.data()) + (block * pages.size(1) + offset) * row;
}

// Token t's row of a contiguous [n, ...] tensor into slot (block, offset) of its pool.
void put_row(const Tensor& pages, int64_t block, int64_t offset, const Tensor& rows, int64_t t) {
  const size_t bytes = static_cast<size_t>(rows.numel() / rows.size(0)) * rows.itemsize();
  std::memcpy(slot_address(pages, block, offset),
              static_cast<const char*>(rows.data()) + static_cast<size_t>(t) * bytes, bytes);
}

// The pools of a cache and the rows written into them: for int8 pools the quantized values and
// their scales (quantize_int8), else the rows themselves (contiguous).
struct Pools {
  Tensor k, v, ks, vs;  // ks, vs: the scale pools of int8 pools, else undefined

  struct Rows {
    Tensor k, v, ks, vs;
  };
  Rows prepare(const Tensor& k_in, const Tensor& v_in) const {
    if (!ks.defined()) return {k_in.contiguous(), v_in.contiguous(), {}, {}};
    QuantizedRows qk = quantize_int8(k_in), qv = quantize_int8(v_in);
    return {qk.values, qv.values, qk.scales, qv.scales};
  }
  // Token t of rows into slot (block, offset) of every pool.
  void put(int64_t block, int64_t offset, const Rows& rows, int64_t t) const {
    put_row(k, block, offset, rows.k, t);
    put_row(v, block, offset, rows.v, t);
    if (ks.defined())
      put_row(ks, block, offset, rows.ks, t), put_row(vs, block, offset, rows.vs, t);
  }
  // Block `from` copied into block `to` in every pool.
  void copy_block(int32_t to, int32_t from) const {
    for (const Tensor* pool : {&k, &v, &ks, &vs}) {
      if (!pool->defined()) continue;
      std::memcpy(slot_address(*pool, to, 0), slot_address(*pool, from, 0),
                  static_cast<size_t>(pool->numel() / pool->size(0)) * pool->itemsize());
    }
  }
};

// Quantizes n_rows rows of X floats (src) into dst and their scales.
void quantize_rows(const float* src, int64_t n_rows, int64_t X, int8_t* dst, float* scales) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* x = src + r * X;
    float amax = 0.0f;
    for (int64_t i = 0; i < X; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t i = 0; i < X; ++i) {
      const float q = std::nearbyint(x[i] / scale);
      dst[r * X + i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
    scales[r] = scale;
  }
}

}  // namespace

KVCache::KVCache(int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D, int64_t Dv,
                 DType dtype) {
  constexpr const char* fn = "attn::KVCache";
  if (num_blocks <= 0 || block_size <= 0 || Hkv <= 0 || D <= 0 || Dv <= 0 ||
      num_blocks >= (int64_t{1} << 31) || !(is_floating(dtype) || dtype == DType::i8)) {
    fail(fn,
         fmt::format("num_blocks ({}, < 2^31), block_size ({}), Hkv ({}), D ({}) and Dv ({}) must "
                     "be > 0 and the dtype floating or i8 ({})",
                     num_blocks, block_size, Hkv, D, Dv, dtype_name(dtype)));
  }
  Tensor ks, vs;
  if (dtype == DType::i8) {
    ks = Tensor::full({num_blocks, block_size, Hkv}, 1.0, DType::f32);
    vs = Tensor::full({num_blocks, block_size, Hkv}, 1.0, DType::f32);
  }
  *this = over(Tensor::zeros({num_blocks, block_size, Hkv, D}, dtype),
               Tensor::zeros({num_blocks, block_size, Hkv, Dv}, dtype), ks, vs);
}

KVCache KVCache::over(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k_scales,
                      const Tensor& v_scales) {
  constexpr const char* fn = "attn::KVCache::over";
  check_pools(fn, k_pages, v_pages, k_scales, v_scales);
  if (!k_pages.is_contiguous() || !v_pages.is_contiguous())
    fail(fn, fmt::format("the pools must be contiguous (k_pages {}, v_pages {})",
                         k_pages.shape_str(), v_pages.shape_str()));
  KVCache c;
  c.k_pages_ = k_pages, c.v_pages_ = v_pages, c.k_scales_ = k_scales, c.v_scales_ = v_scales;
  c.block_size_ = k_pages.size(1);
  const auto n = static_cast<int32_t>(k_pages.size(0));
  c.refs_.assign(static_cast<size_t>(n), 0);
  for (int32_t b = n - 1; b >= 0; --b) c.free_.push_back(b);  // block 0 is taken first
  return c;
}

const KVCache::Sequence& KVCache::sequence(const char* fn, int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(seqs_.size()) || !seqs_[id].live) {
    fail(fn, fmt::format("sequence {} is not in the cache (ids 0..{} were given out; freed ones "
                         "are retired)",
                         id, static_cast<int64_t>(seqs_.size()) - 1));
  }
  return seqs_[id];
}

int64_t KVCache::add_sequence() {
  seqs_.push_back({{}, 0, true});
  return static_cast<int64_t>(seqs_.size()) - 1;
}

int64_t KVCache::fork(int64_t parent) {
  Sequence child = sequence("attn::KVCache::fork", parent);
  for (int32_t b : child.blocks) ++refs_[b];
  seqs_.push_back(std::move(child));
  return static_cast<int64_t>(seqs_.size()) - 1;
}

void KVCache::release(int32_t block) {
  if (--refs_[block] == 0) free_.push_back(block);
}

void KVCache::free_sequence(int64_t id) {
  (void)sequence("attn::KVCache::free_sequence", id);
  Sequence& s = seqs_[id];
  for (int32_t b : s.blocks) release(b);
  s = Sequence{};
}

int64_t KVCache::length(int64_t id) const {
  return sequence("attn::KVCache::length", id).length;
}

const std::vector<int32_t>& KVCache::blocks(int64_t id) const {
  return sequence("attn::KVCache::blocks", id).blocks;
}

int64_t KVCache::free_blocks() const {
  return static_cast<int64_t>(free_.size());
}

int32_t KVCache::take_block() {
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

// The blocks the appends of n_i keys to ids[i] take from the pool (new blocks, and a copy of each
// shared partial last block that is about to be written); checks the ids.
int64_t KVCache::blocks_needed(const char* fn, std::span<const int64_t> ids,
                               const std::vector<int64_t>& off) const {
  std::set<int64_t> seen;
  int64_t needed = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = sequence(fn, ids[i]);
    if (!seen.insert(ids[i]).second)
      fail(fn, fmt::format("sequence {} appears twice in ids", ids[i]));
    const int64_t n = off[i + 1] - off[i];
    if (s.length + n >= (int64_t{1} << 31)) {
      fail(fn,
           fmt::format("sequence {} would hold {} keys (at most 2^31 - 1)", ids[i], s.length + n));
    }
    if (n == 0) continue;
    needed +=
        (s.length + n + block_size_ - 1) / block_size_ - static_cast<int64_t>(s.blocks.size());
    if (s.length % block_size_ != 0 && refs_[s.blocks.back()] > 1) ++needed;  // copy on write
  }
  return needed;
}

void KVCache::append(std::span<const int64_t> ids, const Tensor& k_in, const Tensor& v_in,
                     const Tensor& cu_seqlens) {
  constexpr const char* fn = "attn::KVCache::append";
  check_rows(fn, k_pages_, v_pages_, k_in, v_in);
  const std::vector<int64_t> off =
      contract::read_offsets(fn, "cu_seqlens", cu_seqlens, k_in.size(0), "k", k_in);
  if (off.size() != ids.size() + 1) {
    fail(fn, fmt::format("cu_seqlens {} must be [len(ids) + 1 = {}]", cu_seqlens.shape_str(),
                         ids.size() + 1));
  }
  const int64_t needed = blocks_needed(fn, ids, off);
  if (needed > free_blocks()) {
    fail(fn, fmt::format("the pool has {} free blocks of {} keys, these appends need {} (nothing "
                         "was written)",
                         free_blocks(), block_size_, needed));
  }
  const Pools pools{k_pages_, v_pages_, k_scales_, v_scales_};
  const Pools::Rows rows = pools.prepare(k_in, v_in);
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& s = seqs_[ids[i]];
    if (off[i + 1] > off[i] && s.length % block_size_ != 0 && refs_[s.blocks.back()] > 1) {
      const int32_t copy = take_block(), shared = s.blocks.back();
      pools.copy_block(copy, shared);
      release(shared);
      s.blocks.back() = copy;
    }
    for (int64_t tok = off[i]; tok < off[i + 1]; ++tok) {
      if (s.length % block_size_ == 0) s.blocks.push_back(take_block());
      pools.put(s.blocks.back(), s.length % block_size_, rows, tok);
      ++s.length;
    }
  }
}

PagedKV KVCache::view(std::span<const int64_t> ids) const {
  constexpr const char* fn = "attn::KVCache::view";
  size_t max_blocks = 1;
  for (int64_t id : ids) max_blocks = std::max(max_blocks, sequence(fn, id).blocks.size());
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<double> table(ids.size() * max_blocks, 0.0), used;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = seqs_[ids[i]];
    std::copy(s.blocks.begin(), s.blocks.end(), table.begin() + i * max_blocks);
    used.push_back(static_cast<double>(s.length));
  }
  PagedKV kv;
  kv.k_pages = k_pages_, kv.v_pages = v_pages_;
  kv.k_scales = k_scales_, kv.v_scales = v_scales_;
  kv.block_table = Tensor::from_vector({n, static_cast<int64_t>(max_blocks)}, table, DType::i32);
  kv.seqused_k = Tensor::from_vector({n}, used, DType::i32);
  return kv;
}

void write_kv_slots(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k_in,
                    const Tensor& v_in, const Tensor& slot_mapping, const Tensor& k_scales,
                    const Tensor& v_scales) {
  constexpr const char* fn = "attn::write_kv_slots";
  check_pools(fn, k_pages, v_pages, k_scales, v_scales);
  if (!k_pages.is_contiguous() || !v_pages.is_contiguous())
    fail(fn, "the pools must be contiguous");
  check_rows(fn, k_pages, v_pages, k_in, v_in);
  const Tensor& sm = slot_mapping;
  if (!sm.defined() || (sm.dtype() != DType::i32 && sm.dtype() != DType::i64) || sm.dim() != 1 ||
      sm.size(0) != k_in.size(0)) {
    fail(fn, fmt::format("slot_mapping must be int32 or int64 [n = {}], got {} {}", k_in.size(0),
                         sm.defined() ? dtype_name(sm.dtype()) : "nothing", sm.shape_str()));
  }
  const std::vector<double> slots = sm.to_vector();
  const int64_t capacity = k_pages.size(0) * k_pages.size(1);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] != -1.0 && (slots[t] < 0 || slots[t] >= static_cast<double>(capacity))) {
      fail(fn, fmt::format("slot_mapping[{}] = {} is outside [0, num_blocks x block_size = {}) (-1 "
                           "skips a token)",
                           t, static_cast<int64_t>(slots[t]), capacity));
    }
  }
  const Pools pools{k_pages, v_pages, k_scales, v_scales};
  const Pools::Rows rows = pools.prepare(k_in, v_in);
  const int64_t bs = k_pages.size(1);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] == -1.0) continue;
    const auto s = static_cast<int64_t>(slots[t]);
    pools.put(s / bs, s % bs, rows, static_cast<int64_t>(t));
  }
}

QuantizedRows quantize_int8(const Tensor& x) {
  constexpr const char* fn = "attn::quantize_int8";
  if (!x.defined() || x.dim() != 3 ||
      !(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16)) {
    fail(fn, fmt::format("x must be f32, bf16 or f16 [n, H, X], got {} {}",
                         x.defined() ? dtype_name(x.dtype()) : "nothing", x.shape_str()));
  }
  const Tensor xf = x.to(DType::f32).contiguous();
  const int64_t n = x.size(0), H = x.size(1), X = x.size(2);
  const float* src = xf.data_as<float>();
  for (int64_t i = 0; i < n * H * X; ++i) {
    if (!std::isfinite(src[i])) {
      fail(fn, fmt::format("x[{}, {}, {}] = {} is not finite: int8 cannot hold it", i / (H * X),
                           i / X % H, i % X, src[i]));
    }
  }
  QuantizedRows q{Tensor::empty({n, H, X}, DType::i8), Tensor::empty({n, H}, DType::f32)};
  quantize_rows(src, n * H, X, q.values.data_as<int8_t>(), q.scales.data_as<float>());
  return q;
}

}  // namespace attn
