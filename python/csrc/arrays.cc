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

bool is_torch_tensor(nb::handle obj) {
  // torch is never imported here: a tensor can only exist when torch is already loaded.
  PyObject* modules = PySys_GetObject("modules");  // borrowed
  if (!modules) return false;
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
  if (!torch) return false;
  nb::handle torch_mod(torch);
  if (!nb::hasattr(torch_mod, "Tensor")) return false;
  return PyObject_IsInstance(obj.ptr(), torch_mod.attr("Tensor").ptr()) == 1;
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
    const nb::object device = o.attr("device");
    if (to_string(device.attr("type")) != "cpu") {
      value_error(fmt::format("{}: {} must be on the CPU, got a tensor on {}", fn_, name,
                              to_string(device)));
    }
    // DLPack refuses tensors that require grad; attn only reads them (attn.torch handles autograd).
    if (nb::cast<bool>(o.attr("requires_grad"))) o = o.attr("detach")();
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
  Tensor view = Tensor::from_blob(const_cast<void*>(array.data()), shape, dtype, strides);
  keep_.push_back(o);
  arrays_.push_back(array);
  // Misaligned elements (a view at an odd byte offset) are copied so that kernels may assume
  // alignment.
  if (reinterpret_cast<uintptr_t>(array.data()) % dtype_size(dtype) != 0) return view.clone();
  return view;
}

nb::object export_tensor(Tensor t, bool torch) {
  if (!t.defined()) return nb::none();
  if (!torch && t.dtype() == DType::bf16) t = t.to(DType::f32);
  auto* held = new Tensor(std::move(t));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const size_t ndim = static_cast<size_t>(held->dim());
  std::vector<size_t> shape(ndim);
  for (size_t d = 0; d < ndim; ++d) shape[d] = static_cast<size_t>(held->size(static_cast<int>(d)));
  const Shape& strides = held->strides();
  const dl::dtype dtype = dtype_to_dlpack(held->dtype());
  if (torch) {
    return nb::ndarray<nb::pytorch>(held->data(), ndim, shape.data(), owner, strides.data(), dtype)
        .cast();
  }
  return nb::ndarray<nb::numpy>(held->data(), ndim, shape.data(), owner, strides.data(), dtype)
      .cast();
}

}  // namespace attn::python
