// attn::attention_paged (attn/paged.h): the queries of B sequences against their keys and values in
// a paged pool. Every index is checked before any read (the block table's entries for each
// sequence's keys, seqused_k against the table's capacity); then each sequence is one problem of
// B = 1 (contract/packed.h) run on the backend chosen for the call, as the packed entries run theirs:
// the cpu decode kernel reads the keys and values in their pages (decode and speculative steps);
// other problems (prefill chunks, the reference backend) get each sequence's keys gathered into
// contiguous rows first, a copy of O(Lk D) beside O(Lq Lk D) of arithmetic.
#include <fmt/format.h>

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

// q [total_q, Hq, D] floating; k_pages / v_pages [num_blocks, block_size, Hkv, D / Dv] of q's dtype,
// one pool geometry, whole query groups per kv head.
Pool check_pool(const char* fn, const Tensor& q, const PagedKV& kv) {
  contract::check_float(fn, "q", q);
  contract::check_float(fn, "k_pages", kv.k_pages);
  contract::check_float(fn, "v_pages", kv.v_pages);
  const Tensor &k = kv.k_pages, &v = kv.v_pages;
  if (q.dim() != 3 || k.dim() != 4 || v.dim() != 4) {
    fail(fn, fmt::format("q must be [total_q, Hq, D] and k_pages, v_pages [num_blocks, block_size, "
                         "Hkv, D], got q {}, k_pages {}, v_pages {}",
                         q.shape_str(), k.shape_str(), v.shape_str()));
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail(fn, fmt::format("q, k_pages and v_pages must share one dtype, got {}, {} and {}",
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
  Pool pool;
  pool.num_blocks = k.size(0), pool.block_size = k.size(1), pool.Hkv = k.size(2);
  pool.D = k.size(3), pool.Dv = v.size(3);
  return pool;
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

// The keys (or values) of one sequence gathered from the pool [num_blocks, block_size, Hkv, X]:
// the view [1, Hkv, n, X] of a contiguous copy [n, Hkv, X].
Tensor gather(const Tensor& pages, const std::vector<int32_t>& blocks, int64_t n) {
  const int64_t bs = pages.size(1), row = pages.size(2) * pages.size(3);
  const Tensor src = pages.contiguous();  // a pool is contiguous in practice: no copy
  Tensor dst = Tensor::empty({n, pages.size(2), pages.size(3)}, pages.dtype());
  const size_t item = pages.itemsize();
  const char* base = static_cast<const char*>(src.data());
  char* out = static_cast<char*>(dst.data());
  for (int64_t j0 = 0; j0 < n; j0 += bs) {
    const int64_t rows = std::min(bs, n - j0);
    std::memcpy(out + j0 * row * item, base + blocks[j0 / bs] * bs * row * item,
                static_cast<size_t>(rows * row) * item);
  }
  return contract::sequence_view(dst, 0, n);
}

// Sequence b's keys and values for p: the pools in place (the cpu decode kernel reads pages), else
// gathered into contiguous rows.
void set_keys(const PagedKV& kv, const Pool& pool, int64_t b, Backend backend, ForwardProblem& p) {
  if (backend == Backend::cpu) {
    p.k = kv.k_pages.permute({0, 2, 1, 3});  // [num_blocks, Hkv, block_size, D]
    p.v = kv.v_pages.permute({0, 2, 1, 3});
    p.pages.table = pool.block_table.data_as<int32_t>() + b * pool.block_table.size(1);
    p.pages.table_stride = 0, p.pages.block_size = pool.block_size;
    if (kv.k_pages.stride(3) == 1 && kv.v_pages.stride(3) == 1 && cpu::reads_pages(p)) return;
    p.pages = {};
  }
  p.k = gather(kv.k_pages, pool.table[b], pool.used[b]);
  p.v = gather(kv.v_pages, pool.table[b], pool.used[b]);
}

}  // namespace

AttentionResult attention_paged(const Tensor& q, const Tensor& cu_seqlens_q, const PagedKV& kv,
                                const AttentionOptions& o) try {
  constexpr const char* fn = "attn::attention_paged";
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
    set_keys(kv, pool, b, pk.backend, p);
    p.threads = threads;
    detail::run_forward(pk.backend, p);
  });
  if (pk.drops_all) res.out.fill(0.0);
  return res;
} catch (const std::bad_alloc&) {
  throw Error(fmt::format("attn::attention_paged: out of memory for q {}, k_pages {}, v_pages {}",
                          q.shape_str(), kv.k_pages.shape_str(), kv.v_pages.shape_str()));
}

}  // namespace attn
