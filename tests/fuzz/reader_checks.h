// Invariants shared by the file-reader harnesses (npy_harness.h, safetensors_harness.h).
#pragma once
#include <cstring>
#include <exception>
#include <string>
#include <typeinfo>

#include "attn/tensor.h"
#include "fuzz/fuzz_input.h"

namespace attn::fuzz {

// Runs `read`; returns false when it rejected the file with an attn::Error starting with `fn` (the
// only allowed failure), true when it returned. Any other exception is a violation: bad_alloc means
// the reader trusted a size from the file, length_error / out_of_range / JSON errors mean unchecked
// input.
template <class Fn>
bool read_or_reject(const char* fn, Fn&& read) {
  try {
    read();
    return true;
  } catch (const Error& e) {
    require(starts_with(e.what(), fn),
            std::string(fn) + " rejected the file, but its message does not start with '" + fn +
                "': " + e.what());
    return false;
  } catch (const Violation&) {
    throw;
  } catch (const std::exception& e) {
    violation(std::string(fn) + " threw " + typeid(e).name() +
              " instead of attn::Error: " + e.what());
  }
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data(), cb.data(), static_cast<size_t>(ca.numel()) * ca.itemsize()) == 0;
}

inline bool readable_dtype(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16 ||
         t == DType::boolean || t == DType::i32 || t == DType::i64;
}

}  // namespace attn::fuzz
