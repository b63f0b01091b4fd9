// cpu/attention.cpp — fused scaled-dot-product attention of the `cpu` backend: FlashAttention-2 style
// forward and backward, f32.
//
// Why hand-written: oneDNN 2.6 (the cpu backend's kernel library) has no attention primitive, and composing
// matmul + softmax + matmul materialises the [T, S] score matrix of every head and re-reads it several times
// in the backward. Here at most one 64 x 64 tile of scores (plus its dP/dS companions) exists per thread.
//
// Forward — one task per (batch, query head, block of <= 64 queries), OpenMP dynamic schedule, biggest first
//   (static, a run of batches per thread, when the runs cost the same: attention_visibility.hpp, "runs of batches";
//   on one thread in (batch, head, block) order, so a head's K and V stay in cache over its query blocks: char-small's
//   forward 4.18-4.32 -> 4.05-4.09 ms on the Emerald Rapids Xeon, `dew-bench kernels --only attention`, same bits):
//   scores are held transposed, S^T [key, query], so the 16 lanes of a vector run over queries. The online
//   softmax (running max m, running sum l, rescale alpha = exp(m_old - m_new)) is then plain vertical vector
//   code. Both products, S^T = K Q^T and O = alpha O + P V (O in query rows: no transpose back), are
//   register-blocked micro-kernels that broadcast one operand (K's input rows, P^T's rows) and load the other
//   from a packed tile or the input rows (Q^T, V). The first key block a task sees sets O; later ones rescale
//   its rows by alpha inside the product.
//   Short queries (T <= 4: decoding) take a row path instead (dot products over D, exact two-pass softmax).
//   A row task is one query position and a group of its heads (all of them unless the threads need more
//   tasks), walked together over the positions, so the cache streams as whole position rows instead of one
//   head's strided slice per pass (on the AVX2 EPYC: attention 0.28 -> 0.16 ms of a char-small bf16 decode
//   token, with the avx2 bf16 load below); the span 8 positions ahead is prefetched, a hint that changes no
//   result. The grouping changes no bit: each (head, key) product and each head's sums run as for one head.
//   On avx512 (D % 16 == 0) the scores are made 16 positions at a time: the rows still stream in order, each head's
//   16 lane sums are kept, and the 16 dots' final trees are reduced together by shuffles doing the very adds of
//   hsum16 (hsum16x16): the same bits; a bf16 cache's row task 8.4 -> 6.7 us warm, 10 -> 8-9 us cold (one
//   char-small layer at position 143, Zen 5; f32 unchanged: its time is the stream). The P V sums of up to 16
//   vectors (4 heads of 64) stay in registers over blocks of 32 positions (pv_in_registers) and the max runs over
//   16 lanes: the same bits, one query against 6 heads x 1024 positions 1.4-2x faster on avx512 and avx2
//   (`dew-bench kernels --only decode`, decode_attention; docs/benchmarks.md, session 28).
// attention_slots (a serving step: rows on their own slots of a cache [slots, C, Hkv, D], each at its own position):
//   the rows' K/V writes, then the row tasks above over every row at once, row b reading slot kv_batch[b] from position
//   qoffs[b] (Geo): the same task code as the row alone over its slot's prefix, so the same bits (served = solo).
// bf16 K/V under f32 q (a bf16 decode cache, dew/kernel_table.hpp): the row path reads the bf16 rows and widens
//   them in registers (exact: the bits shifted up 16), so it streams half the bytes and computes exactly what it
//   computes on the widened f32 rows, bit for bit (dot's scalar tail runs one shared loop); longer queries
//   (a prefill on the cache) widen K and V once into f32 buffers and take the f32 lane path. The backward and
//   max_logit take f32 only; below, "every tensor is f32" reads "q, out and the statistics are f32" for this form.
// Backward (FlashAttention-2) — for each key block K^T and V^T are packed once; for each query block that
//   can see it P = exp(S - lse) is recomputed from the saved lse, dP = dO V^T, dS = scale P (dP - Dsum) with
//   Dsum = rowsum(dO * O), and dV += P^T dO, dK += dS^T Q (key rows, written in place: no transpose back),
//   dQ += dS K (lanes run over keys). A task is one (batch, kv head): it owns dk/dv of that kv head and dq of
//   the Hq/Hkv query heads that read it, so no two threads write the same element and dq is summed in place.
//   When there are too few (batch, kv head) pairs to balance the threads, tasks become (batch, kv head, key
//   block) and every thread sums its dq into a private buffer; the buffers are added at the end (still
//   race-free). dK / dV of a key block, and a query block's dq rows (when the task owns them), are set by the
//   first product that spans them, not zeroed and added to (the same bits). Rows of K, Q, dO (read) and dK, dV
//   (written) are used in place when D is a multiple of 16, else through copies zero padded to Dp.
// Masking: key blocks hidden by causality or the window are never visited, fully visible blocks skip the mask,
//   and inside a block on the causal diagonal the 16 x 16 sub-tiles above the diagonal are not computed.
// Documents (segment_ids [B, S], packed rows): a key is also hidden unless its segment equals the query's and
//   that is not 0. A tile pair whose query and key segment ranges do not meet is skipped like a causally hidden
//   one, a pair inside one document is treated as unsegmented, and only pairs that straddle a boundary apply
//   the segment mask, so a long row of short documents does the work of its block-diagonal part.
// Softcap c: s' = c tanh(s / c); its backward multiplies dS by (1 - tanh^2).
// attention_max_logit (QK-Clip's statistic) — the forward's tasks, key blocks, S^T products and masks, reduced
//   to the largest raw score of the block (before softcap; padding lanes excluded; documents as the forward's)
//   instead of a softmax; the per-task maxima are then reduced per head in task order (a max: exact, thread-count
//   independent).
//
// Invariants: every tensor is contiguous f32 (checked); tiles are 64 wide (4 vectors of 16); lanes past the
// valid query/key count compute on zero padding and are never stored; a masked score is -inf or its P is
// forced to 0, so it contributes exactly nothing (sub-tiles that are skipped are exactly masked ones, and
// nothing reads them unmasked); a row with no visible key keeps m = -inf, l = 0 and is written as zeros with
// lse = -inf (and gets zero gradients). Results are run-to-run deterministic; they do not depend on the thread
// count either, except dq under the key-block split (a different summation order).
// ISA: kernels use GCC/Clang vector extensions (no intrinsics) on 16-lane logical vectors (vec16.hpp: one
// 64-byte vector on avx512, a struct of native 8- or 4-lane parts on avx2 and the portable path, so compares,
// selects and shuffles stay native there; a vector select is vsel(m, a, b)); the file is compiled once per
// path (isa_clones.hpp: avx512, avx2, portable, each with its own register blocking) and the caller names the
// path (the backend's `isa`, isa.hpp), so the speed never depends on the plugin's flags. The blocking and the
// lane-count-dependent reductions differ per path, so paths agree within the tolerance of
// tests/backends_cpu_attention, not bit for bit. exp and tanh are vector polynomials (Cephes expf; relative
// error ~1e-7).
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "attention.hpp"

#include <immintrin.h>  // vec16.hpp's avx2 bf16 load
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "dew/error.hpp"
#include "dew/kernel_contracts.hpp"

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector arguments: everything below is inlined

#define DEW_CPU_ISA_SELF "attention.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, Tensor& out,
                       Tensor& lse, const AttentionParams& p, Isa isa) {
  DEW_CPU_ISA_CALL(isa, attention_forward, q, k, v, segment_ids, out, lse, p);
}
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionParams& p, Isa isa) {
  DEW_CPU_ISA_CALL(isa, attention_backward, q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p);
}
void attention_max_logit(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                         const AttentionParams& p, Isa isa) {
  DEW_CPU_ISA_CALL(isa, attention_max_logit, q, k, segment_ids, out, p);
}
void attention_slots_forward(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                             const std::vector<int64_t>& slots, const std::vector<int64_t>& positions, Tensor& k_cache,
                             Tensor& v_cache, Tensor& out, const AttentionParams& p, Isa isa) {
  DEW_CPU_ISA_CALL(isa, attention_slots_forward, q, k_new, v_new, slots, positions, k_cache, v_cache, out, p);
}

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but vec16.hpp and
       // attention_visibility.hpp)

// This path's 16-lane vectors and their helpers: vf / vi / vu, vload, vstore, viload, vload_bf16, vset, viset, iota,
// vsel, vmax, hsum16, transpose16 (native code on every path: one zmm per vector on avx512, two ymm on avx2, four
// xmm on the portable path).
#include "vec16.hpp"

namespace {

constexpr int L = 16;           // lanes of one vector
constexpr int64_t TILE = 64;    // tile width: 4 vectors (queries in the forward, keys in the backward)
constexpr int64_t FWD_BK = 64;  // keys per forward step
constexpr int64_t BWD_BQ = 64;  // queries per backward step
constexpr int64_t ROW_PATH_MAX_T = 4;
constexpr int64_t kMaxRowHeads = 16;  // query heads one row task walks together
// Row work (a decode step's attention) reading less K/V than this runs on one thread (attention_forward).
constexpr int64_t kRowSerialBytes = int64_t(1) << 20;
static_assert(FWD_BK <= TILE && BWD_BQ <= TILE, "the causal sub-tile tables hold 4 chunks of 16");
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------- vector helpers (vf, vload, vsel, ...: vec16.hpp)

// vexp_upto88 / vexp (e^x for softmax arguments): vec16.hpp, shared with the loss.

// tanh(y) = sign(y) (1 - 2 / (e^{2|y|} + 1)); absolute error ~1e-7.
DEW_AI vf vtanh(const vf& y) {
  const vi sign = (vi)y & viset(INT32_MIN);
  const vf a = (vf)((vi)y ^ sign);
  const vf e = vexp(a + a);
  const vf t = vset(1.0f) - vset(2.0f) / (e + vset(1.0f));
  return (vf)((vi)t | sign);
}

// ---- K/V rows of f32 or bf16 (a bf16 K/V cache), widened exactly: the bf16 bits shifted up 16 are the f32 bits.
DEW_AI float widen_bf16(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
// (own name: a vload overload here would hide isa.hpp's vload(const float*) in this namespace)
DEW_AI vf vload_row(const float* p) { return vload(p); }
DEW_AI vf vload_row(const uint16_t* p) { return vload_bf16(p); }
// The scalar tail of dot(): the one loop both row types run (on f32 values), so the compiler treats it alike
// (it vectorises an f32 tail into unfused products; a bf16 tail of its own became scalar FMAs: other bits).
DEW_AI float dot_tail(float s, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// dot()'s 16 lane sums before its tree (the same code): acc0 (even steps of 16, a last odd one) + acc1 (odd steps).
template <class B>
DEW_AI vf dot_lanes(const float* a, const B* b, int64_t n) {
  vf acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    acc0 += vload(a + i) * vload_row(b + i);
    acc1 += vload(a + i + L) * vload_row(b + i + L);
  }
  for (; i + L <= n; i += L) acc0 += vload(a + i) * vload_row(b + i);
  return acc0 + acc1;
}

// sum a[i] b[i] for b f32 or bf16 (widened in registers): the same bits for a bf16 row as for its widening.
// (Not written over dot_lanes: GCC then compiled the f32 tail of the backward's Dsum differently.)
template <class B>
DEW_AI float dot(const float* a, const B* b, int64_t n) {
  vf acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    acc0 += vload(a + i) * vload_row(b + i);
    acc1 += vload(a + i + L) * vload_row(b + i + L);
  }
  for (; i + L <= n; i += L) acc0 += vload(a + i) * vload_row(b + i);
  const float s = hsum16(acc0 + acc1);
  if constexpr (std::is_same_v<B, float>) {
    return dot_tail(s, a + i, b + i, n - i);
  } else {
    float tail[L];  // fewer than 16 left
    for (int64_t j = 0; j < n - i; ++j) tail[j] = widen_bf16(b[i + j]);
    return dot_tail(s, a + i, tail, n - i);
  }
}

// y[0, n) += a * x[0, n) for x f32 or bf16 (widened in registers; elementwise, so the same bits either way)
template <class X>
DEW_AI void axpy(float* y, float a, const X* x, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) vstore(y + i, vload(y + i) + a * vload_row(x + i));
  for (; i < n; ++i) {
    if constexpr (std::is_same_v<X, float>)
      y[i] += a * x[i];
    else
      y[i] += a * widen_bf16(x[i]);
  }
}

#if defined(DEW_CPU_ISA_IS_AVX512)
// out[p] = hsum16(u[p]) for 16 vectors at once: the same adds on the same operands as isa.hpp's tree (halves, then
// quarters, then (b0 + b2) + (b1 + b3)), with shuffles putting the operands of 2, 4, 8 and 16 of those adds side
// by side in one vector each: 15 adds and 31 shuffles instead of 16 x 7 dependent steps.
DEW_AI void hsum16x16(const vf (&u)[16], float* out) {
  __m512 w[8], x[4], c[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // w[i]: the halves' sums of u[2i] (lanes 0-7) and u[2i + 1] (lanes 8-15)
    const __m512 a = (__m512)u[2 * i], b = (__m512)u[2 * i + 1];
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // x[i]: quarter m holds the quarters' sums b of u[4i + m]
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xdd));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // c[i]: per quarter b0 + b2, b1 + b3 of two vectors
    c[i] =
        _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44), _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xee));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xdd));
  // lane 4m + t of r is u[m + 4t]'s sum
  _mm512_storeu_ps(out,
                   _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r));
}
#endif

// dst[c * ldd + r] = mul * src[r * lds + c] for r < nr, c < nc; zero for nr <= r < lanes (lanes % 16 == 0).
DEW_AI void pack_t(const float* src, int64_t lds, int64_t nr, int64_t nc, float* dst, int64_t ldd, int64_t lanes,
                   float mul) {
  for (int64_t r0 = 0; r0 < lanes; r0 += L) {
    int64_t c0 = 0;
    for (; c0 + L <= nc; c0 += L) {
      vf x[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) x[r] = r0 + r < nr ? vload(src + (r0 + r) * lds + c0) * mul : vf{};
      transpose16(x);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) vstore(dst + (c0 + c) * ldd + r0, x[c]);
    }
    for (; c0 < nc; ++c0)
      for (int r = 0; r < 16; ++r) dst[c0 * ldd + r0 + r] = r0 + r < nr ? mul * src[(r0 + r) * lds + c0] : 0.0f;
  }
}

// ---------------------------------------------------------------- micro-kernels

// How a product starts: C = A B (kSet), C += A B (kAdd), C = C * scale + A B with one factor of `scale` per row
// (kScaleRowAdd: the forward's online-softmax rescale, scale[r] for row r of the call).
enum Init { kSet, kAdd, kScaleRowAdd };

// C[r][0, 16 NV) (op)= sum_k A[r * ars + k * aks] * B[k * ldb + (0, 16 NV)] for r < R: one broadcast of A
// and NV loads of B feed R * NV accumulators held in registers.
template <int R, int NV, int INIT>
DEW_AI void mk(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t ars, int64_t aks,
               const float* __restrict B, int64_t ldb, int64_t K, const float* __restrict rowscale) {
  vf acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (INIT == kSet) acc[r][v] = vf{};
      if constexpr (INIT == kAdd) acc[r][v] = vload(C + r * ldc + v * L);
      if constexpr (INIT == kScaleRowAdd) acc[r][v] = vload(C + r * ldc + v * L) * rowscale[r];
    }
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + v * L);
    const float* a = A + k * aks;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf av = vset(a[r * ars]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * L, acc[r][v]);
}

// The register file of this path, in native registers, and how many of them one vf (16 floats) takes: 32 zmm
// of one each on avx512, 16 ymm of two on avx2, 16 xmm of four on the portable path.
constexpr int kNativeRegs = kIsa == Isa::avx512 ? 32 : 16;
constexpr int kRegsPerVf = kIsa == Isa::avx512 ? 1 : kIsa == Isa::avx2 ? 2 : 4;
// Vectors of 16 columns per micro-kernel call: 4 (64 columns, 6 rows) where the register file holds them;
// one where it does not (avx2: 6 rows x 2 ymm of accumulators, 2 of B, 1 broadcast — the classic 6 x 16
// kernel; wider columns there left one row per call, so every B load fed a single FMA: the tile of B came
// from L2 once per row, and the S^T / O^T products ran at ~35 % of the FMA peak).
constexpr int kMaxNV = kIsa == Isa::avx512 ? 4 : 1;
// Rows per micro-kernel call: R * NV accumulators, NV vectors of B and one broadcast in the register file.
// The blocking only decides which elements a call computes: each element's sum runs over k in order, so
// the bits do not depend on it.
constexpr int rows_for(int nv) {
  const int per_row = kRegsPerVf * nv;
  const int r = (kNativeRegs - per_row - 1) / per_row;
  return r < 1 ? 1 : r > 8 ? 8 : r;
}

template <int NV, int INIT>
DEW_AI void gemm_nv(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb,
                    int64_t M, int64_t K, const float* rs) {
  constexpr int RM = rows_for(NV);
  const auto at = [rs](int64_t r) { return INIT == kScaleRowAdd ? rs + r : rs; };  // (rs: nullptr otherwise)
  int64_t r = 0;
  for (; r + RM <= M; r += RM) mk<RM, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r));
  if constexpr (RM > 4) {
    for (; r + 4 <= M; r += 4) mk<4, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r));
  }
  if constexpr (RM > 2) {
    for (; r + 2 <= M; r += 2) mk<2, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r));
  }
  if constexpr (RM > 1) {
    for (; r < M; ++r) mk<1, NV, INIT>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, at(r));
  }
}

// C [M, N] (op)= A [M, K] B [K, N] with A[m][k] at A + m * ars + k * aks; N a multiple of 16; rowscale [M]
// for kScaleRowAdd (else unread).
template <int INIT>
DEW_AI void gemm(float* C, int64_t ldc, const float* A, int64_t ars, int64_t aks, const float* B, int64_t ldb,
                 int64_t M, int64_t K, int64_t N, const float* rowscale = nullptr) {
  for (int64_t n0 = 0; n0 < N; n0 += kMaxNV * L) {
    const float* cs = rowscale;
    if constexpr (kMaxNV == 1) {
      gemm_nv<1, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, cs);
    } else {
      switch (std::min<int64_t>(kMaxNV, (N - n0) / L)) {
        case 4:
          gemm_nv<4, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, cs);
          break;
        case 3:
          gemm_nv<3, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, cs);
          break;
        case 2:
          gemm_nv<2, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, cs);
          break;
        default:
          gemm_nv<1, INIT>(C + n0, ldc, A, ars, aks, B + n0, ldb, M, K, cs);
          break;
      }
    }
  }
}

// ---------------------------------------------------------------- problem description

struct Geo {
  int64_t B, T, S, Hq, Hkv, G, D, Dp;
  int64_t qrs, krs;  // row strides of q/out/dout (Hq * D) and of k/v (Hkv * D)
  float scale, cap;
  bool causal;
  int64_t window;  // 0 = none (also when larger than any distance)
  int64_t qoff;
  const int32_t* seg;  // segment ids [B, S], or nullptr (one document)
  int64_t row_heads;   // the row path's query heads per task (<= kMaxRowHeads; set by attention_forward)
  // The row path over a slot cache (attention_slots): batch row b reads K/V batch kv_batch[b] (S positions each)
  // with its queries from position qoffs[b]; nullptr: batch b, from qoff.
  const int64_t* kv_batch;
  const int64_t* qoffs;
};

struct Ptrs {
  const float *q, *k, *v, *o, *lse, *dout;
  float *out, *lse_out, *dq, *dk, *dv;
  const uint16_t *k16, *v16;  // bf16 K/V (their bits) for the row path, instead of k and v
};

#include "attention_visibility.hpp"  // Vis, classify, classify_segments, classify_all; runs of batches

// ---------------------------------------------------------------- forward

size_t fwd_lane_ws(const Geo& g) {
  return size_t(g.D * TILE + TILE * g.Dp + FWD_BK * TILE + (g.D % L ? FWD_BK * g.Dp : 0));
}
int64_t fwd_row_ws_per_head(const Geo& g) { return 2 * g.Dp + g.S + L; }
size_t fwd_row_ws(const Geo& g) { return size_t(g.row_heads * fwd_row_ws_per_head(g)); }

// One (b, h, query block); task order puts the longest (latest) query blocks first.
DEW_AI void fwd_lane_task(const Geo& g, const Ptrs& P, int64_t task, float* ws) {
  const int64_t nqb = (g.T + TILE - 1) / TILE;
  const int64_t bh = task % (g.B * g.Hq), ib = nqb - 1 - task / (g.B * g.Hq);
  const int64_t b = bh / g.Hq, h = bh % g.Hq, hk = h / g.G, D = g.D;
  const int64_t t0 = ib * TILE, nq = std::min(TILE, g.T - t0);
  const int NV = int((nq + L - 1) / L);
  const int64_t LN = int64_t(NV) * L;

  const int64_t Dp = g.Dp;
  float* QT = ws;                    // [D][TILE]  scale * Q^T
  float* O = QT + D * TILE;          // [TILE][Dp]  unnormalised O (query rows; set by the first key block seen)
  float* ST = O + TILE * Dp;         // [FWD_BK][TILE]  S^T, then P^T
  float* Vp = ST + FWD_BK * TILE;    // [FWD_BK][Dp]  V rows zero padded to Dp (D % 16 != 0 only)
  const bool v_direct = D % L == 0;  // the P V product reads V's rows in place

  const float* qb = P.q + ((b * g.T + t0) * g.Hq + h) * D;
  pack_t(qb, g.qrs, nq, D, QT, TILE, LN, g.scale);
  bool started = false;  // O holds the sums of some key block

  vf mv[4], lv[4];
  for (int v = 0; v < 4; ++v) mv[v] = vset(kNegInf), lv[v] = vf{};

  const int64_t pmin = g.qoff + t0, pmax = pmin + nq - 1;
  const int64_t slo = g.window ? std::max<int64_t>(0, pmin - g.window + 1) : 0;
  const int64_t shi = g.causal ? std::min<int64_t>(g.S, pmax + 1) : g.S;
  const float* kb = P.k + b * g.S * g.krs + hk * D;
  const float* vb = P.v + b * g.S * g.krs + hk * D;
  const float inv_cap = g.cap > 0 ? 1.0f / g.cap : 0.0f;
  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  alignas(64) int32_t qseg[TILE];  // the query lanes' segments (-1 past nq: those lanes are never stored)
  if (segrow)  // (filled only with segments: GCC vectorises the fill into masked loads, off a null row a
               // fault-suppression assist per task, ~5 % of a DiT-shape forward)
    for (int64_t i = 0; i < TILE; ++i) qseg[i] = i < nq ? segrow[pmin + i] : -1;

  for (int64_t s0 = slo; s0 < shi; s0 += FWD_BK) {
    const int64_t s1 = std::min(s0 + FWD_BK, shi), nk = s1 - s0;
    bool seg_mask = false;
    const Vis vis = classify_all(g, b, pmin, pmax, s0, s1, &seg_mask);
    if (vis == kNone) continue;
    // Causal triangle: key rows [16c, 16c + 16) are hidden from the query vectors below first[c], so those
    // products are skipped (their S^T entries stay unset and the mask below turns them into -inf).
    int first[4] = {0, 0, 0, 0};
    const int nch = int((nk + L - 1) / L);
    if (vis == kPartial && g.causal)
      for (int c = 0; c < nch; ++c) {
        const int64_t x = s0 + c * L - (pmin + L - 1);  // > 0: even the last lane of vector 0 is too early
        first[c] = x <= 0 ? 0 : int(std::min<int64_t>(NV, (x + L - 1) / L));
      }
    // S^T[j][i] = sum_d K[s0 + j][d] * (scale Q)[i][d], by runs of chunks with the same first vector
    for (int c0 = 0, c1; c0 < nch; c0 = c1) {
      for (c1 = c0 + 1; c1 < nch && first[c1] == first[c0];) ++c1;
      const int64_t r0 = c0 * L, r1 = std::min<int64_t>(nk, c1 * L), l0 = first[c0] * L;
      if (l0 < LN)
        gemm<kSet>(ST + r0 * TILE + l0, TILE, kb + (s0 + r0) * g.krs, g.krs, 1, QT + l0, TILE, r1 - r0, D, LN - l0);
    }
    if (g.cap > 0) {
      for (int64_t j = 0; j < nk; ++j)
        for (int v = 0; v < NV; ++v) {
          float* s = ST + j * TILE + v * L;
          vstore(s, vtanh(vload(s) * inv_cap) * g.cap);
        }
    }
    if (vis == kPartial) {
      for (int64_t j = 0; j < nk; ++j) {
        const vi sv = viset(int32_t(s0 + j));
        for (int v = 0; v < NV; ++v) {
          // (selects one condition at a time: a vi mask kept across the branches is lowered lane by lane)
          const vi pos = viset(int32_t(pmin + v * L)) + iota();
          float* s = ST + j * TILE + v * L;
          vf x = vload(s);
          if (g.causal) x = vsel(sv <= pos, x, vset(kNegInf));
          if (g.window) x = vsel((pos - sv) < viset(int32_t(g.window)), x, vset(kNegInf));
          if (seg_mask) {
            const vi qs = viload(qseg + v * L);
            x = vsel(qs == viset(segrow[s0 + j]), x, vset(kNegInf));
            x = vsel(qs != vi{}, x, vset(kNegInf));
          }
          vstore(s, x);
        }
      }
    }
    // online softmax, per vector of 16 queries; O^T is rescaled by alpha inside the P V product below
    float alpha[TILE];
    for (int v = 0; v < NV; ++v) {
      vf mx = mv[v];
      for (int64_t j = 0; j < nk; ++j) mx = vmax(mx, vload(ST + j * TILE + v * L));
      const vf muse = vsel(mx == vset(kNegInf), vf{}, mx);  // a still fully masked row: keep exp() at 0, not NaN
      const vf a = vexp_upto88(mv[v] - muse);
      mv[v] = mx;
      vf sum = {};
      for (int64_t j = 0; j < nk; ++j) {
        float* s = ST + j * TILE + v * L;
        const vf p = vexp_upto88(vload(s) - muse);
        vstore(s, p);
        sum += p;
      }
      lv[v] = lv[v] * a + sum;
      vstore(alpha + v * L, a);
    }
    // O[i][d] = alpha[i] O[i][d] + sum_j P^T[j][i] V[s0 + j][d], in query rows (the broadcast runs along a row of
    // P^T, V's rows are read in place), so O needs no transpose back. P^T is 0 left of first[c]; the first run
    // rescales its rows, and the rows above it saw no key here (alpha = exp(0) = 1 exactly). The first key block
    // seen sets O (rows above its first run, never reached by it, are zeroed) instead of rescaling zeros.
    const float* vsrc = vb + s0 * g.krs;
    int64_t vld = g.krs;
    if (!v_direct) {
      for (int64_t j = 0; j < nk; ++j) {
        std::memcpy(Vp + j * Dp, vsrc + j * g.krs, size_t(D) * sizeof(float));
        for (int64_t d = D; d < Dp; ++d) Vp[j * Dp + d] = 0.0f;
      }
      vsrc = Vp, vld = Dp;
    }
    for (int c0 = 0, c1; c0 < nch; c0 = c1) {
      for (c1 = c0 + 1; c1 < nch && first[c1] == first[c0];) ++c1;
      const int64_t r0 = c0 * L, r1 = std::min<int64_t>(nk, c1 * L), l0 = first[c0] * L;
      if (l0 >= LN) continue;
      float* C = O + l0 * Dp;
      const float* A = ST + r0 * TILE + l0;
      if (c0 == 0 && !started) {
        std::memset(O, 0, size_t(l0 * Dp) * sizeof(float));
        gemm<kSet>(C, Dp, A, 1, TILE, vsrc + r0 * vld, vld, nq - l0, r1 - r0, Dp);
        started = true;
      } else if (c0 == 0) {
        gemm<kScaleRowAdd>(C, Dp, A, 1, TILE, vsrc + r0 * vld, vld, nq - l0, r1 - r0, Dp, alpha + l0);
      } else {
        gemm<kAdd>(C, Dp, A, 1, TILE, vsrc + r0 * vld, vld, nq - l0, r1 - r0, Dp);
      }
    }
  }
  if (!started) std::memset(O, 0, size_t(nq * Dp) * sizeof(float));  // no key block seen: zeros

  float mf[TILE], lf[TILE], inv[TILE];
  for (int v = 0; v < 4; ++v) vstore(mf + v * L, mv[v]), vstore(lf + v * L, lv[v]);
  float* lse = P.lse_out + (b * g.Hq + h) * g.T + t0;
  for (int64_t i = 0; i < nq; ++i) {
    if (lf[i] > 0.0f) {
      inv[i] = 1.0f / lf[i];
      lse[i] = mf[i] + std::log(lf[i]);
    } else {
      inv[i] = 0.0f;
      lse[i] = kNegInf;
    }
  }
  float* ob = P.out + ((b * g.T + t0) * g.Hq + h) * D;
  for (int64_t i = 0; i < nq; ++i) {
    const float* src = O + i * Dp;
    float* dst = ob + i * g.qrs;
    const float w = inv[i];
    for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * w;
  }
}

// Prefetches the D elements at p (a K or V row of the row path) when `valid`, one line of 64 bytes at a time;
// a hint, never a result.
constexpr int64_t kRowAhead = 8;
template <class KV>
DEW_AI void prefetch_row(const KV* p, int64_t D, bool valid) {
  if (!valid) return;
  for (int64_t d = 0; d < D; d += 64 / int64_t(sizeof(KV))) __builtin_prefetch(p + d, 0, 3);
}

// The K or V rows of element type KV: the f32 ones, or the bf16 ones.
template <class KV>
DEW_AI const KV* kv_rows(const float* f32, const uint16_t* bf16) {
  if constexpr (std::is_same_v<KV, float>)
    return f32;
  else
    return bf16;
}

// The row task's P V sums in registers: acc_h[d] += P_h[j] V_j[h's slice][d] for the positions j in order, one FMA
// per element and position, the very arithmetic of axpy() position by position (the same bits), but the sums of HC
// heads (HC * VD vectors, VD = D / 16) stay in registers across a block of kPvBlock positions instead of going
// through memory at every position (a load, an FMA and a store per vector and position, each position's FMA waiting
// on the last one's store: ~40 % of the row task's samples). Between blocks the sums are stored and reloaded
// (exact), and a block's 32 rows of the task's span (6 heads of 64: 24 KiB bf16, 48 f32) are read once per chunk of
// heads, from L1 or L2 after the first. Heads are the live ones of the task, in order; sc and acc are the first head's
// scores and sums, `stride` floats apart per head (fwd_row_task's workspace). false (nothing done) where D is not 16 VD
// for a VD below, or on the portable path (its 16-lane vectors are four xmm each: a chunk would not stay in 16
// registers).
constexpr int64_t kPvBlock = 32;
template <int VD, int HC, class KV>
DEW_AI void pv_chunks(const KV* vb, int64_t krs, int64_t lo, int64_t n, int64_t span, const int64_t* heads,
                      int64_t nheads, const int64_t* koff, float* sc, float* acc, int64_t stride) {
  for (int64_t j0 = 0; j0 < n; j0 += kPvBlock) {
    const int64_t j1 = std::min(n, j0 + kPvBlock);
    for (int64_t c0 = 0; c0 < nheads; c0 += HC) {
      const int64_t nc = std::min<int64_t>(HC, nheads - c0);
      vf a[HC][VD];
#pragma GCC unroll 16
      for (int c = 0; c < HC; ++c)
#pragma GCC unroll 16
        for (int v = 0; v < VD; ++v) a[c][v] = c < nc ? vload(acc + heads[c0 + c] * stride + v * L) : vf{};
      for (int64_t j = j0; j < j1; ++j) {
        if (c0 == 0) prefetch_row(vb + (lo + j + kRowAhead) * krs, span, j + kRowAhead < n);
        const KV* vrow = vb + (lo + j) * krs;
#pragma GCC unroll 16
        for (int c = 0; c < HC; ++c) {
          if (c >= nc) break;
          const int64_t h = heads[c0 + c];
          const float p = sc[h * stride + j];
          const KV* x = vrow + koff[h];
#pragma GCC unroll 16
          for (int v = 0; v < VD; ++v) a[c][v] = a[c][v] + p * vload_row(x + v * L);
        }
      }
#pragma GCC unroll 16
      for (int c = 0; c < HC; ++c)
        if (c < nc)
#pragma GCC unroll 16
          for (int v = 0; v < VD; ++v) vstore(acc + heads[c0 + c] * stride + v * L, a[c][v]);
    }
  }
}
template <class KV>
DEW_AI bool pv_in_registers(const KV* vb, int64_t krs, int64_t lo, int64_t n, int64_t span, int64_t D, int64_t nh,
                            const bool* live, const int64_t* koff, float* sc, float* acc, int64_t stride) {
#if defined(DEW_CPU_ISA_IS_PORTABLE)
  return false;
#else
#if defined(DEW_CPU_ISA_IS_AVX512)
  constexpr int kRegs = 16;  // sums a chunk keeps: 16 of the 32 zmm
#else
  constexpr int kRegs = 4;  // avx2: 4 16-lane sums = 8 of the 16 ymm
#endif
  int64_t heads[kMaxRowHeads], nheads = 0;
  for (int64_t h = 0; h < nh; ++h)
    if (live[h]) heads[nheads++] = h;
  switch (D) {
    case 32:
      pv_chunks<2, kRegs / 2>(vb, krs, lo, n, span, heads, nheads, koff, sc, acc, stride);
      return true;
    case 64:
      pv_chunks<4, kRegs / 4>(vb, krs, lo, n, span, heads, nheads, koff, sc, acc, stride);
      return true;
    case 128:
      if constexpr (kRegs >= 8) {
        pv_chunks<8, kRegs / 8>(vb, krs, lo, n, span, heads, nheads, koff, sc, acc, stride);
        return true;
      }
      return false;
    default:
      return false;
  }
#endif
}

// One query position (b, t) for the query heads [h0, h1) of its group (task = (b * T + t) * groups + group, groups
// of g.row_heads heads): per head an exact softmax over the visible keys, vectorised over D. For T <= ROW_PATH_MAX_T.
// The heads of a task walk the positions together, so K and V are read as one stream of whole position rows
// (the group's kv heads are contiguous in a row) rather than one head's strided slice after another; each
// (head, key) dot and each head's running axpy is the one-head computation in the same order (bits do not
// depend on the grouping).
// KV: float (f32 K/V, P.k / P.v) or uint16_t (bf16 K/V, P.k16 / P.v16).
template <class KV>
DEW_AI void fwd_row_task(const Geo& g, const Ptrs& P, int64_t task, float* ws) {
  const int64_t ngroups = (g.Hq + g.row_heads - 1) / g.row_heads;
  const int64_t grp = task % ngroups, bt = task / ngroups, t = bt % g.T, b = bt / g.T, D = g.D;
  const int64_t h0 = grp * g.row_heads, h1 = std::min(g.Hq, h0 + g.row_heads), nh = h1 - h0;
  const int64_t pos = (g.qoffs ? g.qoffs[b] : g.qoff) + t, kvb = g.kv_batch ? g.kv_batch[b] : b;
  const int64_t lo = g.window ? std::max<int64_t>(0, pos - g.window + 1) : 0;
  const int64_t hi = g.causal ? std::min<int64_t>(g.S, pos + 1) : g.S;
  float* orow = P.out + (b * g.T + t) * g.qrs;  // head h's output at orow + h * D
  float* lse = P.lse_out + b * g.Hq * g.T + t;  // head h's at lse[h * T]
  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  if (lo >= hi || (segrow && segrow[pos] == 0)) {
    std::memset(orow + h0 * D, 0, size_t(nh * D) * sizeof(float));
    for (int64_t h = h0; h < h1; ++h) lse[h * g.T] = kNegInf;
    return;
  }
  // Per head of the group, in ws: qs [Dp] (scale * q), acc [Dp] (the V sum), sc [S + 16] (scores, then P).
  const int64_t stride = fwd_row_ws_per_head(g);
  auto qs_of = [&](int64_t h) { return ws + (h - h0) * stride; };
  auto acc_of = [&](int64_t h) { return ws + (h - h0) * stride + g.Dp; };
  auto sc_of = [&](int64_t h) { return ws + (h - h0) * stride + 2 * g.Dp; };
  const float* qrow = P.q + (b * g.T + t) * g.qrs;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t d = 0; d < D; ++d) qs_of(h)[d] = g.scale * qrow[h * D + d];
  // The group's kv heads hk0 .. hk1 - 1: one contiguous span of each position's row.
  const int64_t hk0 = h0 / g.G, span = ((h1 - 1) / g.G - hk0 + 1) * D;
  const KV* kb = kv_rows<KV>(P.k, P.k16) + kvb * g.S * g.krs + hk0 * D;
  const KV* vb = kv_rows<KV>(P.v, P.v16) + kvb * g.S * g.krs + hk0 * D;
  const int64_t n = hi - lo, npad = (n + L - 1) / L * L;
  int64_t koff[kMaxRowHeads];  // head h's slice of a position's span, (h / G - hk0) * D: no division per position
  for (int64_t h = h0; h < h1; ++h) koff[h - h0] = (h / g.G - hk0) * D;
  // K and V rows are g.krs apart: the span kRowAhead positions on is prefetched while a row is used (decoding
  // streams the whole cache once per token).
  int64_t j = 0;
#if defined(DEW_CPU_ISA_IS_AVX512)
  // 16 positions at a time: every head's dot lane sums position by position (the rows stream in order, as in the
  // loop below), then per head the 16 trees together (hsum16x16: the bits of dot() one position at a time).
  // D % 16 == 0 only (no scalar tail). A head-major walk of the 16 rows measured slower on a cold f32 cache.
  // The common head widths take a copy of the loop with D a constant: dot_lanes' loop unrolled, the same sums.
  const auto score_blocks = [&](auto width) {
    const int64_t Dc = width.value ? int64_t(width.value) : D;
    vf lanes[kMaxRowHeads][L];  // [head][position of the block]
    for (; j + L <= n; j += L) {
      // position by position, as the loop below (the rows stream in order): each head's lane sums
      for (int64_t p = 0; p < L; ++p) {
        prefetch_row(kb + (lo + j + p + kRowAhead) * g.krs, span, j + p + kRowAhead < n);
        const KV* krow = kb + (lo + j + p) * g.krs;
        for (int64_t h = h0; h < h1; ++h) lanes[h - h0][p] = dot_lanes(qs_of(h), krow + koff[h - h0], Dc);
      }
      for (int64_t h = h0; h < h1; ++h) hsum16x16(lanes[h - h0], sc_of(h) + j);
    }
  };
  if (D == 64)
    score_blocks(std::integral_constant<int, 64>{});
  else if (D == 128)
    score_blocks(std::integral_constant<int, 128>{});
  else if (D % L == 0)
    score_blocks(std::integral_constant<int, 0>{});
#endif
  for (; j < n; ++j) {
    prefetch_row(kb + (lo + j + kRowAhead) * g.krs, span, j + kRowAhead < n);
    const KV* krow = kb + (lo + j) * g.krs;
    for (int64_t h = h0; h < h1; ++h) sc_of(h)[j] = dot(qs_of(h), krow + koff[h - h0], D);
  }
  bool live[kMaxRowHeads];
  float inv[kMaxRowHeads];
  for (int64_t h = h0; h < h1; ++h) {
    float* sc = sc_of(h);
    for (int64_t j = n; j < npad; ++j) sc[j] = 0.0f;
    if (g.cap > 0) {
      const float inv_cap = 1.0f / g.cap;
      for (int64_t j = 0; j < npad; j += L) vstore(sc + j, vtanh(vload(sc + j) * inv_cap) * g.cap);
    }
    if (segrow)
      for (int64_t j = 0; j < n; ++j)
        if (segrow[lo + j] != segrow[pos]) sc[j] = kNegInf;
    float m = kNegInf;  // the largest score; m = max(m, s) in any order is exact (a NaN never enters: s > m fails)
    {
      vf mv = vset(kNegInf);
      int64_t j = 0;
      for (; j + L <= n; j += L) mv = vmax(vload(sc + j), mv);
      float ml[L];
      vstore(ml, mv);
      for (int l = 0; l < L; ++l) m = std::max(m, ml[l]);
      for (; j < n; ++j) m = std::max(m, sc[j]);
    }
    live[h - h0] = m != kNegInf;
    if (!live[h - h0]) {  // every key in reach belongs to another document
      std::memset(orow + h * D, 0, size_t(D) * sizeof(float));
      lse[h * g.T] = kNegInf;
      continue;
    }
    vf lsum = {};
    for (int64_t j = 0; j < npad; j += L) {
      const vf p = vexp_upto88(vload(sc + j) - m);
      vstore(sc + j, p);
      lsum += j + L <= n ? p : vsel(iota() < viset(int32_t(n - j)), p, vf{});
    }
    const float l = hsum16(lsum);
    lse[h * g.T] = m + std::log(l);
    inv[h - h0] = 1.0f / l;
    std::memset(acc_of(h), 0, size_t(D) * sizeof(float));
  }
  if (!pv_in_registers(vb, g.krs, lo, n, span, D, nh, live, koff, sc_of(h0), acc_of(h0), stride))
    for (int64_t j = 0; j < n; ++j) {
      prefetch_row(vb + (lo + j + kRowAhead) * g.krs, span, j + kRowAhead < n);
      const KV* vrow = vb + (lo + j) * g.krs;
      for (int64_t h = h0; h < h1; ++h)
        if (live[h - h0]) axpy(acc_of(h), sc_of(h)[j], vrow + koff[h - h0], D);
    }
  for (int64_t h = h0; h < h1; ++h) {
    if (!live[h - h0]) continue;
    const float* acc = acc_of(h);
    for (int64_t d = 0; d < D; ++d) orow[h * D + d] = acc[d] * inv[h - h0];
  }
}

// ---------------------------------------------------------------- max logit

// One (b, h, query block), numbered as in fwd_lane_task: the largest visible raw score scale * q.k, to *result.
DEW_AI void max_logit_task(const Geo& g, const Ptrs& P, int64_t task, float* ws, float* result) {
  const int64_t nqb = (g.T + TILE - 1) / TILE;
  const int64_t bh = task % (g.B * g.Hq), ib = nqb - 1 - task / (g.B * g.Hq);
  const int64_t b = bh / g.Hq, h = bh % g.Hq, hk = h / g.G, D = g.D;
  const int64_t t0 = ib * TILE, nq = std::min(TILE, g.T - t0);
  const int NV = int((nq + L - 1) / L);
  const int64_t LN = int64_t(NV) * L;
  float* QT = ws;             // [D][TILE]  scale * Q^T
  float* ST = QT + D * TILE;  // [FWD_BK][TILE]  S^T
  pack_t(P.q + ((b * g.T + t0) * g.Hq + h) * D, g.qrs, nq, D, QT, TILE, LN, g.scale);
  vf mv[4];
  for (int v = 0; v < 4; ++v) mv[v] = vset(kNegInf);
  const int64_t pmin = g.qoff + t0, pmax = pmin + nq - 1;
  const int64_t slo = g.window ? std::max<int64_t>(0, pmin - g.window + 1) : 0;
  const int64_t shi = g.causal ? std::min<int64_t>(g.S, pmax + 1) : g.S;
  const float* kb = P.k + b * g.S * g.krs + hk * D;
  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  alignas(64) int32_t qseg[TILE];  // the query lanes' segments (-1 past nq: excluded below anyway)
  if (segrow)                      // (as in fwd_lane_task: filled only with segments)
    for (int64_t i = 0; i < TILE; ++i) qseg[i] = i < nq ? segrow[pmin + i] : -1;
  for (int64_t s0 = slo; s0 < shi; s0 += FWD_BK) {
    const int64_t s1 = std::min(s0 + FWD_BK, shi), nk = s1 - s0;
    bool seg_mask = false;
    const Vis vis = classify_all(g, b, pmin, pmax, s0, s1, &seg_mask);
    if (vis == kNone) continue;
    int first[4] = {0, 0, 0, 0};  // as in fwd_lane_task: the skipped sub-tiles are masked below
    const int nch = int((nk + L - 1) / L);
    if (vis == kPartial && g.causal)
      for (int c = 0; c < nch; ++c) {
        const int64_t x = s0 + c * L - (pmin + L - 1);
        first[c] = x <= 0 ? 0 : int(std::min<int64_t>(NV, (x + L - 1) / L));
      }
    for (int c0 = 0, c1; c0 < nch; c0 = c1) {
      for (c1 = c0 + 1; c1 < nch && first[c1] == first[c0];) ++c1;
      const int64_t r0 = c0 * L, r1 = std::min<int64_t>(nk, c1 * L), l0 = first[c0] * L;
      if (l0 < LN)
        gemm<kSet>(ST + r0 * TILE + l0, TILE, kb + (s0 + r0) * g.krs, g.krs, 1, QT + l0, TILE, r1 - r0, D, LN - l0);
    }
    for (int64_t j = 0; j < nk; ++j) {
      const vi sv = viset(int32_t(s0 + j));
      for (int v = 0; v < NV; ++v) {
        const vi pos = viset(int32_t(pmin + v * L)) + iota();
        vf x = vload(ST + j * TILE + v * L);
        if (vis == kPartial && g.causal) x = vsel(sv <= pos, x, vset(kNegInf));
        if (vis == kPartial && g.window) x = vsel((pos - sv) < viset(int32_t(g.window)), x, vset(kNegInf));
        if (seg_mask) {  // as in fwd_lane_task: another document's key, or a padding query, sees nothing
          const vi qs = viload(qseg + v * L);
          x = vsel(qs == viset(segrow[s0 + j]), x, vset(kNegInf));
          x = vsel(qs != vi{}, x, vset(kNegInf));
        }
        mv[v] = vmax(mv[v], x);
      }
    }
  }
  float mf[TILE];
  for (int v = 0; v < 4; ++v) vstore(mf + v * L, mv[v]);
  float m = kNegInf;
  for (int64_t i = 0; i < nq; ++i) m = std::max(m, mf[i]);  // lanes past nq ran on zero padding
  *result = m;
}

// ---------------------------------------------------------------- backward

// Where a backward task sums dq = dS K:
//   kDqDirect  straight into dq (the task owns these rows; needs D % 16 == 0): zeroed first;
//   kDqLocal   into a [G][T][Dp] buffer in ws, zeroed first and copied to dq at the end (odd D);
//   kDqShared  into the caller's per-thread [G][T][Dp] slice (key-block tasks), summed by the caller.
enum DqMode { kDqDirect, kDqLocal, kDqShared };

size_t bwd_ws(const Geo& g, DqMode mode) {
  const int64_t nqb = (g.T + BWD_BQ - 1) / BWD_BQ;
  return size_t(2 * g.D * TILE + 3 * TILE * g.Dp + 3 * BWD_BQ * TILE + (g.D % L ? 2 * BWD_BQ * g.Dp : 0) + g.G * g.T +
                g.G * nqb + (mode == kDqLocal ? g.G * g.T * g.Dp : 0));
}

// Key blocks [jb0, jb1) of (b, kv head hk), all G query heads reading it (see DqMode for dq_shared).
DEW_AI void bwd_task(const Geo& g, const Ptrs& P, int64_t b, int64_t hk, int64_t jb0, int64_t jb1, float* dq_shared,
                     DqMode mode, float* ws) {
  const int64_t D = g.D, Dp = g.Dp, G = g.G, T = g.T;
  const bool rows_direct = D % L == 0;  // K, Q, dO rows read in place and dK, dV rows written in place
  float* KT = ws;                    // [D][TILE]
  float* VT = KT + D * TILE;         // [D][TILE]
  float* dKb = VT + D * TILE;        // [TILE][Dp]  dK rows (odd D; else written in place)
  float* dVb = dKb + TILE * Dp;      // [TILE][Dp]  dV rows (odd D)
  float* Kp = dVb + TILE * Dp;       // [TILE][Dp]  K rows, zero padded to Dp (odd D)
  float* Pt = Kp + TILE * Dp;        // [BWD_BQ][TILE]  P
  float* dSt = Pt + BWD_BQ * TILE;   // [BWD_BQ][TILE]  dP, then dS
  float* TH = dSt + BWD_BQ * TILE;   // [BWD_BQ][TILE]  tanh(s / cap)
  float* Qp = TH + BWD_BQ * TILE;    // [BWD_BQ][Dp]  Q rows, zero padded (odd D)
  float* dOp = Qp + (rows_direct ? 0 : BWD_BQ * Dp);    // [BWD_BQ][Dp]  dO rows, zero padded (odd D)
  float* Dsum = dOp + (rows_direct ? 0 : BWD_BQ * Dp);  // [G][T]
  const int64_t nqb = (T + BWD_BQ - 1) / BWD_BQ;
  float* dq_unset = Dsum + G * T;  // [G][nqb]  kDqDirect: 1 while the dq rows of (gi, query block) hold nothing
  // dq rows of query head gi: dqacc + gi * dq_hs + t * dq_ld
  float* dqacc = mode == kDqDirect  ? P.dq + (b * T * g.Hq + hk * G) * D
                 : mode == kDqLocal ? dq_unset + G * nqb
                                    : dq_shared;
  const int64_t dq_hs = mode == kDqDirect ? D : T * Dp, dq_ld = mode == kDqDirect ? g.qrs : Dp;
  // kDqDirect: a query block's dq rows are set by the first dS K product that covers them all (or zeroed just
  // before a partial one, or at the end when no key reached them) instead of zeroed up front (16 KB a DiT head).
  const auto zero_dq_block = [&](int64_t gi, int64_t qb) {
    for (int64_t t = qb * BWD_BQ; t < std::min(T, (qb + 1) * BWD_BQ); ++t)
      std::memset(dqacc + gi * dq_hs + t * dq_ld, 0, size_t(D) * sizeof(float));
  };

  // Dsum = rowsum(dO * O): up front when the task has several key blocks; with one (the DiT's 64-token rows)
  // per query block just before its dS, its O rows prefetched before the block's two products: up front, the
  // first touch of dO and O stalled with no work to hide it (~9 % of a DiT-shape backward in perf).
  const bool dsum_late = jb1 - jb0 == 1;
  const auto dsum_rows = [&](int64_t gi, int64_t t_begin, int64_t t_end) {
    const int64_t h = hk * G + gi;
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t row = ((b * T + t) * g.Hq + h) * D;
      Dsum[gi * T + t] = dot(P.dout + row, P.o + row, D);
    }
  };
  if (!dsum_late)
    for (int64_t gi = 0; gi < G; ++gi) dsum_rows(gi, 0, T);
  if (mode == kDqLocal) std::memset(dqacc, 0, size_t(G * T * Dp) * sizeof(float));
  for (int64_t i = 0; i < G * nqb; ++i) dq_unset[i] = mode == kDqDirect ? 1.0f : 0.0f;

  const float* kb = P.k + b * g.S * g.krs + hk * D;
  const float* vb = P.v + b * g.S * g.krs + hk * D;
  const float inv_cap = g.cap > 0 ? 1.0f / g.cap : 0.0f;
  // rows [0, n) of `rows` (ld apart) copied to dst [n][Dp], zero padded past D
  const auto pad_rows = [D, Dp](const float* rows, int64_t ld, int64_t n, float* dst) {
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(dst + r * Dp, rows + r * ld, size_t(D) * sizeof(float));
      for (int64_t d = D; d < Dp; ++d) dst[r * Dp + d] = 0.0f;
    }
  };

  const int32_t* segrow = g.seg ? g.seg + b * g.S : nullptr;
  for (int64_t jb = jb0; jb < jb1; ++jb) {
    const int64_t s0 = jb * TILE, s1 = std::min(s0 + TILE, g.S), nk = s1 - s0;
    // dK and dV of the block's keys: rows of dk / dv in place (D a multiple of 16), else of dKb / dVb copied out
    float* dkr = rows_direct ? P.dk + (b * g.S + s0) * g.krs + hk * D : dKb;
    float* dvr = rows_direct ? P.dv + (b * g.S + s0) * g.krs + hk * D : dVb;
    const int64_t dkv_ld = rows_direct ? g.krs : Dp;
    const auto zero_dkv = [&] {
      for (int64_t j = 0; j < nk; ++j) {
        std::memset(dkr + j * dkv_ld, 0, size_t(Dp) * sizeof(float));
        std::memset(dvr + j * dkv_ld, 0, size_t(Dp) * sizeof(float));
      }
    };
    const auto store_dkv = [&] {
      if (rows_direct) return;
      for (int64_t j = 0; j < nk; ++j) {
        std::memcpy(P.dk + (b * g.S + s0 + j) * g.krs + hk * D, dKb + j * Dp, size_t(D) * sizeof(float));
        std::memcpy(P.dv + (b * g.S + s0 + j) * g.krs + hk * D, dVb + j * Dp, size_t(D) * sizeof(float));
      }
    };
    // query blocks that see nothing of this key block, segment-wise too, are skipped before any packing
    if (segrow) {
      const int64_t tq_lo = g.causal ? std::clamp<int64_t>(s0 - g.qoff, 0, T) : 0;
      bool any = false;
      for (int64_t t0 = tq_lo; t0 < T && !any; t0 += BWD_BQ)
        any = classify_segments(g, b, g.qoff + t0, g.qoff + std::min(t0 + BWD_BQ, T) - 1, s0, s1) != kNone;
      if (!any) {
        zero_dkv();
        store_dkv();
        continue;
      }
    }
    alignas(64) int32_t kseg[TILE];  // the key lanes' segments (-2 past nk: masked by the lane count anyway)
    if (segrow)                      // (as in fwd_lane_task: filled only with segments)
      for (int64_t j = 0; j < TILE; ++j) kseg[j] = j < nk ? segrow[s0 + j] : -2;
    pack_t(kb + s0 * g.krs, g.krs, nk, D, KT, TILE, TILE, 1.0f);
    pack_t(vb + s0 * g.krs, g.krs, nk, D, VT, TILE, TILE, 1.0f);
    // K's rows for dQ += dS K: in place when D is a multiple of 16, else copied zero padded to Dp
    const float* krows = kb + s0 * g.krs;
    int64_t kld = g.krs;
    if (!rows_direct) {
      pad_rows(kb + s0 * g.krs, g.krs, nk, Kp);
      krows = Kp, kld = Dp;
    }
    // dK and dV are set by the first product pair when it spans every key, else zeroed before it
    bool dkv_unset = true;

    // queries that can see some key of the block: pos >= s0 (causal), pos < s1 - 1 + window
    const int64_t t_lo = g.causal ? std::clamp<int64_t>(s0 - g.qoff, 0, T) : 0;
    const int64_t t_hi = g.window ? std::clamp<int64_t>(s1 - 1 + g.window - g.qoff, 0, T) : T;
    const vi nkv = viset(int32_t(nk));
    for (int64_t gi = 0; gi < G && t_lo < t_hi; ++gi) {
      const int64_t h = hk * G + gi;
      const float* qh = P.q + (b * T * g.Hq + h) * D;
      const float* doh = P.dout + (b * T * g.Hq + h) * D;
      const float* lseh = P.lse + (b * g.Hq + h) * T;
      const float* Dh = Dsum + gi * T;
      float* dqh = dqacc + gi * dq_hs;
      for (int64_t t0 = t_lo; t0 < t_hi; t0 += BWD_BQ) {
        const int64_t t1 = std::min(t0 + BWD_BQ, t_hi), nq = t1 - t0;
        const int64_t pmin = g.qoff + t0, pmax = g.qoff + t1 - 1;
        bool seg_mask = false;
        const Vis vis = classify_all(g, b, pmin, pmax, s0, s1, &seg_mask);
        if (vis == kNone) continue;
        const bool mask = vis == kPartial || nk < TILE;
        // Causal triangle: query rows [16c, 16c + 16) can only see the first lanes[c] keys of the block (lanes
        // past nk are padding); products beyond are skipped and those P / dS entries are never read.
        // Runs of chunks with equal lanes share one call per product.
        const int64_t key_lanes = (nk + L - 1) / L * L;
        const int nch = int((nq + L - 1) / L);
        int64_t lanes[4];
        for (int c = 0; c < nch; ++c) {
          lanes[c] = key_lanes;
          if (vis == kPartial && g.causal) {
            const int64_t x = g.qoff + t0 + std::min<int64_t>(c * L + L - 1, nq - 1) - s0;  // last row's reach
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
        if (dsum_late)  // (a hint: O's rows arrive while S and dP are computed)
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t d = 0; d < D; d += 16)
              __builtin_prefetch(P.o + ((b * T + t0 + i) * g.Hq + hk * G + gi) * D + d);
        // S = Q K^T, then P = exp(scale S [capped] - lse), masked to 0
        for (int r = 0; r < nruns; ++r)
          gemm<kSet>(Pt + run_r0[r] * TILE, TILE, qh + (t0 + run_r0[r]) * g.qrs, g.qrs, 1, KT, TILE,
                     run_r1[r] - run_r0[r], D, run_lanes[r]);
        for (int64_t i = 0; i < nq; ++i) {
          const int nv = int(lanes[i / L] / L);
          float* prow = Pt + i * TILE;
          float* throw_ = TH + i * TILE;
          const float lse = lseh[t0 + i];
          if (lse == kNegInf) {  // no visible key: no gradient
            std::memset(prow, 0, size_t(nv * L) * sizeof(float));
            if (g.cap > 0) std::memset(throw_, 0, size_t(nv * L) * sizeof(float));
            continue;
          }
          const vi pos = viset(int32_t(g.qoff + t0 + i));
          const int32_t qs = segrow ? segrow[g.qoff + t0 + i] : 0;
          for (int v = 0; v < nv; ++v) {
            vf x = vload(prow + v * L) * g.scale;
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
                p = vsel(ks == viset(qs) && qs != 0, p, vf{});
              }
            }
            vstore(prow + v * L, p);
          }
        }
        // dP = dO V^T; dS = scale P (dP - Dsum) [* (1 - tanh^2)] (d raw score; the scale folded in for dq, dk)
        for (int r = 0; r < nruns; ++r)
          gemm<kSet>(dSt + run_r0[r] * TILE, TILE, doh + (t0 + run_r0[r]) * g.qrs, g.qrs, 1, VT, TILE,
                     run_r1[r] - run_r0[r], D, run_lanes[r]);
        if (dsum_late) dsum_rows(gi, t0, t1);
        for (int64_t i = 0; i < nq; ++i) {
          const int nv = int(lanes[i / L] / L);
          const vf di = vset(Dh[t0 + i]);
          for (int v = 0; v < nv; ++v) {
            float* ds = dSt + i * TILE + v * L;
            vf x = vload(Pt + i * TILE + v * L) * g.scale * (vload(ds) - di);
            if (g.cap > 0) {
              const vf th = vload(TH + i * TILE + v * L);
              x *= vset(1.0f) - th * th;
            }
            vstore(ds, x);
          }
        }
        // dV^T[d][j] += sum_i dO[i][d] P[i][j];  dK^T[d][j] += sum_i Q[i][d] dS[i][j];  dQ[i][:] += dS[i][j] K[j][:]
        // (kSet where a product spans every element it will own: the bits of kAdd onto zeros)
        const int64_t qb0 = t0 / BWD_BQ, qb1 = (t0 + nq - 1) / BWD_BQ;
        const bool dq_set = mode == kDqDirect && t0 % BWD_BQ == 0 && nq == std::min(BWD_BQ, T - t0) && nruns == 1 &&
                            run_r0[0] == 0 && run_r1[0] == nq && dq_unset[gi * nqb + qb0] != 0.0f;
        for (int64_t qb = qb0; qb <= qb1; ++qb) {
          if (!dq_set && dq_unset[gi * nqb + qb] != 0.0f) zero_dq_block(gi, qb);
          dq_unset[gi * nqb + qb] = 0.0f;
        }
        const bool dkv_set = dkv_unset && nruns == 1 && run_lanes[0] == key_lanes;
        if (dkv_unset && !dkv_set) zero_dkv();
        dkv_unset = false;
        // Q and dO rows of the block for dK, dV: in place, or padded copies
        const float* qB = qh + t0 * g.qrs;
        const float* doB = doh + t0 * g.qrs;
        int64_t bld = g.qrs;
        if (!rows_direct) {
          pad_rows(qB, g.qrs, nq, Qp);
          pad_rows(doB, g.qrs, nq, dOp);
          qB = Qp, doB = dOp, bld = Dp;
        }
        for (int r = 0; r < nruns; ++r) {
          const int64_t r0 = run_r0[r], nr = run_r1[r] - r0, nl = run_lanes[r], nkr = std::min(nk, nl);
          float* dqr = dqh + (t0 + r0) * dq_ld;
          // dV[j][:] (+)= sum_i P[i][j] dO[i][:]; dK[j][:] (+)= sum_i dS[i][j] Q[i][:] (key rows: the broadcast
          // runs along a row of P / dS, dO and Q rows are read as they lie)
          if (dkv_set) {
            gemm<kSet>(dvr, dkv_ld, Pt + r0 * TILE, 1, TILE, doB + r0 * bld, bld, nkr, nr, Dp);
            gemm<kSet>(dkr, dkv_ld, dSt + r0 * TILE, 1, TILE, qB + r0 * bld, bld, nkr, nr, Dp);
          } else {
            gemm<kAdd>(dvr, dkv_ld, Pt + r0 * TILE, 1, TILE, doB + r0 * bld, bld, nkr, nr, Dp);
            gemm<kAdd>(dkr, dkv_ld, dSt + r0 * TILE, 1, TILE, qB + r0 * bld, bld, nkr, nr, Dp);
          }
          if (dq_set)
            gemm<kSet>(dqr, dq_ld, dSt + r0 * TILE, TILE, 1, krows, kld, nr, std::min(nk, nl), Dp);
          else
            gemm<kAdd>(dqr, dq_ld, dSt + r0 * TILE, TILE, 1, krows, kld, nr, std::min(nk, nl), Dp);
        }
      }
    }
    if (dkv_unset) zero_dkv();  // no query saw the block
    store_dkv();
  }
  for (int64_t gi = 0; gi < G; ++gi)  // dq rows no key reached
    for (int64_t qb = 0; qb < nqb; ++qb)
      if (dq_unset[gi * nqb + qb] != 0.0f) zero_dq_block(gi, qb);

  if (mode == kDqLocal) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t h = hk * G + gi;
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(P.dq + ((b * T + t) * g.Hq + h) * D, dqacc + gi * dq_hs + t * dq_ld, size_t(D) * sizeof(float));
    }
  }
}

// ---------------------------------------------------------------- ISA dispatch

using FwdFn = void (*)(const Geo&, const Ptrs&, int64_t, float*);
using BwdFn = void (*)(const Geo&, const Ptrs&, int64_t, int64_t, int64_t, int64_t, float*, DqMode, float*);
using MaxFn = void (*)(const Geo&, const Ptrs&, int64_t, float*, float*);
struct Kernels {
  FwdFn fwd_lane, fwd_row, fwd_row_bf16kv;
  BwdFn bwd;
  MaxFn max_logit;
};

// This path's kernels (their register blocking: kMaxNV and rows_for above).
void fwd_lane_kernel(const Geo& g, const Ptrs& p, int64_t task, float* ws) { fwd_lane_task(g, p, task, ws); }
void fwd_row_kernel(const Geo& g, const Ptrs& p, int64_t task, float* ws) { fwd_row_task<float>(g, p, task, ws); }
void fwd_row_bf16kv_kernel(const Geo& g, const Ptrs& p, int64_t task, float* ws) {
  fwd_row_task<uint16_t>(g, p, task, ws);
}
void bwd_kernel(const Geo& g, const Ptrs& p, int64_t b, int64_t hk, int64_t jb0, int64_t jb1, float* dq_shared,
                DqMode mode, float* ws) {
  bwd_task(g, p, b, hk, jb0, jb1, dq_shared, mode, ws);
}
void max_logit_kernel(const Geo& g, const Ptrs& p, int64_t task, float* ws, float* result) {
  max_logit_task(g, p, task, ws, result);
}
const Kernels& kernels() {
  static const Kernels k{fwd_lane_kernel, fwd_row_kernel, fwd_row_bf16kv_kernel, bwd_kernel, max_logit_kernel};
  return k;
}

// Per-thread scratch kept for the life of the (pooled) OpenMP thread: no allocation or page faults per call.
// It grows to the largest request seen (tens to hundreds of KiB for usual shapes).
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// ---------------------------------------------------------------- checks

// `bf16_ok`: bf16 is accepted too (k and v of the forward).
void check_tensor(const Tensor& t, const char* what, bool bf16_ok = false) {
  DEW_CHECK(t.defined(), "cpu attention: ", what, " is undefined");
  DEW_CHECK(t.dtype() == DType::f32 || (bf16_ok && t.dtype() == DType::bf16), "cpu attention: ", what, " must be f32",
            bf16_ok ? " or bf16" : "", ", got ", dtype_name(t.dtype()));
}

void check_shape(const Tensor& t, const Shape& want, const char* what, bool bf16_ok = false) {
  check_tensor(t, what, bf16_ok);
  DEW_CHECK(t.shape() == want, "cpu attention: ", what, " has shape ", shape_str(t.shape()), ", expected ",
            shape_str(want));
}

constexpr int64_t kMaxPos = int64_t(1) << 30;  // lane positions are int32

// The fields of g that follow from its sizes (B, T, S, Hq, Hkv, D) and p.
void derive_geo(Geo& g, const AttentionParams& p) {
  g.G = g.Hq / g.Hkv;
  g.Dp = (g.D + L - 1) / L * L;
  g.qrs = g.Hq * g.D;
  g.krs = g.Hkv * g.D;
  g.scale = p.scale;
  g.cap = p.softcap;
  g.causal = p.causal;
  g.window = p.window >= kMaxPos ? 0 : p.window;
  g.qoff = p.q_offset;
}

// `bf16_kv`: k and v may be bf16 (both; the forward's bf16 decode cache).
Geo make_geo(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, const AttentionParams& p,
             bool bf16_kv = false) {
  check_tensor(q, "q");
  check_tensor(k, "k", bf16_kv);
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4, "cpu attention: q and k must be [B, T, H, D], got ", shape_str(q.shape()),
            " and ", shape_str(k.shape()));
  check_shape(v, k.shape(), "v", bf16_kv);
  DEW_CHECK(v.dtype() == k.dtype(), "cpu attention: k is ", dtype_name(k.dtype()), " and v ", dtype_name(v.dtype()),
            "; they must be of one dtype");
  Geo g{};
  g.B = q.size(0), g.T = q.size(1), g.Hq = q.size(2), g.D = q.size(3);
  g.S = k.size(1), g.Hkv = k.size(2);
  DEW_CHECK(k.size(0) == g.B && k.size(3) == g.D, "cpu attention: k ", shape_str(k.shape()), " does not match q ",
            shape_str(q.shape()));
  DEW_CHECK(g.Hkv > 0 && g.Hq % g.Hkv == 0, "cpu attention: Hq = ", g.Hq, " is not a multiple of Hkv = ", g.Hkv);
  DEW_CHECK(g.D > 0, "cpu attention: head width D must be positive");
  DEW_CHECK(p.window >= 0, "cpu attention: window must be >= 0, got ", p.window);
  DEW_CHECK(p.softcap >= 0.0f, "cpu attention: softcap must be >= 0, got ", p.softcap);
  DEW_CHECK(g.S < kMaxPos && p.q_offset > -kMaxPos && p.q_offset + g.T < kMaxPos,
            "cpu attention: positions out of range (S = ", g.S, ", q_offset = ", p.q_offset, ", T = ", g.T, ")");
  derive_geo(g, p);
  g.seg = contracts::check_attention_segments("cpu attention", segment_ids, g.B, g.T, g.S, p.q_offset)
              ? segment_ids.data_as<const int32_t>()
              : nullptr;
  return g;
}

}  // namespace

// ---------------------------------------------------------------- entry points

// dst[i] = the f32 value of the bf16 bits src[i], i < n (exact), over the threads.
void widen_all(const uint16_t* src, float* dst, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) dst[i] = widen_bf16(src[i]);
  }
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, Tensor& out,
                       Tensor& lse, const AttentionParams& p) {
  Geo g = make_geo(q, k, v, segment_ids, p, /*bf16_kv=*/true);
  check_shape(out, q.shape(), "out");
  check_shape(lse, Shape{g.B, g.Hq, g.T}, "lse");
  if (g.B == 0 || g.T == 0 || g.Hq == 0) return;
  const bool rows = g.T <= ROW_PATH_MAX_T, bf16_kv = k.dtype() == DType::bf16;
  // Row work under kRowSerialBytes of K/V reads (a decode step at a short context) stays on the calling thread: there
  // the region's fork and join cost more than the split saves (bits do not depend on it: a row task's grouping changes
  // none). One query against 6 heads of 64 (`dew-bench kernels --only decode`, Zen 5, us, 1 / 2 threads): S 256 f32
  // 11.3 / 12.9, bf16 7.5 / 10.0; S 512 f32 25.2 / 20.9, bf16 15.2 / 14.3; S 1024 bf16 33 / 27.
  const int64_t row_bytes = g.B * g.T * g.Hq * g.S * g.D * 2 * int64_t(bf16_kv ? sizeof(uint16_t) : sizeof(float));
  const int threads = rows && row_bytes < kRowSerialBytes ? 1 : omp_get_max_threads();
  if (rows) {  // row tasks: all heads of a position together, split only as far as the threads need
    const int64_t groups = std::min<int64_t>(g.Hq, (threads + g.B * g.T - 1) / (g.B * g.T));
    g.row_heads = std::min<int64_t>(kMaxRowHeads, (g.Hq + groups - 1) / groups);
  }
  Ptrs P{};
  P.q = q.data_as<const float>();
  P.out = out.data_as<float>();
  P.lse_out = lse.data_as<float>();
  std::vector<float> k_wide, v_wide;  // bf16 K/V widened for the lane path (a prefill on a bf16 cache)
  if (!bf16_kv) {
    P.k = k.data_as<const float>();
    P.v = v.data_as<const float>();
  } else if (rows) {
    P.k16 = k.data_as<const uint16_t>();
    P.v16 = v.data_as<const uint16_t>();
  } else {
    k_wide.resize(size_t(k.numel()));
    v_wide.resize(size_t(v.numel()));
    widen_all(k.data_as<const uint16_t>(), k_wide.data(), k.numel());
    widen_all(v.data_as<const uint16_t>(), v_wide.data(), v.numel());
    P.k = k_wide.data();
    P.v = v_wide.data();
  }

  const Kernels& K = kernels();
  const FwdFn fn = !rows ? K.fwd_lane : bf16_kv ? K.fwd_row_bf16kv : K.fwd_row;
  const int64_t ntasks =
      rows ? g.B * g.T * ((g.Hq + g.row_heads - 1) / g.row_heads) : g.B * g.Hq * ((g.T + TILE - 1) / TILE);
  const size_t ws_size = rows ? fwd_row_ws(g) : fwd_lane_ws(g);
  const int64_t nqb = (g.T + TILE - 1) / TILE;
  if (ntasks <= 1 || threads == 1) {  // no region on one thread (cpu_backend.hpp: team_of_many)
    float* ws = scratch(ws_size);
    for (int64_t task = 0; task < ntasks; ++task) fn(g, P, rows ? task : forward_task_in_batch_order(g, task, nqb), ws);
    return;
  }
  const bool runs = !rows && static_forward_runs(g, nqb, omp_get_max_threads());
#pragma omp parallel
  {
    float* ws = scratch(ws_size);
    if (runs) {  // one contiguous run of batches per thread (attention_visibility.hpp)
#pragma omp for schedule(static)
      for (int64_t i = 0; i < ntasks; ++i) fn(g, P, forward_task_in_batch_order(g, i, nqb), ws);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < ntasks; ++task) fn(g, P, task, ws);
    }
  }
}

// attention_slots: every row's cache write, then the row tasks of attention_forward over all rows at once, row b's
// K/V from its slot (Geo::kv_batch, S = the slots' capacity C) and its query at its own position (Geo::qoffs). A
// row at position pos sees keys lo .. pos exactly as attention_forward on the slot's first pos + 1 keys does (the
// causal bound min(S, pos + 1) is pos + 1 either way), with the same task code: the same bits. Parallel over the
// rows' (row, head group) tasks when their K/V reads pass kRowSerialBytes together, as attention_forward splits.
void attention_slots_forward(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                             const std::vector<int64_t>& slots, const std::vector<int64_t>& positions, Tensor& k_cache,
                             Tensor& v_cache, Tensor& out, const AttentionParams& p) {
  DEW_CHECK(q.dtype() == DType::f32 && out.dtype() == DType::f32, "cpu attention_slots: the row tasks take f32 q");
  DEW_CHECK(p.window >= 0 && p.softcap >= 0.0f, "cpu attention_slots: window and softcap must be >= 0");
  const int64_t n = q.size(0), capacity = k_cache.size(1);
  DEW_CHECK(capacity < kMaxPos, "cpu attention_slots: ", capacity, " cache positions are too many");
  if (n == 0) return;
  const bool bf16_kv = k_cache.dtype() == DType::bf16;
  const int64_t esize = bf16_kv ? int64_t(sizeof(uint16_t)) : int64_t(sizeof(float));
  const int64_t row_bytes = k_cache.size(2) * k_cache.size(3) * esize;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = (slots[size_t(i)] * capacity + positions[size_t(i)]) * row_bytes;
    std::memcpy(static_cast<char*>(k_cache.data()) + at, static_cast<const char*>(k_new.data()) + i * row_bytes,
                size_t(row_bytes));
    std::memcpy(static_cast<char*>(v_cache.data()) + at, static_cast<const char*>(v_new.data()) + i * row_bytes,
                size_t(row_bytes));
  }
  Geo g{};
  g.B = n, g.T = 1, g.S = capacity, g.Hq = q.size(2), g.Hkv = k_cache.size(2), g.D = q.size(3);
  derive_geo(g, p);
  g.causal = true;  // (q_offset: per row, below)
  g.kv_batch = slots.data();
  g.qoffs = positions.data();
  int64_t reads = 0;  // as attention_forward counts one row's: every query head over the keys it may see, K and V
  for (int64_t i = 0; i < n; ++i) reads += g.Hq * (positions[size_t(i)] + 1) * g.D * 2 * esize;
  const int threads = reads < kRowSerialBytes ? 1 : omp_get_max_threads();
  const int64_t groups = std::min<int64_t>(g.Hq, (threads + n - 1) / n);
  g.row_heads = std::min<int64_t>(kMaxRowHeads, (g.Hq + groups - 1) / groups);
  std::vector<float> lse(size_t(n * g.Hq));  // the row tasks write it; a decode step does not read it
  Ptrs P{};
  P.q = q.data_as<const float>();
  P.out = out.data_as<float>();
  P.lse_out = lse.data();
  if (bf16_kv) {
    P.k16 = k_cache.data_as<const uint16_t>();
    P.v16 = v_cache.data_as<const uint16_t>();
  } else {
    P.k = k_cache.data_as<const float>();
    P.v = v_cache.data_as<const float>();
  }
  const FwdFn fn = bf16_kv ? kernels().fwd_row_bf16kv : kernels().fwd_row;
  const int64_t ntasks = n * ((g.Hq + g.row_heads - 1) / g.row_heads);
  const size_t ws_size = fwd_row_ws(g);
  if (ntasks <= 1 || threads == 1) {
    float* ws = scratch(ws_size);
    for (int64_t task = 0; task < ntasks; ++task) fn(g, P, task, ws);
    return;
  }
#pragma omp parallel
  {
    float* ws = scratch(ws_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) fn(g, P, task, ws);
  }
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionParams& p) {
  const Geo g = make_geo(q, k, v, segment_ids, p);
  check_shape(out, q.shape(), "out");
  check_shape(dout, q.shape(), "dout");
  check_shape(lse, Shape{g.B, g.Hq, g.T}, "lse");
  check_shape(dq, q.shape(), "dq");
  check_shape(dk, k.shape(), "dk");
  check_shape(dv, k.shape(), "dv");
  if (g.B == 0 || g.Hq == 0) return;
  if (g.T == 0 || g.S == 0) {  // nothing attends: zero gradients
    if (dq.numel()) std::memset(dq.data(), 0, dq.nbytes());
    if (dk.numel()) std::memset(dk.data(), 0, dk.nbytes());
    if (dv.numel()) std::memset(dv.data(), 0, dv.nbytes());
    return;
  }
  Ptrs P{};
  P.q = q.data_as<const float>();
  P.k = k.data_as<const float>();
  P.v = v.data_as<const float>();
  P.o = out.data_as<const float>();
  P.lse = lse.data_as<const float>();
  P.dout = dout.data_as<const float>();
  P.dq = dq.data_as<float>();
  P.dk = dk.data_as<float>();
  P.dv = dv.data_as<float>();

  const BwdFn fn = kernels().bwd;
  const int nth = omp_get_max_threads();
  const int64_t units = g.B * g.Hkv, nkb = (g.S + TILE - 1) / TILE;
  // (batch, kv head) tasks are race-free and need no reduction; use them unless they would leave threads idle.
  const bool coarse = nth == 1 || nkb == 1 || units % nth == 0 || units >= 4 * int64_t(nth);
  if (coarse) {
    const DqMode mode = g.D % L == 0 ? kDqDirect : kDqLocal;
    const size_t ws_size = bwd_ws(g, mode);
    const bool runs = static_backward_runs(g);
#pragma omp parallel if (units > 1)
    {
      float* ws = scratch(ws_size);
      if (runs) {  // one contiguous run of batches per thread (attention_visibility.hpp)
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; ++u) fn(g, P, u / g.Hkv, u % g.Hkv, 0, nkb, nullptr, mode, ws);
      } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; ++u) fn(g, P, u / g.Hkv, u % g.Hkv, 0, nkb, nullptr, mode, ws);
      }
    }
    return;
  }
  // Fine split: tasks (b, kv head, key block), earliest key blocks (the most queries when causal) first;
  // each thread sums dS K into its own [B][Hq][T][Dp] buffer.
  const int64_t per_thread = g.B * g.Hq * g.T * g.Dp;
  std::unique_ptr<float[]> dqbuf(new float[size_t(nth) * size_t(per_thread)]);  // zeroed per thread below
  int team = 1;
  const size_t ws_size = bwd_ws(g, kDqShared);
#pragma omp parallel
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    team = omp_get_num_threads();
    float* mine = dqbuf.get() + size_t(tid) * size_t(per_thread);
    std::memset(mine, 0, size_t(per_thread) * sizeof(float));
    float* ws = scratch(ws_size);
#pragma omp for schedule(static, 1)  // static: which thread sums which dq part must not vary between runs
    for (int64_t task = 0; task < units * nkb; ++task) {
      const int64_t jb = task / units, u = task % units, b = u / g.Hkv, hk = u % g.Hkv;
      fn(g, P, b, hk, jb, jb + 1, mine + (b * g.Hq + hk * g.G) * g.T * g.Dp, kDqShared, ws);
    }
  }
  const int64_t nrows = g.B * g.T * g.Hq;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t h = r % g.Hq, bt = r / g.Hq, t = bt % g.T, b = bt / g.T;
    const size_t off = size_t(((b * g.Hq + h) * g.T + t) * g.Dp);
    float* dst = P.dq + r * g.D;
    for (int64_t d = 0; d < g.D; ++d) {
      float s = 0.0f;
      for (int th = 0; th < team; ++th) s += dqbuf[size_t(th) * size_t(per_thread) + off + size_t(d)];
      dst[d] = s;
    }
  }
}

void attention_max_logit(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                         const AttentionParams& p) {
  const Geo g = make_geo(q, k, k, segment_ids, p);  // k stands in for v (unused)
  check_shape(out, Shape{g.Hq}, "out");
  float* o = out.data_as<float>();
  for (int64_t h = 0; h < g.Hq; ++h) o[h] = kNegInf;
  if (g.B == 0 || g.T == 0 || g.S == 0 || g.Hq == 0) return;
  Ptrs P{};
  P.q = q.data_as<const float>();
  P.k = k.data_as<const float>();
  const MaxFn fn = kernels().max_logit;
  const int64_t ntasks = g.B * g.Hq * ((g.T + TILE - 1) / TILE);
  std::vector<float> part(size_t(ntasks), kNegInf);
  const size_t ws_size = size_t(g.D * TILE + FWD_BK * TILE);
#pragma omp parallel if (ntasks > 1)
  {
    float* ws = scratch(ws_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) fn(g, P, task, ws, &part[size_t(task)]);
  }
  for (int64_t task = 0; task < ntasks; ++task) {
    const int64_t h = (task % (g.B * g.Hq)) % g.Hq;
    o[h] = std::max(o[h], part[size_t(task)]);
  }
}

#endif  // DEW_CPU_ISA
