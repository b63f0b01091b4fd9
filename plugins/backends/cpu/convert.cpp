// cpu/convert.cpp — the f32 <-> bf16 conversions of the cast kernel, vectorised (mixed precision moves
// every activation through them; docs/precision.md).
//
// Exactly dew/dtype.hpp's conversions (the conformance suite checks cast bit for bit): f32 -> bf16 rounds
// to nearest even on the bits, keeps denormals (unlike vcvtneps2bf16, which flushes them) and turns NaN
// into a quiet NaN; bf16 -> f32 is a shift. Written branch-free so GCC vectorises the loops.
// Also here: bf16 add / sub / mul of equal shapes straight on the bf16 bits (binary_bf16_same_shape).
// ISA: compiled once per path (isa_clones.hpp) and called on the backend's path. Integer bit operations and
// one rounding per element: every path (avx512, avx2, portable) gives the same bits.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "convert.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

bool binary_bf16_same_shape(Isa isa, const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  return DEW_CPU_ISA_CALL(isa, binary_bf16_same_shape, a, b, out, op);
}
bool cast_bf16_fast(Isa isa, const Tensor& x, Tensor& out) { return DEW_CPU_ISA_CALL(isa, cast_bf16_fast, x, out); }

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but
       // bf16_bits.hpp)

#include "bf16_bits.hpp"

namespace {

void f32_to_bf16_range(const uint32_t* s, uint16_t* d, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t u = s[i];
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    d[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}
void bf16_to_f32_range(const uint16_t* s, uint32_t* d, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) d[i] = uint32_t(s[i]) << 16;
}

// o = a (op) b on bf16 bits, each element widened, combined in f32 and rounded once as above: the
// residual adds and gating multiplies of a bf16 step, without f32 copies (widen_bits / round_bits: bf16_bits.hpp).
void bf16_add(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) + widen_bits(b[i]));
}
void bf16_sub(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) - widen_bits(b[i]));
}
void bf16_mul(const uint16_t* a, const uint16_t* b, uint16_t* o, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) o[i] = round_bits(widen_bits(a[i]) * widen_bits(b[i]));
}

}  // namespace

bool binary_bf16_same_shape(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  const int64_t n = out.numel();
  if (a.numel() != n || b.numel() != n || a.dtype() != DType::bf16 || b.dtype() != DType::bf16 ||
      out.dtype() != DType::bf16 || (op != BinaryOp::add && op != BinaryOp::sub && op != BinaryOp::mul))
    return false;
  const uint16_t *pa = a.data_as<uint16_t>(), *pb = b.data_as<uint16_t>();
  uint16_t* po = out.data_as<uint16_t>();
  for_blocks(n, n >= (int64_t(1) << 16), [&](int64_t lo, int64_t hi) {
    switch (op) {
      case BinaryOp::add:
        bf16_add(pa, pb, po, lo, hi);
        break;
      case BinaryOp::sub:
        bf16_sub(pa, pb, po, lo, hi);
        break;
      default:
        bf16_mul(pa, pb, po, lo, hi);
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

#endif  // DEW_CPU_ISA
