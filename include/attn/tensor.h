// attn::Tensor: a dtype, a shape (up to 8 dims) and strides (in elements, any sign but >= 0 here) over
// shared storage. Owning tensors are 64-byte aligned and contiguous; slicing, transposing, expanding
// (stride 0) and selecting are views that share the storage. Copies happen only when asked
// (contiguous(), clone(), to()).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attn/dtype.h"
#include "attn/error.h"
#include "attn/shape.h"

namespace attn {

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() == false

  // Owning, contiguous, 64-byte aligned. empty() leaves the memory uninitialised.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor full(const Shape& shape, double value, DType dtype);
  // Copies `values` (row-major) into a new tensor of `dtype`.
  static Tensor from_vector(const Shape& shape, std::span<const double> values, DType dtype);
  static Tensor from_vector(const Shape& shape, std::initializer_list<double> values, DType dtype);
  // A non-owning view of memory the caller keeps alive. Strides in elements; empty = contiguous.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, const Shape& strides = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int d) const;    // negative d counts from the end
  int64_t stride(int d) const;  // negative d counts from the end
  int64_t numel() const;
  size_t itemsize() const { return dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 3, 4]"

  void* data() const;  // address of element [0, 0, ...]
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Views (share storage).
  Tensor slice(int d, int64_t start, int64_t stop, int64_t step = 1) const;
  Tensor select(int d, int64_t index) const;  // drops dim d
  Tensor transpose(int a, int b) const;
  Tensor permute(const std::vector<int>& order) const;
  Tensor unsqueeze(int d) const;
  Tensor squeeze(int d) const;  // dim d must have size 1
  // NumPy broadcasting to `shape`, stride 0 on new/size-1 dims
  Tensor expand(const Shape& shape) const;
  Tensor view(const Shape& shape) const;     // requires a compatible layout; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view when possible, else a contiguous copy
  // A view with explicit shape and strides (elements), starting `offset` elements after data(). The
  // caller guarantees that every addressed element lies inside the storage.
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset = 0) const;

  // Copies.
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor clone() const;
  // converted contiguous copy (returns a copy even for the same dtype)
  Tensor to(DType dtype) const;
  void copy_from(const Tensor& src);  // same shape (src may broadcast), converts dtype

  // Element access by multi-index, converting through double (for tests and small tools).
  double at(std::initializer_list<int64_t> index) const;
  double at(std::span<const int64_t> index) const;
  void set(std::initializer_list<int64_t> index, double value);
  void set(std::span<const int64_t> index, double value);
  std::vector<double> to_vector() const;  // row-major values as double
  void fill(double value);

 private:
  std::shared_ptr<void> storage_;
  char* base_ = nullptr;  // element [0, ...] of this view
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
};

// Row-major strides of a shape; throws attn::Error when the element count overflows int64.
Shape contiguous_strides(const Shape& shape);
// Product of dims with overflow checking; `what` names the caller for the message.
int64_t checked_numel(const Shape& shape, const char* what);
// NumPy broadcasting of two shapes; throws attn::Error naming `what` on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what);
std::string shape_to_string(const Shape& shape);

// Reads one element of `dtype` at `p` as double / writes one, rounding as the dtype requires.
double load_as_double(const void* p, DType dtype);
void store_from_double(void* p, DType dtype, double value);

}  // namespace attn
