// A paged KV cache: a pool of fixed-size blocks of keys and values, and the sequences that own them
// (the layout attn::attention_paged reads, attn/paged.h). Sequences grow by appends that take blocks
// from the pool as they fill; fork() shares a sequence's blocks with a new one (a common prefix),
// each block counted by the sequences that hold it, and a shared block is copied only when one of
// them writes into it. The pool can be attn's own or a view of memory the caller owns (a torch tensor,
// a NumPy array, another engine's cache) of the same layout. One thread at a time may change a cache
// (add, fork, free, append); attention_paged calls on its views may run while none does.
//
//   KVCache cache(/*num_blocks=*/1024, /*block_size=*/16, /*Hkv=*/8, /*D=*/128, /*Dv=*/128, DType::bf16);
//   const int64_t a = cache.add_sequence(), b = cache.add_sequence();
//   cache.append({a, b}, k, v, cu_seqlens);        // k [total, Hkv, D] packed in the order a, b
//   AttentionResult r = attention_paged(q, cu_q, cache.view({a, b}), options);
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "attn/paged.h"

namespace attn {

class KVCache {
 public:
  // An owned pool of num_blocks blocks [block_size, Hkv, D] (keys) and [block_size, Hkv, Dv] (values)
  // of a floating dtype, or int8 (DType::i8) with a scale per (token, kv head) in f32 pools
  // [num_blocks, block_size, Hkv] (attn/paged.h); zero-filled (scales 1).
  KVCache(int64_t num_blocks, int64_t block_size, int64_t Hkv, int64_t D, int64_t Dv, DType dtype);
  // A cache over pools the caller owns and keeps alive: k_pages [num_blocks, block_size, Hkv, D],
  // v_pages [num_blocks, block_size, Hkv, Dv], one floating dtype, contiguous; for int8 pools also
  // k_scales and v_scales, f32 [num_blocks, block_size, Hkv], contiguous. Every block starts free
  // (their contents are not read until a sequence's appends fill them).
  static KVCache over(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k_scales = {},
                      const Tensor& v_scales = {});

  // A new empty sequence: its id.
  int64_t add_sequence();
  // A new sequence holding parent's keys (its blocks shared, none copied): its id.
  int64_t fork(int64_t parent);
  // The sequence's blocks go back to the pool once no other sequence holds them; the id is retired.
  void free_sequence(int64_t id);

  // Appends to each sequence ids[i] the rows cu_seqlens[i] .. cu_seqlens[i + 1] of k [total, Hkv, D]
  // and v [total, Hkv, Dv] (the cache's dtype; for an int8 cache f32, bf16 or f16 rows, quantized by
  // quantize_int8), cu_seqlens int32 [n + 1]. Blocks are taken as
  // sequences fill theirs; a shared block about to be written is copied first. Every argument and
  // the pool's capacity are checked before anything changes: on an error the cache is as it was.
  void append(std::span<const int64_t> ids, const Tensor& k, const Tensor& v,
              const Tensor& cu_seqlens);

  // What attention_paged reads for these sequences (in this order): the pools, block_table [n,
  // max_blocks] (entries past a sequence's keys are 0) and seqused_k [n].
  PagedKV view(std::span<const int64_t> ids) const;

  int64_t length(int64_t id) const;  // keys of the sequence
  int64_t free_blocks() const;       // blocks no sequence holds
  int64_t block_size() const { return block_size_; }
  const Tensor& k_pages() const { return k_pages_; }
  const Tensor& v_pages() const { return v_pages_; }
  const Tensor& k_scales() const {
    return k_scales_;
  }  // int8 caches: [num_blocks, block_size, Hkv]
  const Tensor& v_scales() const { return v_scales_; }
  // The blocks of a sequence in order, and how many sequences hold a block (for tests and tools).
  const std::vector<int32_t>& blocks(int64_t id) const;
  int32_t holders(int32_t block) const { return refs_.at(static_cast<size_t>(block)); }

 private:
  KVCache() = default;
  struct Sequence {
    std::vector<int32_t> blocks;
    int64_t length = 0;
    bool live = false;
  };
  const Sequence& sequence(const char* fn, int64_t id) const;
  int64_t blocks_needed(const char* fn, std::span<const int64_t> ids,
                        const std::vector<int64_t>& off) const;
  int32_t take_block();
  void release(int32_t block);

  Tensor k_pages_, v_pages_, k_scales_, v_scales_;
  int64_t block_size_ = 0;
  std::vector<Sequence> seqs_;
  std::vector<int32_t> refs_;  // [num_blocks] sequences holding each block
  std::vector<int32_t> free_;  // free blocks, the next taken from the back
};

// vLLM's reshape_and_cache: token t's key and value (k [n, Hkv, D], v [n, Hkv, Dv], the pools'
// dtype) into slot slot_mapping[t] = block * block_size + offset of the pools; a slot of -1 skips the
// token (padding). slot_mapping int32 or int64 [n]; every slot is checked before any write. int8
// pools take floating k and v, quantized (quantize_int8) into the pools and their scale pools.
void write_kv_slots(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k, const Tensor& v,
                    const Tensor& slot_mapping, const Tensor& k_scales = {},
                    const Tensor& v_scales = {});

// Symmetric int8 quantization of x [n, H, X] (f32, bf16 or f16, every element finite) with one scale
// per (row, head): scale = max |x| / 127 in f32 (1 for a head of zeros), value = x / scale rounded to
// nearest (ties to even): values int8 [n, H, X], scales f32 [n, H]. The cache's form of keys and
// values; value * scale is within scale / 2 of x.
struct QuantizedRows {
  Tensor values, scales;
};
QuantizedRows quantize_int8(const Tensor& x);

}  // namespace attn
