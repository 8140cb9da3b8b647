// attn::attention_varlen's refusals: every hostile offset, length or option is a clear attn::Error
// naming the argument and the offending position, raised before any read of the packed data.
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "attn/varlen.h"
#include "expect_error.h"

namespace attn::test {
namespace {

struct Args {
  Tensor q = Tensor::zeros({10, 4, 8}, DType::f32);
  Tensor k = Tensor::zeros({12, 2, 8}, DType::f32);
  Tensor v = Tensor::zeros({12, 2, 8}, DType::f32);
  VarlenBatch batch;
  AttentionOptions o;
  Args() {
    batch.cu_seqlens_q = Tensor::from_vector({3}, {0, 4, 10}, DType::i32);
    batch.cu_seqlens_k = Tensor::from_vector({3}, {0, 5, 12}, DType::i32);
  }
};

void expect_refused(const Args& a, std::initializer_list<std::string> parts) {
  expect_error([&] { (void)attention_varlen(a.q, a.k, a.v, a.batch, a.o); },
               "attn::attention_varlen", parts);
  const Tensor dout = Tensor::zeros({a.q.size(0), a.q.size(1), a.v.size(2)}, DType::f32);
  const Tensor lse = Tensor::zeros({a.q.size(1), a.q.size(0)}, DType::f32);
  expect_error(
      [&] { (void)attention_varlen_backward(dout, a.q, a.k, a.v, dout, lse, a.batch, a.o); },
      "attn::attention_varlen_backward", parts);
}

Tensor i32(std::initializer_list<double> v) {
  return Tensor::from_vector({static_cast<int64_t>(v.size())}, v, DType::i32);
}

TEST(VarlenErrors, Offsets) {
  Args a;
  a.batch.cu_seqlens_q = Tensor::from_vector({3}, {0, 4, 10}, DType::i64);
  expect_refused(a, {"cu_seqlens_q must be int32 [B + 1]", "i64"});
  a = Args();
  a.batch.cu_seqlens_k = Tensor();
  expect_refused(a, {"cu_seqlens_k must be int32 [B + 1], got nothing"});
  a = Args();
  a.batch.cu_seqlens_q = i32({1, 4, 10});
  expect_refused(a, {"cu_seqlens_q[0] = 1, must be 0"});
  a = Args();
  a.batch.cu_seqlens_k = i32({0, 7, 5, 12});
  expect_refused(a, {"cu_seqlens_k[2] = 5 is below cu_seqlens_k[1] = 7"});
  a = Args();
  a.batch.cu_seqlens_q = i32({0, 4, 9});
  expect_refused(a, {"cu_seqlens_q[B = 2] = 9 must equal the packed length of q [10, 4, 8]"});
  a = Args();
  a.batch.cu_seqlens_k = i32({0, 2, 5, 12});
  expect_refused(a, {"cu_seqlens_q [3] and cu_seqlens_k [4] must both be [B + 1]"});
}

TEST(VarlenErrors, SequsedAndMaxSeqlen) {
  Args a;
  a.batch.seqused_k = i32({5, 8});
  expect_refused(a, {"seqused_k[1] = 8 is outside [0, 7] (sequence 1 has keys 5..12)"});
  a.batch.seqused_k = i32({-1, 2});
  expect_refused(a, {"seqused_k[0] = -1 is outside [0, 5]"});
  a.batch.seqused_k = Tensor::from_vector({3}, {1, 1, 1}, DType::i32);
  expect_refused(a, {"seqused_k must be int32 [B = 2]", "[3]"});
  a = Args();
  a.batch.max_seqlen_q = 5;
  expect_refused(a, {"max_seqlen_q = 5 but sequence 1 has length 6"});
  a = Args();
  a.batch.max_seqlen_k = -3;
  expect_refused(a, {"max_seqlen_k must be -1 (not given) or >= 0, got -3"});
}

TEST(VarlenErrors, TensorsAndOptions) {
  Args a;
  a.k = Tensor::zeros({12, 3, 8}, DType::f32);
  a.v = Tensor::zeros({12, 3, 8}, DType::f32);
  expect_refused(a, {"need Hq a multiple of Hkv"});
  a = Args();
  a.q = Tensor::zeros({1, 10, 4, 8}, DType::f32);
  expect_refused(a, {"must be packed [total, heads, dim]", "[1, 10, 4, 8]"});
  a = Args();
  a.v = Tensor::zeros({12, 2, 8}, DType::bf16);
  expect_refused(a, {"q, k and v must share one dtype"});
  a = Args();
  a.o.key_lengths = Tensor::zeros({2}, DType::i64);
  expect_refused(a, {"key_lengths ([2]) is not taken by the packed entries", "seqused_k"});
  a = Args();
  a.o.mask = Tensor::zeros({10, 12}, DType::boolean);
  expect_refused(a, {"dense masks ([10, 12]) are not supported on a packed batch"});
  a = Args();
  a.o.alibi_slopes = Tensor::zeros({3, 4}, DType::f32);
  expect_refused(a, {"alibi_slopes must be floating [Hq = 4] or [B = 2, Hq]", "[3, 4]"});
  a = Args();
  a.o.sinks = Tensor::zeros({2}, DType::f32);
  expect_refused(a, {"sinks must be a floating vector [Hq = 4]"});
  a = Args();
  a.o.scale = std::nan("");
  expect_refused(a, {"scale must be finite"});
}

TEST(VarlenErrors, BackwardShapes) {
  Args a;
  const Tensor dout = Tensor::zeros({10, 4, 8}, DType::f32);
  expect_error(
      [&] {
        (void)attention_varlen_backward(dout, a.q, a.k, a.v, dout,
                                        Tensor::zeros({10, 4}, DType::f32), a.batch, a.o);
      },
      "attn::attention_varlen_backward",
      {"lse must have shape [4, 10] ([Hq, total_q]), got [10, 4]"});
}

}  // namespace
}  // namespace attn::test
