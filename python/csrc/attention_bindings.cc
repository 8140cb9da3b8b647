// attn.attention and attn.attention_backward: the whole contract of include/attn/attention.h, with
// NumPy / PyTorch arrays in and out. Arguments are parsed (the options by attention_options.h) and
// arrays imported with the GIL held; the computation runs with it released.
#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include <string>
#include <utility>

#include "arrays.h"
#include "attention_options.h"
#include "attn/attention.h"
#include "attn/memory.h"
#include "attn/options.h"
#include "attn/threads.h"
#include "bindings.h"

namespace attn::python {

namespace {

nb::object attention_py(nb::handle q, nb::handle k, nb::handle v, const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention");
  OptionParser parser(scope, OptionUse::forward, kwargs);
  const Tensor tq = scope.import(q, "q"), tk = scope.import(k, "k"), tv = scope.import(v, "v");
  for (auto [t, name] : {std::pair{&tq, "q"}, std::pair{&tk, "k"}, std::pair{&tv, "v"}})
    require_floating(*t, scope.fn(), name);
  bool return_lse = false;
  const AttentionOptions o = parser.options(&return_lse);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = attention(tq, tk, tv, o);
  }
  const bool torch = scope.torch();
  nb::object out = export_tensor(std::move(r.out), torch);
  if (!return_lse && !o.return_weights) return out;
  nb::list result;
  result.append(out);
  if (return_lse) result.append(export_tensor(std::move(r.lse), torch));
  if (o.return_weights) result.append(export_tensor(std::move(r.weights), torch));
  return nb::tuple(result);
}

// dweights (None: not given) = dL/dweights [..., Hq, Lq, Lk] for the weights the forward returned:
// an array of the backward like dout, not an option, so keyword-only ahead of the table's keywords.
nb::object attention_backward_py(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                 nb::handle out, nb::handle lse, nb::handle dweights,
                                 const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention_backward");
  OptionParser parser(scope, OptionUse::backward, kwargs);
  const Tensor tdout = scope.import(dout, "dout"), tq = scope.import(q, "q"),
               tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               tout = scope.import(out, "out"), tlse = scope.import(lse, "lse"),
               tdweights = scope.import(dweights, "dweights", true);
  const std::pair<const Tensor*, const char*> arrays[] = {
      {&tdout, "dout"}, {&tq, "q"}, {&tk, "k"}, {&tv, "v"}, {&tout, "out"}, {&tlse, "lse"}};
  for (auto [t, name] : arrays) require_floating(*t, scope.fn(), name);
  require_floating(tdweights, scope.fn(), "dweights");  // (undefined when not given)
  const AttentionOptions o = parser.options(nullptr);
  AttentionGrads g;
  {
    nb::gil_scoped_release release;
    g = attention_backward(tdout, tq, tk, tv, tout, tlse, o, tdweights);
  }
  return grads_tuple(std::move(g), o, scope.torch());
}

constexpr const char* kShapesDoc = R"(
Shapes (any number of leading batch dims "...", equal across q, k and v):
    q [..., Hq, Lq, D], k [..., Hkv, Lk, D], v [..., Hkv, Lk, Dv]  ->  out [..., Hq, Lq, Dv]
    lse [..., Hq, Lq] (float64 for float64 inputs, else float32), weights [..., Hq, Lq, Lk].
    Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv) (GQA / MQA without copies).
q, k and v share one dtype (float64, float32, float16, or bfloat16 for torch tensors), which is the
compute type (float64 computes in double, the others accumulate in float32 or better). Arrays are
NumPy arrays or PyTorch CPU tensors; they are read without a copy when their last dim is contiguous.
Results are NumPy arrays, or torch tensors when any input is a torch tensor.

Alignment: query i sits at key position p(i) = i + Lk - Lq with align='bottom-right' (the default,
FlashAttention's causal) and p(i) = i with align='top-left' (PyTorch's is_causal);
position_offset=n overrides both: p(i) = i + n (chunked prefill, ring attention).
Key j is used by query i only when every rule allows it:
    causal: j <= p(i); window=(left, right): p(i) - left <= j <= p(i) + right (None or -1 = unbounded);
    mask: broadcastable to [..., Hq, Lq, Lk], with mask_type 'keep' (bool, True = may attend, as
    torch's scaled_dot_product_attention), 'drop' (bool, True = masked, as nn.MultiheadAttention) or
    'add' (float added to the scores, -inf removes the key);
    key_lengths [...] (int): keys j >= key_lengths[b] are padding;
    block_layout [..., Hq, ceil(Lq / bq), ceil(Lk / bk)] (bool) with block_size bq or (bq, bk).
Score s = scale * q.k (scale defaults to 1/sqrt(D)); softcap c: s = c * tanh(s / c); ALiBi slopes [Hq]:
s -= slope[h] * |p(i) - j|; then an 'add' mask is added. Softmax over the allowed keys only; a row
with no allowed key gives out = 0, weights = 0, lse = -inf (never NaN).
Dropout p drops weights with probability p and scales the rest by 1/(1 - p); the keep-pattern is a
function of (seed, batch, head, i, j): seed=None draws a fresh seed, pass one to reproduce it.
backend: 'auto', 'reference' (double precision, defines the contract) or 'cpu'; threads=None uses
attn.set_num_threads, ATTN_NUM_THREADS or all cores. Raises ValueError (bad shapes or options) or
TypeError (not an array, unsupported dtype); the GIL is released while computing.)";

OptionUse parse_direction(const std::string& direction, const char* fn) {
  if (direction != "forward" && direction != "backward") {
    throw nb::value_error(
        fmt::format("{}: direction must be 'forward' or 'backward', got '{}'", fn, direction)
            .c_str());
  }
  return direction == "forward" ? OptionUse::forward : OptionUse::backward;
}

// [(name, Python type, kind, default)] of a direction's keywords: attn.torch builds its op schema from it.
nb::list keyword_table(const std::string& direction) {
  nb::list table;
  for (const Keyword& kw : keywords(parse_direction(direction, "attn._core.option_keywords")))
    table.append(nb::make_tuple(kw.name, kw.type, kw.kind, kw.default_));
  return table;
}

}  // namespace

void bind_attention(nb::module_& m) {
  static const std::string attention_doc =
      std::string(
          "Exact scaled dot-product attention: softmax(scale * q k^T + bias) v under the masks "
          "below.\n\n"
          "Returns out, or a tuple (out[, lse][, weights]) with the ones asked for by return_lse "
          "and\n"
          "return_weights (weights are the probabilities before dropout).\n\n") +
      options_doc(keywords(OptionUse::forward)) + kShapesDoc;
  // nanobind keeps the signature's pointer: the strings live as long as the module.
  static const std::string attention_sig =
      signature("attention", {"q", "k", "v"}, {}, keywords(OptionUse::forward), "Any");
  m.def("attention", &attention_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("kwargs"),
        nb::sig(attention_sig.c_str()), attention_doc.c_str());

  static const std::string backward_doc =
      std::string(
          "Gradients of attention(q, k, v, **options)[0] given dout = dL/dout.\n\n"
          "out and lse are that forward call's results (the backward recomputes the weights from "
          "lse);\n"
          "the options, seed included, must be the forward's. Returns (dq, dk, dv) with the shapes "
          "and\n"
          "dtypes of q, k and v (GQA: dk, dv summed over the query heads of a group), and d(mask) "
          "in the\n"
          "mask's shape as a fourth element when mask_grad=True (mask_type='add' only).\n\n"
          "dweights: ArrayLike | None = None\n"
          "    dL/dweights [..., Hq, Lq, Lk] (any floating dtype) when the forward's weights "
          "(return_weights:\n"
          "    the probabilities before dropout) were used too: their part, dS += P (dW - "
          "rowsum(P dW)) through\n"
          "    softcap, is folded into dq, dk and d(mask). Such a call runs on the reference "
          "backend (double,\n"
          "    exact) whatever backend says.\n\n") +
      options_doc(keywords(OptionUse::backward)) + kShapesDoc;
  static const std::string backward_sig = signature(
      "attention_backward", {"dout", "q", "k", "v", "out", "lse"},
      {"dweights: ArrayLike | None = None"}, keywords(OptionUse::backward), "tuple[Any, ...]");
  m.def("attention_backward", &attention_backward_py, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::kw_only(),
        nb::arg("dweights").none() = nb::none(), nb::arg("kwargs"), nb::sig(backward_sig.c_str()),
        backward_doc.c_str());

  m.def("option_keywords", &keyword_table, nb::arg("direction"),
        nb::sig("def option_keywords(direction: str) -> list[tuple[str, str, str, Any]]"),
        "[(name, Python type, kind, default)] of attention's keywords (direction 'forward') or "
        "attention_backward's ('backward')\nafter the arrays, in order: attn.torch builds its op "
        "schema from them.");
  m.def(
      "options_doc",
      [](const std::string& direction) {
        return options_doc(keywords(parse_direction(direction, "attn._core.options_doc")));
      },
      nb::arg("direction"), nb::sig("def options_doc(direction: str) -> str"),
      "The options section of attention's docstring (direction 'forward') or "
      "attention_backward's ('backward'),\nbuilt from attn/options.h's table: attn.torch's "
      "docstrings show it too.");

  m.def(
      "set_num_threads", [](int n) { set_num_threads(n); }, nb::arg("n"),
      nb::sig("def set_num_threads(n: int) -> None"),
      "Threads used by calls that pass threads=None; n <= 0 restores the default "
      "(ATTN_NUM_THREADS, else all "
      "cores).");
  m.def(
      "get_num_threads", []() { return default_num_threads(); },
      nb::sig("def get_num_threads() -> int"), "Threads a call with threads=None uses.");
  m.def("cached_memory_bytes", &cached_memory_bytes, nb::sig("def cached_memory_bytes() -> int"),
        "Bytes attn holds in freed tensor buffers (>= 256 KiB each) for reuse.");
  m.def("release_cached_memory", &release_cached_memory,
        nb::sig("def release_cached_memory() -> int"),
        "Gives every buffer attn holds for reuse back to the C library; returns the bytes "
        "released.");
  m.def(
      "set_cached_memory_limit", [](size_t bytes) { set_cached_memory_limit(bytes); },
      nb::arg("bytes"), nb::sig("def set_cached_memory_limit(bytes: int) -> None"),
      "The most bytes attn holds in freed buffers (0: none); default ATTN_CACHE_MB MiB, else 1024 "
      "MiB.");
  m.def("cached_memory_limit", &cached_memory_limit, nb::sig("def cached_memory_limit() -> int"),
        "The budget of freed buffers held for reuse, in bytes.");
  m.def(
      "resolve_backend",
      [](const std::string& backend, const std::string& dtype) {
        return std::string(
            backend_name(attn::resolve_backend(parse_backend(backend), parse_dtype(dtype))));
      },
      nb::arg("backend"), nb::arg("dtype"),
      nb::sig("def resolve_backend(backend: str, dtype: str) -> str"),
      "The backend ('reference' or 'cpu') that `backend` ('auto', 'reference', 'cpu') runs for "
      "inputs of `dtype` "
      "('float64', 'float32', 'float16', 'bfloat16') on this machine.");
}

}  // namespace attn::python
