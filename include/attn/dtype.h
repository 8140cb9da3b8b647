// Element types and the 16-bit float conversions (round to nearest, ties to even).
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace attn {

// i8: the elements of quantized KV caches (attn/paged.h), each standing for its value times a scale.
enum class DType : uint8_t { f64, f32, bf16, f16, boolean, i32, i64, i8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::boolean:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::i8:
      return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::boolean:
      return "bool";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::i8:
      return "i8";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// Parses "f64", "f32", "bf16", "f16" (and "float64"/"float32"/"bfloat16"/"float16"); throws attn::Error.
DType parse_dtype(const std::string& name);

// bfloat16: the top 16 bits of an f32, rounded to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16, round to nearest even, overflow to inf, gradual underflow.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace attn
