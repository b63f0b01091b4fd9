// core/tensor/dtype.cpp — dtype names and IEEE half conversions (round to nearest even).
#include "dew/dtype.hpp"

#include "dew/error.hpp"

namespace dew {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::i8:
      return "i8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::i8})
    if (name == dtype_name(t)) return t;
  DEW_USAGE_CHECK(false, "unknown dtype '", name, "'; known: f32, f64, bf16, f16, i32, i64, u8, i8");
  return DType::f32;
}

float f16_to_f32(f16_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // subnormal: normalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return f32_from_bits(sign | uint32_t(127 - 15 - e) << 23 | (mant << 13));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

f16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};   // nan
  if (absu >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // overflow -> inf (incl. rounding)
  if (absu < 0x38800000u) {                                    // subnormal or zero in f16
    if (absu < 0x33000000u) return {uint16_t(sign)};
    const uint32_t e = absu >> 23;
    const uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    const int shift = int(126 - e);  // 14 + (112 - e) ... mantissa shift to f16 subnormal
    const uint32_t val = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = val + ((rem > half || (rem == half && (val & 1))) ? 1 : 0);
    return {uint16_t(sign | r)};
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return {uint16_t(sign | (r >> 13))};
}

}  // namespace dew
