// cpu/matmul_rowwise.cpp — the row-wise decode products y = x W^T (matmul_rowwise.hpp), in three ISA
// paths chosen by the caller from the CPU's features (isa.hpp).
//
// Decoding is nothing but these products: one token (or one per active sequence of a server) against every
// weight, so the speed is how fast the weight streams from memory. The weight is read once for all m rows
// (blocks of J weight rows x R rows of x share their loads), each thread its own blocks of output columns.
// Invariants: every y[r, j] is formed by one thread as a 16-lane accumulator over blocks of 16 (s += x w,
// FMA on avx512 and avx2), then a fixed tree over the 16 lanes, then the k % 16 tail in order: R, J, m,
// r's place in a block and the thread count only decide which products share a load, never a sum's
// arithmetic (continuous batching's served = solo relies on it). The 16-lane vectors are GCC vector
// extensions: one zmm on avx512, two ymm on avx2, four xmm on the portable path, so avx512 and avx2 agree
// bit for bit; portable (no FMA) rounds each product separately. bf16 weights widen exactly to f32 (their
// bits << 16), so the bf16 path is the f32 path on the rounded weight.
// This file is compiled at the x86-64 baseline (CMakeLists.txt), so its plain code is the portable path and
// the avx2 / avx512 clones come from target attributes (isa.hpp's vector helpers are always-inline: they take
// the clone's target).
#include "matmul_rowwise.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector arguments: everything below is inlined

namespace dew::cpu {

namespace {

typedef uint16_t vh __attribute__((vector_size(32)));

DEW_AI vf load16(const float* p) { return vload(p); }  // (vf, vload, hsum16: isa.hpp)
DEW_AI vf load16(const uint16_t* p) {  // 16 bf16 -> 16 f32, exact
  vh h;
  std::memcpy(&h, p, sizeof h);
  return (vf)(__builtin_convertvector(h, vu) << 16);
}
DEW_AI float widen(float v) { return v; }
DEW_AI float widen(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// acc[r][j] = dot(x[r, :], w[j, :]) for R rows of x and J rows of w (k columns each). The tail is an
// explicit fmaf on the FMA paths: written as `a += x * w`, GCC may vectorise the products across j and
// leave the adds scalar, and the contraction then differs between clones.
template <int R, int J, bool Fma, class W>
DEW_AI void dot_block(const float* x, const W* w, int64_t k, float (&acc)[R][J]) {
  vf s[R][J] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    vf wv[J];
    for (int j = 0; j < J; ++j) wv[j] = load16(w + j * k + i);
    for (int r = 0; r < R; ++r) {
      const vf xv = load16(x + r * k + i);
      for (int j = 0; j < J; ++j) s[r][j] += xv * wv[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      float a = hsum16(s[r][j]);
      for (int64_t t = i; t < k; ++t)
        a = Fma ? __builtin_fmaf(x[r * k + t], widen(w[j * k + t]), a) : a + x[r * k + t] * widen(w[j * k + t]);
      acc[r][j] = a;
    }
}

// y[:, j0 .. j0 + J) for all m rows: rows in blocks of R, the rest one at a time.
template <int R, int J, bool Fma, class W>
DEW_AI void column_block(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0) {
  const W* wj = w + j0 * k;
  int64_t r = 0;
  for (; r + R <= m; r += R) {
    float acc[R][J];
    dot_block<R, J, Fma>(x + r * k, wj, k, acc);
    for (int rr = 0; rr < R; ++rr)
      for (int j = 0; j < J; ++j) y[(r + rr) * n + j0 + j] = acc[rr][j];
  }
  for (; r < m; ++r) {
    float acc[1][J];
    dot_block<1, J, Fma>(x + r * k, wj, k, acc);
    for (int j = 0; j < J; ++j) y[r * n + j0 + j] = acc[0][j];
  }
}

// One path over output columns [j0, j1): J1 weight rows per block when m == 1 (decode: as many independent
// accumulators as the registers hold), RM x JM blocks when m > 1, the columns left over one at a time.
template <int J1, int RM, int JM, bool Fma, class W>
DEW_AI void rowwise_range(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                          int64_t j1) {
  int64_t j = j0;
  if (m == 1)
    for (; j + J1 <= j1; j += J1) column_block<1, J1, Fma>(x, w, y, m, n, k, j);
  else
    for (; j + JM <= j1; j += JM) column_block<RM, JM, Fma>(x, w, y, m, n, k, j);
  for (; j < j1; ++j) column_block<1, 1, Fma>(x, w, y, m, n, k, j);
}

// The clones. Registers: avx512 has 32 zmm (one per 16-lane vector), avx2 16 ymm (two per vector), SSE2
// 16 xmm (four). Called once per thread with its own columns (the OpenMP region is outside: a parallel
// region inside a target clone would be outlined before inlining, at the file's baseline flags).
#define DEW_ROWWISE_CLONE(SUF, ATTR, J1, RM, JM, FMA)                                                          \
  ATTR void rowwise_f32_##SUF(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,   \
                              int64_t j0, int64_t j1) {                                                   \
    rowwise_range<J1, RM, JM, FMA>(x, w, y, m, n, k, j0, j1);                                                  \
  }                                                                                                       \
  ATTR void rowwise_bf16_##SUF(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k, \
                               int64_t j0, int64_t j1) {                                                  \
    rowwise_range<J1, RM, JM, FMA>(x, w, y, m, n, k, j0, j1);                                                  \
  }
DEW_ROWWISE_CLONE(avx512, DEW_CPU_TARGET_AVX512, 8, 2, 8, true)
DEW_ROWWISE_CLONE(avx2, DEW_CPU_TARGET_AVX2, 4, 2, 2, true)
DEW_ROWWISE_CLONE(portable, , 2, 1, 2, false)
#undef DEW_ROWWISE_CLONE

// Column ranges per thread are multiples of 8 (a multiple of every path's block width), so the blocks a
// thread makes are the blocks one thread would make: the split changes nothing but who computes what.
template <class W>
void run_split(void (*fn)(const float*, const W*, float*, int64_t, int64_t, int64_t, int64_t, int64_t),
               const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kGranule = 8;
  if (m * n * k < (int64_t(1) << 16) || omp_get_max_threads() == 1 || omp_in_parallel()) return fn(x, w, y, m, n, k, 0, n);
  const int64_t granules = (n + kGranule - 1) / kGranule;
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t j0 = std::min(n, granules * t / T * kGranule), j1 = std::min(n, granules * (t + 1) / T * kGranule);
    if (j0 < j1) fn(x, w, y, m, n, k, j0, j1);
  }
}

}  // namespace

void rowwise_dot_f32(Isa isa, const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  run_split(isa == Isa::avx512 ? rowwise_f32_avx512 : isa == Isa::avx2 ? rowwise_f32_avx2 : rowwise_f32_portable, x, w,
            y, m, n, k);
}

void rowwise_dot_bf16(Isa isa, const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k) {
  run_split(isa == Isa::avx512   ? rowwise_bf16_avx512
            : isa == Isa::avx2   ? rowwise_bf16_avx2
                                 : rowwise_bf16_portable,
            x, w, y, m, n, k);
}

}  // namespace dew::cpu
