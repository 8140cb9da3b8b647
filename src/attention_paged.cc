// attn::attention_paged (attn/paged.h): the queries of B sequences against their keys and values in
// a paged pool. Every index is checked before any read (the block table's entries for each
// sequence's keys, seqused_k against the table's capacity); then each sequence is one problem of
// B = 1 (contract/packed.h) run on the backend chosen for the call, as the packed entries run theirs:
// the cpu decode kernel reads the keys and values in their pages (decode and speculative steps);
// other problems (prefill chunks, the reference backend) get each sequence's keys gathered into
// contiguous rows first, a copy of O(Lk D) beside O(Lq Lk D) of arithmetic.
#include <fmt/format.h>

#include <cfloat>
#include <cstring>
#include <new>
#include <vector>

#include "attn/paged.h"
#include "backend_run.h"
#include "backends/cpu/attention_cpu.h"
#include "contract/packed.h"
#include "contract/validate.h"
#include "core/fail.h"

namespace attn {

namespace {

using contract::ForwardProblem;
using contract::Packed;
using detail::fail;

// The validated pool: its geometry and each sequence's block list.
struct Pool {
  int64_t num_blocks = 0, block_size = 0, Hkv = 0, D = 0, Dv = 0;
  std::vector<int64_t> used;                // [B] keys of each sequence
  std::vector<std::vector<int32_t>> table;  // [B][blocks holding its keys]
  Tensor block_table;                       // int32 [B, max_blocks], contiguous (the kernels')
};

// q [total_q, Hq, D] floating; k_pages / v_pages [num_blocks, block_size, Hkv, D / Dv] of q's dtype
// (or int8 with their scale pools), one pool geometry, whole query groups per kv head.
Pool check_pool(const char* fn, const Tensor& q, const PagedKV& kv) {
  contract::check_float(fn, "q", q);
  const Tensor &k = kv.k_pages, &v = kv.v_pages;
  if (!k.defined() || !v.defined() || q.dim() != 3 || k.dim() != 4 || v.dim() != 4) {
    fail(fn, fmt::format("q must be [total_q, Hq, D] and k_pages, v_pages [num_blocks, block_size, "
                         "Hkv, D], got q {}, k_pages {}, v_pages {}",
                         q.shape_str(), k.shape_str(), v.shape_str()));
  }
  const bool quantized = k.dtype() == DType::i8 && v.dtype() == DType::i8;
  if (!quantized && (k.dtype() != q.dtype() || v.dtype() != q.dtype())) {
    fail(fn, fmt::format("k_pages and v_pages must have q's dtype or be int8 (with k_scales and "
                         "v_scales), got q {}, k_pages {} and v_pages {}",
                         dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype())));
  }
  const bool ok = k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(1) > 0 &&
                  k.size(2) == v.size(2) && k.size(2) > 0 && q.size(1) % k.size(2) == 0 &&
                  q.size(2) == k.size(3);
  if (!ok) {
    fail(fn, fmt::format("q {}, k_pages {}, v_pages {}: need one num_blocks, block_size > 0 and "
                         "Hkv > 0 for both pools, Hq a multiple of Hkv, one head dim for q and k",
                         q.shape_str(), k.shape_str(), v.shape_str()));
  }
  const Shape scales = {k.size(0), k.size(1), k.size(2)};
  for (const auto& [name, t] : {std::pair{"k_scales", &kv.k_scales}, {"v_scales", &kv.v_scales}}) {
    if (!quantized && t->defined())
      fail(fn, fmt::format("{} belongs to int8 pools; these are {}", name, dtype_name(k.dtype())));
    if (quantized && (!t->defined() || t->dtype() != DType::f32 || t->shape() != scales)) {
      fail(fn, fmt::format("int8 pools need {} f32 [num_blocks, block_size, Hkv] = {}, got {}",
                           name, shape_to_string(scales),
                           t->defined() ? dtype_name(t->dtype()) + std::string(" ") + t->shape_str()
                                        : std::string("nothing")));
    }
  }
  Pool pool;
  pool.num_blocks = k.size(0), pool.block_size = k.size(1), pool.Hkv = k.size(2);
  pool.D = k.size(3), pool.Dv = v.size(3);
  return pool;
}

// Whether the Hkv scales of a key (stride apart) are all finite and > 0.
bool scales_ok(const float* s, int64_t Hkv, int64_t stride) {
  bool ok = true;
  for (int64_t h = 0; h < Hkv; ++h) ok &= s[h * stride] > 0.0f && s[h * stride] <= FLT_MAX;
  return ok;
}

// The scales of every key the sequences read (int8 pools) are finite and > 0: one pass over 4 / D of
// the bytes the kernel reads.
void check_scales(const char* fn, const PagedKV& kv, const Pool& pool) {
  for (const auto& [name, t] : {std::pair{"k_scales", &kv.k_scales}, {"v_scales", &kv.v_scales}}) {
    const float* base = t->data_as<float>();
    const int64_t s0 = t->stride(0), s1 = t->stride(1), s2 = t->stride(2);
    for (size_t b = 0; b < pool.table.size(); ++b) {
      for (int64_t j = 0; j < pool.used[b]; ++j) {
        const int64_t block = pool.table[b][j / pool.block_size], row = j % pool.block_size;
        const float* at = base + block * s0 + row * s1;
        if (scales_ok(at, pool.Hkv, s2)) continue;
        for (int64_t h = 0; h < pool.Hkv; ++h) {
          if (!scales_ok(at + h * s2, 1, s2)) {
            fail(fn, fmt::format("{}[{}, {}, {}] = {} (key {} of sequence {}) must be finite and > "
                                 "0",
                                 name, block, row, h, at[h * s2], j, b));
          }
        }
      }
    }
  }
}

// seqused_k int32 [B] within the table's capacity, block_table int32 [B, max_blocks] whose entries
// for each sequence's keys lie in [0, num_blocks).
void read_tables(const char* fn, const PagedKV& kv, int64_t B, Pool& pool) {
  const Tensor &bt = kv.block_table, &su = kv.seqused_k;
  if (!bt.defined() || bt.dtype() != DType::i32 || bt.dim() != 2 || bt.size(0) != B) {
    fail(fn, fmt::format("block_table must be int32 [B = {}, max_blocks], got {}", B,
                         bt.defined() ? dtype_name(bt.dtype()) + std::string(" ") + bt.shape_str()
                                      : std::string("nothing")));
  }
  if (!su.defined() || su.dtype() != DType::i32 || su.dim() != 1 || su.size(0) != B) {
    fail(fn, fmt::format("seqused_k must be int32 [B = {}], got {}", B,
                         su.defined() ? dtype_name(su.dtype()) + std::string(" ") + su.shape_str()
                                      : std::string("nothing")));
  }
  const int64_t max_blocks = bt.size(1), bs = pool.block_size;
  const std::vector<double> used = su.to_vector();
  pool.block_table = bt.contiguous();
  const int32_t* entries = pool.block_table.data_as<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const auto n = static_cast<int64_t>(used[b]);
    if (n < 0 || n > max_blocks * bs) {
      fail(fn, fmt::format("seqused_k[{}] = {} is outside [0, {}] (block_table row {} holds {} "
                           "blocks of {})",
                           b, n, max_blocks * bs, b, max_blocks, bs));
    }
    pool.used.push_back(n);
    std::vector<int32_t>& row = pool.table.emplace_back();
    for (int64_t i = 0; i < (n + bs - 1) / bs; ++i) {
      const int32_t e = entries[b * max_blocks + i];
      if (e < 0 || e >= pool.num_blocks) {
        fail(fn,
             fmt::format("block_table[{}, {}] = {} is outside [0, num_blocks = {}) (sequence {} "
                         "has {} keys)",
                         b, i, e, pool.num_blocks, b, n));
      }
      row.push_back(e);
    }
  }
}

// The rows of one sequence gathered from the pool [num_blocks, block_size, ...]: [n, ...].
Tensor gather_rows(const Tensor& pages, const std::vector<int32_t>& blocks, int64_t n) {
  const int64_t bs = pages.size(1), row = pages.numel() / (pages.size(0) * bs);
  const Tensor src = pages.contiguous();  // a pool is contiguous in practice: no copy
  Shape shape = pages.shape();
  shape.erase(shape.begin());
  shape[0] = n;
  Tensor dst = Tensor::empty(shape, pages.dtype());
  const size_t item = pages.itemsize();
  const char* base = static_cast<const char*>(src.data());
  char* out = static_cast<char*>(dst.data());
  for (int64_t j0 = 0; j0 < n; j0 += bs) {
    const int64_t rows = std::min(bs, n - j0);
    std::memcpy(out + j0 * row * item, base + blocks[j0 / bs] * bs * row * item,
                static_cast<size_t>(rows * row) * item);
  }
  return dst;
}

// The keys (or values) of one sequence gathered from the pool [num_blocks, block_size, Hkv, X]:
// the view [1, Hkv, n, X] of a contiguous copy [n, Hkv, X]; for int8 pools its f32 values (element
// x scale, scales [num_blocks, block_size, Hkv]).
Tensor gather(const Tensor& pages, const Tensor& scales, const std::vector<int32_t>& blocks,
              int64_t n) {
  Tensor rows = gather_rows(pages, blocks, n);
  if (scales.defined()) {
    const Tensor scale_rows = gather_rows(scales, blocks, n);  // [n, Hkv]
    rows = rows.to(DType::f32);
    float* v = rows.data_as<float>();
    const float* sc = scale_rows.data_as<float>();
    const int64_t X = pages.size(3);
    for (int64_t i = 0; i < rows.numel(); ++i) v[i] *= sc[i / X];
  }
  return contract::sequence_view(rows, 0, n);
}

// Sequence b's keys and values for p: the pools in place (the cpu decode kernel reads pages), else
// gathered into contiguous rows (int8 pools: into f32 values, q's rows taken as f32 too: out and
// out_f32 are then set for the caller to copy back).
void set_keys(const PagedKV& kv, const Pool& pool, int64_t b, Backend backend, ForwardProblem& p) {
  const bool quantized = kv.k_scales.defined();
  if (backend == Backend::cpu) {
    p.k = kv.k_pages.permute({0, 2, 1, 3});  // [num_blocks, Hkv, block_size, D]
    p.v = kv.v_pages.permute({0, 2, 1, 3});
    if (quantized) {
      p.k_scale = kv.k_scales.permute({0, 2, 1});  // [num_blocks, Hkv, block_size]
      p.v_scale = kv.v_scales.permute({0, 2, 1});
    }
    p.pages.table = pool.block_table.data_as<int32_t>() + b * pool.block_table.size(1);
    p.pages.table_stride = 0, p.pages.block_size = pool.block_size;
    if (kv.k_pages.stride(3) == 1 && kv.v_pages.stride(3) == 1 && cpu::reads_pages(p)) return;
    p.pages = {};
    p.k_scale = p.v_scale = Tensor{};
  }
  p.k = gather(kv.k_pages, kv.k_scales, pool.table[b], pool.used[b]);
  p.v = gather(kv.v_pages, kv.v_scales, pool.table[b], pool.used[b]);
  if (quantized && p.q.dtype() != DType::f32) {  // the problem in f32; the caller copies out back
    p.q = p.q.to(DType::f32);
    p.out = Tensor::empty(p.out.shape(), DType::f32);
    p.dtype = DType::f32;
  }
}

}  // namespace

AttentionResult attention_paged(const Tensor& q_in, const Tensor& cu_seqlens_q, const PagedKV& kv,
                                const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_paged";
  const Tensor q = contract::unit_stride_rows(q_in);
  contract::check_enum(fn, "backend", o.backend);
  contract::check_enum(fn, "align", o.align);
  Pool pool = check_pool(fn, q, kv);
  contract::refuse_unpacked_options(fn, o);
  Packed pk;
  pk.total_q = q.size(0);
  if (cu_seqlens_q.defined()) {
    pk.cu_q = contract::read_offsets(fn, "cu_seqlens_q", cu_seqlens_q, pk.total_q, "q", q);
  } else {
    for (int64_t b = 0; b <= pk.total_q; ++b) pk.cu_q.push_back(b);  // one query each
  }
  pk.B = static_cast<int64_t>(pk.cu_q.size()) - 1;
  read_tables(fn, kv, pk.B, pool);
  if (kv.k_scales.defined()) check_scales(fn, kv, pool);
  pk.cu_k = {0};
  for (int64_t n : pool.used) pk.cu_k.push_back(pk.cu_k.back() + n);
  pk.total_k = pk.cu_k.back();
  contract::build_sequences(fn, o, {q.size(1), pool.Hkv, pool.D, pool.Dv, q.dtype()}, {}, pk);
  AttentionResult res;
  res.out = Tensor::empty({pk.total_q, q.size(1), pool.Dv}, q.dtype());
  res.lse = Tensor::empty({q.size(1), pk.total_q}, contract::lse_dtype(q.dtype()));
  contract::for_each_sequence(pk, [&](int64_t b, int threads) {
    ForwardProblem& p = pk.seqs[b];
    p.q = contract::sequence_view(q, pk.cu_q[b], pk.cu_q[b + 1]);
    p.out = contract::sequence_view(res.out, pk.cu_q[b], pk.cu_q[b + 1]);
    p.lse = contract::lse_view(res.lse, pk.cu_q[b], pk.cu_q[b + 1]);
    Tensor out_b = p.out;
    set_keys(kv, pool, b, pk.backend, p);
    p.threads = threads;
    detail::run_forward(pk.backend, p);
    if (p.out.dtype() != out_b.dtype()) out_b.copy_from(p.out);
  });
  if (pk.drops_all) res.out.fill(0.0);
  return res;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention_paged: out of memory for q {}, k_pages {}, v_pages {}",
                          q_in.shape_str(), kv.k_pages.shape_str(), kv.v_pages.shape_str()));
}

}  // namespace attn
