// cpu/vec16.hpp — 16-lane logical vectors whose code is native on every ISA path (isa.hpp), for a kernel family
// written once on `vf` / `vi` / `vu` and compiled once per path (isa_clones.hpp).
//
// Why: isa.hpp's vf is one 64-byte GCC vector. On avx512 that is one zmm and everything is native. Below it GCC 12
// splits + - * / & | ^ << into native halves (avx2: two ymm) or quarters (SSE2: four xmm), but it lowers 64-byte
// comparisons and vector `?:` lane by lane (vcomiss and a branch per lane: `a > b ? a : b` is 16 vmaxss, a
// select on a compare 16 vcomiss + branches), and __builtin_shufflevector / __builtin_convertvector through the
// stack (vinsertps / vextractps). Attention's exp, online softmax, masks and transposes are made of exactly those,
// so its avx2 path ran ~6-9x its avx512 time on one CPU. SSE2 does the same at 32 and 64 bytes.
//
// What: below avx512 a logical vector is a struct of P native GCC vectors (`Split<E>`: P = 2 parts of 8 lanes on
// avx2, P = 4 parts of 4 lanes at the SSE2 baseline) with always-inline operators doing each part's operation, so
// every comparison, select and shuffle is one the compiler lowers natively (vcmpps + vblendvps, vmaxps,
// vbroadcastss, vshufps / vperm2f128, vpmovzxwd; cmpps + and/andnot/or at SSE2). Lane i is lane i % W of
// part i / W (W = 16 / P), so a lanewise operation computes what the 64-byte vector computes, and the cross-lane
// helpers (hsum16, transpose16) keep isa.hpp's order of operations. On avx512 the kit is isa.hpp's GCC vectors.
// A struct cannot take the language's vector `?:` or a brace list of lanes, so kernels write those with helpers
// every path provides, and read the same on every path:
//   vf vi vu          16 float / int32 / uint32 lanes; (vf)x, (vi)x, (vu)x reinterpret the bits; vf{} is zero
//   a op b            + - * / (a scalar on either side too), & | ^ ~ << >> on vi / vu, unary -; a comparison
//                     gives a vi mask (-1 true, 0 false); `mask && flag` is mask & (flag ? -1 : 0) (GCC's form)
//   vsel(m, a, b)     m ? a : b lane by lane (the vector `?:`)
//   vmax(a, b)        a > b ? a : b
//   vload vstore      16 floats from / to memory (unaligned); viload: 16 int32; vload_bf16: 16 bf16 widened
//                     exactly to f32
//   vset viset        a scalar in every lane; iota(): lanes 0, 1, ..., 15
//   hsum16            isa.hpp's fixed tree: halves, then quarters, then pairs
//   transpose16       in-register 16 x 16 transpose
//   vexp_upto88 vexp  e^x (Cephes expf, ~1e-7): exactly 0 below -87; vexp saturates at e^88
// Included by a family's kernels (the #if defined(DEW_CPU_ISA) part, at namespace scope), so once per path inside
// that path's namespace and `#pragma GCC target` region: its names hide isa.hpp's there, and every helper is
// compiled for the path that inlines it. That matters: GCC 12 gimplifies a vector `?:` or comparison in the
// target of the function that holds it, so a select helper defined outside the region (default target) stays
// lane by lane even inlined into an avx512 or avx2 function. The one header a family's kernels may include
// (isa_clones.hpp): it includes nothing (the family's first pass includes <immintrin.h>: the avx2 bf16 load is
// an intrinsic), and defines only always-inline functions and types of the path's own namespace, so no code of
// one path can stand in for another's.
#ifndef DEW_CPU_ISA
#error "vec16.hpp is included by a family's kernels, once per path (isa_clones.hpp)"
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // vector arguments of always-inline helpers

#if defined(DEW_CPU_ISA_IS_AVX512)
// ---- avx512: isa.hpp's 64-byte GCC vectors (one zmm, everything native).
using ::dew::cpu::hsum16;
using ::dew::cpu::vf;
using ::dew::cpu::vi;
using ::dew::cpu::viset;
using ::dew::cpu::vload;
using ::dew::cpu::vset;  // the shuffle of lane 0 (isa.hpp)
using ::dew::cpu::vstore;
using ::dew::cpu::vu;

DEW_AI vi viload(const int32_t* p) {
  vi v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
DEW_AI vf vload_bf16(const uint16_t* p) {  // one vpmovzxwd from memory (GCC 12 lowers a convertvector to halves)
  return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
}
DEW_AI vi iota() { return vi{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
template <class V>
DEW_AI V vsel(const vi& m, const V& a, const V& b) {
  return m ? a : b;
}
DEW_AI vf vmax(const vf& a, const vf& b) { return a > b ? a : b; }
// Four butterfly stages, stage K swapping bit K of the row index with bit K of the lane index.
DEW_AI void transpose16(vf (&x)[16]) {
#pragma GCC unroll 16
  for (int r = 0; r < 16; r += 2) {
    const vf a = x[r], b = x[r + 1];
    x[r] = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    x[r + 1] = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    if (r & 2) continue;
    const vf a = x[r], b = x[r + 2];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    x[r + 2] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    if (r & 4) continue;
    const vf a = x[r], b = x[r + 4];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    x[r + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 8; ++r) {
    const vf a = x[r], b = x[r + 8];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    x[r + 8] = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}

#else
// ---- avx2 / portable: Split<E>, 16 lanes of E as kVecParts native vectors of kVecW lanes.
#if defined(DEW_CPU_ISA_IS_AVX2)
constexpr int kVecParts = 2;  // two ymm
typedef float vpart_f __attribute__((vector_size(32)));
typedef int32_t vpart_i __attribute__((vector_size(32)));
typedef uint32_t vpart_u __attribute__((vector_size(32)));
typedef uint16_t vpart_h __attribute__((vector_size(16)));  // the bf16 bits of one part
#else
constexpr int kVecParts = 4;  // four xmm
typedef float vpart_f __attribute__((vector_size(16)));
typedef int32_t vpart_i __attribute__((vector_size(16)));
typedef uint32_t vpart_u __attribute__((vector_size(16)));
typedef uint16_t vpart_h __attribute__((vector_size(8)));
#endif
constexpr int kVecW = 16 / kVecParts;

template <class E>
struct VecPart;
template <>
struct VecPart<float> {
  typedef vpart_f type;
};
template <>
struct VecPart<int32_t> {
  typedef vpart_i type;
};
template <>
struct VecPart<uint32_t> {
  typedef vpart_u type;
};

template <class E>
struct Split {
  typedef typename VecPart<E>::type part;
  typedef Split<int32_t> mask;
  static constexpr int P = kVecParts;
  part p[P];

  Split() = default;  // vf{} is zero (value-initialisation), `vf x;` is uninitialised
  // (vf)x and friends: the same bits read as another element type (the GCC vector cast)
  template <class F>
  DEW_AI explicit Split(const Split<F>& o) {
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) p[i] = (part)o.p[i];
  }

#define DEW_VEC16_LOOP(expr) _Pragma("GCC unroll 4") for (int i = 0; i < P; ++i) r.p[i] = (expr)
#define DEW_VEC16_BINARY(op)                                                  \
  friend DEW_AI Split operator op(const Split& a, const Split& b) {           \
    Split r;                                                                  \
    DEW_VEC16_LOOP(a.p[i] op b.p[i]);                                         \
    return r;                                                                 \
  }                                                                           \
  friend DEW_AI Split operator op(const Split& a, E s) {                      \
    Split r;                                                                  \
    DEW_VEC16_LOOP(a.p[i] op s);                                              \
    return r;                                                                 \
  }                                                                           \
  friend DEW_AI Split operator op(E s, const Split& a) {                      \
    Split r;                                                                  \
    DEW_VEC16_LOOP(s op a.p[i]);                                              \
    return r;                                                                 \
  }                                                                           \
  DEW_AI Split& operator op##=(const Split& b) { return *this = *this op b; } \
  DEW_AI Split& operator op##=(E s) { return *this = *this op s; }
  DEW_VEC16_BINARY(+)
  DEW_VEC16_BINARY(-)
  DEW_VEC16_BINARY(*)
  DEW_VEC16_BINARY(/)
#undef DEW_VEC16_BINARY

  // integer lanes only (SFINAE on the element type)
#define DEW_VEC16_INT(op)                                           \
  template <class X = E, class = decltype(X() op X())>              \
  friend DEW_AI Split operator op(const Split& a, const Split& b) { \
    Split r;                                                        \
    DEW_VEC16_LOOP(a.p[i] op b.p[i]);                               \
    return r;                                                       \
  }                                                                 \
  template <class X = E, class = decltype(X() op X())>              \
  DEW_AI Split& operator op##=(const Split& b) {                    \
    return *this = *this op b;                                      \
  }
  DEW_VEC16_INT(&)
  DEW_VEC16_INT(|)
  DEW_VEC16_INT(^)
#undef DEW_VEC16_INT
#define DEW_VEC16_SHIFT(op)                                \
  template <class X = E, class = decltype(X() op 1)>       \
  friend DEW_AI Split operator op(const Split& a, int n) { \
    Split r;                                               \
    DEW_VEC16_LOOP(a.p[i] op n);                           \
    return r;                                              \
  }
  DEW_VEC16_SHIFT(<<)
  DEW_VEC16_SHIFT(>>)
#undef DEW_VEC16_SHIFT
  friend DEW_AI Split operator-(const Split& a) {
    Split r;
    DEW_VEC16_LOOP(-a.p[i]);
    return r;
  }
  template <class X = E, class = decltype(~X())>
  friend DEW_AI Split operator~(const Split& a) {
    Split r;
    DEW_VEC16_LOOP(~a.p[i]);
    return r;
  }

#define DEW_VEC16_COMPARE(op)                                      \
  friend DEW_AI mask operator op(const Split& a, const Split& b) { \
    mask r;                                                        \
    DEW_VEC16_LOOP((vpart_i)(a.p[i] op b.p[i]));                   \
    return r;                                                      \
  }
  DEW_VEC16_COMPARE(<)
  DEW_VEC16_COMPARE(<=)
  DEW_VEC16_COMPARE(>)
  DEW_VEC16_COMPARE(>=)
  DEW_VEC16_COMPARE(==)
  DEW_VEC16_COMPARE(!=)
#undef DEW_VEC16_COMPARE

  // a mask and a scalar flag, as GCC's `vector && scalar`: (mask != 0) & (flag ? -1 : 0)
  template <class X = E, class = decltype(X() & X())>
  friend DEW_AI mask operator&&(const Split& m, bool flag) {
    mask r;
    const int32_t f = flag ? -1 : 0;
    DEW_VEC16_LOOP((vpart_i)(m.p[i] != 0) & f);
    return r;
  }
#undef DEW_VEC16_LOOP
};

using vf = Split<float>;
using vi = Split<int32_t>;
using vu = Split<uint32_t>;

// part by part (one memcpy of the whole struct became an aggregate copy through the stack in 16-byte pieces)
template <class E>
DEW_AI Split<E> load_parts(const E* p) {
  Split<E> v;
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) __builtin_memcpy(&v.p[i], p + i * kVecW, sizeof v.p[i]);
  return v;
}
DEW_AI vf vload(const float* p) { return load_parts(p); }
DEW_AI void vstore(float* p, const vf& v) {
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) __builtin_memcpy(p + i * kVecW, &v.p[i], sizeof v.p[i]);
}
DEW_AI vi viload(const int32_t* p) { return load_parts(p); }
DEW_AI vf vload_bf16(const uint16_t* p) {
  vf r;
#if defined(DEW_CPU_ISA_IS_AVX2)
  // vpmovzxwd from memory per part: GCC 12 lowers the convertvector below to xmm halves and a vinserti128
  for (int i = 0; i < kVecParts; ++i)
    r.p[i] = (vpart_f)_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * kVecW))), 16);
#else
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) {
    vpart_h h;
    __builtin_memcpy(&h, p + i * kVecW, sizeof h);
    r.p[i] = (vpart_f)(__builtin_convertvector(h, vpart_u) << 16);
  }
#endif
  return r;
}
// lane 0 shuffled into every lane of a part (vbroadcastss / shufps), that register in every part
template <class E>
DEW_AI Split<E> splat(E s) {
  typedef typename Split<E>::part part;
  const part one = {s};
#if defined(DEW_CPU_ISA_IS_AVX2)
  const part all = __builtin_shufflevector(one, one, 0, 0, 0, 0, 0, 0, 0, 0);
#else
  const part all = __builtin_shufflevector(one, one, 0, 0, 0, 0);
#endif
  Split<E> r;
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) r.p[i] = all;
  return r;
}
DEW_AI vf vset(float s) { return splat(s); }
DEW_AI vi viset(int32_t s) { return splat(s); }
DEW_AI vi iota() {
#if defined(DEW_CPU_ISA_IS_AVX2)
  const vpart_i first = {0, 1, 2, 3, 4, 5, 6, 7};
#else
  const vpart_i first = {0, 1, 2, 3};
#endif
  vi r;
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) r.p[i] = first + i * kVecW;
  return r;
}
template <class V>
DEW_AI V vsel(const vi& m, const V& a, const V& b) {
  V r;
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) r.p[i] = m.p[i] ? a.p[i] : b.p[i];
  return r;
}
DEW_AI vf vmax(const vf& a, const vf& b) {
  vf r;
#pragma GCC unroll 4
  for (int i = 0; i < kVecParts; ++i) r.p[i] = a.p[i] > b.p[i] ? a.p[i] : b.p[i];
  return r;
}
// isa.hpp's tree: lanes [0, 8) + [8, 16), then [0, 4) + [4, 8) of that, then (b0 + b2) + (b1 + b3).
DEW_AI float hsum16(const vf& v) {
  typedef float v4 __attribute__((vector_size(16)));
#if defined(DEW_CPU_ISA_IS_AVX2)
  const vpart_f a = v.p[0] + v.p[1];
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#else
  const v4 b = (v.p[0] + v.p[2]) + (v.p[1] + v.p[3]);
#endif
  return (b[0] + b[2]) + (b[1] + b[3]);
}
// The avx512 path's butterfly (stage K swaps bit K of the row index with bit K of the lane index), the stages
// whose lane bit is at or above the part width moving whole parts (no instruction), the others shuffling in parts.
DEW_AI void transpose16(vf (&x)[16]) {
  constexpr int P = kVecParts;
#pragma GCC unroll 16
  for (int r = 0; r < 16; r += 2) {  // stage 0: single lanes
    const vf a = x[r], b = x[r + 1];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
#if defined(DEW_CPU_ISA_IS_AVX2)
      x[r].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 0, 8, 2, 10, 4, 12, 6, 14);
      x[r + 1].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 1, 9, 3, 11, 5, 13, 7, 15);
#else
      x[r].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 0, 4, 2, 6);
      x[r + 1].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 1, 5, 3, 7);
#endif
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {  // stage 1: pairs of lanes
    if (r & 2) continue;
    const vf a = x[r], b = x[r + 2];
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
#if defined(DEW_CPU_ISA_IS_AVX2)
      x[r].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 0, 1, 8, 9, 4, 5, 12, 13);
      x[r + 2].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 2, 3, 10, 11, 6, 7, 14, 15);
#else
      x[r].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 0, 1, 4, 5);
      x[r + 2].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 2, 3, 6, 7);
#endif
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {  // stage 2: quads of lanes (inside a part of 8; whole parts of 4)
    if (r & 4) continue;
    const vf a = x[r], b = x[r + 4];
#if defined(DEW_CPU_ISA_IS_AVX2)
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      x[r].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 0, 1, 2, 3, 8, 9, 10, 11);
      x[r + 4].p[i] = __builtin_shufflevector(a.p[i], b.p[i], 4, 5, 6, 7, 12, 13, 14, 15);
    }
#else
    x[r].p[0] = a.p[0], x[r].p[1] = b.p[0], x[r].p[2] = a.p[2], x[r].p[3] = b.p[2];
    x[r + 4].p[0] = a.p[1], x[r + 4].p[1] = b.p[1], x[r + 4].p[2] = a.p[3], x[r + 4].p[3] = b.p[3];
#endif
  }
#pragma GCC unroll 16
  for (int r = 0; r < 8; ++r) {  // stage 3: octets of lanes (whole parts)
    const vf a = x[r], b = x[r + 8];
#pragma GCC unroll 4
    for (int i = 0; i < P / 2; ++i) {
      x[r].p[i] = a.p[i], x[r].p[P / 2 + i] = b.p[i];
      x[r + 8].p[i] = a.p[P / 2 + i], x[r + 8].p[P / 2 + i] = b.p[P / 2 + i];
    }
  }
}
#endif

// ---- shared on every path: e^x in 16 lanes (Cephes expf, relative error ~1e-7; attention's softmax and the loss)

// e^x for x <= 88 (softmax arguments are <= 0); exactly 0 below -87, so exp(-inf) = 0 (far below -87 the
// integer exponent is garbage, but the final select discards it).
DEW_AI vf vexp_upto88(const vf& x) {
  const vf magic = vset(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const vf t = x * vset(1.44269504088896341f) + magic;
  const vf n = t - magic;
  const vu ni = (vu)t - (vu)viset(0x4B400000);  // n as an integer (unsigned: no signed overflow on garbage)
  vf r = x - n * vset(0.693359375f);
  r = r - n * vset(-2.12194440e-4f);
  vf p = vset(1.9875691500e-4f);
  p = p * r + vset(1.3981999507e-3f);
  p = p * r + vset(8.3334519073e-3f);
  p = p * r + vset(4.1665795894e-2f);
  p = p * r + vset(1.6666665459e-1f);
  p = p * r + vset(5.0000001201e-1f);
  const vf e = p * (r * r) + r + vset(1.0f);
  const vf res = e * (vf)((ni + (vu)viset(127)) << 23);  // e * 2^n
  return vsel(x < vset(-87.0f), vf{}, res);
}
// e^x for any x; saturates at e^88.
DEW_AI vf vexp(const vf& x) { return vexp_upto88(vsel(x > vset(88.0f), vset(88.0f), x)); }

#pragma GCC diagnostic pop
