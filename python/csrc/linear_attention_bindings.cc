// attn.linear_attention and attn.linear_attention_backward: include/attn/linear_attention.h with
// NumPy / PyTorch arrays in and out (the GIL released while computing), as attn.attention.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays.h"
#include "attn/linear_attention.h"
#include "bindings.h"

namespace attn::python {

namespace {

LinearAttentionOptions parse_options(ArrayScope& scope, bool causal, const std::string& align,
                                     nb::handle key_lengths, nb::handle key_keep,
                                     std::optional<int> threads) {
  LinearAttentionOptions o;
  o.causal = causal;
  o.align = parse_align(align);
  o.key_lengths = scope.import(key_lengths, "key_lengths", true);
  o.key_keep = scope.import(key_keep, "key_keep", true);
  o.threads = threads.value_or(0);
  return o;
}

nb::object linear_attention_py(nb::handle q, nb::handle k, nb::handle v, bool causal,
                               const std::string& align, nb::handle key_lengths,
                               nb::handle key_keep, std::optional<int> threads) {
  ArrayScope scope("attn.linear_attention");
  const Tensor tq = scope.import(q, "q"), tk = scope.import(k, "k"), tv = scope.import(v, "v");
  const LinearAttentionOptions o =
      parse_options(scope, causal, align, key_lengths, key_keep, threads);
  Tensor out;
  {
    nb::gil_scoped_release release;
    out = linear_attention(tq, tk, tv, o);
  }
  return export_tensor(std::move(out), scope.torch());
}

nb::tuple linear_attention_backward_py(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                       bool causal, const std::string& align,
                                       nb::handle key_lengths, nb::handle key_keep,
                                       std::optional<int> threads) {
  ArrayScope scope("attn.linear_attention_backward");
  const Tensor tdout = scope.import(dout, "dout"), tq = scope.import(q, "q"),
               tk = scope.import(k, "k"), tv = scope.import(v, "v");
  const LinearAttentionOptions o =
      parse_options(scope, causal, align, key_lengths, key_keep, threads);
  LinearAttentionGrads g;
  {
    nb::gil_scoped_release release;
    g = linear_attention_backward(tdout, tq, tk, tv, o);
  }
  const bool torch = scope.torch();
  return nb::make_tuple(export_tensor(std::move(g.dq), torch),
                        export_tensor(std::move(g.dk), torch),
                        export_tensor(std::move(g.dv), torch));
}

constexpr const char* kLinearDoc = R"(
Linear attention (Katharopoulos et al. 2020), phi(x) = elu(x) + 1:
    out_i = sum_{j in K(i)} (phi(q_i) . phi(k_j)) v_j / sum_{j in K(i)} phi(q_i) . phi(k_j)
No scale and no softmax; O(L D Dv) time per head. docs/semantics.md "Linear attention".
Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv]; exactly
4-D, one dtype (float32 or float64, computed in double), Hq % Hkv == 0 (query head h reads
key/value head h // (Hq // Hkv)).
Options (keyword-only):
    causal: only keys j <= p(i), with p(i) = i + Lk - Lq for align='bottom-right' (the default, as
        attn.attention) and p(i) = i for align='top-left' (PyTorch's is_causal).
    key_lengths [B] (int): keys j >= key_lengths[b] are padding.
    key_keep [B, Lk] (bool): True = use the key. With both, a key is used when both keep it.
    threads: None uses attn.set_num_threads, ATTN_NUM_THREADS or all cores.
A query with no usable key gets out = 0 and zero gradients. Results are NumPy arrays, or torch
tensors (outside autograd) when any input is one. Raises ValueError (bad shapes or options) or
TypeError (not an array, unsupported dtype).)";

}  // namespace

void bind_linear_attention(nb::module_& m) {
  static const std::string forward_doc =
      std::string("Linear attention: returns out.\n") + kLinearDoc;
  m.def("linear_attention", &linear_attention_py, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::kw_only(), nb::arg("causal") = false, nb::arg("align") = "bottom-right",
        nb::arg("key_lengths").none() = nb::none(), nb::arg("key_keep").none() = nb::none(),
        nb::arg("threads").none() = nb::none(),
        nb::sig("def linear_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = "
                "False, align: str = 'bottom-right', key_lengths: ArrayLike | None = None, "
                "key_keep: ArrayLike | None = None, threads: int | None = None) -> Any"),
        forward_doc.c_str());
  static const std::string backward_doc =
      std::string(
          "Gradients of linear_attention(q, k, v, **options) given dout = dL/dout [B, Hq, Lq, Dv] "
          "(q's dtype):\n(dq, dk, dv) with the shapes and dtypes of q, k and v (dk, dv summed over "
          "the query heads of a group).\n") +
      kLinearDoc;
  m.def("linear_attention_backward", &linear_attention_backward_py, nb::arg("dout"), nb::arg("q"),
        nb::arg("k"), nb::arg("v"), nb::kw_only(), nb::arg("causal") = false,
        nb::arg("align") = "bottom-right", nb::arg("key_lengths").none() = nb::none(),
        nb::arg("key_keep").none() = nb::none(), nb::arg("threads").none() = nb::none(),
        nb::sig("def linear_attention_backward(dout: ArrayLike, q: ArrayLike, k: ArrayLike, v: "
                "ArrayLike, *, causal: bool = False, align: str = 'bottom-right', key_lengths: "
                "ArrayLike | None = None, key_keep: ArrayLike | None = None, threads: int | None = "
                "None) -> tuple[Any, Any, Any]"),
        backward_doc.c_str());
}

}  // namespace attn::python
