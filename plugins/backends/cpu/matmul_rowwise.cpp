// cpu/matmul_rowwise.cpp — the row-wise decode products y = x W^T (matmul_rowwise.hpp), in three ISA
// paths chosen by the caller from the CPU's features (isa.hpp).
//
// Decoding is nothing but these products: one token (or one per active sequence of a server) against every
// weight, so the speed is how fast the weight streams from memory. The weight is read once for all m rows
// (blocks of J weight rows x R rows of x share their loads), each thread its own blocks of output columns.
// Invariants: every y[r, j] is formed by one thread as two 16-lane accumulators over blocks of 16 (s0 the
// even blocks, s1 the odd; s += x w, FMA on avx512 and avx2), then s0 + s1 lane by lane, a fixed tree over the
// 16 lanes (isa.hpp's hsum16: halves, quarters, pairs), then the k % 16 tail in order: R, J, m, r's place in a block
// and the thread count only decide which products share a load, never a sum's arithmetic (continuous batching's served
// = solo relies on it). avx512 holds a 16-lane vector in one zmm, avx2 in two ymm (lanes 0-7, 8-15), both with FMA, so
// avx512 and avx2 agree bit for bit; portable (GCC vectors at the baseline, no FMA) rounds each product separately.
// bf16 weights widen exactly to f32 (their bits << 16: vpmovzxwd + vpslld on the vector paths), so the bf16
// path is the f32 path on the rounded weight. int8 weights (with per-group scales) take integer blocks of 32
// against x rounded to int16 (vpmovsxbw + vpmaddwd: exact dots), or the f32 widening for other group lengths
// (matmul_rowwise.hpp says which and how they sum). Why integers: widening int8 to f32 (vpmovsxbd + vcvtdq2ps
// per 8 weights) bound the kernel at ~13.8 G weights/s on the AVX2 EPYC, under what the cache delivers.
// Weights in panels (matmul_rowwise.hpp: 32 rows a panel, column-major inside; what decoding lays its weights out
// in, dew/generate.hpp) take panel_dot_*: the weight is read in address order as one stream, a column's 32 weights
// two 16-lane vectors against x[r, i] broadcast, two FMA chains per output (even / odd columns). Why: on the Zen 5
// the row-major form read char-small's weights at 0.63 of a plain read loop over the same buffers (8 rows side by
// side, software prefetch; one row at a time: 0.85), the panels at its rate, and at 4-32 rows of x they multiply
// at twice the row-major rate (docs/benchmarks.md, session 23). Several rows of x share a pass over a panel (avx512:
// 6; avx2: 3, over half panels, its 16 ymm holding one row's whole-panel chains only; session 33).
// The epilogue (bias, alpha, activation) runs in the same call, on the columns the thread just made.
// Speed: at m == 1 a block is J1 whole weight rows (J1 independent accumulators), and while it streams, a later
// block's rows (contiguous in memory) are prefetched, one line per line loaded, so that block's misses are in
// flight before its first load (avx512: 8 rows, the next block; bf16 weights 2 rows, the block four on, which
// measured faster on the Zen 5; avx2 reads one row at a time with no software prefetch, which streams fastest
// on the AVX2 EPYC it was measured on: kJ1 below). Prefetches never fault and never change a result.
// The file is compiled once per path through isa_clones.hpp (namespaces avx512 / avx2 / portable; the
// vector paths inside `#pragma GCC target` regions, so their intrinsics and OpenMP-free helpers get the
// target); the first pass holds the dispatch and the OpenMP split over columns.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "matmul_rowwise.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_backend.hpp"  // fast_exp, silu_value, gelu_tanh_value (the elementwise family's expressions)

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector arguments: everything below is inlined

namespace dew::cpu {
// x's rows rounded to int16 per block of 32 columns (matmul_rowwise.hpp): scale absmax / 32767, values
// nearbyint(x / scale) (nearest even) in [-32767, 32767]; an all-zero block has scale 0, a block with a NaN or an
// infinity a NaN scale (and zero values). Plain scalar code at the baseline ISA: the reference the vector paths
// (quantize_rows below) equal bit for bit, and what they run on a block whose scale is not a positive number.
static void quantize_block_int16(const float* src, int16_t* xq, float* xs) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 32; ++i) {
    finite = finite && std::isfinite(src[i]);
    amax = std::max(amax, std::fabs(src[i]));
  }
  const float scale = !finite ? std::numeric_limits<float>::quiet_NaN() : amax / 32767.0f;
  *xs = scale;
  for (int i = 0; i < 32; ++i)
    xq[i] = !finite || amax == 0.0f ? 0 : int16_t(std::clamp(std::nearbyint(src[i] / scale), -32767.0f, 32767.0f));
}
}  // namespace dew::cpu

#define DEW_CPU_ISA_SELF "matmul_rowwise.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

namespace {

// Column ranges per thread are multiples of 8 (a multiple of every path's block width), so the blocks a
// thread makes are the blocks one thread would make: the split changes nothing but who computes what.
// `scales`: the weight's row scales (QuantScales, int8 weights only).
// Calls f(u0, u1) once per thread with its share [u0, u1) of `units` work units (non-empty shares only), or once
// with all of them on the caller's thread when the product is small (a weight under kSplitMinBytes and under
// kSplitMinMacs multiply-adds), with one thread, or inside a parallel region: the split of both product forms below.
// Why the bounds: a parallel region costs ~3.2 us on the Zen 5 VM (2 threads, spinning: an empty one, measured), as
// much as half of a small decode product takes; char-small's bf16 decode at 2 threads, its six 1x384x384 products
// (295 KB each) 0.045-0.051 -> 0.027-0.028 ms a token on one thread, its f32 head (393 KB) 0.009 -> 0.006, the f32
// 384x384 (590 KB) alike either way (docs/benchmarks.md, session 28).
constexpr int64_t kSplitMinBytes = int64_t(512) << 10, kSplitMinMacs = int64_t(1) << 20;
// A weight's bytes for that bound; int8 counts two a weight (its kernel multiplies at about bf16's rate per weight:
// compute-bound, not streaming).
template <class W>
int64_t split_bytes(int64_t n, int64_t k) {
  return n * k * int64_t(std::max<size_t>(sizeof(W), 2));
}
template <class F>
void split_units(int64_t units, int64_t mnk, int64_t weight_bytes, const F& f) {
  if ((weight_bytes < kSplitMinBytes && mnk < kSplitMinMacs) || omp_get_max_threads() == 1 || omp_in_parallel())
    return f(int64_t(0), units);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t u0 = units * t / T, u1 = units * (t + 1) / T;
    if (u0 < u1) f(u0, u1);
  }
}

template <class W, class... Scales>
void run_split(Isa isa, const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k,
               const RowwiseEpilogue& ep, const Scales&... scales) {
  constexpr int64_t kGranule = 8;
  split_units((n + kGranule - 1) / kGranule, m * n * k, split_bytes<W>(n, k), [&](int64_t g0, int64_t g1) {
    const int64_t j0 = std::min(n, g0 * kGranule), j1 = std::min(n, g1 * kGranule);
    DEW_CPU_ISA_CALL(isa, rowwise_columns, x, w, y, m, n, k, j0, j1, ep, scales...);
  });
}

}  // namespace

void rowwise_dot_f32(Isa isa, const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                     const RowwiseEpilogue& ep) {
  run_split(isa, x, w, y, m, n, k, ep);
}

void rowwise_dot_bf16(Isa isa, const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                      const RowwiseEpilogue& ep) {
  run_split(isa, x, w, y, m, n, k, ep);
}

// Panels split over threads (whole panels each: a thread's columns are the columns one thread would make).
template <class W>
void run_panels(Isa isa, const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k,
                const RowwiseEpilogue& ep, bool prefetch) {
  DEW_CHECK(n % kPanelRows == 0, "cpu matmul: a weight in panels of ", kPanelRows, " rows has ", n, " rows");
  split_units(n / kPanelRows, m * n * k, split_bytes<W>(n, k), [&](int64_t p0, int64_t p1) {
    DEW_CPU_ISA_CALL(isa, panel_columns, x, w, y, m, n, k, p0, p1, ep, prefetch);
  });
}

void panel_dot_f32(Isa isa, const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                   const RowwiseEpilogue& ep) {
  run_panels(isa, x, w, y, m, n, k, ep, false);
}

void panel_dot_bf16(Isa isa, const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                    const RowwiseEpilogue& ep, bool prefetch) {
  run_panels(isa, x, w, y, m, n, k, ep, prefetch);
}

void rowwise_dot_i8(Isa isa, const float* x, const int8_t* w, const QuantScales& scales, float* y, int64_t m,
                    int64_t n, int64_t k, const RowwiseEpilogue& ep) {
  if ((k / scales.groups) % 32 != 0) return run_split(isa, x, w, y, m, n, k, ep, scales);
  thread_local std::vector<int16_t> xq;  // per calling thread, kept across calls (a decode step's rows)
  thread_local std::vector<float> xs;
  xq.resize(size_t(m * k));
  xs.resize(size_t(m * k / 32));
  DEW_CPU_ISA_CALL(isa, quantize_rows, x, m * k / 32, xq.data(), xs.data());
  QuantScales q = scales;
  q.xq = xq.data();
  q.xs = xs.data();
  run_split(isa, x, w, y, m, n, k, ep, q);
}

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

// ---- one 16-lane accumulator and its operations, per path. V: the vector; zero, load (f32 / bf16),
// fma (s + x w), sum (the fixed tree of isa.hpp's hsum16).
#if defined(DEW_CPU_ISA_IS_AVX512)
struct V {
  __m512 v;
};
DEW_AI V vzero() { return {_mm512_setzero_ps()}; }
DEW_AI V vload16(const float* p) { return {_mm512_loadu_ps(p)}; }
DEW_AI V vload16(const uint16_t* p) {
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(h, 16))};
}
DEW_AI V vload16(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
DEW_AI V vset1(float v) { return {_mm512_set1_ps(v)}; }
DEW_AI V vadd(const V& a, const V& b) { return {_mm512_add_ps(a.v, b.v)}; }
// A block of 32 columns, int8 weights against int16 x: lane l = w[2l] x[2l] + w[2l+1] x[2l+1], exact (|lane| <
// 2^24, so the conversion to f32 is exact too).
DEW_AI V qdot32(const int8_t* w, const int16_t* x) {
  const __m512i w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return {_mm512_cvtepi32_ps(_mm512_madd_epi16(w16, _mm512_loadu_si512(x)))};
}
DEW_AI V vfma(const V& x, const V& w, const V& s) { return {_mm512_fmadd_ps(x.v, w.v, s.v)}; }
DEW_AI void vstore16(float* p, const V& v) { _mm512_storeu_ps(p, v.v); }
DEW_AI float vsum(const V& s) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(s.v), _mm512_extractf32x8_ps(s.v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));  // b0 + b2, b1 + b3
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
constexpr bool kFma = true;
#elif defined(DEW_CPU_ISA_IS_AVX2)
struct V {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
DEW_AI V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
DEW_AI V vload16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
DEW_AI V vload16(const uint16_t* p) {
  const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
DEW_AI V vload16(const int8_t* p) {
  const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
  return {_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)};
}
DEW_AI V vset1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
DEW_AI V vadd(const V& a, const V& b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
DEW_AI V qdot32(const int8_t* w, const int16_t* x) {  // lanes 0-7: columns 0-15, lanes 8-15: columns 16-31
  const __m256i wlo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m256i whi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
  const __m256i plo = _mm256_madd_epi16(wlo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  const __m256i phi = _mm256_madd_epi16(whi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16)));
  return {_mm256_cvtepi32_ps(plo), _mm256_cvtepi32_ps(phi)};
}
DEW_AI V vfma(const V& x, const V& w, const V& s) {
  return {_mm256_fmadd_ps(x.lo, w.lo, s.lo), _mm256_fmadd_ps(x.hi, w.hi, s.hi)};
}
DEW_AI void vstore16(float* p, const V& v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
DEW_AI float vsum(const V& s) {
  const __m256 a = _mm256_add_ps(s.lo, s.hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
constexpr bool kFma = true;
#else  // portable: GCC vectors (four xmm), products and sums rounded separately
struct V {
  vf v;
};
typedef uint16_t vh __attribute__((vector_size(32)));
DEW_AI V vzero() { return {vf{}}; }
DEW_AI V vload16(const float* p) { return {vload(p)}; }
DEW_AI V vload16(const uint16_t* p) {
  vh h;
  __builtin_memcpy(&h, p, sizeof h);
  return {(vf)(__builtin_convertvector(h, vu) << 16)};
}
DEW_AI V vload16(const int8_t* p) {
  typedef int8_t vq __attribute__((vector_size(16)));
  vq q;
  __builtin_memcpy(&q, p, sizeof q);
  return {__builtin_convertvector(q, vf)};
}
DEW_AI V vset1(float v) { return {vf{} + v}; }
DEW_AI V vadd(const V& a, const V& b) { return {a.v + b.v}; }
DEW_AI V qdot32(const int8_t* w, const int16_t* x) {
  V r;
  for (int l = 0; l < 16; ++l)
    r.v[l] = float(int32_t(w[2 * l]) * x[2 * l] + int32_t(w[2 * l + 1]) * x[2 * l + 1]);
  return r;
}
DEW_AI V vfma(const V& x, const V& w, const V& s) { return {s.v + x.v * w.v}; }
DEW_AI void vstore16(float* p, const V& v) { __builtin_memcpy(p, &v.v, sizeof v.v); }
DEW_AI float vsum(const V& s) { return hsum16(s.v); }
constexpr bool kFma = false;
#endif

DEW_AI float widen(float v) { return v; }
DEW_AI float widen(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
DEW_AI float widen(int8_t q) { return float(q); }
DEW_AI void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// acc[r][j] = dot(x[r, :], w[j, :]) for R rows of x and J rows of w (k columns each). `next`: the next
// block's J rows (contiguous, J * k elements), prefetched one cache line per line this block loads (none when
// null). The tail is an explicit fmaf on the FMA paths: written as `a += x * w`, GCC may vectorise the
// products across j and leave the adds scalar, and the contraction then differs between clones.
// One step of 16 columns at i: s[r][j] += x[r, i..] w[j, i..] (16 lanes) for R rows of x and J rows of w; while
// pf is set, the lines of the next block this step's lines stand for (J * 16 weights) are prefetched first.
template <int R, int J, class W>
DEW_AI void step16(const float* x, const W* w, int64_t k, int64_t i, const char*& pf, V (&s)[R][J]) {
  constexpr int kLinesPerStep = int(J * 16 * sizeof(W) / 64);  // lines of one step of 16 over J rows
  if (pf) {
#pragma GCC unroll 32
    for (int l = 0; l < kLinesPerStep; ++l) prefetch(pf + l * 64);
    pf += kLinesPerStep * 64;
  }
  V wv[J];
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) wv[j] = vload16(w + j * k + i);
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
    const V xv = vload16(x + r * k + i);
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) s[r][j] = vfma(xv, wv[j], s[r][j]);
  }
}

// dot_block's accumulator chains: 16-column steps alternate between two 16-lane accumulators per (r, j),
// s0 (even steps) and s1 (odd), summed lane by lane at the end (s0 + s1), then the fixed tree over the lanes,
// then the k % 16 tail in order. Why two: at m == 1 a block on avx2 is one weight row (kJ1), so one accumulator
// makes every step wait for the last step's FMA (4 cycles per 16 weights: 16 bytes a cycle of bf16 weights,
// ~30 GB/s on the AVX2 EPYC, under what its cache and memory deliver); two chains halve that bound.
constexpr int kChains = 2;

template <int R, int J, class W>
DEW_AI void dot_block(const float* x, const W* w, int64_t k, const W* next, float (&acc)[R][J]) {
  V s[kChains][R][J];
#pragma GCC unroll 32
  for (int c = 0; c < kChains; ++c)
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
      for (int j = 0; j < J; ++j) s[c][r][j] = vzero();
  const char* pf = reinterpret_cast<const char*>(next);
  int64_t i = 0;
  for (; i + 16 * kChains <= k; i += 16 * kChains)
#pragma GCC unroll 4
    for (int c = 0; c < kChains; ++c) step16<R, J>(x, w, k, i + 16 * c, pf, s[c]);
  static_assert(kChains == 2, "the leftover step below is one step");
  if (i + 16 <= k) step16<R, J>(x, w, k, i, pf, s[0]), i += 16;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      V sum = s[0][r][j];
#pragma GCC unroll 4
      for (int c = 1; c < kChains; ++c) sum = vadd(sum, s[c][r][j]);
      float a = vsum(sum);
      for (int64_t t = i; t < k; ++t)
        a = kFma ? __builtin_fmaf(x[r * k + t], widen(w[j * k + t]), a) : a + x[r * k + t] * widen(w[j * k + t]);
      acc[r][j] = a;
    }
}

// Group g (columns [g * per, (g + 1) * per)) added into t and tail as dot_block_q8 describes. PER: per as a
// compile-time constant (32, what --weights int8 stores: the group's two blocks then compile to straight-line
// code), or 0 (any group length, at run time).
template <int R, int J, int PER>
DEW_AI void group_q8(const float* x, const int8_t* w, const float* scales, int64_t groups, int64_t k, int64_t g,
                     int64_t per_rt, int64_t vec_end_rt, const char*& pf, V (&t)[R][J], float (&tail)[R][J]) {
  const int64_t per = PER ? PER : per_rt, vec_end = PER ? PER - PER % 16 : vec_end_rt;
  const int64_t base = g * per;
  V s0[R][J], s1[R][J];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) s0[r][j] = vzero(), s1[r][j] = vzero();
  int64_t i = base;
  for (; i + 32 <= base + vec_end; i += 32) {
    step16<R, J>(x, w, k, i, pf, s0);
    step16<R, J>(x, w, k, i + 16, pf, s1);
  }
  if (i < base + vec_end) step16<R, J>(x, w, k, i, pf, s0);
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
    const float sc = scales[j * groups + g];
    const V sv = vset1(sc);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      t[r][j] = vfma(vadd(s0[r][j], s1[r][j]), sv, t[r][j]);
      if (vec_end == per) continue;
      float d = 0.0f;
      for (int64_t e = base + vec_end; e < base + per; ++e)
        d = kFma ? __builtin_fmaf(x[r * k + e], widen(w[j * k + e]), d) : d + x[r * k + e] * widen(w[j * k + e]);
      tail[r][j] = kFma ? __builtin_fmaf(sc, d, tail[r][j]) : tail[r][j] + sc * d;
    }
  }
}

// dot_block for an int8 weight in groups, widened to f32 (QuantScales: `groups` groups of k / groups columns per
// row, the scale of row j's group g at scales[j * groups + g]). Per group: its blocks of 16 (each int8 widened
// exactly to f32) go alternately into two 16-lane accumulators s0 (even blocks) and s1 (odd), s = s0 + s1; then
// t[g % 2] += s * scale, lane by lane (FMA); the group's k / groups % 16 tail is summed in order and added as
// tail += scale * d. The result is the fixed tree over the lanes of t[0] + t[1], plus tail. A fixed order
// again, whatever R, J and the thread count are. Why two of each: a row's int8 weights are a quarter of its f32
// bytes and stay in cache, so with one accumulator the product would be bound by one FMA chain (4 cycles per
// block of 16: 4 weights a cycle, which an AVX-512 core's two FMA ports could triple). On the AVX2 EPYC both
// forms measured the same, ~13.8 G weights/s at m = 1 (5-6 cycles per 32 weights: the widening, vpmovsxbd and
// vcvtdq2ps per 8 weights, is the bound there, hence the integer form below for groups of 32); two weight rows
// per block (J = 2) measured no faster either.
template <int R, int J>
DEW_AI void dot_block_q8(const float* x, const int8_t* w, const float* scales, int64_t groups, int64_t k,
                         const int8_t* next, float (&acc)[R][J]) {
  const int64_t per = k / groups, vec_end = per - per % 16;
  V t0[R][J], t1[R][J];
  float tail[R][J];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) t0[r][j] = vzero(), t1[r][j] = vzero(), tail[r][j] = 0.0f;
  const char* pf = reinterpret_cast<const char*>(next);
  int64_t g = 0;
  if (per == 32) {
    for (; g + 2 <= groups; g += 2) {
      group_q8<R, J, 32>(x, w, scales, groups, k, g, per, vec_end, pf, t0, tail);
      group_q8<R, J, 32>(x, w, scales, groups, k, g + 1, per, vec_end, pf, t1, tail);
    }
    if (g < groups) group_q8<R, J, 32>(x, w, scales, groups, k, g, per, vec_end, pf, t0, tail);
  } else {
    for (; g + 2 <= groups; g += 2) {
      group_q8<R, J, 0>(x, w, scales, groups, k, g, per, vec_end, pf, t0, tail);
      group_q8<R, J, 0>(x, w, scales, groups, k, g + 1, per, vec_end, pf, t1, tail);
    }
    if (g < groups) group_q8<R, J, 0>(x, w, scales, groups, k, g, per, vec_end, pf, t0, tail);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = vsum(vadd(t0[r][j], t1[r][j])) + tail[r][j];
}

// Block b of the integer form into t, its weight rows' scales at sw[j * groups] (the group's column already
// added): t[r][j] += qdot32 * (sw * xs[r * blocks + b]). Prefetches P bytes ahead at pf.
template <int R, int J, int P>
DEW_AI void block_q8i(const int16_t* xq, const float* xs, const int8_t* w, const float* sw, int64_t groups, int64_t k,
                      int64_t blocks, int64_t b, const char*& pf, V (&t)[R][J]) {
  if (pf) {
#pragma GCC unroll 32
    for (int l = 0; l < (P + 63) / 64; ++l) prefetch(pf + l * 64);
    pf += P;
  }
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
    const float s = sw[j * groups];
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
      t[r][j] = vfma(qdot32(w + j * k + b * 32, xq + r * k + b * 32), vset1(s * xs[r * blocks + b]), t[r][j]);
  }
}

// The integer form (matmul_rowwise.hpp): xq / xs the R rows' int16 values and block scales, w's rows in groups
// of a multiple of 32 columns. Block b of 32: t[b % 2] += qdot32 * (weight scale of b's group * xs[b]), lane by
// lane (FMA); the result is the fixed tree over the lanes of t[0] + t[1].
template <int R, int J>
DEW_AI void dot_block_q8i(const int16_t* xq, const float* xs, const int8_t* w, const float* scales, int64_t groups,
                          int64_t k, const int8_t* next, float (&acc)[R][J]) {
  const int64_t blocks = k / 32, per_group = blocks / groups;
  constexpr int P = J * 32;  // bytes of the next block's rows per block of 32 columns
  V t0[R][J], t1[R][J];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) t0[r][j] = vzero(), t1[r][j] = vzero();
  const char* pf = reinterpret_cast<const char*>(next);
  int64_t b = 0;
  if (per_group == 1) {  // a scale per block (what --weights int8 stores): group b for block b
    for (; b + 2 <= blocks; b += 2) {
      block_q8i<R, J, P>(xq, xs, w, scales + b, groups, k, blocks, b, pf, t0);
      block_q8i<R, J, P>(xq, xs, w, scales + b + 1, groups, k, blocks, b + 1, pf, t1);
    }
    if (b < blocks) block_q8i<R, J, P>(xq, xs, w, scales + b, groups, k, blocks, b, pf, t0);
  } else {
    for (; b + 2 <= blocks; b += 2) {
      block_q8i<R, J, P>(xq, xs, w, scales + b / per_group, groups, k, blocks, b, pf, t0);
      block_q8i<R, J, P>(xq, xs, w, scales + (b + 1) / per_group, groups, k, blocks, b + 1, pf, t1);
    }
    if (b < blocks) block_q8i<R, J, P>(xq, xs, w, scales + b / per_group, groups, k, blocks, b, pf, t0);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = vsum(vadd(t0[r][j], t1[r][j]));
}

// What the weight rows carry besides their elements: nothing (f32, bf16) or int8 groups' scales. `r`: the first
// of the R rows of x (x points at it already; the integer form's own rows are found by it).
struct NoScales {};
template <int R, int J, class W>
DEW_AI void dot_rows(const float* x, const W* w, int64_t k, const W* next, float (&acc)[R][J], int64_t, int64_t,
                     NoScales) {
  dot_block<R, J>(x, w, k, next, acc);
}
template <int R, int J>
DEW_AI void dot_rows(const float* x, const int8_t* w, int64_t k, const int8_t* next, float (&acc)[R][J], int64_t r,
                     int64_t j0, const QuantScales& q) {
  if (q.xq)
    dot_block_q8i<R, J>(q.xq + r * k, q.xs + r * (k / 32), w, q.scales + j0 * q.groups, q.groups, k, next, acc);
  else
    dot_block_q8<R, J>(x, w, q.scales + j0 * q.groups, q.groups, k, next, acc);
}

// y[:, j0 .. j0 + J) for all m rows: rows in blocks of R, the rest one at a time. `next`: what the first
// row block prefetches (the next column block's weight rows, or null).
template <int R, int J, class W, class Q>
DEW_AI void column_block(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                         const W* next, const Q& q) {
  const W* wj = w + j0 * k;
  int64_t r = 0;
  for (; r + R <= m; r += R) {
    float acc[R][J];
    dot_rows<R, J>(x + r * k, wj, k, r == 0 ? next : nullptr, acc, r, j0, q);
    for (int rr = 0; rr < R; ++rr)
      for (int j = 0; j < J; ++j) y[(r + rr) * n + j0 + j] = acc[rr][j];
  }
  for (; r < m; ++r) {
    float acc[1][J];
    dot_rows<1, J>(x + r * k, wj, k, r == 0 ? next : nullptr, acc, r, j0, q);
    for (int j = 0; j < J; ++j) y[r * n + j0 + j] = acc[0][j];
  }
}

// Registers: avx512 has 32 zmm (one per 16-lane vector), avx2 16 ymm (two per vector), SSE2 16 xmm (four); a
// block holds kChains x R x J accumulators (avx2 at m > 1: 2 chains x 3 rows x 1 weight row x 2 ymm = 12 ymm).
// avx2 decodes one weight row at a time with no software prefetch: measured on an AVX2-only AMD EPYC (Zen 4
// with AVX-512 hidden, 1 thread, char-small's 42.9 MB of products per token), one sequential stream read at
// 22-24 GB/s where 2-6 rows interleaved read at 9-11 (a stand-alone loop), and dew's decode went from
// 2.8-3.1 ms/token (4 rows, next block prefetched) to 1.9-2.3 (1 row, none). The avx512 blocking was
// measured on the AVX-512 Xeon and Zen 4 (0.88 of the bandwidth roofline) and is kept.
// avx512 with bf16 weights decodes two weight rows a block, prefetching the block four on (the same 4 rows x
// 768 bytes = 6 KiB ahead as 8 rows one block on; char-small's 384-column rows): on the Zen 5 of session 20
// (docs/benchmarks.md) that took a bf16 token's CPU time from 0.927 to 0.875 ms (6 runs alternated) where f32
// weights measured slower that way (1.811 -> 1.927 ms), so f32 and int8 keep 8 rows one block on.
#if defined(DEW_CPU_ISA_IS_AVX512)
constexpr int kJ1 = 8, kRM = 2, kJM = 4;
constexpr int kJ1Bf16 = 2, kAheadBf16 = 4;
constexpr bool kPrefetchNext = true;
#elif defined(DEW_CPU_ISA_IS_AVX2)
constexpr int kJ1 = 1, kRM = 3, kJM = 1;
constexpr int kJ1Bf16 = kJ1, kAheadBf16 = 1;
constexpr bool kPrefetchNext = false;
#else
constexpr int kJ1 = 1, kRM = 1, kJM = 1;
constexpr int kJ1Bf16 = kJ1, kAheadBf16 = 1;
constexpr bool kPrefetchNext = true;
#endif

// One path over output columns [j0, j1): J1 weight rows per block when m == 1 (decode), RM x JM blocks when
// m > 1, the columns left over one at a time. Each block prefetches the rows of the block AHEAD blocks on (at
// m > 1 the next one) while that block is in [j0, j1) (at m == 1 only where kPrefetchNext).
template <int J1, int AHEAD, int RM, int JM, class W, class Q>
DEW_AI void rowwise_range(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0, int64_t j1,
                          const Q& q) {
  int64_t j = j0;
  if (m == 1)
    for (; j + J1 <= j1; j += J1)
      column_block<1, J1>(x, w, y, m, n, k, j,
                          kPrefetchNext && j + (AHEAD + 1) * J1 <= j1 ? w + (j + AHEAD * J1) * k : nullptr, q);
  else
    for (; j + JM <= j1; j += JM)
      column_block<RM, JM>(x, w, y, m, n, k, j, j + 2 * JM <= j1 ? w + (j + JM) * k : nullptr, q);
  for (; j < j1; ++j) column_block<1, 1>(x, w, y, m, n, k, j, static_cast<const W*>(nullptr), q);
}

// ---- weights in panels (matmul_rowwise.hpp: kPanelRows rows, column-major inside a panel). A panel's column i
// is its 32 rows' weights at column i, back to back: two 16-lane vectors, y's 32 columns as lanes. Column i goes
// into chain i % 2 (FMA, x[r, i] broadcast), the chains are added lane by lane at the end: the same arithmetic for
// every y[r, j] whatever R, m, the thread count and the path's register width are (avx512: one zmm a vector,
// avx2: two ymm). The weight streams in address order, one sequential read per panel: no software prefetch (the
// hardware's stream prefetcher sees one stream; measured on the Zen 5, docs/benchmarks.md, session 23).
// Column i of a panel into acc: acc[r][h] += x[r, i] * w[i][16 h .. 16 h + 16) for the R rows of x.
template <int R, class W>
DEW_AI void panel_column(const float* x, const W* wp, int64_t k, int64_t i, V (&acc)[R][2]) {
  const V w0 = vload16(wp + i * kPanelRows), w1 = vload16(wp + i * kPanelRows + 16);
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
    const V xv = vset1(x[r * k + i]);
    acc[r][0] = vfma(xv, w0, acc[r][0]);
    acc[r][1] = vfma(xv, w1, acc[r][1]);
  }
}

// A panel's 32 sums, lane h * 16 + l of (lo, hi) = row h * 16 + l, stored at y.
template <class W>
DEW_AI void panel_store(float* y, const V& lo, const V& hi) {
  vstore16(y, lo);
  vstore16(y + 16, hi);
}

#if defined(DEW_CPU_ISA_IS_AVX512)
// bf16 panels on avx512: one 64-byte load is a column's 32 weights, and its 32-bit lanes hold two each: the low
// halves (rows 0, 2, .., 30) widen exactly by a shift, the high halves (rows 1, 3, .., 31) by a mask. So the two
// accumulators of a row of x hold the even and the odd rows (3 operations a column where widening each half
// from memory takes 4, and one load instead of two); panel_store puts the lanes back in row order, once a panel.
// Each sum is the same FMA chain as with the plain widening: the same bits.
template <int R>
DEW_AI void panel_column(const float* x, const uint16_t* wp, int64_t k, int64_t i, V (&acc)[R][2]) {
  const __m512i pairs = _mm512_loadu_si512(wp + i * kPanelRows);
  const V even{_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16))};
  const V odd{_mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int(0xffff0000u))))};
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
    const V xv = vset1(x[r * k + i]);
    acc[r][0] = vfma(xv, even, acc[r][0]);
    acc[r][1] = vfma(xv, odd, acc[r][1]);
  }
}
template <>
DEW_AI void panel_store<uint16_t>(float* y, const V& even, const V& odd) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_ps(y, _mm512_permutex2var_ps(even.v, first, odd.v));
  _mm512_storeu_ps(y + 16, _mm512_permutex2var_ps(even.v, second, odd.v));
}
#endif

// y[r, j0 .. j0 + 32) for R rows of x against one panel wp (32 rows x k columns).
#if defined(DEW_CPU_ISA_IS_PORTABLE)
// portable: one half of the panel (16 rows) at a time, so that a row's two chains (8 xmm) and a half column (4)
// fit SSE2's 16 registers (both halves at once spilled: 3x slower than the row-major kernel); the same sums. Still
// ~7 % slower than the row-major kernel there (compute-bound without FMA), so a backend on the portable path asks
// for no panels (CpuBackend::decode_panel_rows); this serves a tensor laid out by hand.
template <int R, class W, bool Prefetch = false>  // (no prefetch on this path)
DEW_AI void panel_block(const float* x, const W* wp, float* y, int64_t n, int64_t k, int64_t j0) {
  for (int h = 0; h < 2; ++h) {
    V s[2][R];
    for (int c = 0; c < 2; ++c)
      for (int r = 0; r < R; ++r) s[c][r] = vzero();
    const W* half = wp + 16 * h;
    for (int64_t i = 0; i < k; ++i) {
      const V wv = vload16(half + i * kPanelRows);
      for (int r = 0; r < R; ++r) s[i % 2][r] = vfma(vset1(x[r * k + i]), wv, s[i % 2][r]);
    }
    for (int r = 0; r < R; ++r) vstore16(y + r * n + j0 + 16 * h, vadd(s[0][r], s[1][r]));
  }
}
#else
// Prefetch: every line of the two columns kPanelPrefetchBytes on in the stream (the next panel past the end of this
// one: panels lie back to back) is prefetched into L2 first (a hint: no value changes).
template <int R, class W, bool Prefetch = false>
DEW_AI void panel_block(const float* x, const W* wp, float* y, int64_t n, int64_t k, int64_t j0) {
  V s[2][R][2];
#pragma GCC unroll 32
  for (int c = 0; c < 2; ++c)
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) s[c][r][0] = vzero(), s[c][r][1] = vzero();
  int64_t i = 0;
  for (; i + 2 <= k; i += 2) {
    if constexpr (Prefetch) {
      const char* ahead = reinterpret_cast<const char*>(wp + i * kPanelRows) + kPanelPrefetchBytes;
#pragma GCC unroll 4
      for (int l = 0; l < int(2 * kPanelRows * sizeof(W)) / 64; ++l) __builtin_prefetch(ahead + 64 * l, 0, 2);
    }
    panel_column<R>(x, wp, k, i, s[0]);
    panel_column<R>(x, wp, k, i + 1, s[1]);
  }
  if (i < k) panel_column<R>(x, wp, k, i, s[0]);
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r) {
    panel_store<W>(y + r * n + j0, vadd(s[0][r][0], s[1][r][0]), vadd(s[0][r][1], s[1][r][1]));
  }
}
#endif

#if defined(DEW_CPU_ISA_IS_AVX2)
// avx2, several rows of x: one half of the panel (16 of y's columns) at a time, R rows a pass: a row's two chains
// are 2 ymm each, so R rows take 4R ymm of the 16, where whole panels (panel_block) leave room for one row only;
// the same sums. A lone row keeps panel_block: the halves read the panel as two strided streams, and a decode
// token's one row is bound by that read (1 x 384 x 2048 f32 12 GFLOP/s against 16).
template <int R, class W>
DEW_AI void panel_block_halves(const float* x, const W* wp, float* y, int64_t n, int64_t k, int64_t j0) {
  for (int h = 0; h < 2; ++h) {
    const W* half = wp + 16 * h;
    V even[R], odd[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) even[r] = vzero(), odd[r] = vzero();
    int64_t i = 0;
    for (; i + 2 <= k; i += 2) {
      const V a = vload16(half + i * kPanelRows);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) even[r] = vfma(vset1(x[r * k + i]), a, even[r]);
      const V b = vload16(half + (i + 1) * kPanelRows);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) odd[r] = vfma(vset1(x[r * k + i + 1]), b, odd[r]);
    }
    if (i < k) {
      const V a = vload16(half + i * kPanelRows);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) even[r] = vfma(vset1(x[r * k + i]), a, even[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) vstore16(y + r * n + j0 + 16 * h, vadd(even[r], odd[r]));
  }
}
#endif

#if defined(DEW_CPU_ISA_IS_AVX512)
// Rows of x a panel pass serves: 6 x 2 chains x 2 vectors = 24 zmm accumulators (4 before: a server's 16 rows took
// 4 passes over each panel, now 3; `dew-bench kernels --only decode`, Emerald Rapids, 1 thread: 16 x 384 x 2048
// f32 111.6 -> 120-121 GFLOP/s, bf16 134.9 -> 143-145; 7 rows: 32 rows faster, 16 slower, 16 + 2 rows a pass).
constexpr int kPanelR = 6;
#elif defined(DEW_CPU_ISA_IS_AVX2)
constexpr int kPanelR = 3;  // half panels (panel_block_halves): 3 rows x 2 chains x 2 ymm = 12 ymm accumulators
#else
constexpr int kPanelR = 1;  // portable: a row's two chains of xmm quads
#endif

// ---- the epilogue over y[r, j0 .. j1) (matmul_rowwise.hpp): one expression per element.
struct Identity {
  DEW_AI float operator()(float v) const { return v; }
};
struct Relu {
  DEW_AI float operator()(float v) const { return v < 0.0f ? 0.0f : v; }
};
struct Silu {
  DEW_AI float operator()(float v) const { return silu_value(v); }
};
struct GeluTanh {
  DEW_AI float operator()(float v) const { return gelu_tanh_value(v); }
};
template <class F>
DEW_AI void epilogue_rows(const RowwiseEpilogue& ep, float* y, int64_t m, int64_t n, int64_t j0, int64_t j1, F f) {
  const float alpha = ep.alpha;
  for (int64_t r = 0; r < m; ++r) {
    float* __restrict row = y + r * n;
    if (ep.bias) {
      const float* __restrict b = ep.bias;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) row[j] = f(alpha * row[j] + b[j]);
    } else {
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) row[j] = f(alpha * row[j]);
    }
  }
}
DEW_AI void epilogue(const RowwiseEpilogue& ep, float* y, int64_t m, int64_t n, int64_t j0, int64_t j1) {
  switch (ep.act) {
    case Activation::none:
      if (ep.alpha != 1.0f || ep.bias) epilogue_rows(ep, y, m, n, j0, j1, Identity{});
      return;
    case Activation::relu:
      return epilogue_rows(ep, y, m, n, j0, j1, Relu{});
    case Activation::silu:
      return epilogue_rows(ep, y, m, n, j0, j1, Silu{});
    case Activation::gelu_tanh:
      return epilogue_rows(ep, y, m, n, j0, j1, GeluTanh{});
    default:  // gelu (erf): the backend's scalar activate() (matmul.cpp), one element at a time
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = j0; j < j1; ++j)
          y[r * n + j] = activate(ep.alpha * y[r * n + j] + (ep.bias ? ep.bias[j] : 0.0f), ep.act);
  }
}


}  // namespace

// x's rows rounded to int16, `blocks` blocks of 32 (quantize_block_int16 above, the scalar reference). The vector
// paths compute the same operations on 16 or 8 lanes: |x| and its maximum (exact), amax / 32767 (the same scalar
// division), x / scale (vdivps: correctly rounded like the scalar division), round to nearest even (vroundps /
// vrndscaleps), the clamp (no NaN can reach it: x is finite and scale > 0) and the exact conversion of an integral
// float, so every value and scale has the scalar loop's bits. A block holding a NaN or an infinity, or whose scale
// is 0 (all zeros, or underflowed), takes the scalar reference.
void quantize_rows(const float* x, int64_t blocks, int16_t* xq, float* xs) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* src = x + b * 32;
    int16_t* dst = xq + b * 32;
#if defined(DEW_CPU_ISA_IS_AVX512)
    const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
    const bool finite = (_mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ)) == 0xffff;
    const float scale = finite ? _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / 32767.0f : 0.0f;
    if (!(scale > 0.0f)) {
      quantize_block_int16(src, dst, xs + b);
      continue;
    }
    xs[b] = scale;
    const __m512 sv = _mm512_set1_ps(scale), hi = _mm512_set1_ps(32767.0f), lo = _mm512_set1_ps(-32767.0f);
    auto q16 = [&](__m512 v) {
      const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(v, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      return _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi)));
    };
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q16(v0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16), q16(v1));
#elif defined(DEW_CPU_ISA_IS_AVX2)
    __m256 v[4], a[4];
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(std::numeric_limits<float>::max());
    int ok = 0xff;
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(src + 8 * i);
      a[i] = _mm256_andnot_ps(sign, v[i]);
      ok &= _mm256_movemask_ps(_mm256_cmp_ps(a[i], big, _CMP_LE_OQ));
    }
    __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float scale = ok == 0xff ? _mm_cvtss_f32(m4) / 32767.0f : 0.0f;
    if (!(scale > 0.0f)) {
      quantize_block_int16(src, dst, xs + b);
      continue;
    }
    xs[b] = scale;
    const __m256 sv = _mm256_set1_ps(scale), hi = _mm256_set1_ps(32767.0f), lo = _mm256_set1_ps(-32767.0f);
    __m256i r[4];
    for (int i = 0; i < 4; ++i)
      r[i] = _mm256_cvtps_epi32(_mm256_min_ps(
          _mm256_max_ps(_mm256_round_ps(_mm256_div_ps(v[i], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo),
          hi));
    // packs interleaves the 128-bit lanes of its operands; the permute puts columns back in order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(r[0], r[1]), 0xd8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(r[2], r[3]), 0xd8));
#else
    quantize_block_int16(src, dst, xs + b);
#endif
  }
}

// Called once per thread with its own columns (the OpenMP region is in the first pass: DEW_CPU_ISA_CALL).
void rowwise_columns(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                     int64_t j1, const RowwiseEpilogue& ep) {
  rowwise_range<kJ1, 1, kRM, kJM>(x, w, y, m, n, k, j0, j1, NoScales{});
  epilogue(ep, y, m, n, j0, j1);
}
void rowwise_columns(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                     int64_t j1, const RowwiseEpilogue& ep) {
  rowwise_range<kJ1Bf16, kAheadBf16, kRM, kJM>(x, w, y, m, n, k, j0, j1, NoScales{});
  epilogue(ep, y, m, n, j0, j1);
}
void rowwise_columns(const float* x, const int8_t* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                     int64_t j1, const RowwiseEpilogue& ep, const QuantScales& q) {
  rowwise_range<kJ1, 1, kRM, kJM>(x, w, y, m, n, k, j0, j1, q);
  epilogue(ep, y, m, n, j0, j1);
}

// Panels [p0, p1) of a weight in panels (y's columns [32 p0, 32 p1)), all m rows: rows in blocks of kPanelR (avx2:
// over half panels), the rest in blocks of 4 and 2 (avx512) and one at a time, then the epilogue on those columns.
// A row's sums are the same whichever block it is in.
// Prefetch: each pass over a panel prefetches the stream ahead (panel_block; not avx2's multi-row half-panel passes,
// nor the portable path).
template <class W, bool Prefetch>
DEW_AI void panel_columns_t(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t p0,
                            int64_t p1, const RowwiseEpilogue& ep) {
  for (int64_t p = p0; p < p1; ++p) {
    const W* wp = w + p * kPanelRows * k;
    int64_t r = 0;
#if defined(DEW_CPU_ISA_IS_AVX2)
    for (; r + kPanelR <= m; r += kPanelR) panel_block_halves<kPanelR>(x + r * k, wp, y + r * n, n, k, p * kPanelRows);
#else
    for (; r + kPanelR <= m; r += kPanelR)
      panel_block<kPanelR, W, Prefetch>(x + r * k, wp, y + r * n, n, k, p * kPanelRows);
#endif
    if constexpr (kPanelR > 4) {
      for (; r + 4 <= m; r += 4) panel_block<4, W, Prefetch>(x + r * k, wp, y + r * n, n, k, p * kPanelRows);
      for (; r + 2 <= m; r += 2) panel_block<2, W, Prefetch>(x + r * k, wp, y + r * n, n, k, p * kPanelRows);
    }
    for (; r < m; ++r) panel_block<1, W, Prefetch>(x + r * k, wp, y + r * n, n, k, p * kPanelRows);
  }
  epilogue(ep, y, m, n, p0 * kPanelRows, p1 * kPanelRows);
}
void panel_columns(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, int64_t p0, int64_t p1,
                   const RowwiseEpilogue& ep, bool prefetch) {
  (void)prefetch;  // f32 panels stream at the memory's rate without it (docs/benchmarks.md, session 34)
  panel_columns_t<float, false>(x, w, y, m, n, k, p0, p1, ep);
}
void panel_columns(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k, int64_t p0, int64_t p1,
                   const RowwiseEpilogue& ep, bool prefetch) {
  if (prefetch)
    panel_columns_t<uint16_t, true>(x, w, y, m, n, k, p0, p1, ep);
  else
    panel_columns_t<uint16_t, false>(x, w, y, m, n, k, p0, p1, ep);
}

#endif  // DEW_CPU_ISA
