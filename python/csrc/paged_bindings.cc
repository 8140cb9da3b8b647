// attn.attention_paged, attn.KVCache and attn.write_kv_slots: include/attn/paged.h and
// include/attn/kv_cache.h with NumPy / PyTorch arrays in and out. The options are attention's, parsed
// by the same OptionParser from the same table (attention_options.h), the varlen entries' list; the
// C++ refuses by name those a paged batch does not take. Arrays are imported with the GIL held; the
// attention runs with it released.
//
// The pools are written in place: KVCache.over(k_pages, v_pages) and write_kv_slots take the
// caller's arrays themselves, never a copy (a copy would swallow the writes), and an over() cache
// keeps the caller's objects alive as long as it lives (ArrayScope::release(): the views outlive
// the call that imported them).
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attention_options.h"
#include "attn/kv_cache.h"
#include "attn/paged.h"
#include "bindings.h"

namespace attn::python {

namespace {

[[noreturn]] void value_error(const std::string& msg) {
  throw nb::value_error(msg.c_str());
}

// Block tables, lengths and offsets are int32, FlashAttention's and vLLM's convention: another
// dtype is a TypeError naming the argument (the C++ checks their shapes and values).
void require_int32(const Tensor& t, const char* fn, const char* name) {
  if (t.defined() && t.dtype() != DType::i32)
    dtype_error(fn, name, "int32 (numpy.int32 / torch.int32)", t);
}

// A pool attn writes into: a view of the caller's own memory. Refused, since the writes would not
// reach the caller or would go behind its back: a read-only NumPy array, a tensor that requires
// grad, and whatever the import has to copy (a list, a reversed or misaligned view, another byte
// order, a lazily negated tensor).
Tensor import_in_place(ArrayScope& scope, nb::handle obj, const char* name) {
  const char* fn = scope.fn();
  if (is_torch_tensor(obj)) {
    if (nb::cast<bool>(obj.attr("requires_grad"))) {
      value_error(
          fmt::format("{}: {} requires grad; attn writes into it in place, outside "
                      "autograd: pass {}.detach() (the same memory)",
                      fn, name, name));
    }
  } else if (nb::hasattr(obj, "flags") && !nb::cast<bool>(obj.attr("flags").attr("writeable"))) {
    value_error(
        fmt::format("{}: {} is a read-only NumPy array (flags.writeable is False) and attn "
                    "writes into it in place: pass a writable array",
                    fn, name));
  }
  const Tensor t = scope.import(obj, name);
  if (t.numel() == 0) return t;  // the C++ names the empty pool
  const auto data = reinterpret_cast<uintptr_t>(t.data());
  for (const ArrayScope::Owner& o : scope.owners())
    if (o.name == name && o.obj.is(obj) && o.begin == data) return t;
  value_error(
      fmt::format("{}: {} must be a NumPy array or a PyTorch CPU tensor that attn can write "
                  "in place (aligned, native byte order), got a {} that would be copied",
                  fn, name, nb::cast<std::string>(nb::type_name(obj.type()))));
}

// (out, lse) of attention_paged, computed with the GIL released. `keep`: the Python objects behind
// kv's pools when the caller does not hold them (a KVCache over caller-owned arrays), alive until
// the call ends whatever other threads do meanwhile.
nb::object run_paged(const Tensor& q, const Tensor& cu_seqlens_q, const PagedKV& kv,
                     const AttentionOptions& o, bool torch, std::vector<nb::object> keep = {}) {
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = attention_paged(q, cu_seqlens_q, kv, o);
  }
  return nb::make_tuple(export_tensor(std::move(r.out), torch),
                        export_tensor(std::move(r.lse), torch));
}

// kwargs without the int8 pools' scales (k_scales, v_scales: arrays beside the options), which go to
// *k_scales / *v_scales (None: absent).
nb::kwargs options_of(const nb::kwargs& kwargs, nb::object* k_scales, nb::object* v_scales) {
  nb::kwargs options;
  for (auto [key, value] : kwargs) {
    const std::string name = nb::cast<std::string>(key);
    if (name == "k_scales") {
      *k_scales = nb::borrow(value);
    } else if (name == "v_scales") {
      *v_scales = nb::borrow(value);
    } else {
      options[key] = value;
    }
  }
  return options;
}

// A pool: floating, or int8 (its scales then given).
void require_pool(const Tensor& t, const char* fn, const char* name) {
  if (t.defined() && t.dtype() != DType::i8) require_floating(t, fn, name);
}

nb::object attention_paged_py(nb::handle q, nb::handle k_pages, nb::handle v_pages,
                              nb::handle block_table, nb::handle seqused_k, nb::handle cu_seqlens_q,
                              const nb::kwargs& kwargs) {
  ArrayScope scope("attn.attention_paged");
  if (kwargs.contains("return_lse")) {
    throw nb::type_error(
        "attn.attention_paged: return_lse is not a keyword of attn._core.attention_paged, which "
        "always returns (out, lse) (attn.attention_paged and KVCache.attention take it)");
  }
  nb::object k_scales = nb::none(), v_scales = nb::none();
  const nb::kwargs options = options_of(kwargs, &k_scales, &v_scales);
  OptionParser parser(scope, OptionUse::forward, varlen_keywords(OptionUse::forward), options);
  const Tensor tq = scope.import(q, "q");
  PagedKV kv;
  kv.k_pages = scope.import(k_pages, "k_pages");
  kv.v_pages = scope.import(v_pages, "v_pages");
  kv.k_scales = scope.import(k_scales, "k_scales", true);
  kv.v_scales = scope.import(v_scales, "v_scales", true);
  require_floating(tq, scope.fn(), "q");
  require_pool(kv.k_pages, scope.fn(), "k_pages");
  require_pool(kv.v_pages, scope.fn(), "v_pages");
  kv.block_table = scope.import(block_table, "block_table");
  kv.seqused_k = scope.import(seqused_k, "seqused_k");
  const Tensor cu_q = scope.import(cu_seqlens_q, "cu_seqlens_q", true);
  require_int32(kv.block_table, scope.fn(), "block_table");
  require_int32(kv.seqused_k, scope.fn(), "seqused_k");
  require_int32(cu_q, scope.fn(), "cu_seqlens_q");
  return run_paged(tq, cu_q, kv, parser.options(nullptr), scope.torch());
}

void write_kv_slots_py(nb::handle k_pages, nb::handle v_pages, nb::handle k, nb::handle v,
                       nb::handle slot_mapping, nb::handle k_scales, nb::handle v_scales) {
  ArrayScope scope("attn.write_kv_slots");
  const Tensor kp = import_in_place(scope, k_pages, "k_pages"),
               vp = import_in_place(scope, v_pages, "v_pages");
  const Tensor ks = k_scales.is_none() ? Tensor() : import_in_place(scope, k_scales, "k_scales"),
               vs = v_scales.is_none() ? Tensor() : import_in_place(scope, v_scales, "v_scales");
  const Tensor tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               slots = scope.import(slot_mapping, "slot_mapping");
  nb::gil_scoped_release release;
  write_kv_slots(kp, vp, tk, tv, slots, ks, vs);
}

// attn.quantize_int8: (values int8 [n, H, X], scales f32 [n, H]).
nb::object quantize_int8_py(nb::handle x) {
  ArrayScope scope("attn.quantize_int8");
  const Tensor tx = scope.import(x, "x");
  QuantizedRows q;
  {
    nb::gil_scoped_release release;
    q = quantize_int8(tx);
  }
  return nb::make_tuple(export_tensor(std::move(q.values), scope.torch()),
                        export_tensor(std::move(q.scales), scope.torch()));
}

// A KVCache and, for one over caller-owned pools, the caller's objects (k_pages, v_pages), kept
// alive with it; results are torch tensors when the pools were (or the dtype was a torch.dtype).
struct PyKVCache {
  KVCache cache;
  std::vector<ArrayScope::Owner> owners;  // over(): [k_pages, v_pages(, k_scales, v_scales)]
  bool torch = false;
};

// A torch tensor the cache was made over whose storage moved since (resize_, set_): the cache's
// views of it may point at freed memory, so it refuses to touch them. (NumPy refuses to resize an
// array the cache holds a reference to.)
void check_unmoved(const PyKVCache& c, const char* fn) {
  for (const ArrayScope::Owner& o : c.owners) {
    if (!o.torch || nb::cast<uintptr_t>(o.obj.attr("data_ptr")()) == o.begin) continue;
    PyErr_SetString(PyExc_RuntimeError,
                    fmt::format("{}: the storage of {}, the tensor the cache was made over, moved "
                                "(resize_ or set_): its memory may be gone; make a new cache",
                                fn, o.name)
                        .c_str());
    throw nb::python_error();
  }
}

// "float32", "bfloat16", "float16", "float64" (or "f32", ...), a NumPy dtype or type, a torch.dtype
// (then *torch is set).
DType cache_dtype(nb::handle dtype, bool* torch) {
  constexpr const char* expected =
      "attn.KVCache: dtype must be 'float32', 'bfloat16', 'float16', 'float64' or 'int8' (or a "
      "NumPy / torch dtype of these), got {}";
  std::string name;
  const nb::dict modules = nb::borrow<nb::dict>(PyImport_GetModuleDict());
  if (nb::isinstance<nb::str>(dtype)) {
    name = nb::cast<std::string>(dtype);
  } else if (modules.contains("torch") &&
             PyObject_IsInstance(dtype.ptr(), modules["torch"].attr("dtype").ptr()) == 1) {
    name = nb::cast<std::string>(nb::str(dtype));
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    *torch = true;
  } else {
    try {
      name = nb::cast<std::string>(nb::module_::import_("numpy").attr("dtype")(dtype).attr("name"));
    } catch (const nb::python_error&) {
      throw nb::type_error(fmt::format(expected, nb::cast<std::string>(nb::repr(dtype))).c_str());
    }
  }
  for (const char* ok : {"float32", "bfloat16", "float16", "float64", "f32", "bf16", "f16", "f64"})
    if (name == ok) return parse_dtype(name);
  if (name == "int8" || name == "i8") return DType::i8;
  throw nb::type_error(fmt::format(expected, nb::cast<std::string>(nb::repr(dtype))).c_str());
}

// A pool as Python sees it: the caller's object itself for an over() cache, else a view of the
// cache's memory (a NumPy array or torch tensor that keeps it alive; bfloat16 to NumPy: a float32
// copy).
// which: 0 k_pages, 1 v_pages, 2 k_scales, 3 v_scales (None for a floating cache's scales).
nb::object pool_object(const PyKVCache& c, const Tensor& pages, size_t which) {
  if (!pages.defined()) return nb::none();
  if (!c.owners.empty()) return c.owners[which].obj;
  return export_tensor(pages, c.torch);
}

// What attention_paged reads for these sequences (k_scales, v_scales: None for a floating cache).
struct PagedView {
  nb::object k_pages, v_pages, block_table, seqused_k, k_scales, v_scales;
  nb::tuple items() const { return nb::make_tuple(k_pages, v_pages, block_table, seqused_k); }
};

PagedView view_py(const PyKVCache& c, const std::vector<int64_t>& ids) {
  check_unmoved(c, "attn.KVCache.view");
  PagedKV kv = c.cache.view(ids);
  return {pool_object(c, c.cache.k_pages(), 0),
          pool_object(c, c.cache.v_pages(), 1),
          export_tensor(std::move(kv.block_table), c.torch),
          export_tensor(std::move(kv.seqused_k), c.torch),
          pool_object(c, c.cache.k_scales(), 2),
          pool_object(c, c.cache.v_scales(), 3)};
}

nb::object cache_attention_py(const PyKVCache& c, nb::handle q, const std::vector<int64_t>& ids,
                              nb::handle cu_seqlens_q, bool return_lse, const nb::kwargs& kwargs) {
  ArrayScope scope("attn.KVCache.attention");
  check_unmoved(c, scope.fn());
  OptionParser parser(scope, OptionUse::forward, varlen_keywords(OptionUse::forward), kwargs);
  const Tensor tq = scope.import(q, "q");
  require_floating(tq, scope.fn(), "q");
  const Tensor cu_q = scope.import(cu_seqlens_q, "cu_seqlens_q", true);
  require_int32(cu_q, scope.fn(), "cu_seqlens_q");
  const PagedKV kv = c.cache.view(ids);
  const AttentionOptions o = parser.options(nullptr);
  std::vector<nb::object> keep;  // the pools stay alive if another thread drops the cache meanwhile
  for (const ArrayScope::Owner& owner : c.owners) keep.push_back(owner.obj);
  nb::object r = run_paged(tq, cu_q, kv, o, scope.torch() || c.torch, std::move(keep));
  return return_lse ? r : nb::object(r[0]);
}

PyKVCache over_py(nb::handle k_pages, nb::handle v_pages, nb::handle k_scales,
                  nb::handle v_scales) {
  ArrayScope scope("attn.KVCache.over");
  const Tensor kp = import_in_place(scope, k_pages, "k_pages"),
               vp = import_in_place(scope, v_pages, "v_pages");
  const Tensor ks = k_scales.is_none() ? Tensor() : import_in_place(scope, k_scales, "k_scales"),
               vs = v_scales.is_none() ? Tensor() : import_in_place(scope, v_scales, "v_scales");
  KVCache cache = KVCache::over(kp, vp, ks, vs);
  const bool torch = scope.torch();
  std::vector<ArrayScope::Owner> owners = scope.release();  // [k_pages, v_pages(, scales)]
  if (owners.size() != (ks.defined() ? 4u : 2u)) {          // an empty pool has no memory to hold
    value_error(
        fmt::format("attn.KVCache.over: the pools must not be empty, got k_pages {} and "
                    "v_pages {}",
                    kp.shape_str(), vp.shape_str()));
  }
  return PyKVCache{std::move(cache), std::move(owners), torch};
}

void append_py(PyKVCache& c, const std::vector<int64_t>& ids, nb::handle k, nb::handle v,
               nb::handle cu_seqlens) {
  ArrayScope scope("attn.KVCache.append");
  check_unmoved(c, scope.fn());
  const Tensor tk = scope.import(k, "k"), tv = scope.import(v, "v"),
               cu = scope.import(cu_seqlens, "cu_seqlens");
  require_floating(tk, scope.fn(), "k");
  require_floating(tv, scope.fn(), "v");
  require_int32(cu, scope.fn(), "cu_seqlens");
  // With the GIL held: the cache's bookkeeping changes, and the GIL is what keeps two Python
  // threads from changing it at once (the copy is of the appended rows only).
  c.cache.append(ids, tk, tv, cu);
}

std::string repr_py(const PyKVCache& c) {
  const Tensor &k = c.cache.k_pages(), &v = c.cache.v_pages();
  return fmt::format(
      "attn.KVCache(num_blocks={}, block_size={}, num_kv_heads={}, head_dim={}, head_dim_v={}, "
      "dtype={}{}, free_blocks={})",
      k.size(0), k.size(1), k.size(2), k.size(3), v.size(3), dtype_name(k.dtype()),
      c.owners.empty() ? "" : ", over caller's pools", c.cache.free_blocks());
}

constexpr const char* kRefusedDoc = R"doc(
Of attention's keywords, these have no meaning on a paged batch and raise ValueError when used:
key_lengths (seqused_k is each sequence's), mask, block_layout (and so block_size),
return_weights, mask_grad.

)doc";

constexpr const char* kPagedDoc = R"doc(
Shapes (B sequences; their keys and values in a pool of blocks, vLLM's and FlashAttention's layout):
    q [total_q, Hq, D] with cu_seqlens_q int32 [B + 1] (the queries of each sequence packed, as
        attention_varlen's), or q [B, Hq, D] and cu_seqlens_q None (one query per sequence: decode)
    k_pages [num_blocks, block_size, Hkv, D], v_pages [num_blocks, block_size, Hkv, Dv]
    block_table int32 [B, max_blocks]: key j of sequence b is row j % block_size of block
        block_table[b, j // block_size] (entries past a sequence's keys are not read)
    seqused_k int32 [B]: sequence b's keys are 0 .. seqused_k[b] - 1 (<= max_blocks * block_size)
    ->  out [total_q, Hq, Dv] (q's dtype), lse [Hq, total_q] (float64 for float64 inputs, else
    float32; -inf for a row with no allowed key).
    Hq % Hkv == 0; query head h reads key/value head h // (Hq // Hkv).
Sequence b's queries attend to its seqused_k[b] keys exactly as attention() does on those keys
gathered into one array (the same bits), every option applied per sequence, aligned against Lq_b
and Lk_b = seqused_k[b]: with align='bottom-right' (the default) query i sits at key position
i + Lk_b - Lq_b, so the Lq_b queries are the last Lq_b keys (append a step's keys before the call:
decode, speculative steps, chunked prefill); 'top-left' puts it at i, position_offset=n at i + n.
alibi_slopes may be [Hq] or [B, Hq]; sinks [Hq] join every row's softmax.
q and the pools share one dtype (float64, float32, float16, or bfloat16 for torch tensors), or the
pools are int8 with k_scales and v_scales float32 [num_blocks, block_size, Hkv] (keywords; one scale
per token and kv head: element x scale in float32 is the value, attn.quantize_int8's form), read
inside the kernel and never dequantized into memory for decode; the result is attention() over the
dequantized values to the contract's tolerance for q's dtype (docs/semantics.md). Arrays
are NumPy arrays or PyTorch CPU tensors, read in place; results are NumPy arrays, or torch tensors
when any input is one. Every index is checked before any read: ValueError naming it ("block_table[0,
1] = 40 is outside [0, num_blocks = 32)", "seqused_k[1] = 90 is outside [0, 64]"), TypeError for an
unsupported dtype (block_table, seqused_k and cu_seqlens_q are int32). Forward only (no gradient);
the GIL is released while computing.)doc";

constexpr const char* kCacheDoc =
    R"doc(A paged KV cache: a pool of blocks of keys and values, and the sequences that own them.

KVCache(num_blocks, block_size, num_kv_heads, head_dim, head_dim_v=None, dtype='float32') owns a
zero-filled pool: k_pages [num_blocks, block_size, num_kv_heads, head_dim] and v_pages [..,
head_dim_v (default head_dim)]; dtype 'float32', 'bfloat16', 'float16', 'float64' or a NumPy /
torch dtype, or 'int8': int8 pools with a float32 scale per token and kv head (k_scales, v_scales),
appends quantized by attn.quantize_int8's rule. KVCache.over(k_pages, v_pages) works in the caller's own arrays (NumPy arrays or torch
CPU tensors, contiguous, writable), without a copy: appends write into them, and the cache keeps
them alive as long as it lives.

Sequences grow by append(ids, k, v, cu_seqlens), taking blocks from the pool as theirs fill;
fork(parent) starts a sequence that shares the parent's blocks (a common prefix; holders(block)
counts the sequences holding a block), and a shared block is copied only when one of them writes
into it; free_sequence(id) gives a sequence's blocks back once no other sequence holds them. An
append that the pool cannot hold, or with a bad argument, raises ValueError and changes nothing.
view(ids) is what attention_paged reads for those sequences (attn.attention_paged(q, *view));
attention(q, ids, ...) runs it.

Arrays come back as torch tensors when the cache was made over torch tensors or with a torch
dtype, else as NumPy arrays (a bfloat16 pool then shows as a float32 copy). Its methods run with the GIL
held, which keeps two threads from changing a cache at once; attention releases it while computing
(its pools stay alive meanwhile).)doc";

// KVCache.view's result, attn._core.PagedKV.
void bind_paged_view(nb::module_& m) {
  nb::class_<PagedView>(m, "PagedKV",
                        "What attn.attention_paged reads for some sequences of a KVCache "
                        "(KVCache.view): k_pages, v_pages, block_table [n, max_blocks] and "
                        "seqused_k [n], int32; unpacks as a 4-tuple.")
      .def_prop_ro(
          "k_pages", [](const PagedView& p) { return p.k_pages; },
          nb::for_getter(nb::sig("def k_pages(self) -> Any")))
      .def_prop_ro(
          "v_pages", [](const PagedView& p) { return p.v_pages; },
          nb::for_getter(nb::sig("def v_pages(self) -> Any")))
      .def_prop_ro(
          "block_table", [](const PagedView& p) { return p.block_table; },
          nb::for_getter(nb::sig("def block_table(self) -> Any")))
      .def_prop_ro(
          "seqused_k", [](const PagedView& p) { return p.seqused_k; },
          nb::for_getter(nb::sig("def seqused_k(self) -> Any")))
      .def_prop_ro(
          "k_scales", [](const PagedView& p) { return p.k_scales; },
          nb::for_getter(nb::sig("def k_scales(self) -> Any")),
          "An int8 cache's key scales [num_blocks, block_size, Hkv] (pass k_scales=view.k_scales "
          "to attention_paged); None for a floating cache.")
      .def_prop_ro(
          "v_scales", [](const PagedView& p) { return p.v_scales; },
          nb::for_getter(nb::sig("def v_scales(self) -> Any")),
          "An int8 cache's value scales; None for a floating cache.")
      .def("__len__", [](const PagedView&) { return 4; })
      .def("__iter__", [](const PagedView& p) { return nb::iter(p.items()); })
      .def(
          "__getitem__",
          [](const PagedView& p, nb::handle i) {
            PyObject* item = PyObject_GetItem(p.items().ptr(), i.ptr());  // IndexError past 4
            if (item == nullptr) throw nb::python_error();
            return nb::steal(item);
          },
          nb::sig("def __getitem__(self, i: int) -> Any"));
}

void bind_kv_cache(nb::module_& m) {
  bind_paged_view(m);

  nb::class_<PyKVCache> cls(m, "KVCache", kCacheDoc);
  cls.def(
         "__init__",
         [](PyKVCache* self, int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
            int64_t head_dim, std::optional<int64_t> head_dim_v, nb::handle dtype) {
           bool torch = false;
           const DType dt = cache_dtype(dtype, &torch);
           new (self) PyKVCache{KVCache(num_blocks, block_size, num_kv_heads, head_dim,
                                        head_dim_v.value_or(head_dim), dt),
                                {},
                                torch};
         },
         nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
         nb::arg("head_dim_v").none() = nb::none(), nb::arg("dtype") = "float32",
         nb::sig("def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, "
                 "head_dim: int, head_dim_v: int | None = None, dtype: Any = 'float32') -> None"))
      .def_static("over", &over_py, nb::arg("k_pages"), nb::arg("v_pages"),
                  nb::arg("k_scales").none() = nb::none(), nb::arg("v_scales").none() = nb::none(),
                  nb::sig("def over(k_pages: ArrayLike, v_pages: ArrayLike, k_scales: ArrayLike | "
                          "None = None, v_scales: ArrayLike | None = None) -> KVCache"),
                  "A cache over the caller's pools k_pages [num_blocks, block_size, Hkv, D] and "
                  "v_pages [.., Dv] (one floating dtype, or int8\nwith k_scales and v_scales "
                  "float32 [num_blocks, block_size, Hkv]; contiguous, writable NumPy arrays or "
                  "torch\nCPU tensors that do not require grad), without a copy: appends write "
                  "into them, and the cache keeps them\nalive. Every block starts free.")
      .def(
          "add_sequence", [](PyKVCache& c) { return c.cache.add_sequence(); },
          "A new empty sequence: its id.")
      .def(
          "fork", [](PyKVCache& c, int64_t parent) { return c.cache.fork(parent); },
          nb::arg("parent"),
          "A new sequence holding parent's keys, its blocks shared (none copied): its id.")
      .def(
          "free_sequence", [](PyKVCache& c, int64_t id) { c.cache.free_sequence(id); },
          nb::arg("id"),
          "The sequence's blocks go back to the pool once no other sequence holds them; the id "
          "is retired.")
      .def("append", &append_py, nb::arg("ids"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens"),
           nb::sig("def append(self, ids: list[int], k: ArrayLike, v: ArrayLike, cu_seqlens: "
                   "ArrayLike) -> None"),
           "Appends rows cu_seqlens[i]:cu_seqlens[i + 1] of k [total, Hkv, D] and v [total, Hkv, "
           "Dv] (the cache's dtype; for an int8\ncache float32, bfloat16 or float16, quantized "
           "as attn.quantize_int8 does) to sequence ids[i]; cu_seqlens int32\n[len(ids) + 1]. "
           "Every argument and the pool's capacity are checked first: on an error (ValueError) "
           "the cache\nis as it was.")
      .def("view", &view_py, nb::arg("ids"), nb::sig("def view(self, ids: list[int]) -> PagedKV"),
           "What attention_paged reads for these sequences, in this order: (k_pages, v_pages, "
           "block_table int32 [n, max_blocks],\nseqused_k int32 [n]); the pools are not copied.")
      .def(
          "length", [](const PyKVCache& c, int64_t id) { return c.cache.length(id); },
          nb::arg("id"), "The keys of the sequence.")
      .def(
          "blocks", [](const PyKVCache& c, int64_t id) { return c.cache.blocks(id); },
          nb::arg("id"), "The sequence's blocks, in order.")
      .def(
          "holders",
          [](const PyKVCache& c, int64_t block) {
            const int64_t n = c.cache.k_pages().size(0);
            if (block < 0 || block >= n)
              value_error(
                  fmt::format("attn.KVCache.holders: block {} is outside [0, num_blocks "
                              "= {})",
                              block, n));
            return c.cache.holders(static_cast<int32_t>(block));
          },
          nb::arg("block"), "How many sequences hold the block (0: free).")
      .def_prop_ro(
          "free_blocks", [](const PyKVCache& c) { return c.cache.free_blocks(); },
          "Blocks no sequence holds.")
      .def_prop_ro(
          "block_size", [](const PyKVCache& c) { return c.cache.block_size(); }, "Keys per block.")
      .def_prop_ro(
          "num_blocks", [](const PyKVCache& c) { return c.cache.k_pages().size(0); },
          "Blocks of the pool.")
      .def_prop_ro(
          "k_pages", [](const PyKVCache& c) { return pool_object(c, c.cache.k_pages(), 0); },
          nb::for_getter(nb::sig("def k_pages(self) -> Any")),
          "The key pool [num_blocks, block_size, Hkv, D], not copied (over(): the caller's "
          "array itself).")
      .def_prop_ro(
          "v_pages", [](const PyKVCache& c) { return pool_object(c, c.cache.v_pages(), 1); },
          nb::for_getter(nb::sig("def v_pages(self) -> Any")),
          "The value pool [num_blocks, block_size, Hkv, Dv], not copied (over(): the caller's "
          "array itself).")
      .def_prop_ro(
          "k_scales", [](const PyKVCache& c) { return pool_object(c, c.cache.k_scales(), 2); },
          nb::for_getter(nb::sig("def k_scales(self) -> Any")),
          "An int8 cache's key scales float32 [num_blocks, block_size, Hkv], not copied; None "
          "for a floating cache.")
      .def_prop_ro(
          "v_scales", [](const PyKVCache& c) { return pool_object(c, c.cache.v_scales(), 3); },
          nb::for_getter(nb::sig("def v_scales(self) -> Any")),
          "An int8 cache's value scales, as k_scales.")
      .def("__repr__", &repr_py);
  static const std::string attention_doc = std::string(
      "attn.attention_paged(q, *self.view(ids), cu_seqlens_q, **options): sequence ids[b]'s "
      "queries (rows\ncu_seqlens_q[b]:cu_seqlens_q[b + 1] of q [total_q, Hq, D], or row b of "
      "q [len(ids), Hq, D] when\ncu_seqlens_q is None) against its keys (an int8 cache's "
      "scales included). Returns out [total_q, Hq, Dv], or\n(out, lse) with "
      "return_lse=True. The options, shapes and errors are attn.attention_paged's (see its "
      "docstring).\n");
  static const std::string attention_sig =
      "def attention(self, " +
      signature("", {"q", "ids: list[int]", "cu_seqlens_q: ArrayLike | None = None"},
                {"return_lse: bool = False"}, varlen_keywords(OptionUse::forward), "Any")
          .substr(5);  // "def (" dropped
  cls.def("attention", &cache_attention_py, nb::arg("q"), nb::arg("ids"),
          nb::arg("cu_seqlens_q").none() = nb::none(), nb::kw_only(), nb::arg("return_lse") = false,
          nb::arg("kwargs"), nb::sig(attention_sig.c_str()), attention_doc.c_str());
}

}  // namespace

void bind_paged(nb::module_& m) {
  static const std::string doc =
      std::string(
          "Attention over a paged KV cache (vLLM's and FlashAttention's layout): the queries of B "
          "sequences\nagainst their keys and values in a pool of fixed-size blocks, listed by a "
          "block table.\n\nReturns (out, lse) (attn.attention_paged returns out unless "
          "return_lse=True).\n") +
      kRefusedDoc + options_doc(varlen_keywords(OptionUse::forward)) + kPagedDoc;
  static const std::string sig =
      signature("attention_paged",
                {"q", "k_pages", "v_pages", "block_table", "seqused_k",
                 "cu_seqlens_q: ArrayLike | None = None"},
                {"k_scales: ArrayLike | None = None", "v_scales: ArrayLike | None = None"},
                varlen_keywords(OptionUse::forward), "tuple[Any, Any]");
  m.def("attention_paged", &attention_paged_py, nb::arg("q"), nb::arg("k_pages"),
        nb::arg("v_pages"), nb::arg("block_table"), nb::arg("seqused_k"),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("kwargs"), nb::sig(sig.c_str()),
        doc.c_str());
  m.def("quantize_int8", &quantize_int8_py, nb::arg("x"),
        nb::sig("def quantize_int8(x: ArrayLike) -> tuple[Any, Any]"),
        "Symmetric int8 quantization of x [n, H, X] (float32, bfloat16 or float16, finite), the "
        "form of an int8 KVCache's\nkeys and values: one scale per (row, head), scale = max |x| / "
        "127 in float32 (1 for a head of zeros), values = x / scale\nrounded to nearest (ties to "
        "even). Returns (values int8 [n, H, X], scales float32 [n, H]); values * scales is within\n"
        "scale / 2 of x.");
  m.def("write_kv_slots", &write_kv_slots_py, nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("k"),
        nb::arg("v"), nb::arg("slot_mapping"), nb::arg("k_scales").none() = nb::none(),
        nb::arg("v_scales").none() = nb::none(),
        nb::sig("def write_kv_slots(k_pages: ArrayLike, v_pages: ArrayLike, k: ArrayLike, v: "
                "ArrayLike, slot_mapping: ArrayLike, k_scales: ArrayLike | None = None, "
                "v_scales: ArrayLike | None = None) -> None"),
        "vLLM's reshape_and_cache: token t's key k[t] [Hkv, D] and value v[t] [Hkv, Dv] into "
        "slot slot_mapping[t] = block * block_size +\noffset of the pools k_pages [num_blocks, "
        "block_size, Hkv, D] and v_pages [.., Dv], in place: they are the caller's\narrays "
        "(contiguous, writable NumPy arrays or torch CPU tensors that do not require grad), "
        "never a copy. k and v have\nthe pools' dtype; slot_mapping is int32 or int64 [n], -1 "
        "skips a token (padding). Every slot is checked before any\nwrite: ValueError "
        "\"slot_mapping[3] = 99 is outside [0, num_blocks x block_size = 64)\". int8 pools "
        "take float k and v,\nquantized (attn.quantize_int8) into them and into k_scales and "
        "v_scales [num_blocks, block_size, Hkv] (in place, as\nthe pools). The GIL is released "
        "while writing.");
  bind_kv_cache(m);
}

}  // namespace attn::python
