// attn.attention_varlen and attn.attention_varlen_backward: include/attn/varlen.h (FlashAttention's
// packed variable-length form) with NumPy / PyTorch arrays in and out. The options are attention's,
// parsed by the same OptionParser from the same table (attention_options.h); the C++ refuses by name
// those a packed batch does not take. Arrays are imported with the GIL held; the computation runs
// with it released.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "attention_options.h"
#include "attn/varlen.h"
#include "bindings.h"

namespace attn::python {

namespace {

// The offsets and seqused_k are int32, FlashAttention's convention: another dtype is a TypeError
// naming the argument, as a non-floating q is (the C++ checks their shapes and values).
void require_int32(const Tensor& t, const char* fn, const char* name) {
  if (t.defined() && t.dtype() != DType::i32)
    dtype_error(fn, name, "int32 (numpy.int32 / torch.int32, FlashAttention's offsets)", t);
}

// The packed batch's description; a bound of None is -1 (not given).
VarlenBatch parse_batch(ArrayScope& scope, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                        std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,
                        nb::handle seqused_k) {
  VarlenBatch vb;
  vb.cu_seqlens_q = scope.import(cu_seqlens_q, "cu_seqlens_q");
  vb.cu_seqlens_k = scope.import(cu_seqlens_k, "cu_seqlens_k");
  vb.seqused_k = scope.import(seqused_k, "seqused_k", true);
  require_int32(vb.cu_seqlens_q, scope.fn(), "cu_seqlens_q");
  require_int32(vb.cu_seqlens_k, scope.fn(), "cu_seqlens_k");
  require_int32(vb.seqused_k, scope.fn(), "seqused_k");
  vb.max_seqlen_q = max_seqlen_q.value_or(-1);
  vb.max_seqlen_k = max_seqlen_k.value_or(-1);
  return vb;
}

nb::object attention_varlen_py(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                               nb::handle cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
                               std::optional<int64_t> max_seqlen_k, nb::handle seqused_k,
                               const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention_varlen");
  if (kwargs.contains("return_lse")) {
    // Not a keyword here (the list has none): said plainly rather than "unexpected keyword".
    throw nb::type_error(
        "attn.attention_varlen: return_lse is not a keyword of the packed forward, which always "
        "returns (out, lse) (attn.attention_varlen and attn.torch.attention_varlen take it)");
  }
  OptionParser parser(scope, OptionUse::forward, varlen_keywords(OptionUse::forward), kwargs);
  const Tensor tq = scope.import(q, "q"), tk = scope.import(k, "k"), tv = scope.import(v, "v");
  for (auto [t, name] : {std::pair{&tq, "q"}, std::pair{&tk, "k"}, std::pair{&tv, "v"}})
    require_floating(*t, scope.fn(), name);
  const VarlenBatch vb =
      parse_batch(scope, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k);
  const AttentionOptions o = parser.options(nullptr);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = attention_varlen(tq, tk, tv, vb, o);
  }
  const bool torch = scope.torch();
  return nb::make_tuple(export_tensor(std::move(r.out), torch),
                        export_tensor(std::move(r.lse), torch));
}

nb::object attention_varlen_backward_py(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                        nb::handle out, nb::handle lse, nb::handle cu_seqlens_q,
                                        nb::handle cu_seqlens_k,
                                        std::optional<int64_t> max_seqlen_q,
                                        std::optional<int64_t> max_seqlen_k, nb::handle seqused_k,
                                        const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention_varlen_backward");
  OptionParser parser(scope, OptionUse::backward, varlen_keywords(OptionUse::backward), kwargs);
  const Tensor tdout = scope.import(dout, "dout"), tq = scope.import(q, "q"),
               tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               tout = scope.import(out, "out"), tlse = scope.import(lse, "lse");
  const std::pair<const Tensor*, const char*> arrays[] = {
      {&tdout, "dout"}, {&tq, "q"}, {&tk, "k"}, {&tv, "v"}, {&tout, "out"}, {&tlse, "lse"}};
  for (auto [t, name] : arrays) require_floating(*t, scope.fn(), name);
  const VarlenBatch vb =
      parse_batch(scope, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k);
  const AttentionOptions o = parser.options(nullptr);
  AttentionGrads g;
  {
    nb::gil_scoped_release release;
    g = attention_varlen_backward(tdout, tq, tk, tv, tout, tlse, vb, o);
  }
  return grads_tuple(std::move(g), o, scope.torch());
}

constexpr const char* kRefusedDoc = R"(
Of attention's keywords, these have no meaning on a packed batch and raise ValueError when used:
key_lengths (pass seqused_k), mask, block_layout (and so block_size), return_weights, mask_grad.
return_lse is no keyword of attn._core.attention_varlen (TypeError): it always returns lse.

)";

constexpr const char* kPackedDoc = R"(
Shapes (the tokens of B sequences packed one after the other, no padding):
    q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]  ->  out [total_q, Hq, Dv] (q's
    dtype), lse [Hq, total_q] (float64 for float64 inputs, else float32; the natural log of each row's
    softmax sum, sinks included, -inf for a row with no allowed key).
    Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
cu_seqlens_q, cu_seqlens_k: int32 [B + 1], FlashAttention's cumulative offsets: 0, then
    non-decreasing, the last equal to total_q (total_k). Sequence b owns rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (its Lq_b queries) and rows
    cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v (its Lk_b keys); equal offsets make an empty
    sequence (Lq_b = 0: nothing to compute; Lk_b = 0: its queries see no key, out = 0).
seqused_k: int32 [B] or None: sequence b reads only its first seqused_k[b] <= Lk_b keys (the rest of
    its rows, a cache's capacity, are never read): key_lengths of that sequence alone.
max_seqlen_q, max_seqlen_k: optional bounds (FlashAttention's arguments): when given, every Lq_b
    (Lk_b) must be <= them. Not needed for anything else.
Each sequence attends to its own keys only, exactly as attention(q_b, k_b, v_b, **options) on its rows
alone would (the same bits: the kernels read the packed rows in place). Every option applies per
sequence, its alignment against Lq_b and Lk_b: query i of sequence b sits at key position
p(i) = i + Lk_b - Lq_b with align='bottom-right' (the default, FlashAttention's varlen causal: the
queries are the last Lq_b of the keys), p(i) = i with 'top-left', p(i) = i + position_offset when
given. alibi_slopes may be [Hq] or [B, Hq] (a row per sequence); sinks [Hq] join every row's softmax;
dropout's keep-pattern is that of batch entry b with the sequence's local i and j.
q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors). Arrays are
NumPy arrays or PyTorch CPU tensors; results are NumPy arrays, or torch tensors when any input is a
torch tensor. Raises ValueError naming the argument for bad offsets, shapes or options (the offsets
are checked before any read: "cu_seqlens_q[2] = 1 is below cu_seqlens_q[1] = 3 ..."), TypeError for
an unsupported dtype; the GIL is released while computing.)";

}  // namespace

void bind_varlen(nb::module_& m) {
  static const std::string forward_doc =
      std::string(
          "Packed variable-length attention (FlashAttention's varlen form): B sequences of "
          "different lengths,\ntheir tokens packed one after the other, each attending to its own "
          "keys only.\n\nReturns (out, lse) (attention_varlen_backward takes lse).\n") +
      kRefusedDoc + options_doc(varlen_keywords(OptionUse::forward)) + kPackedDoc;
  static const std::string forward_sig =
      signature("attention_varlen", {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"},
                {"max_seqlen_q: int | None = None", "max_seqlen_k: int | None = None",
                 "seqused_k: ArrayLike | None = None"},
                varlen_keywords(OptionUse::forward), "tuple[Any, Any]");
  m.def("attention_varlen", &attention_varlen_py, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::kw_only(),
        nb::arg("max_seqlen_q").none() = nb::none(), nb::arg("max_seqlen_k").none() = nb::none(),
        nb::arg("seqused_k").none() = nb::none(), nb::arg("kwargs"), nb::sig(forward_sig.c_str()),
        forward_doc.c_str());

  static const std::string backward_doc =
      std::string(
          "Gradients of attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)[0] given dout = "
          "dL/dout\n[total_q, Hq, Dv].\n\nout and lse are that forward call's results; the "
          "offsets, seqused_k and the options, seed\nincluded, must be the forward's. Returns "
          "(dq, dk, dv), packed like q, k and v (GQA: dk, dv summed\nover the query heads of a "
          "group; key rows no sequence reads get 0), and dsinks [Hq] (summed over the\n"
          "sequences) as a fourth element when sinks is given. Deterministic: the same bits for "
          "any thread count.\n") +
      kRefusedDoc + options_doc(varlen_keywords(OptionUse::backward)) + kPackedDoc;
  static const std::string backward_sig =
      signature("attention_varlen_backward",
                {"dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k"},
                {"max_seqlen_q: int | None = None", "max_seqlen_k: int | None = None",
                 "seqused_k: ArrayLike | None = None"},
                varlen_keywords(OptionUse::backward), "tuple[Any, ...]");
  m.def("attention_varlen_backward", &attention_varlen_backward_py, nb::arg("dout"), nb::arg("q"),
        nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::kw_only(), nb::arg("max_seqlen_q").none() = nb::none(),
        nb::arg("max_seqlen_k").none() = nb::none(), nb::arg("seqused_k").none() = nb::none(),
        nb::arg("kwargs"), nb::sig(backward_sig.c_str()), backward_doc.c_str());
}

}  // namespace attn::python
