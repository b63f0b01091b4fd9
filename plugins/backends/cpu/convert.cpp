// cpu/convert.cpp — the f32 <-> bf16 conversions of the cast kernel, vectorised (mixed precision moves
// every activation through them; docs/precision.md).
//
// Exactly dew/dtype.hpp's conversions (the conformance suite checks cast bit for bit): f32 -> bf16 rounds
// to nearest even on the bits, keeps denormals (unlike vcvtneps2bf16, which flushes them) and turns NaN
// into a quiet NaN; bf16 -> f32 is a shift. Written branch-free so GCC vectorises the loops; each is
// compiled for AVX-512 and for the build's baseline (AVX2), and the version is picked at run time by the
// CPU's features (__builtin_cpu_supports, as attention.cpp does), never by the build machine's flags.
// Also here: bf16 add / sub / mul of equal shapes straight on the bf16 bits (binary_bf16_same_shape).
#include "cpu_backend.hpp"

namespace dew::cpu {

namespace {

#define DEW_CONVERT_KERNELS(suffix, target)                                                     \
  target void f32_to_bf16_##suffix(const uint32_t* s, uint16_t* d, int64_t lo, int64_t hi) {   \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; ++i) {                                   \
      const uint32_t u = s[i];                                                                \
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                        \
      const uint32_t quiet_nan = (u >> 16) | 0x40u;                                           \
      d[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);                 \
    }                                                                                         \
  }                                                                                           \
  target void bf16_to_f32_##suffix(const uint16_t* s, uint32_t* d, int64_t lo, int64_t hi) {   \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; ++i) d[i] = uint32_t(s[i]) << 16;        \
  }
DEW_CONVERT_KERNELS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))))
DEW_CONVERT_KERNELS(base, )

// o = a (op) b on bf16 bits, each element widened, combined in f32 and rounded once as above: the
// residual adds and gating multiplies of a bf16 step, without f32 copies.
[[gnu::always_inline]] inline float widen_bits(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
[[gnu::always_inline]] inline uint16_t round_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}
#define DEW_BF16_BINARY_KERNELS(suffix, target)                                                                \
  target void bf16_add_##suffix(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) { \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) + widen_bits(b[i])); \
  }                                                                                                        \
  target void bf16_sub_##suffix(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) { \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) - widen_bits(b[i])); \
  }                                                                                                        \
  target void bf16_mul_##suffix(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) { \
    _Pragma("omp simd") for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) * widen_bits(b[i])); \
  }
DEW_BF16_BINARY_KERNELS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))))
DEW_BF16_BINARY_KERNELS(base, )

bool have_avx512bw() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return yes;
}

void f32_to_bf16_range(const uint32_t* s, uint16_t* d, int64_t lo, int64_t hi) {
  have_avx512bw() ? f32_to_bf16_avx512(s, d, lo, hi) : f32_to_bf16_base(s, d, lo, hi);
}
void bf16_to_f32_range(const uint16_t* s, uint32_t* d, int64_t lo, int64_t hi) {
  have_avx512bw() ? bf16_to_f32_avx512(s, d, lo, hi) : bf16_to_f32_base(s, d, lo, hi);
}

}  // namespace

bool binary_bf16_same_shape(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  const int64_t n = out.numel();
  if (a.numel() != n || b.numel() != n || a.dtype() != DType::bf16 || b.dtype() != DType::bf16 ||
      out.dtype() != DType::bf16 || (op != BinaryOp::add && op != BinaryOp::sub && op != BinaryOp::mul))
    return false;
  const uint16_t *pa = a.data_as<uint16_t>(), *pb = b.data_as<uint16_t>();
  uint16_t* po = out.data_as<uint16_t>();
  const bool wide = have_avx512bw();
  for_blocks(n, n >= (int64_t(1) << 16), [&](int64_t lo, int64_t hi) {
    switch (op) {
      case BinaryOp::add:
        wide ? bf16_add_avx512(pa, pb, po, lo, hi) : bf16_add_base(pa, pb, po, lo, hi);
        break;
      case BinaryOp::sub:
        wide ? bf16_sub_avx512(pa, pb, po, lo, hi) : bf16_sub_base(pa, pb, po, lo, hi);
        break;
      default:
        wide ? bf16_mul_avx512(pa, pb, po, lo, hi) : bf16_mul_base(pa, pb, po, lo, hi);
        break;
    }
  });
  return true;
}

bool cast_bf16_fast(const Tensor& x, Tensor& out) {
  const DType from = x.dtype(), to = out.dtype();
  const int64_t n = x.numel();
  if (n != out.numel() || n == 0) return false;
  const bool par = n >= (int64_t(1) << 16);
  if (from == DType::f32 && to == DType::bf16) {
    const uint32_t* s = x.data_as<uint32_t>();
    uint16_t* d = out.data_as<uint16_t>();
    for_blocks(n, par, [&](int64_t lo, int64_t hi) { f32_to_bf16_range(s, d, lo, hi); });
    return true;
  }
  if (from == DType::bf16 && to == DType::f32) {
    const uint16_t* s = x.data_as<uint16_t>();
    uint32_t* d = out.data_as<uint32_t>();
    for_blocks(n, par, [&](int64_t lo, int64_t hi) { bf16_to_f32_range(s, d, lo, hi); });
    return true;
  }
  return false;
}

}  // namespace dew::cpu
