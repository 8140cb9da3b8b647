#include "arrays.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace attn::python {

namespace {

namespace dl = nb::dlpack;

// The attn dtype of a DLPack dtype; false when attn has none.
bool dtype_from_dlpack(dl::dtype t, DType* out) {
  if (t.lanes != 1) return false;
  const auto code = static_cast<dl::dtype_code>(t.code);
  if (code == dl::dtype_code::Float && t.bits == 64) return *out = DType::f64, true;
  if (code == dl::dtype_code::Float && t.bits == 32) return *out = DType::f32, true;
  if (code == dl::dtype_code::Float && t.bits == 16) return *out = DType::f16, true;
  if (code == dl::dtype_code::Bfloat && t.bits == 16) return *out = DType::bf16, true;
  if (code == dl::dtype_code::Bool && t.bits == 8) return *out = DType::boolean, true;
  if (code == dl::dtype_code::Int && t.bits == 32) return *out = DType::i32, true;
  if (code == dl::dtype_code::Int && t.bits == 64) return *out = DType::i64, true;
  if (code == dl::dtype_code::Int && t.bits == 8) return *out = DType::i8, true;
  return false;
}

dl::dtype dtype_to_dlpack(DType t) {
  switch (t) {
    case DType::f64:
      return nb::dtype<double>();
    case DType::f32:
      return nb::dtype<float>();
    case DType::f16:
      return {static_cast<uint8_t>(dl::dtype_code::Float), 16, 1};
    case DType::bf16:
      return {static_cast<uint8_t>(dl::dtype_code::Bfloat), 16, 1};
    case DType::boolean:
      return nb::dtype<bool>();
    case DType::i32:
      return nb::dtype<int32_t>();
    case DType::i64:
      return nb::dtype<int64_t>();
    case DType::i8:
      return nb::dtype<int8_t>();
  }
  return nb::dtype<double>();
}

// "numpy.ndarray of dtype object" / "list": what the caller passed, for messages.
// str(obj), or "?" when str() raises.
std::string to_string(nb::handle obj) {
  PyObject* s = PyObject_Str(obj.ptr());
  if (!s) {
    PyErr_Clear();
    return "?";
  }
  return nb::cast<std::string>(nb::steal<nb::str>(s));
}

std::string describe(nb::handle obj) {
  std::string what = nb::cast<std::string>(nb::type_name(obj.type()));
  if (nb::hasattr(obj, "dtype")) {
    what += " of dtype " + to_string(obj.attr("dtype"));
  }
  return what;
}

[[noreturn]] void type_error(const std::string& msg) {
  throw nb::type_error(msg.c_str());
}
[[noreturn]] void value_error(const std::string& msg) {
  throw nb::value_error(msg.c_str());
}

nb::object numpy_module() {
  return nb::module_::import_("numpy");
}

}  // namespace

namespace {

// torch.Tensor, looked up once torch is loaded (a loaded module is never unloaded); null before.
PyObject* torch_tensor_type() {
  static PyObject* type = nullptr;
  if (type != nullptr) return type;
  PyObject* modules = PySys_GetObject("modules");  // borrowed
  if (!modules) return nullptr;
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
  if (!torch) return nullptr;
  PyObject* t = PyObject_GetAttrString(torch, "Tensor");  // new reference, kept for good
  if (!t) {
    PyErr_Clear();  // torch half-imported: not a tensor yet
    return nullptr;
  }
  type = t;
  return type;
}

// torch's dtypes attn reads, looked up once: torch.<name> for each DType in `kTorchDtypes`.
struct TorchDtype {
  const char* name;
  DType dtype;
};
constexpr TorchDtype kTorchDtypes[] = {{"float32", DType::f32},   {"float64", DType::f64},
                                       {"bfloat16", DType::bf16}, {"float16", DType::f16},
                                       {"bool", DType::boolean},  {"int64", DType::i64},
                                       {"int32", DType::i32},     {"int8", DType::i8}};

// torch's objects attn uses on every call, looked up once and kept for the life of the process
// (never released: a static's destructor would run after the interpreter is gone).
struct TorchObjects {
  std::vector<nb::object> dtypes;  // kTorchDtypes' order
  nb::object strided, from_numpy, bfloat16;
};

const TorchObjects& torch_objects() {
  static const TorchObjects* objects = [] {
    nb::module_ torch = nb::module_::import_("torch");
    auto* r = new TorchObjects;
    for (const TorchDtype& d : kTorchDtypes) r->dtypes.push_back(torch.attr(d.name));
    r->strided = torch.attr("strided");
    r->from_numpy = torch.attr("from_numpy");
    r->bfloat16 = torch.attr("bfloat16");
    return r;
  }();
  return *objects;
}

// A CPU tensor of a dtype attn reads, as a view of its storage, read off its attributes (a few
// attribute reads instead of a DLPack capsule each way: the fixed cost of a small call). False
// for anything else (other devices, layouts, dtypes, lazily negated views): the DLPack path then
// decides and names the problem.
// An attribute by an interned name (made once per name): tensors' attributes are read on every
// call, and a name built from a C string each time costs as much as the read.
nb::object attr(nb::handle obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj.ptr(), name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}
#define ATTN_NAME(s)                                           \
  ([]() {                                                      \
    static PyObject* interned = PyUnicode_InternFromString(s); \
    return interned;                                           \
  }())

bool truthy(const nb::object& o) {
  return o.ptr() == Py_True;
}

// A torch tensor's memory as import_torch_fast reads it.
struct TorchView {
  void* data = nullptr;
  Shape shape, strides;
  DType dtype = DType::f32;
};

bool import_torch_fast(nb::handle t, TorchView* out) {
  const TorchObjects& torch = torch_objects();
  if (!truthy(attr(t, ATTN_NAME("is_cpu"))) || !attr(t, ATTN_NAME("layout")).is(torch.strided) ||
      truthy(attr(t, ATTN_NAME("is_nested"))) || truthy(attr(t, ATTN_NAME("is_neg"))())) {
    return false;
  }
  const nb::object dtype = attr(t, ATTN_NAME("dtype"));
  const std::vector<nb::object>& known = torch.dtypes;
  size_t which = 0;
  while (which < known.size() && !known[which].is(dtype)) ++which;
  if (which == known.size()) return false;
  const nb::object shape_t = attr(t, ATTN_NAME("shape"));
  const nb::object stride_t = attr(t, ATTN_NAME("stride"))();
  if (!PyTuple_Check(shape_t.ptr()) || !PyTuple_Check(stride_t.ptr())) return false;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape_t.ptr());
  if (ndim > kMaxDims || PyTuple_GET_SIZE(stride_t.ptr()) != ndim) return false;
  Shape shape(static_cast<size_t>(ndim)), strides(static_cast<size_t>(ndim));
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    const auto i = static_cast<size_t>(d);
    shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_t.ptr(), d));
    strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride_t.ptr(), d));
    if (strides[i] < 0) return false;   // also PyLong_AsLongLong's -1 on error (cleared below)
    if (shape[i] <= 1) strides[i] = 0;  // a size-1 dim's stride is arbitrary
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  out->dtype = kTorchDtypes[which].dtype;
  out->data = reinterpret_cast<void*>(
      static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(attr(t, ATTN_NAME("data_ptr"))().ptr())));
  out->shape = std::move(shape);
  out->strides = std::move(strides);
  return true;
}
#undef ATTN_NAME

}  // namespace

bool is_torch_tensor(nb::handle obj) {
  // torch is never imported here: a tensor can only exist when torch is already loaded.
  PyObject* type = torch_tensor_type();
  return type != nullptr && PyObject_IsInstance(obj.ptr(), type) == 1;
}

Tensor ArrayScope::import(nb::handle obj, const char* name, bool optional) {
  if (obj.is_none()) {
    if (optional) return {};
    type_error(fmt::format("{}: {} must be an array, got None", fn_, name));
  }
  nb::object o = nb::borrow(obj);
  const bool from_torch = is_torch_tensor(o);
  if (from_torch) {
    torch_ = true;
    TorchView fast;  // a CPU tensor of a dtype attn reads (the device object costs ~1 us to make)
    if (import_torch_fast(o, &fast)) {
      return view_of(o, name, fast.data, fast.shape, fast.dtype, fast.strides, true);
    }
    const nb::object device = o.attr("device");
    if (to_string(device.attr("type")) != "cpu") {
      value_error(fmt::format("{}: {} must be on the CPU, got a tensor on {}", fn_, name,
                              to_string(device)));
    }
    // DLPack refuses tensors that require grad; attn only reads them (attn.torch handles autograd).
    if (nb::cast<bool>(o.attr("requires_grad"))) o = o.attr("detach")();
    // A lazily negated view (torch._neg_view, conjugation's imaginary part) holds -x as x plus a
    // bit; torch's DLPack export hands out the memory as it is, so the values are made first.
    if (nb::cast<bool>(o.attr("is_neg")())) o = o.attr("resolve_neg")();
  }

  nb::ndarray<nb::ro, nb::device::cpu> array;
  bool ok = nb::try_cast(o, array, /*convert=*/false);
  if (!ok && !from_torch) {
    // Lists, scalars and other array-likes: let NumPy make an array of them (object arrays stay
    // refused).
    try {
      o = numpy_module().attr("asarray")(o);
      ok = nb::try_cast(o, array, false);
      // Non-native byte order (DLPack has none): a native-order copy.
      if (!ok && nb::cast<bool>(o.attr("dtype").attr("isnative")) == false) {
        o = o.attr("astype")(o.attr("dtype").attr("newbyteorder")("="));
        ok = nb::try_cast(o, array, false);
      }
    } catch (const nb::python_error&) {
      ok = false;
    }
  }
  if (!ok) {
    type_error(
        fmt::format("{}: {} must be a NumPy array or a PyTorch CPU tensor of f64, f32, f16 or bf16 "
                    "(bool or integer for masks and lengths), got {}",
                    fn_, name, describe(obj)));
  }
  DType dtype;
  if (!dtype_from_dlpack(array.dtype(), &dtype)) {
    type_error(fmt::format(
        "{}: {} has an unsupported dtype ({}); attn takes f64, f32, f16, bf16, bool, i32 or i64",
        fn_, name, describe(obj)));
  }
  const size_t ndim = array.ndim();
  if (ndim > static_cast<size_t>(kMaxDims)) {
    value_error(fmt::format("{}: {} has rank {}, attn tensors have at most {} dims", fn_, name,
                            ndim, kMaxDims));
  }
  Shape shape(ndim), strides(ndim);
  bool negative_stride = false;
  for (size_t d = 0; d < ndim; ++d) {
    shape[d] = static_cast<int64_t>(array.shape(d));
    strides[d] = array.stride(d);
    if (strides[d] < 0 && shape[d] > 1) negative_stride = true;
    if (shape[d] <= 1)
      strides[d] = 0 > strides[d] ? 0 : strides[d];  // a size-1 dim's stride is arbitrary
  }
  const int64_t numel = checked_numel(shape, fn_);
  if (numel == 0)
    return Tensor::empty(shape, dtype);  // nothing to read; the data pointer may be null
  if (negative_stride) {
    // attn views have non-negative strides: reversed NumPy views are copied (torch has none).
    o = numpy_module().attr("ascontiguousarray")(o);
    return import(o, name, optional);
  }
  arrays_.push_back(array);
  return view_of(o, name, const_cast<void*>(array.data()), shape, dtype, strides, from_torch);
}

Tensor ArrayScope::view_of(nb::object owner, const char* name, void* data, const Shape& shape,
                           DType dtype, const Shape& strides, bool from_torch) {
  if (checked_numel(shape, fn_) == 0)
    return Tensor::empty(shape, dtype);  // nothing to read; the data pointer may be null
  Tensor view = Tensor::from_blob(data, shape, dtype, strides);
  // Misaligned elements (a view at an odd byte offset) are copied so that kernels may assume
  // alignment; the copy is attn's own, so nothing needs keeping.
  const auto begin = reinterpret_cast<uintptr_t>(data);
  if (begin % dtype_size(dtype) != 0) return view.clone();
  uintptr_t last = 0;  // the offset of the last addressable element, in elements
  for (size_t d = 0; d < shape.size(); ++d)
    last += static_cast<uintptr_t>(shape[d] - 1) * static_cast<uintptr_t>(strides[d]);
  // The owner keeps the memory alive while the view is used: this call, or longer after release().
  owners_.push_back(
      Owner{std::move(owner), name, begin, begin + (last + 1) * dtype_size(dtype), from_torch});
  return view;
}

nb::object ArrayScope::export_result(Tensor t, bool torch) const {
  if (t.defined() && t.numel() > 0) {
    const auto p = reinterpret_cast<uintptr_t>(t.data());
    for (const Owner& o : owners_) {
      if (p < o.begin || p >= o.end) continue;
      // A read-only NumPy input (np.broadcast_to, a memory map) stays read-only: its alias would
      // be writable, so it is copied.
      if (!o.torch && nb::hasattr(o.obj, "flags") &&
          !nb::cast<bool>(o.obj.attr("flags").attr("writeable")))
        return export_tensor(t.clone(), torch);
      return export_tensor(std::move(t), torch, o.obj);
    }
  }
  return export_tensor(std::move(t), torch);
}

nb::object export_tensor(Tensor t, bool torch, nb::object base) {
  if (!t.defined()) return nb::none();
  if (!torch && t.dtype() == DType::bf16) {
    t = t.to(DType::f32);  // NumPy has no bf16: a converted copy, which needs no base
    base = nb::object();
  }
  // The capsule owns the Tensor (its storage) and `base` (the memory of a view of an input); it
  // is released by the array's deallocation, with the GIL held.
  struct Held {
    Tensor t;
    nb::object base;
  };
  auto* h = new Held{std::move(t), std::move(base)};
  Tensor* held = &h->t;
  nb::capsule owner(h, [](void* p) noexcept { delete static_cast<Held*>(p); });
  const size_t ndim = static_cast<size_t>(held->dim());
  std::vector<size_t> shape(ndim);
  for (size_t d = 0; d < ndim; ++d) shape[d] = static_cast<size_t>(held->size(static_cast<int>(d)));
  const Shape& strides = held->strides();
  const dl::dtype dtype = dtype_to_dlpack(held->dtype());
  if (!torch) {
    return nb::ndarray<nb::numpy>(held->data(), ndim, shape.data(), owner, strides.data(), dtype)
        .cast();
  }
  // To torch through a NumPy array and torch.from_numpy (about 1 us; torch's DLPack import costs
  // several): bf16, which NumPy lacks, travels as uint16 and is viewed back as bf16.
  const bool bf16 = held->dtype() == DType::bf16;
  const dl::dtype carrier = bf16 ? nb::dtype<uint16_t>() : dtype;
  nb::object array =
      nb::ndarray<nb::numpy>(held->data(), ndim, shape.data(), owner, strides.data(), carrier)
          .cast();
  const TorchObjects& torch_objs = torch_objects();
  nb::object tensor = torch_objs.from_numpy(array);
  return bf16 ? tensor.attr("view")(torch_objs.bfloat16) : tensor;
}

}  // namespace attn::python
