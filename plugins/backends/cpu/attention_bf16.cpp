// cpu/attention_bf16.cpp — bf16 attention of the `cpu` backend on AVX512-BF16: FlashAttention-2 forward and
// backward whose products take bf16 operands, in pairs, through vdpbf16ps (acc[i] += a[2i] b[2i] + a[2i+1] b[2i+1],
// f32 accumulators), for bf16-mixed training, and for f32 training under matmul_precision = medium (half.cpp's
// attention_medium rounds q, k, v, out, dout to bf16 and takes f32 outputs: out, dq, dk, dv are then the f32 sums
// this file otherwise rounds once, Ptrs::f32_out).
//
// Which calls: half.cpp's attention_bf16 / attention_backward_bf16 take these kernels when the backend's path is
// avx512 (option `isa`: avx2 and portable keep the widened path), the CPU has AVX512-BF16 (+F, BW, VL, DQ), q, k, v
// (and out, dout, dq, dk, dv) are bf16 with D % 16 == 0, D <= 256 and T > 4 (attention_bf16_fast_covers), and, for
// the backward, its (batch, kv head) tasks keep the threads busy: one thread, one key block, B * Hkv a multiple of
// the threads or at least 4 per thread (attention_bf16_fast_backward_covers). Causal with q_offset, window, GQA,
// softcap and segment_ids are all covered. Every other bf16 call (decode rows T <= 4, odd D, D > 256, one kv head
// over several key blocks at 2+ threads, ...) takes half.cpp's path: per sample, widened to f32, attention.cpp's f32
// kernel, rounded once. The bf16 decode-cache form (f32 q over bf16 k / v) is attention.cpp's, not this file's.
//
// Precision of each step (bf16 eps = 2^-8; operands are exact bf16 values, a bf16 x bf16 product is exact in f32):
//   forward   S = scale * (Q K^T): bf16 q, k as they are, f32 sums; the scale multiplies the f32 sums. Softcap,
//             masks, the online softmax (running max, sum l, rescale alpha) in f32; P = exp(S - m) in f32, summed
//             into l in f32, and rounded to bf16 (nearest even) as the operand of O += P V (V bf16, f32 sums).
//             lse = m + log l in f32; out = O / l rounded to bf16 once. (PyTorch's CPU flash attention rounds P the
//             same way for bf16.) Error against exact attention on the bf16 inputs: <= eps * max |V| (P's roundings,
//             then out's).
//   backward  P = exp(scale Q K^T [capped] - lse) recomputed in f32 from the saved lse; dP = dO V^T (bf16 operands,
//             f32 sums); Dsum = rowsum(dO * O) in f32 from the bf16 dO and out; dS = scale P (dP - Dsum)
//             [* (1 - tanh^2)] in f32. P and dS are rounded to bf16 as the operands of dV += P^T dO, dK += dS^T Q,
//             dQ += dS K; dQ, dK, dV accumulate in f32 over the whole row / key range and are rounded to bf16 once.
//   tests/backends_cpu_attention (the "bf16 (vdpbf16ps)" cases) bounds out at 1.01 eps absolute (V in [-1, 1]),
//   dq / dk / dv at 4 eps of their largest magnitude (measured 0.6-1.6 eps), lse at 1e-4.
//
// Layout: a vdpbf16ps operand holds 16 words of bf16 pairs; one operand is a broadcast word (a pair), the other
// 16 words of pairs along the same axis. attention.cpp's tiles (64 queries x 64 keys), S^T layout in the forward
// (lanes over queries: the online softmax is vertical vector code), register-blocked micro-kernel (mk: R rows x NV
// vectors of accumulators, 6 x 4 at most) and causal sub-tile skipping are kept; what changes is the pairing:
//   forward   S^T = K Q^T: pairs along D. K's rows are read in place (a word = two adjacent d), Q^T is packed per
//             task as [D / 2][64 queries] words (a 16 x 16 word transpose). O = alpha O + P V: pairs along keys.
//             P^T is written as [32 key pairs][64 queries] words (two S^T rows interleaved while rounding); V is
//             packed once per call, for the whole batch, as [B][Hkv][S / 2][D] words (rows 2j, 2j+1 interleaved).
//   backward  S = Q K^T and dP = dO V^T: pairs along D (Q, dO rows in place; K^T, V^T packed per key block as
//             [D / 2][64 keys]). dV = P^T dO and dK = dS^T Q: pairs along queries (P^T, dS^T written as [32 query
//             pairs][64 keys]; Q and dO packed once per task as [T / 2][D] words). dQ = dS K: pairs along keys (dS
//             rows in bf16 are already pairs; K packed per key block as [32 key pairs][D]). A query block starts at an
//             even row (a causal start rounded down: the extra row sees nothing of the key block and is masked).
//   Odd T, S, nk, nq: the pair's missing half is zero on both sides (a zero P / dS row or key, a zero padding row).
// Tasks and threads: the forward's task is (batch, query head, block of 64 queries), biggest first, OpenMP dynamic
// schedule, or static in batch order when the runs cost the same (attention_visibility.hpp: "runs of batches"; V's pair
// packing first, split statically); the backward's is (batch, kv head), static without segments: all key blocks and the
// G query heads that read it, so it owns dk / dv of the kv head and dq of its query heads (no reduction). At one
// thread (or one task) no OpenMP region is opened. Every output element is computed by one task in a fixed order,
// so results are the same bits at every thread count (tested at 1 to 3). Workspace: per thread, kept for the life
// of the (pooled) thread; the forward's V pairs live in the calling thread's buffer (4 bytes per V element).
// Measured on the Zen 5 (docs/benchmarks.md, session 22; dew-bench kernels, one thread, against the widened path):
// char-small's shape forward 3.04 -> 1.87 ms, forward + backward 10.1 -> 6.6 ms; the DiT's 0.51 -> 0.29 and
// 1.75 -> 0.96 ms. The products run at ~2x the f32 FMA rate (210 vs 102 GMAC/s in a 6 x 4 micro-kernel loop), so
// exp, masks and packing (f32, unchanged in kind) are now about half of the forward's time.
//
// Compiled at the plugin's baseline except the kernels, which sit in a `#pragma GCC target` region for AVX-512 +
// AVX512-BF16 and are called only after attention_bf16_fast_cpu() (the entry points check it); all headers are
// included before that region, so no inline function of a header is emitted with AVX-512 code.
#include "attention_bf16.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "dew/error.hpp"
#include "dew/kernel_contracts.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dew::cpu {

bool attention_bf16_fast_cpu() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
}

namespace {

constexpr int64_t kMaxD = 256;
constexpr int64_t kRowPathMaxT = 4;  // attention.cpp's ROW_PATH_MAX_T: decoding rows

// q and k both bf16, or both f32 (the medium form, rounded to bf16 by the caller), of a shape the kernels take
bool covered_shape(const Tensor& q, const Tensor& k) {
  if (!q.defined() || !k.defined() || q.dtype() != k.dtype()) return false;
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f32) return false;
  if (q.ndim() != 4 || k.ndim() != 4) return false;
  const int64_t D = q.size(3), T = q.size(1);
  return D > 0 && D % 16 == 0 && D <= kMaxD && T > kRowPathMaxT;
}

}  // namespace

bool attention_bf16_fast_covers(const Tensor& q, const Tensor& k, const AttentionParams& p) {
  (void)p;
  return attention_bf16_fast_cpu() && covered_shape(q, k);
}

bool attention_bf16_fast_backward_covers(const Tensor& q, const Tensor& k, const AttentionParams& p, int threads) {
  if (!attention_bf16_fast_covers(q, k, p)) return false;
  // One task per (batch, kv head), each owning its dq / dk / dv rows: balanced when the tasks divide among the
  // threads or are many (attention.cpp's coarse split); otherwise the widened f32 kernel splits key blocks too.
  const int64_t units = q.size(0) * k.size(2), nkb = (k.size(1) + 63) / 64;
  return threads <= 1 || nkb == 1 || units % threads == 0 || units >= 4 * int64_t(threads);
}

}  // namespace dew::cpu

// The problem, as the kernels see it (data only: no code outside the target region below).
namespace dew::cpu::avx512bf16 {
namespace {

struct Geo {
  int64_t B, T, S, Hq, Hkv, G, D, Dw;  // Dw = D / 2: words (bf16 pairs) of a row
  int64_t qrs, krs;                    // row strides of q/out/dout and of k/v, in elements
  int64_t Sh;                          // ceil(S / 2): key pairs
  float scale, cap;
  bool causal;
  int64_t window;
  int64_t qoff;
  const int32_t* seg;
};

struct Ptrs {
  const uint16_t *q, *k, *v, *o, *dout;
  const float* lse;
  void *out, *dq, *dk, *dv;  // bf16, or f32 when f32_out (matmul_precision = medium: f32 in and out)
  bool f32_out;
  float* lse_out;
  const uint32_t* vpairs;  // forward: V as key pairs [B][Hkv][Sh][D] words
};

}  // namespace
}  // namespace dew::cpu::avx512bf16

// ==================================================================== the kernels (AVX-512 + AVX512-BF16)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")

// (namespace avx512bf16: tests/backends_cpu/check_baseline.py allows AVX-512 code there and in the per-ISA paths only)
namespace dew::cpu::avx512bf16 {
namespace {

#define BA_AI inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint32_t u32a __attribute__((may_alias));  // a bf16 pair read as one word

constexpr int L = 16;
constexpr int64_t TILE = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

BA_AI vf vload(const float* p) { return (vf)_mm512_loadu_ps(p); }
BA_AI void vstore(float* p, const vf& x) { _mm512_storeu_ps(p, (__m512)x); }
BA_AI vf vset(float x) { return (vf)_mm512_set1_ps(x); }
BA_AI vi viset(int32_t x) { return (vi)_mm512_set1_epi32(x); }
BA_AI vi viload(const int32_t* p) { return (vi)_mm512_loadu_si512(p); }
BA_AI vi iota() { return vi{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
template <class V>
BA_AI V vsel(const vi& m, const V& a, const V& b) {
  return m ? a : b;
}
BA_AI vf vmax(const vf& a, const vf& b) { return a > b ? a : b; }
// 16 bf16 (their bits) widened exactly to f32
BA_AI vf vload_bf16(const uint16_t* p) {
  return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
}
// 16 f32 rounded to bf16 (nearest even), stored
BA_AI void vstore_bf16(uint16_t* p, const vf& x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh((__m512)x));
}
// 16 output elements at element index i of an output (out, dq, dk, dv): rounded to bf16 once, or the f32 sums as
// they are (Ptrs::f32_out)
BA_AI void vstore_out(void* base, int64_t i, const vf& x, bool f32) {
  if (f32)
    vstore(static_cast<float*>(base) + i, x);
  else
    vstore_bf16(static_cast<uint16_t*>(base) + i, x);
}
// Lane i: the bf16 pair (x0[i], x1[i]) (x0 in the low half), each rounded nearest even: a vdpbf16ps operand
// whose pairs run along the axis x0 and x1 are two steps of.
BA_AI __m512i pair_bf16(const vf& x0, const vf& x1) {
  const __m512i c = (__m512i)_mm512_cvtne2ps_pbh((__m512)x1, (__m512)x0);  // bf16 0-15: x0, 16-31: x1
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, c);
}
// Lane i: the bf16 bits a[i] (low half) and b[i] (high half): two rows of 16 bf16 interleaved (exact).
BA_AI __m512i pair_rows(const uint16_t* a, const uint16_t* b) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// e^x for x <= 88 (softmax arguments are <= 0), -inf included: 2^n e^r with n = round(x log2 e), |r| <= ln 2 / 2,
// e^r by attention.cpp's Cephes polynomial (relative error ~1e-7) and 2^n applied by vscalefps (0 once x < -104:
// the clamp keeps r finite for x = -inf).
BA_AI vf vexp_upto88(const vf& x0) {
  const vf x = vmax(x0, vset(-104.0f));
  const vf n = (vf)_mm512_roundscale_ps((__m512)(x * vset(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  vf r = x - n * vset(0.693359375f);
  r = r - n * vset(-2.12194440e-4f);
  vf p = vset(1.9875691500e-4f);
  p = p * r + vset(1.3981999507e-3f);
  p = p * r + vset(8.3334519073e-3f);
  p = p * r + vset(4.1665795894e-2f);
  p = p * r + vset(1.6666665459e-1f);
  p = p * r + vset(5.0000001201e-1f);
  const vf e = p * (r * r) + r + vset(1.0f);
  return (vf)_mm512_scalef_ps((__m512)e, (__m512)n);
}
BA_AI vf vexp(const vf& x) { return vexp_upto88(vsel(x > vset(88.0f), vset(88.0f), x)); }
BA_AI vf vtanh(const vf& y) {
  const vi sign = (vi)y & viset(INT32_MIN);
  const vf a = (vf)((vi)y ^ sign);
  const vf e = vexp(a + a);
  const vf t = vset(1.0f) - vset(2.0f) / (e + vset(1.0f));
  return (vf)((vi)t | sign);
}

// In-register 16 x 16 transpose of 32-bit lanes (vec16.hpp's butterfly; pure data movement).
BA_AI void transpose16(vi (&x)[16]) {
#pragma GCC unroll 16
  for (int r = 0; r < 16; r += 2) {
    const vi a = x[r], b = x[r + 1];
    x[r] = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    x[r + 1] = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    if (r & 2) continue;
    const vi a = x[r], b = x[r + 2];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    x[r + 2] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    if (r & 4) continue;
    const vi a = x[r], b = x[r + 4];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    x[r + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 8; ++r) {
    const vi a = x[r], b = x[r + 8];
    x[r] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    x[r + 8] = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}

// dst[c * 64 + r] = word c of row r (src + r * lds_words words: a row's bf16 pairs), r < nr, c < ncw; zero for
// nr <= r < 64: rows of bf16 pairs transposed into pair-major columns of 64 (exact; ncw % 8 == 0).
BA_AI void pack_pairs_t(const uint16_t* src, int64_t lds_words, int64_t nr, int64_t ncw, uint32_t* dst) {
  const u32a* s = reinterpret_cast<const u32a*>(src);
  for (int64_t r0 = 0; r0 < TILE; r0 += L) {
    for (int64_t c0 = 0; c0 < ncw; c0 += L) {
      const int64_t nc = std::min<int64_t>(L, ncw - c0);
      const __mmask16 m = __mmask16((1u << nc) - 1);
      vi x[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r)
        x[r] = r0 + r < nr ? (vi)_mm512_maskz_loadu_epi32(m, s + (r0 + r) * lds_words + c0) : vi{};
      transpose16(x);
      for (int64_t c = 0; c < nc; ++c) _mm512_storeu_si512(dst + (c0 + c) * TILE + r0, (__m512i)x[c]);
    }
  }
}

// dst[jp * D + d] = (rows[2 jp][d], rows[2 jp + 1][d]) for jp < (n + 1) / 2, rows `ld` elements apart, the row past
// n zero: rows of bf16 interleaved into pairs along the row axis (exact; D % 16 == 0).
BA_AI void pack_row_pairs(const uint16_t* rows, int64_t ld, int64_t n, int64_t D, uint32_t* dst) {
  for (int64_t jp = 0; jp < (n + 1) / 2; ++jp) {
    const uint16_t* r0 = rows + 2 * jp * ld;
    if (2 * jp + 1 < n) {
      for (int64_t d = 0; d < D; d += L) _mm512_storeu_si512(dst + jp * D + d, pair_rows(r0 + d, r0 + ld + d));
    } else {
      for (int64_t d = 0; d < D; d += L)
        _mm512_storeu_si512(dst + jp * D + d,
                            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + d))));
    }
  }
}

// ---------------------------------------------------------------- the vdpbf16ps micro-kernel

enum Init { kSet, kAdd, kScaleRowAdd };

// C[r][0, 16 NV) (op)= sum_k pair(A[r * ars + k * aks]) . pair(B[k * ldb + (0, 16 NV)]) for r < R: A, B words
// holding bf16 pairs (one pair = two steps of the sum); one broadcast word of A and NV loads of B feed R * NV
// f32 accumulators (vdpbf16ps: acc += a.lo b.lo + a.hi b.hi per lane).
template <int R, int NV, int INIT>
BA_AI void mk(float* __restrict C, int64_t ldc, const uint32_t* __restrict A, int64_t ars, int64_t aks,
              const uint32_t* __restrict B, int64_t ldb, int64_t K, const float* __restrict rowscale, float cs) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (INIT == kSet) acc[r][v] = _mm512_setzero_ps();
      if constexpr (INIT == kAdd) acc[r][v] = _mm512_loadu_ps(C + r * ldc + v * L);
      if constexpr (INIT == kScaleRowAdd)
        acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(C + r * ldc + v * L), _mm512_set1_ps(rowscale[r]));
    }
  for (int64_t k = 0; k < K; ++k) {
    const uint32_t* b = B + k * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + v * L);
    const u32a* a = A + k * aks;  // (words of bf16 storage or of scratch written by intrinsics)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int32_t(a[r * ars]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (INIT == kSet) acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(cs));
      _mm512_storeu_ps(C + r * ldc + v * L, acc[r][v]);
    }
}

// 32 zmm: R * NV accumulators, NV of B, one broadcast.
constexpr int rows_for(int nv) { return std::min(8, (32 - nv - 1) / nv); }

template <int NV, int INIT>
BA_AI void gemm_nv(float* C, int64_t ldc, const uint32_t* A, int64_t ars, int64_t aks, const uint32_t* B, int64_t ldb,
                   int64_t M, int64_t K, const float* rs, float cs) {
  constexpr int RM = rows_for(NV);
  const auto at = [rs](int64_t r) { return INIT == kScaleRowAdd ? rs + r : rs; };
  int64_t r = 0;
  for (; r + RM <= M; r += RM) mk<RM, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r), cs);
  for (; r + 4 <= M; r += 4) mk<4, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r), cs);
  for (; r + 2 <= M; r += 2) mk<2, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r), cs);
  for (; r < M; ++r) mk<1, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r), cs);
}

// C [M, N] (op)= A [M, K pairs] B [K pairs, N]: A's pair (m, k) at A[m * ars + k * aks], B's row k at B + k * ldb
// (N words: N columns); N % 16 == 0. kSet stores cs times the sums (one f32 multiply: the softmax scale).
template <int INIT>
BA_AI void gemm(float* C, int64_t ldc, const uint32_t* A, int64_t ars, int64_t aks, const uint32_t* B, int64_t ldb,
                int64_t M, int64_t K, int64_t N, const float* rowscale = nullptr, float cs = 1.0f) {
  if (M <= 0 || K <= 0) {
    if (INIT == kSet && K <= 0)
      for (int64_t m = 0; m < M; ++m) std::memset(C + m * ldc, 0, size_t(N) * sizeof(float));
    if (INIT == kScaleRowAdd && K <= 0)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) C[m * ldc + n] *= rowscale[m];
    return;
  }
  for (int64_t n0 = 0; n0 < N; n0 += 4 * L) {
    switch (std::min<int64_t>(4, (N - n0) / L)) {
      case 4:
        gemm_nv<4, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, rowscale, cs);
        break;
      case 3:
        gemm_nv<3, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, rowscale, cs);
        break;
      case 2:
        gemm_nv<2, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, rowscale, cs);
        break;
      default:
        gemm_nv<1, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, rowscale, cs);
        break;
    }
  }
}

// ---------------------------------------------------------------- visibility of key blocks (shared with attention.cpp)

#include "attention_visibility.hpp"  // Vis, classify, classify_segments, classify_all; runs of batches

// ---------------------------------------------------------------- forward

size_t fwd_ws(const Geo& g) { return size_t(g.Dw * TILE + TILE * TILE + (TILE / 2) * TILE + TILE * g.D); }

// One (b, h, query block of <= 64); the longest (latest) query blocks first.
void fwd_task(const Geo& g, const Ptrs& P, int64_t task, float* ws) {
  const int64_t nqb = (g.T + TILE - 1) / TILE;
  const int64_t bh = task % (g.B * g.Hq), ib = nqb - 1 - task / (g.B * g.Hq);
  const int64_t b = bh / g.Hq, h = bh % g.Hq, hk = h / g.G, D = g.D;
  const int64_t t0 = ib * TILE, nq = std::min(TILE, g.T - t0);
  const int NV = int((nq + L - 1) / L);
  const int64_t LN = int64_t(NV) * L;

  uint32_t* QTp = reinterpret_cast<uint32_t*>(ws);               // [Dw][64]  Q's pairs along D, query columns
  float* ST = ws + g.Dw * TILE;                                  // [64 keys][64 queries]  S^T, then P^T (f32)
  uint32_t* Pp = reinterpret_cast<uint32_t*>(ST + TILE * TILE);  // [32 key pairs][64 queries]  P^T in bf16 pairs
  float* O = ST + TILE * TILE + (TILE / 2) * TILE;               // [64][D]  unnormalised O (f32)

  pack_pairs_t(P.q + ((b * g.T + t0) * g.Hq + h) * D, g.qrs / 2, nq, g.Dw, QTp);
  bool started = false;
  vf mv[4], lv[4];
  for (int v = 0; v < 4; ++v) mv[v] = vset(kNegInf), lv[v] = vf{};

  const int64_t pmin = g.qoff + t0, pmax = pmin + nq - 1;
  const int64_t slo = g.window ? std::max<int64_t>(0, pmin - g.window + 1) / 2 * 2 : 0;  // even: whole key pairs
  const int64_t shi = g.causal ? std::min<int64_t>(g.S, pmax + 1) : g.S;
  const uint32_t* kb = reinterpret_cast<const uint32_t*>(P.k + b * g.S * g.krs + hk * D);  // (words)
  const uint32_t* vpb = P.vpairs + (b * g.Hkv + hk) * g.Sh * D;
  const float inv_cap = g.cap > 0 ? 1.0f / g.cap : 0.0f;
  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  alignas(64) int32_t qseg[TILE];
  if (segrow)
    for (int64_t i = 0; i < TILE; ++i) qseg[i] = i < nq ? segrow[pmin + i] : -1;
  const int64_t krw = g.krs / 2;  // K row stride in words

  for (int64_t s0 = slo; s0 < shi; s0 += TILE) {
    const int64_t s1 = std::min(s0 + TILE, shi), nk = s1 - s0;
    bool seg_mask = false;
    const Vis vis = classify_all(g, b, pmin, pmax, s0, s1, &seg_mask);
    if (vis == kNone) continue;
    int first[4] = {0, 0, 0, 0};
    const int nch = int((nk + L - 1) / L);
    if (vis == kPartial && g.causal)
      for (int c = 0; c < nch; ++c) {
        const int64_t x = s0 + c * L - (pmin + L - 1);
        first[c] = x <= 0 ? 0 : int(std::min<int64_t>(NV, (x + L - 1) / L));
      }
    // S^T[j][i] = scale * sum over D pairs of K[s0 + j] . Q[i] (vdpbf16ps, f32 sums; the scale at the store)
    for (int c0 = 0, c1; c0 < nch; c0 = c1) {
      for (c1 = c0 + 1; c1 < nch && first[c1] == first[c0];) ++c1;
      const int64_t r0 = c0 * L, r1 = std::min<int64_t>(nk, c1 * L), l0 = first[c0] * L;
      if (l0 < LN)
        gemm<kSet>(ST + r0 * TILE + l0, TILE, kb + (s0 + r0) * krw, krw, 1, QTp + l0, TILE, r1 - r0, g.Dw, LN - l0,
                   nullptr, g.scale);
    }
    // softcap and masks (skipped sub-tiles are exactly masked ones: set to -inf here, unread before), with the
    // running maxima of the query lanes
    vf mx[4] = {mv[0], mv[1], mv[2], mv[3]};
    if (g.cap > 0 || vis == kPartial) {
      for (int64_t j = 0; j < nk; ++j) {
        const vi sv = viset(int32_t(s0 + j));
        for (int v = 0; v < NV; ++v) {
          float* s = ST + j * TILE + v * L;
          vf x = vload(s);
          if (g.cap > 0) x = vtanh(x * inv_cap) * g.cap;
          if (vis == kPartial) {
            const vi pos = viset(int32_t(pmin + v * L)) + iota();
            if (g.causal) x = vsel(sv <= pos, x, vset(kNegInf));
            if (g.window) x = vsel((pos - sv) < viset(int32_t(g.window)), x, vset(kNegInf));
            if (seg_mask) {
              const vi qs = viload(qseg + v * L);
              x = vsel(qs == viset(segrow[s0 + j]), x, vset(kNegInf));
              x = vsel(qs != vi{}, x, vset(kNegInf));
            }
          }
          vstore(s, x);
          mx[v] = vmax(mx[v], x);
        }
      }
    } else {
      for (int64_t j = 0; j < nk; ++j)
        for (int v = 0; v < NV; ++v) mx[v] = vmax(mx[v], vload(ST + j * TILE + v * L));
    }
    // online softmax (f32), per vector of 16 queries; P^T rounded to bf16 pairs along keys into Pp
    float alpha[TILE];
    const int64_t nkp = (nk + 1) / 2;
    for (int v = 0; v < NV; ++v) {
      const vf muse = vsel(mx[v] == vset(kNegInf), vf{}, mx[v]);
      const vf a = vexp_upto88(mv[v] - muse);
      mv[v] = mx[v];
      vf sum = {};
      for (int64_t jp = 0; jp < nkp; ++jp) {
        const vf p0 = vexp_upto88(vload(ST + 2 * jp * TILE + v * L) - muse);
        const vf p1 = 2 * jp + 1 < nk ? vexp_upto88(vload(ST + (2 * jp + 1) * TILE + v * L) - muse) : vf{};
        sum += p0 + p1;
        _mm512_storeu_si512(Pp + jp * TILE + v * L, pair_bf16(p0, p1));
      }
      lv[v] = lv[v] * a + sum;
      vstore(alpha + v * L, a);
    }
    // O[i][:] = alpha[i] O[i][:] + sum over key pairs of P^T pair . V pair (rows of query, lanes over D)
    for (int c0 = 0, c1; c0 < nch; c0 = c1) {
      for (c1 = c0 + 1; c1 < nch && first[c1] == first[c0];) ++c1;
      const int64_t r0 = c0 * L, r1 = std::min<int64_t>(nk, c1 * L), l0 = first[c0] * L;
      if (l0 >= LN) continue;
      float* C = O + l0 * D;
      const uint32_t* A = Pp + (r0 / 2) * TILE + l0;
      const uint32_t* Bv = vpb + ((s0 + r0) / 2) * D;
      const int64_t kp = (r1 - r0 + 1) / 2;
      if (c0 == 0 && !started) {
        std::memset(O, 0, size_t(l0 * D) * sizeof(float));
        gemm<kSet>(C, D, A, 1, TILE, Bv, D, nq - l0, kp, D);
        started = true;
      } else if (c0 == 0) {
        gemm<kScaleRowAdd>(C, D, A, 1, TILE, Bv, D, nq - l0, kp, D, alpha + l0);
      } else {
        gemm<kAdd>(C, D, A, 1, TILE, Bv, D, nq - l0, kp, D);
      }
    }
  }
  if (!started) std::memset(O, 0, size_t(nq * D) * sizeof(float));

  float mf[TILE], lf[TILE];
  for (int v = 0; v < 4; ++v) vstore(mf + v * L, mv[v]), vstore(lf + v * L, lv[v]);
  float* lse = P.lse_out + (b * g.Hq + h) * g.T + t0;
  const int64_t ob = ((b * g.T + t0) * g.Hq + h) * D;
  for (int64_t i = 0; i < nq; ++i) {
    float inv = 0.0f;
    if (lf[i] > 0.0f) {
      inv = 1.0f / lf[i];
      lse[i] = mf[i] + std::log(lf[i]);
    } else {
      lse[i] = kNegInf;
    }
    for (int64_t d = 0; d < D; d += L) vstore_out(P.out, ob + i * g.qrs + d, vload(O + i * D + d) * inv, P.f32_out);
  }
}

// V [B, S, Hkv, D] as key pairs: dst[((b * Hkv + hk) * Sh + jp) * D + d] = (V[2jp][d], V[2jp + 1][d]) (zero past S).
void pack_v_pairs(const Geo& g, const uint16_t* v, uint32_t* dst, int64_t b, int64_t jp) {
  const int64_t s = 2 * jp;
  alignas(64) static const uint16_t zeros[kMaxD] = {};
  for (int64_t hk = 0; hk < g.Hkv; ++hk) {
    const uint16_t* r0 = v + ((b * g.S + s) * g.Hkv + hk) * g.D;
    const uint16_t* r1 = s + 1 < g.S ? r0 + g.krs : zeros;
    uint32_t* o = dst + ((b * g.Hkv + hk) * g.Sh + jp) * g.D;
    for (int64_t d = 0; d < g.D; d += L) _mm512_storeu_si512(o + d, pair_rows(r0 + d, r1 + (s + 1 < g.S ? d : 0)));
  }
}

// Per-thread scratch kept for the life of the (pooled) OpenMP thread (attention.cpp's): no allocation or page
// faults per call; it grows to the largest request seen.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void forward_impl(const Geo& g, Ptrs P, uint32_t* vpairs) {
  const int nth = omp_get_max_threads();
  const int64_t npairs = g.B * g.Sh;
  P.vpairs = vpairs;
  const int64_t nqb = (g.T + TILE - 1) / TILE, ntasks = g.B * g.Hq * nqb;
  const size_t ws_size = fwd_ws(g);
  if (nth == 1 || ntasks <= 1) {
    for (int64_t i = 0; i < npairs; ++i) pack_v_pairs(g, P.v, vpairs, i / g.Sh, i % g.Sh);
    float* ws = scratch(ws_size);
    for (int64_t task = 0; task < ntasks; ++task) fwd_task(g, P, task, ws);
    return;
  }
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < npairs; ++i) pack_v_pairs(g, P.v, vpairs, i / g.Sh, i % g.Sh);
    float* ws = scratch(ws_size);
    if (static_forward_runs(g, nqb, nth)) {  // one contiguous run of batches per thread (attention_visibility.hpp)
#pragma omp for schedule(static)
      for (int64_t i = 0; i < ntasks; ++i) fwd_task(g, P, forward_task_in_batch_order(g, i, nqb), ws);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < ntasks; ++task) fwd_task(g, P, task, ws);
    }
  }
}

// ---------------------------------------------------------------- backward

// Per-task workspace (floats and words of 4 bytes), see bwd_task.
struct BwdWs {
  size_t qp, dop, dsum, dqacc, ktp, vtp, kpair, dkacc, dvacc, pt, dst, th, ptp, dstp, dsb, total;
};
BwdWs bwd_ws(const Geo& g) {
  const size_t G = size_t(g.G), Th = size_t((g.T + 1) / 2), T = size_t(g.T), D = size_t(g.D), Dw = size_t(g.Dw);
  const size_t n = size_t(TILE);
  BwdWs w{};
  size_t at = 0;
  const auto take = [&at](size_t k) {
    const size_t here = at;
    at += (k + 15) / 16 * 16;  // 64-byte multiples
    return here;
  };
  w.qp = take(G * Th * D), w.dop = take(G * Th * D), w.dsum = take(G * T), w.dqacc = take(G * T * D);
  w.ktp = take(Dw * n), w.vtp = take(Dw * n), w.kpair = take(n / 2 * D), w.dkacc = take(n * D), w.dvacc = take(n * D);
  w.pt = take(n * n), w.dst = take(n * n), w.th = take(n * n), w.ptp = take(n / 2 * n), w.dstp = take(n / 2 * n);
  w.dsb = take(n * n / 2);
  w.total = at;
  return w;
}

// (b, kv head hk): all key blocks, all G query heads that read the kv head. The task owns dk / dv of the kv head
// and dq of its query heads (summed in f32 over every key block, rounded once at the end).
void bwd_task(const Geo& g, const Ptrs& P, int64_t b, int64_t hk, float* wsf, const BwdWs& W) {
  const int64_t D = g.D, Dw = g.Dw, G = g.G, T = g.T, Th = (T + 1) / 2;
  uint32_t* wsu = reinterpret_cast<uint32_t*>(wsf);
  uint32_t* Qp = wsu + W.qp;        // [G][Th][D]  Q rows in pairs along queries (dK += dS^T Q)
  uint32_t* dOp = wsu + W.dop;      // [G][Th][D]  dO rows in pairs along queries (dV += P^T dO)
  float* Dsum = wsf + W.dsum;       // [G][T]  rowsum(dO * O), f32 from the bf16 rows
  float* dQacc = wsf + W.dqacc;     // [G][T][D]  f32 dq
  uint32_t* KTp = wsu + W.ktp;      // [Dw][64]  K^T of the key block, pairs along D (S = Q K^T)
  uint32_t* VTp = wsu + W.vtp;      // [Dw][64]  V^T, pairs along D (dP = dO V^T)
  uint32_t* Kpair = wsu + W.kpair;  // [32][D]  K rows in pairs along keys (dQ += dS K)
  float* dKacc = wsf + W.dkacc;     // [64][D]  f32 dk rows of the block
  float* dVacc = wsf + W.dvacc;     // [64][D]
  float* Pt = wsf + W.pt;           // [64 queries][64 keys]  P (f32)
  float* dSt = wsf + W.dst;         // [64][64]  dP (f32)
  float* TH = wsf + W.th;           // [64][64]  tanh(s / cap)
  uint32_t* PTp = wsu + W.ptp;      // [32 query pairs][64 keys]  P^T, bf16 pairs along queries
  uint32_t* dSTp = wsu + W.dstp;    // [32][64]  dS^T, bf16 pairs along queries
  uint16_t* dSb = reinterpret_cast<uint16_t*>(wsu + W.dsb);  // [64 queries][64 keys]  dS in bf16 (pairs along keys)
  const uint32_t* dSw = wsu + W.dsb;                         // (the same, as words [64][32])

  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t h = hk * G + gi;
    const uint16_t* qh = P.q + (b * T * g.Hq + h) * D;
    const uint16_t* doh = P.dout + (b * T * g.Hq + h) * D;
    const uint16_t* oh = P.o + (b * T * g.Hq + h) * D;
    pack_row_pairs(qh, g.qrs, T, D, Qp + gi * Th * D);
    pack_row_pairs(doh, g.qrs, T, D, dOp + gi * Th * D);
    for (int64_t t = 0; t < T; ++t) {
      vf acc = {};
      for (int64_t d = 0; d < D; d += L) acc += vload_bf16(doh + t * g.qrs + d) * vload_bf16(oh + t * g.qrs + d);
      Dsum[gi * T + t] = _mm512_reduce_add_ps((__m512)acc);
    }
  }
  std::memset(dQacc, 0, size_t(G * T * D) * sizeof(float));

  const uint16_t* kb = P.k + b * g.S * g.krs + hk * D;
  const uint16_t* vb = P.v + b * g.S * g.krs + hk * D;
  const float inv_cap = g.cap > 0 ? 1.0f / g.cap : 0.0f;
  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  const int64_t qrw = g.qrs / 2;  // q / dout row stride in words
  const int64_t nkb = (g.S + TILE - 1) / TILE;
  for (int64_t jb = 0; jb < nkb; ++jb) {
    const int64_t s0 = jb * TILE, s1 = std::min(s0 + TILE, g.S), nk = s1 - s0;
    std::memset(dKacc, 0, size_t(nk * D) * sizeof(float));
    std::memset(dVacc, 0, size_t(nk * D) * sizeof(float));
    const auto store_dkv = [&] {
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t row = ((b * g.S + s0 + j) * g.Hkv + hk) * D;
        for (int64_t d = 0; d < D; d += L) {
          vstore_out(P.dk, row + d, vload(dKacc + j * D + d), P.f32_out);
          vstore_out(P.dv, row + d, vload(dVacc + j * D + d), P.f32_out);
        }
      }
    };
    // queries that can see some key of the block: pos >= s0 (causal), pos < s1 - 1 + window; the first one
    // rounded down to even (query pairs; the extra row sees nothing of the block: masked)
    int64_t t_lo = g.causal ? std::clamp<int64_t>(s0 - g.qoff, 0, T) : 0;
    const int64_t t_hi = g.window ? std::clamp<int64_t>(s1 - 1 + g.window - g.qoff, 0, T) : T;
    if (t_lo >= t_hi) {
      store_dkv();
      continue;
    }
    t_lo &= ~int64_t(1);
    if (segrow) {  // query blocks that see nothing of this key block, segment-wise too, are skipped before packing
      bool any = false;
      for (int64_t t0 = t_lo; t0 < t_hi && !any; t0 += TILE)
        any = classify_segments(g, b, g.qoff + t0, g.qoff + std::min(t0 + TILE, t_hi) - 1, s0, s1) != kNone;
      if (!any) {
        store_dkv();
        continue;
      }
    }
    alignas(64) int32_t kseg[TILE];
    if (segrow)
      for (int64_t j = 0; j < TILE; ++j) kseg[j] = j < nk ? segrow[s0 + j] : -2;
    pack_pairs_t(kb + s0 * g.krs, g.krs / 2, nk, Dw, KTp);
    pack_pairs_t(vb + s0 * g.krs, g.krs / 2, nk, Dw, VTp);
    pack_row_pairs(kb + s0 * g.krs, g.krs, nk, D, Kpair);
    const vi nkv = viset(int32_t(nk));
    const int64_t key_lanes = (nk + L - 1) / L * L;

    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t h = hk * G + gi;
      const uint32_t* qw = reinterpret_cast<const uint32_t*>(P.q + (b * T * g.Hq + h) * D);
      const uint32_t* dow = reinterpret_cast<const uint32_t*>(P.dout + (b * T * g.Hq + h) * D);
      const float* lseh = P.lse + (b * g.Hq + h) * T;
      const float* Dh = Dsum + gi * T;
      float* dqh = dQacc + gi * T * D;
      const uint32_t* Qph = Qp + gi * Th * D;
      const uint32_t* dOph = dOp + gi * Th * D;
      for (int64_t t0 = t_lo; t0 < t_hi; t0 += TILE) {
        const int64_t t1 = std::min(t0 + TILE, t_hi), nq = t1 - t0;
        const int64_t pmin = g.qoff + t0, pmax = g.qoff + t1 - 1;
        bool seg_mask = false;
        const Vis vis = classify_all(g, b, pmin, pmax, s0, s1, &seg_mask);
        if (vis == kNone) continue;
        const bool mask = vis == kPartial || nk < TILE;
        const int nch = int((nq + L - 1) / L);
        int64_t lanes[4];
        for (int c = 0; c < nch; ++c) {
          lanes[c] = key_lanes;
          if (vis == kPartial && g.causal) {
            const int64_t x = g.qoff + t0 + std::min<int64_t>(c * L + L - 1, nq - 1) - s0;
            lanes[c] = x < 0 ? 0 : std::min(key_lanes, (x / L + 1) * L);
          }
        }
        int64_t run_r0[4], run_r1[4], run_lanes[4];
        int nruns = 0;
        for (int c0 = 0, c1; c0 < nch; c0 = c1) {
          for (c1 = c0 + 1; c1 < nch && lanes[c1] == lanes[c0];) ++c1;
          if (lanes[c0] == 0) continue;
          run_r0[nruns] = c0 * L, run_r1[nruns] = std::min<int64_t>(nq, c1 * L), run_lanes[nruns] = lanes[c0];
          ++nruns;
        }
        // S = scale Q K^T (bf16 pairs along D, f32 sums), then P = exp(S [capped] - lse) in f32, masked to 0
        for (int r = 0; r < nruns; ++r)
          gemm<kSet>(Pt + run_r0[r] * TILE, TILE, qw + (t0 + run_r0[r]) * qrw, qrw, 1, KTp, TILE, run_r1[r] - run_r0[r],
                     Dw, run_lanes[r], nullptr, g.scale);
        for (int64_t i = 0; i < nq; ++i) {
          const int nv = int(lanes[i / L] / L);
          float* prow = Pt + i * TILE;
          float* throw_ = TH + i * TILE;
          const float lse = lseh[t0 + i];
          if (lse == kNegInf) {
            std::memset(prow, 0, size_t(nv * L) * sizeof(float));
            if (g.cap > 0) std::memset(throw_, 0, size_t(nv * L) * sizeof(float));
            continue;
          }
          const vi pos = viset(int32_t(g.qoff + t0 + i));
          const int32_t qs = segrow ? segrow[g.qoff + t0 + i] : 0;
          for (int v = 0; v < nv; ++v) {
            vf x = vload(prow + v * L);
            if (g.cap > 0) {
              const vf th = vtanh(x * inv_cap);
              vstore(throw_ + v * L, th);
              x = th * g.cap;
            }
            vf p = vexp(x - lse);
            if (mask) {
              const vi jl = iota() + viset(v * L);
              const vi sv = jl + viset(int32_t(s0));
              p = vsel(jl < nkv, p, vf{});
              if (g.causal) p = vsel(sv <= pos, p, vf{});
              if (g.window) p = vsel((pos - sv) < viset(int32_t(g.window)), p, vf{});
              if (seg_mask) {
                const vi ks = viload(kseg + v * L);
                p = vsel(ks == viset(qs), p, vf{});
                p = vsel(viset(qs) != vi{}, p, vf{});
              }
            }
            vstore(prow + v * L, p);
          }
        }
        // dP = dO V^T; dS = scale P (dP - Dsum) [* (1 - tanh^2)] in f32, by pairs of query rows: dS rounded
        // to bf16 into dSb (rows: pairs along keys, for dQ) and, with P, into dS^T / P^T pairs along queries (the
        // row past nq: zero)
        for (int r = 0; r < nruns; ++r)
          gemm<kSet>(dSt + run_r0[r] * TILE, TILE, dow + (t0 + run_r0[r]) * qrw, qrw, 1, VTp, TILE,
                     run_r1[r] - run_r0[r], Dw, run_lanes[r]);
        for (int64_t ip = 0; ip < (nq + 1) / 2; ++ip) {
          const int64_t i0 = 2 * ip, i1 = i0 + 1;
          const bool two = i1 < nq;
          const int nv = int(lanes[i0 / L] / L);  // (rows i0, i1 lie in one chunk of 16)
          const vf di0 = vset(Dh[t0 + i0]), di1 = vset(two ? Dh[t0 + i1] : 0.0f);
          for (int v = 0; v < nv; ++v) {
            const vf p0 = vload(Pt + i0 * TILE + v * L), p1 = two ? vload(Pt + i1 * TILE + v * L) : vf{};
            vf x0 = p0 * g.scale * (vload(dSt + i0 * TILE + v * L) - di0);
            vf x1 = two ? p1 * g.scale * (vload(dSt + i1 * TILE + v * L) - di1) : vf{};
            if (g.cap > 0) {
              const vf th0 = vload(TH + i0 * TILE + v * L);
              x0 *= vset(1.0f) - th0 * th0;
              if (two) {
                const vf th1 = vload(TH + i1 * TILE + v * L);
                x1 *= vset(1.0f) - th1 * th1;
              }
            }
            vstore_bf16(dSb + i0 * TILE + v * L, x0);
            if (two) vstore_bf16(dSb + i1 * TILE + v * L, x1);
            _mm512_storeu_si512(PTp + ip * TILE + v * L, pair_bf16(p0, p1));
            _mm512_storeu_si512(dSTp + ip * TILE + v * L, pair_bf16(x0, x1));
          }
        }
        // dV[j][:] += sum_i P[i][j] dO[i][:];  dK[j][:] += sum_i dS[i][j] Q[i][:] (pairs along queries);
        // dQ[i][:] += sum_j dS[i][j] K[j][:] (pairs along keys)
        for (int r = 0; r < nruns; ++r) {
          const int64_t r0 = run_r0[r], nr = run_r1[r] - r0, nl = run_lanes[r], nkr = std::min(nk, nl);
          const int64_t qp0 = (t0 + r0) / 2, nqp = (nr + 1) / 2;
          gemm<kAdd>(dVacc, D, PTp + (r0 / 2) * TILE, 1, TILE, dOph + qp0 * D, D, nkr, nqp, D);
          gemm<kAdd>(dKacc, D, dSTp + (r0 / 2) * TILE, 1, TILE, Qph + qp0 * D, D, nkr, nqp, D);
          gemm<kAdd>(dqh + (t0 + r0) * D, D, dSw + r0 * (TILE / 2), TILE / 2, 1, Kpair, D, nr, (nkr + 1) / 2, D);
        }
      }
    }
    store_dkv();
  }
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t h = hk * G + gi;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = ((b * T + t) * g.Hq + h) * D;
      for (int64_t d = 0; d < D; d += L) vstore_out(P.dq, row + d, vload(dQacc + (gi * T + t) * D + d), P.f32_out);
    }
  }
}

void backward_impl(const Geo& g, const Ptrs& P) {
  const int64_t units = g.B * g.Hkv;
  const BwdWs W = bwd_ws(g);
  if (omp_get_max_threads() == 1 || units <= 1) {
    float* ws = scratch(W.total);
    for (int64_t u = 0; u < units; ++u) bwd_task(g, P, u / g.Hkv, u % g.Hkv, ws, W);
    return;
  }
#pragma omp parallel
  {
    float* ws = scratch(W.total);
    if (static_backward_runs(g)) {  // one contiguous run of batches per thread (attention_visibility.hpp)
#pragma omp for schedule(static)
      for (int64_t u = 0; u < units; ++u) bwd_task(g, P, u / g.Hkv, u % g.Hkv, ws, W);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; ++u) bwd_task(g, P, u / g.Hkv, u % g.Hkv, ws, W);
    }
  }
}

}  // namespace

}  // namespace dew::cpu::avx512bf16

#pragma GCC pop_options

// ==================================================================== entry points (baseline code)
namespace dew::cpu {
namespace {

using avx512bf16::Geo;
using avx512bf16::Ptrs;

void check_bf16(const Tensor& t, const char* what) {
  DEW_CHECK(t.defined(), "cpu attention (bf16): ", what, " is undefined");
  DEW_CHECK(t.dtype() == DType::bf16, "cpu attention (bf16): ", what, " must be bf16, got ", dtype_name(t.dtype()));
}
// An output: bf16, or f32 when `f32` (the medium form: every output of the call f32)
void check_output(const Tensor& t, bool f32, const char* what) {
  DEW_CHECK(t.defined(), "cpu attention (bf16): ", what, " is undefined");
  DEW_CHECK(t.dtype() == (f32 ? DType::f32 : DType::bf16), "cpu attention (bf16): ", what, " must be ",
            f32 ? "f32 (as dq)" : "bf16", ", got ", dtype_name(t.dtype()));
}
void check_shape(const Tensor& t, const Shape& want, const char* what) {
  DEW_CHECK(t.shape() == want, "cpu attention (bf16): ", what, " has shape ", shape_str(t.shape()), ", expected ",
            shape_str(want));
}

Geo make_geo(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, const AttentionParams& p) {
  check_bf16(q, "q");
  check_bf16(k, "k");
  check_bf16(v, "v");
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4, "cpu attention (bf16): q and k must be [B, T, H, D]");
  check_shape(v, k.shape(), "v");
  Geo g{};
  g.B = q.size(0), g.T = q.size(1), g.Hq = q.size(2), g.D = q.size(3);
  g.S = k.size(1), g.Hkv = k.size(2);
  DEW_CHECK(k.size(0) == g.B && k.size(3) == g.D, "cpu attention (bf16): k ", shape_str(k.shape()),
            " does not match q ", shape_str(q.shape()));
  DEW_CHECK(g.Hkv > 0 && g.Hq % g.Hkv == 0, "cpu attention (bf16): Hq = ", g.Hq, " is not a multiple of Hkv = ", g.Hkv);
  DEW_CHECK(g.D % 16 == 0 && g.D <= kMaxD && g.T > kRowPathMaxT,
            "cpu attention (bf16): the vdpbf16ps kernel takes D % 16 == 0, D <= 256, T > 4 (ask "
            "attention_bf16_fast_covers)");
  DEW_CHECK(attention_bf16_fast_cpu(), "cpu attention (bf16): this CPU has no AVX512-BF16");
  DEW_CHECK(p.window >= 0, "cpu attention: window must be >= 0, got ", p.window);
  DEW_CHECK(p.softcap >= 0.0f, "cpu attention: softcap must be >= 0, got ", p.softcap);
  constexpr int64_t kMaxPos = int64_t(1) << 30;
  DEW_CHECK(g.S < kMaxPos && p.q_offset > -kMaxPos && p.q_offset + g.T < kMaxPos,
            "cpu attention: positions out of range (S = ", g.S, ", q_offset = ", p.q_offset, ", T = ", g.T, ")");
  g.G = g.Hq / g.Hkv;
  g.Dw = g.D / 2;
  g.qrs = g.Hq * g.D;
  g.krs = g.Hkv * g.D;
  g.Sh = (g.S + 1) / 2;
  g.scale = p.scale;
  g.cap = p.softcap;
  g.causal = p.causal;
  g.window = p.window >= kMaxPos ? 0 : p.window;
  g.qoff = p.q_offset;
  g.seg = contracts::check_attention_segments("cpu attention", segment_ids, g.B, g.T, g.S, p.q_offset)
              ? segment_ids.data_as<const int32_t>()
              : nullptr;
  return g;
}

}  // namespace

void attention_bf16_fast_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                 Tensor& out, Tensor& lse, const AttentionParams& p) {
  const Geo g = make_geo(q, k, v, segment_ids, p);
  check_output(out, out.dtype() == DType::f32, "out");
  check_shape(out, q.shape(), "out");
  DEW_CHECK(lse.defined() && lse.dtype() == DType::f32, "cpu attention (bf16): lse must be f32");
  check_shape(lse, Shape{g.B, g.Hq, g.T}, "lse");
  if (g.B == 0 || g.Hq == 0) return;
  Ptrs P{};
  P.q = q.data_as<const uint16_t>();
  P.k = k.data_as<const uint16_t>();
  P.v = v.data_as<const uint16_t>();
  P.out = out.data();
  P.f32_out = out.dtype() == DType::f32;
  P.lse_out = lse.data_as<float>();
  thread_local std::vector<uint32_t> vpairs;  // grows to the largest call (kept: no page faults per call)
  const size_t need = size_t(g.B * g.Hkv * g.Sh * g.D);
  if (vpairs.size() < need) vpairs.resize(need);
  avx512bf16::forward_impl(g, P, vpairs.data());
}

void attention_bf16_fast_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                  Tensor& dv, const AttentionParams& p) {
  const Geo g = make_geo(q, k, v, segment_ids, p);
  const bool f32_out = dq.defined() && dq.dtype() == DType::f32;
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&out, "out"}, {&dout, "dout"}}) {
    check_bf16(*t, what);
    check_shape(*t, q.shape(), what);
  }
  check_output(dq, f32_out, "dq");
  check_shape(dq, q.shape(), "dq");
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&dk, "dk"}, {&dv, "dv"}}) {
    check_output(*t, f32_out, what);
    check_shape(*t, k.shape(), what);
  }
  DEW_CHECK(lse.defined() && lse.dtype() == DType::f32, "cpu attention (bf16): lse must be f32");
  check_shape(lse, Shape{g.B, g.Hq, g.T}, "lse");
  if (g.B == 0 || g.Hq == 0) return;
  if (g.S == 0) {  // nothing attends: zero gradients
    if (dq.numel()) std::memset(dq.data(), 0, dq.nbytes());
    return;
  }
  Ptrs P{};
  P.q = q.data_as<const uint16_t>();
  P.k = k.data_as<const uint16_t>();
  P.v = v.data_as<const uint16_t>();
  P.o = out.data_as<const uint16_t>();
  P.dout = dout.data_as<const uint16_t>();
  P.lse = lse.data_as<const float>();
  P.dq = dq.data();
  P.dk = dk.data();
  P.dv = dv.data();
  P.f32_out = f32_out;
  avx512bf16::backward_impl(g, P);
}

}  // namespace dew::cpu

#pragma GCC diagnostic pop
