// attn::Shape: the dims (or the strides) of a tensor, at most kMaxDims of them, held inline.
//
// Building, copying or growing a Shape allocates nothing. As a std::vector<int64_t> it did: the
// views, checks and outputs of one attn::attention call built ~60 shapes, 63 heap allocations, about
// 1 us of the call's 2 us fixed cost (AMD Zen 4). The interface is std::vector's, for what shapes
// need (iteration, indexing, push_back, insert, erase, resize, comparison), and a std::vector<int64_t>
// converts to it. More than kMaxDims values throw attn::Error naming the count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <vector>

namespace attn {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { append(dims.begin(), dims.end()); }
  explicit Shape(size_t n, int64_t value = 0) { resize(n, value); }
  template <std::input_iterator It>
  Shape(It first, It last) {
    append(first, last);
  }
  Shape(const std::vector<int64_t>& dims) { append(dims.begin(), dims.end()); }  // NOLINT: implicit

  std::vector<int64_t> to_vector() const { return std::vector<int64_t>(begin(), end()); }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  static constexpr size_t capacity() { return kMaxDims; }
  static constexpr size_t max_size() { return kMaxDims; }

  int64_t* data() { return dims_; }
  const int64_t* data() const { return dims_; }
  iterator begin() { return dims_; }
  iterator end() { return dims_ + n_; }
  const_iterator begin() const { return dims_; }
  const_iterator end() const { return dims_ + n_; }
  const_iterator cbegin() const { return dims_; }
  const_iterator cend() const { return dims_ + n_; }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  int64_t& operator[](size_t i) { return dims_[i]; }
  const int64_t& operator[](size_t i) const { return dims_[i]; }
  int64_t& front() { return dims_[0]; }
  const int64_t& front() const { return dims_[0]; }
  int64_t& back() { return dims_[n_ - 1]; }
  const int64_t& back() const { return dims_[n_ - 1]; }

  void clear() { n_ = 0; }
  void assign(size_t n, int64_t value) {
    clear();
    resize(n, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    Shape values(first, last);  // first and last may point into this shape
    *this = values;
  }
  void push_back(int64_t value) {
    grow_to(n_ + 1);
    dims_[n_++] = value;
  }
  void pop_back() { --n_; }
  void resize(size_t n, int64_t value = 0) {
    grow_to(n);
    for (size_t i = n_; i < n; ++i) dims_[i] = value;
    n_ = static_cast<uint8_t>(n);
  }
  // Inserts before pos; returns the first inserted value's position.
  iterator insert(const_iterator pos, int64_t value) { return insert(pos, &value, &value + 1); }
  iterator insert(const_iterator pos, std::initializer_list<int64_t> values) {
    return insert(pos, values.begin(), values.end());
  }
  template <std::input_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const size_t at = static_cast<size_t>(pos - begin());
    const Shape values(first, last);  // (they may be this shape's own)
    grow_to(n_ + values.n_);          // throws before anything changes
    for (size_t i = n_; i-- > at;) dims_[i + values.n_] = dims_[i];
    for (size_t i = 0; i < values.n_; ++i) dims_[at + i] = values.dims_[i];
    n_ = static_cast<uint8_t>(n_ + values.n_);
    return begin() + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const size_t a = static_cast<size_t>(first - begin()), b = static_cast<size_t>(last - begin());
    for (size_t i = b; i < n_; ++i) dims_[a + i - b] = dims_[i];
    n_ = static_cast<uint8_t>(n_ - (b - a));
    return begin() + a;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.n_ != b.n_) return false;
    for (size_t i = 0; i < a.n_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

 private:
  template <class It>
  void append(It first, It last) {
    if constexpr (std::forward_iterator<It>)
      grow_to(n_ + static_cast<size_t>(std::distance(first, last)));
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  // Throws attn::Error naming n when n values do not fit.
  static void grow_to(size_t n) {
    if (n > kMaxDims) too_many(n);
  }
  [[noreturn]] static void too_many(size_t n);

  int64_t dims_[kMaxDims] = {};
  uint8_t n_ = 0;
};

}  // namespace attn
