// dew/dtype.hpp — element types and the bf16/f16 <-> f32 conversions every backend shares.
// Invariants: conversions round to nearest even; NaN stays NaN. dtype names are the ones configs and
// checkpoints use ("f32", "bf16", ...). i8 is the storage of quantized decode weights (TensorImpl::scales,
// dew/tensor.hpp); it is appended last so the other values keep their numbers.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dew {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, i8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::u8:
    case DType::i8:
      return 1;
  }
  return 0;
}
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
const char* dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // throws UsageError naming the known dtypes

// Machine epsilon of the storage format (used by the conformance tolerances).
constexpr double dtype_epsilon(DType t) {
  switch (t) {
    case DType::f64:
      return 2.220446049250313e-16;
    case DType::f32:
      return 1.1920928955078125e-07;
    case DType::bf16:
      return 0.0078125;
    case DType::f16:
      return 0.0009765625;
    default:
      return 0.0;
  }
}

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
inline float bf16_to_f32(bf16_t h) { return f32_from_bits(uint32_t(h.bits) << 16); }

float f16_to_f32(f16_t h);
f16_t f32_to_f16(float f);

}  // namespace dew
