// Arrays in and out of the extension. Inputs are NumPy arrays, PyTorch CPU tensors or anything else
// that speaks DLPack / the buffer protocol (Python lists and scalars go through numpy.asarray);
// they become attn::Tensor views of the caller's memory, without a copy, whatever their strides
// (attention copies a tensor itself only when its last dim is not unit-stride; nn modules when it
// is not contiguous or not of their dtype). Copies are made here only where a view cannot be:
// reversed (negative-stride) NumPy views, non-native byte order, misaligned elements, lists and
// other non-arrays, and lazily negated torch views. Outputs are attn::Tensors handed back without a
// copy as NumPy arrays, or as PyTorch tensors when any array input was one ("the caller's type").
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>  // every file casting std::string must see this caster (ODR)

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::python {

namespace nb = nanobind;

// Keeps the Python objects behind imported views alive (and records which framework they came from)
// for the duration of one call. The views stay valid while the GIL is released because these
// references do.
class ArrayScope {
 public:
  explicit ArrayScope(const char* fn) : fn_(fn) {}

  // Converts `obj` (the argument called `name`) into a view. None gives an undefined Tensor when
  // `optional`, else a TypeError. Raises TypeError for what is not an array of a supported dtype
  // (f64, f32, bf16, f16, bool, i32, i64; other integers are widened to i64 by a copy) and
  // ValueError for arrays not on the CPU or of rank > 8.
  Tensor import(nb::handle obj, const char* name, bool optional = false);

  // Whether any imported array was a torch.Tensor: outputs are then torch tensors.
  bool torch() const { return torch_; }
  const char* fn() const { return fn_; }

  // The memory behind one imported view: the Python object it belongs to (the caller's array, or
  // the copy made of it), the argument's name and the bytes the view may address.
  struct Owner {
    nb::object obj;
    std::string name;
    uintptr_t begin = 0, end = 0;  // [begin, end)
    bool torch = false;            // obj is a torch.Tensor (it has a version counter)
  };
  const std::vector<Owner>& owners() const { return owners_; }
  // Hands the owners over, for a module whose caches hold this call's views past the call.
  std::vector<Owner> release() { return std::move(owners_); }

  // export_tensor(t, torch), except that an output sharing memory with one of this call's views
  // (an identity module returns its input) keeps that view's owner alive, as a NumPy view would.
  nb::object export_result(Tensor t, bool torch) const;

 private:
  Tensor view_of(nb::object owner, const char* name, void* data, const Shape& shape, DType dtype,
                 const Shape& strides, bool from_torch);

  const char* fn_;
  bool torch_ = false;
  std::vector<Owner> owners_;
  std::vector<nb::ndarray<nb::ro, nb::device::cpu>> arrays_;
};

// Hands `t` to Python without a copy: a NumPy array, or a torch.Tensor when `torch`. The Python
// object owns the storage (a capsule holds the Tensor and `base`, when given: the object whose
// memory a view `t` reads). bf16 goes to NumPy as f32 (NumPy has no bf16): a copy.
nb::object export_tensor(Tensor t, bool torch, nb::object base = nb::object());

// Whether `obj` is a torch.Tensor (without importing torch when it is not loaded).
bool is_torch_tensor(nb::handle obj);

}  // namespace attn::python
