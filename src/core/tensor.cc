#include "attn/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "core/storage_cache.h"

namespace attn {

void Shape::too_many(size_t n) {
  throw Error(fmt::format("attn::Shape: {} dims, more than the maximum of {}", n, kMaxDims));
}

namespace {

int normalize_dim(int d, int rank, const char* what) {
  int r = d < 0 ? d + rank : d;
  if (r < 0 || r >= rank) {
    throw Error(fmt::format("attn::Tensor::{}: dim {} out of range for a tensor of rank {}", what,
                            d, rank));
  }
  return r;
}

void check_rank(size_t rank, const char* what) {
  if (rank > static_cast<size_t>(kMaxDims)) {
    throw Error(fmt::format("attn::Tensor::{}: rank {} exceeds the maximum of {} dims", what, rank,
                            kMaxDims));
  }
}

// Calls fn(offset_in_elements) for every element in row-major order.
template <class Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
  const int rank = static_cast<int>(shape.size());
  for (int64_t s : shape)
    if (s == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t off = 0;
  while (true) {
    fn(off);
    int d = rank - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Walks two layouts of the same shape in lockstep: fn(offset_a, offset_b).
template <class Fn>
void for_each_offset2(const Shape& shape, const Shape& sa, const Shape& sb, Fn&& fn) {
  const int rank = static_cast<int>(shape.size());
  for (int64_t s : shape)
    if (s == 0) return;
  int64_t idx[kMaxDims] = {};
  int64_t oa = 0, ob = 0;
  while (true) {
    fn(oa, ob);
    int d = rank - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

DType parse_dtype(const std::string& name) {
  if (name == "f64" || name == "float64") return DType::f64;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16") return DType::f16;
  throw Error(
      fmt::format("attn::parse_dtype: unknown dtype '{}' (expected f64, f32, bf16 or f16)", name));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (absu >= 0x38800000u) {                                              // normal in f16
    uint32_t mant_round = absu + 0xfffu + ((absu >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((mant_round - 0x38000000u) >> 13));
  }
  // Subnormal (or zero) in f16: value = absf * 2^24 rounded to an integer number of 2^-24 units.
  const float absf = std::bit_cast<float>(absu);
  const float scaled = absf * 16777216.0f;  // exact: power-of-two scaling of a value < 2^-14
  const float r = std::nearbyint(scaled);   // default rounding mode: ties to even
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

double load_as_double(const void* p, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return *static_cast<const double*>(p);
    case DType::f32:
      return *static_cast<const float*>(p);
    case DType::bf16:
      return bf16_to_f32(*static_cast<const uint16_t*>(p));
    case DType::f16:
      return f16_to_f32(*static_cast<const uint16_t*>(p));
    case DType::boolean:
      return *static_cast<const uint8_t*>(p) ? 1.0 : 0.0;
    case DType::i32:
      return *static_cast<const int32_t*>(p);
    case DType::i64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::i8:
      return *static_cast<const int8_t*>(p);
  }
  return 0;
}

void store_from_double(void* p, DType dtype, double v) {
  switch (dtype) {
    case DType::f64:
      *static_cast<double*>(p) = v;
      return;
    case DType::f32:
      *static_cast<float*>(p) = static_cast<float>(v);
      return;
    // Two roundings (double -> f32 -> 16 bit) can differ from one in rare ties; inputs are f32 in practice.
    case DType::bf16:
      *static_cast<uint16_t*>(p) = f32_to_bf16(static_cast<float>(v));
      return;
    case DType::f16:
      *static_cast<uint16_t*>(p) = f32_to_f16(static_cast<float>(v));
      return;
    case DType::boolean:
      *static_cast<uint8_t*>(p) = v != 0.0;
      return;
    // Out-of-range float -> int conversion is undefined behaviour: saturate, NaN -> 0.
    case DType::i32:
      *static_cast<int32_t*>(p) =
          std::isnan(v) ? 0 : static_cast<int32_t>(std::clamp(v, -2147483648.0, 2147483647.0));
      return;
    case DType::i64:
      *static_cast<int64_t*>(p) = std::isnan(v)                ? 0
                                  : v >= 9223372036854775808.0 ? std::numeric_limits<int64_t>::max()
                                  : v < -9223372036854775808.0 ? std::numeric_limits<int64_t>::min()
                                                               : static_cast<int64_t>(v);
      return;
    case DType::i8:  // as i32: toward zero, saturating, NaN -> 0
      *static_cast<int8_t*>(p) =
          std::isnan(v) ? 0 : static_cast<int8_t>(std::clamp(v, -128.0, 127.0));
      return;
  }
}

std::string shape_to_string(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t checked_numel(const Shape& shape, const char* what) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0)
      throw Error(fmt::format("{}: negative dimension in shape {}", what, shape_to_string(shape)));
    // The overflow test of the product itself: a division per dim cost ~2% of a small call.
    if (__builtin_mul_overflow(n, s, &n)) {
      throw Error(fmt::format("{}: element count of shape {} overflows int64", what,
                              shape_to_string(shape)));
    }
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  checked_numel(shape, "attn::contiguous_strides");
  Shape st(shape.size());
  int64_t acc = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    // A zero dim makes numel 0 but not the strides: [0, 2^40, 2^40] must not overflow here either.
    const int64_t s = std::max<int64_t>(shape[d], 1);
    if (d > 0 && __builtin_mul_overflow(acc, s, &acc)) {  // the last product is not needed
      throw Error(fmt::format("attn::contiguous_strides: strides of shape {} overflow int64",
                              shape_to_string(shape)));
    }
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw Error(fmt::format("{}: shapes {} and {} do not broadcast", what, shape_to_string(a),
                              shape_to_string(b)));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_rank(shape.size(), "empty");
  const int64_t n = checked_numel(shape, "attn::Tensor::empty");
  const auto item = static_cast<int64_t>(dtype_size(dtype));
  if (n > std::numeric_limits<int64_t>::max() / item - 64) {
    throw Error(fmt::format("attn::Tensor::empty: byte size of a {} tensor of shape {} overflows",
                            dtype_name(dtype), shape_to_string(shape)));
  }
  size_t bytes = static_cast<size_t>(n * item);
  if (bytes == 0) bytes = 64;
  std::shared_ptr<void> storage = detail::allocate_storage(bytes);
  if (!storage) {
    throw Error(
        fmt::format("attn::Tensor::empty: cannot allocate {} bytes for a {} tensor of shape {}",
                    bytes, dtype_name(dtype), shape_to_string(shape)));
  }
  Tensor t;
  t.base_ = static_cast<char*>(storage.get());
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.base_, 0, static_cast<size_t>(t.numel()) * t.itemsize());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, std::span<const double> values, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw Error(fmt::format("attn::Tensor::from_vector: {} values for shape {} ({} elements)",
                            values.size(), shape_to_string(shape), t.numel()));
  }
  for (size_t i = 0; i < values.size(); ++i)
    store_from_double(t.base_ + i * t.itemsize(), dtype, values[i]);
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, std::initializer_list<double> values, DType dtype) {
  return from_vector(shape, std::span<const double>(values.begin(), values.size()), dtype);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, const Shape& strides) {
  check_rank(shape.size(), "from_blob");
  checked_numel(shape, "attn::Tensor::from_blob");
  if (!strides.empty() && strides.size() != shape.size()) {
    throw Error(fmt::format("attn::Tensor::from_blob: {} strides for shape {}", strides.size(),
                            shape_to_string(shape)));
  }
  if (!data) throw Error("attn::Tensor::from_blob: data is null");
  Tensor t;
  t.storage_ = std::shared_ptr<void>(data, [](void*) {});
  t.base_ = static_cast<char*>(data);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  return t;
}

int64_t Tensor::size(int d) const {
  return shape_[normalize_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int d) const {
  return strides_[normalize_dim(d, dim(), "stride")];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0)
    return true;  // nothing to address; contiguous_strides() keeps zero dims as size 1
  int64_t acc = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != acc) return false;
    acc *= shape_[d];
  }
  return true;
}

std::string Tensor::shape_str() const {
  return shape_to_string(shape_);
}

void* Tensor::data() const {
  return base_;
}

Tensor Tensor::slice(int d, int64_t start, int64_t stop, int64_t step) const {
  d = normalize_dim(d, dim(), "slice");
  const int64_t n = shape_[d];
  if (step <= 0)
    throw Error(fmt::format("attn::Tensor::slice: step must be positive, got {}", step));
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  Tensor t = *this;
  t.base_ += start * strides_[d] * static_cast<int64_t>(itemsize());
  t.shape_[d] = stop == start ? 0 : (stop - start - 1) / step + 1;  // no overflow for huge steps
  t.strides_[d] = strides_[d] * step;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  if (index < 0) index += shape_[d];
  if (index < 0 || index >= shape_[d]) {
    throw Error(fmt::format("attn::Tensor::select: index {} out of range for dim {} of shape {}",
                            index, d, shape_str()));
  }
  Tensor t = *this;
  t.base_ += index * strides_[d] * static_cast<int64_t>(itemsize());
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  a = normalize_dim(a, dim(), "transpose");
  b = normalize_dim(b, dim(), "transpose");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  if (static_cast<int>(order.size()) != dim()) {
    throw Error(
        fmt::format("attn::Tensor::permute: {} axes for a tensor of rank {}", order.size(), dim()));
  }
  Tensor t = *this;
  std::vector<bool> seen(dim(), false);
  for (int i = 0; i < dim(); ++i) {
    const int src = normalize_dim(order[i], dim(), "permute");
    if (seen[src]) throw Error("attn::Tensor::permute: repeated axis");
    seen[src] = true;
    t.shape_[i] = shape_[src];
    t.strides_[i] = strides_[src];
  }
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  check_rank(shape_.size() + 1, "unsqueeze");
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Tensor t = *this;
  const int64_t st = d < dim() ? strides_[d] * shape_[d] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, st);
  return t;
}

Tensor Tensor::squeeze(int d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (shape_[d] != 1) {
    throw Error(fmt::format("attn::Tensor::squeeze: dim {} of shape {} is not 1", d, shape_str()));
  }
  return select(d, 0);
}

Tensor Tensor::expand(const Shape& shape) const {
  check_rank(shape.size(), "expand");
  if (shape.size() < shape_.size()) {
    throw Error(fmt::format("attn::Tensor::expand: cannot expand shape {} to fewer dims {}",
                            shape_str(), shape_to_string(shape)));
  }
  checked_numel(shape, "attn::Tensor::expand");  // no negative dims, no overflowing element count
  const size_t lead = shape.size() - shape_.size();
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t have = shape_[i], want = shape[lead + i];
    if (have == want) {
      t.strides_[lead + i] = strides_[i];
    } else if (have == 1) {
      t.strides_[lead + i] = 0;
    } else {
      throw Error(fmt::format("attn::Tensor::expand: shape {} does not broadcast to {}",
                              shape_str(), shape_to_string(shape)));
    }
  }
  return t;
}

Tensor Tensor::view(const Shape& shape_in) const {
  Shape shape = shape_in;
  check_rank(shape.size(), "view");
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw Error("attn::Tensor::view: more than one -1 in the shape");
      infer = static_cast<int>(i);
    } else {
      if (shape[i] < 0) {
        throw Error(fmt::format("attn::Tensor::view: negative dimension in shape {}",
                                shape_to_string(shape_in)));
      }
      if (shape[i] != 0 && known > std::numeric_limits<int64_t>::max() / shape[i]) {
        throw Error(fmt::format("attn::Tensor::view: element count of shape {} overflows int64",
                                shape_to_string(shape_in)));
      }
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0) {
      throw Error(fmt::format(
          "attn::Tensor::view: cannot infer the -1 of shape {} from {} elements of shape {}",
          shape_to_string(shape_in), numel(), shape_str()));
    }
    shape[infer] = numel() / known;
  }
  if (checked_numel(shape, "attn::Tensor::view") != numel()) {
    throw Error(fmt::format("attn::Tensor::view: shape {} does not match {} elements of shape {}",
                            shape_to_string(shape_in), numel(), shape_str()));
  }
  if (!is_contiguous()) {
    throw Error(fmt::format(
        "attn::Tensor::view: tensor of shape {} is not contiguous; use reshape()", shape_str()));
  }
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (is_contiguous()) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  check_rank(shape.size(), "as_strided");
  if (shape.size() != strides.size()) {
    throw Error(fmt::format("attn::Tensor::as_strided: shape {} and strides {} differ in rank",
                            shape_to_string(shape), shape_to_string(strides)));
  }
  checked_numel(shape, "attn::Tensor::as_strided");
  Tensor t = *this;
  t.base_ += offset * static_cast<int64_t>(itemsize());
  t.shape_ = shape;
  t.strides_ = strides;
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

namespace {

// The dtype pairs copied a row at a time in one tight loop (the same dtype, f32 <-> bf16: the copies
// and conversions of the nn layers); the rest go element by element.
bool has_row_copy(DType from, DType to) {
  return from == to || (from == DType::f32 && to == DType::bf16) ||
         (from == DType::bf16 && to == DType::f32);
}

// n contiguous elements from s (dtype `from`) to d (dtype `to`), a pair has_row_copy accepts.
void copy_row(const char* s, DType from, char* d, DType to, int64_t n) {
  if (from == to) {
    std::memmove(d, s, static_cast<size_t>(n) * dtype_size(to));
  } else if (from == DType::f32) {
    const auto* f = reinterpret_cast<const float*>(s);
    auto* h = reinterpret_cast<uint16_t*>(d);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(f[i]);
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(s);
    auto* f = reinterpret_cast<float*>(d);
    for (int64_t i = 0; i < n; ++i) f[i] = bf16_to_f32(h[i]);
  }
}

}  // namespace

void Tensor::copy_from(const Tensor& src_in) {
  const Tensor src = src_in.shape_ == shape_ ? src_in : src_in.expand(shape_);
  char* dst = base_;
  const size_t di = itemsize(), si = src.itemsize();
  const bool rows = has_row_copy(src.dtype_, dtype_);
  if (rows && is_contiguous() && src.is_contiguous()) {
    copy_row(src.base_, src.dtype_, dst, dtype_, numel());
    return;
  }
  // Rows of the last dim contiguous on both sides (a permuted or sliced view: the heads split or
  // merged): one copy_row per row instead of one step per element (this copy took 8-12% of an
  // encoder layer's time).
  const int rank = dim();
  if (rows && rank >= 1 && shape_[rank - 1] > 1 && strides_[rank - 1] == 1 &&
      src.strides_[rank - 1] == 1) {
    const Shape lead(shape_.begin(), shape_.end() - 1);
    const Shape lead_dst(strides_.begin(), strides_.end() - 1);
    const Shape lead_src(src.strides_.begin(), src.strides_.end() - 1);
    const int64_t n = shape_[rank - 1];
    for_each_offset2(lead, lead_dst, lead_src, [&](int64_t off, int64_t soff) {
      copy_row(src.base_ + soff * static_cast<int64_t>(si), src.dtype_,
               dst + off * static_cast<int64_t>(di), dtype_, n);
    });
    return;
  }
  for_each_offset2(shape_, strides_, src.strides_, [&](int64_t off, int64_t soff) {
    const char* s = src.base_ + soff * static_cast<int64_t>(si);
    char* d = dst + off * static_cast<int64_t>(di);
    if (src.dtype_ == dtype_) {
      std::memcpy(d, s, di);
    } else if (src.dtype_ == DType::f32 && dtype_ == DType::bf16) {
      float f;
      std::memcpy(&f, s, 4);
      const uint16_t h = f32_to_bf16(f);
      std::memcpy(d, &h, 2);
    } else if (src.dtype_ == DType::f32 && dtype_ == DType::f16) {
      float f;
      std::memcpy(&f, s, 4);
      const uint16_t h = f32_to_f16(f);
      std::memcpy(d, &h, 2);
    } else if (src.dtype_ == DType::f64 && (dtype_ == DType::bf16 || dtype_ == DType::f16)) {
      // Round once from double through f32: exact for the f32-representable values users pass.
      store_from_double(d, dtype_, load_as_double(s, src.dtype_));
    } else {
      store_from_double(d, dtype_, load_as_double(s, src.dtype_));
    }
  });
}

double Tensor::at(std::span<const int64_t> index) const {
  if (static_cast<int>(index.size()) != dim()) {
    throw Error(
        fmt::format("attn::Tensor::at: {} indices for shape {}", index.size(), shape_str()));
  }
  int64_t off = 0;
  for (int d = 0; d < dim(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d]) {
      throw Error(fmt::format("attn::Tensor::at: index {} out of range for dim {} of shape {}",
                              index[d], d, shape_str()));
    }
    off += index[d] * strides_[d];
  }
  return load_as_double(base_ + off * static_cast<int64_t>(itemsize()), dtype_);
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  return at(std::span<const int64_t>(index.begin(), index.size()));
}

void Tensor::set(std::span<const int64_t> index, double value) {
  if (static_cast<int>(index.size()) != dim()) {
    throw Error(
        fmt::format("attn::Tensor::set: {} indices for shape {}", index.size(), shape_str()));
  }
  int64_t off = 0;
  for (int d = 0; d < dim(); ++d) {
    if (index[d] < 0 || index[d] >= shape_[d]) {
      throw Error(fmt::format("attn::Tensor::set: index {} out of range for dim {} of shape {}",
                              index[d], d, shape_str()));
    }
    off += index[d] * strides_[d];
  }
  store_from_double(base_ + off * static_cast<int64_t>(itemsize()), dtype_, value);
}

void Tensor::set(std::initializer_list<int64_t> index, double value) {
  set(std::span<const int64_t>(index.begin(), index.size()), value);
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(numel()));
  for_each_offset(shape_, strides_, [&](int64_t off) {
    out.push_back(load_as_double(base_ + off * static_cast<int64_t>(itemsize()), dtype_));
  });
  return out;
}

void Tensor::fill(double value) {
  if (numel() == 0) return;
  if (value == 0.0 && !std::signbit(value) && is_contiguous()) {  // +0: all-zero bits in any dtype
    std::memset(base_, 0, static_cast<size_t>(numel()) * itemsize());
    return;
  }
  for_each_offset(shape_, strides_, [&](int64_t off) {
    store_from_double(base_ + off * static_cast<int64_t>(itemsize()), dtype_, value);
  });
}

}  // namespace attn
