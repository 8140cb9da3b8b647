// The packed entries' metadata under fuzzing: attn::attention_varlen and attn::attention_paged with
// offsets, seqused_k, block tables and pool shapes drawn from the bytes, hostile ones included
// (offsets that decrease or overrun, tables pointing past the pool, lengths past a table's capacity).
// Invariants: a call either throws attn::Error naming its entry ("attn::attention_varlen: ...") or
// returns results of the promised shapes in which the cpu backend agrees with the reference on the
// same (f64) values; nothing reads out of bounds (the harness runs under AddressSanitizer).
#pragma once
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/paged.h"
#include "attn/varlen.h"
#include "fuzz/fuzz_input.h"

namespace attn::fuzz {

namespace packed_detail {

// An int32 vector of n values, each either plausible (from `good`) or a hostile draw.
inline Tensor int_vector(ByteReader& in, const std::vector<int64_t>& good, bool hostile) {
  std::vector<double> v(good.begin(), good.end());
  if (hostile && !v.empty()) {
    const size_t at = in.byte() % v.size();
    v[at] = static_cast<double>(in.range(-3, 40));
  }
  const DType dtype = hostile && in.byte() % 8 == 0 ? DType::i64 : DType::i32;
  return Tensor::from_vector({static_cast<int64_t>(v.size())}, v, dtype);
}

inline Tensor values(ByteReader& in, const Shape& shape) {
  const int64_t n = checked_numel(shape, "fuzz");
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<double>(in.range(0, 20)) / 10.0 - 1.0;
  return Tensor::from_vector(shape, v, DType::f64);
}

// Runs fn on the reference (f64) and the cpu backend (the same values in f32): both refuse, or both
// give results within f32's bounds of each other.
template <class Fn>
void compare_backends(const char* entry, AttentionOptions o, Fn&& fn) {
  o.threads = 1;
  AttentionResult ref, cpu;
  std::string ref_error, cpu_error;
  try {
    o.backend = Backend::reference;
    ref = fn(o, DType::f64);
  } catch (const Error& e) {
    ref_error = e.what();
  }
  try {
    o.backend = Backend::cpu;
    cpu = fn(o, DType::f32);
  } catch (const Error& e) {
    cpu_error = e.what();
  }
  for (const std::string* e : {&ref_error, &cpu_error}) {
    require(e->empty() || starts_with(*e, std::string(entry) + ": "),
            fmt::format("an error not naming {}: {}", entry, *e));
  }
  require(ref_error.empty() == cpu_error.empty(),
          fmt::format("one backend refused: reference '{}', cpu '{}'", ref_error, cpu_error));
  if (!ref_error.empty()) return;
  require(ref.out.shape() == cpu.out.shape() && ref.lse.shape() == cpu.lse.shape(),
          "the backends' shapes differ");
  const std::vector<double> a = ref.out.to_vector(), b = cpu.out.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    require(std::abs(a[i] - b[i]) <= 1e-4,
            fmt::format("out[{}]: reference {}, cpu {}", i, a[i], b[i]));
  }
}

}  // namespace packed_detail

inline void fuzz_packed(const uint8_t* data, size_t size) {
  using namespace packed_detail;
  ByteReader in(data, size);
  const bool paged = in.flag(), hostile = in.flag();
  const int64_t B = in.range(0, 4), Hkv = in.range(1, 2), Hq = Hkv * in.range(1, 2);
  const int64_t D = in.range(1, 8);
  std::vector<int64_t> lq, lk, cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < B; ++b) {
    lq.push_back(in.range(0, 5)), lk.push_back(in.range(0, 12));
    cu_q.push_back(cu_q.back() + lq.back()), cu_k.push_back(cu_k.back() + lk.back());
  }
  AttentionOptions o;
  o.causal = in.flag();
  o.align = in.flag() ? Align::top_left : Align::bottom_right;
  if (in.flag()) o.sinks = values(in, {Hq});
  const Tensor q = values(in, {cu_q.back(), Hq, D});
  const Tensor cu_seqlens_q = int_vector(in, cu_q, hostile && in.flag());
  if (!paged) {
    const Tensor k = values(in, {cu_k.back(), Hkv, D}), v = values(in, {cu_k.back(), Hkv, D});
    VarlenBatch vb;
    vb.cu_seqlens_q = cu_seqlens_q;
    vb.cu_seqlens_k = int_vector(in, cu_k, hostile && in.flag());
    if (in.flag()) vb.seqused_k = int_vector(in, lk, hostile);
    compare_backends("attn::attention_varlen", o, [&](const AttentionOptions& oo, DType t) {
      return attention_varlen(q.to(t), k.to(t), v.to(t), vb, oo);
    });
    return;
  }
  const int64_t bs = in.range(1, 8), blocks = in.range(1, 12), max_blocks = in.range(1, 4);
  PagedKV kv;
  kv.k_pages = values(in, {blocks, bs, Hkv, D});
  kv.v_pages = values(in, {blocks, bs, Hkv, D});
  std::vector<double> table(static_cast<size_t>(B * max_blocks));
  for (double& e : table)
    e = static_cast<double>(hostile ? in.range(-2, blocks + 1) : in.range(0, blocks - 1));
  kv.block_table = Tensor::from_vector({B, max_blocks}, table, DType::i32);
  std::vector<int64_t> used;
  for (int64_t b = 0; b < B; ++b) used.push_back(std::min(lk[b], max_blocks * bs));
  kv.seqused_k = int_vector(in, used, hostile);
  const bool one_each = !in.flag();
  compare_backends("attn::attention_paged", o, [&](const AttentionOptions& oo, DType t) {
    PagedKV kt = kv;
    kt.k_pages = kv.k_pages.to(t), kt.v_pages = kv.v_pages.to(t);
    return one_each ? attention_paged(q.slice(0, 0, std::min<int64_t>(B, q.size(0))).to(t),
                                      Tensor(), kt, oo)
                    : attention_paged(q.to(t), cu_seqlens_q, kt, oo);
  });
}

}  // namespace attn::fuzz
