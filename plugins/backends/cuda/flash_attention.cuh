// cuda/flash_attention.cuh — the kernels of flash_attention.cu (tensor-core attention; what they compute, their
// tiles, masks, numerics and fragment layouts: flash_attention.cu's top comment), in a header so that the same
// source also runs on a CPU: tests/backends_cuda/test_attention_emulated.cpp includes cuda_emulation.hpp (which
// defines DEW_CUDA_EMULATION and its own versions of the few warp-level primitives below: mma.sync, ldmatrix,
// shuffles, barriers) before it, so every index, mask and softmax step is tested on every CI run, with or without
// a GPU (the emulated plugin, tests/backends_cuda/emulation, runs it through flash_attention.cu as well).
// The platform primitives (pack_bf16, mma_bf16, ldmatrix_x4_trans, to_bf16, ld, warp_sum, the CUDA built-ins)
// come from device.cuh and the PTX below, or from the emulation; nothing else here is platform-specific.
#pragma once
#include <climits>

#include "device.cuh"
#ifndef DEW_CUDA_EMULATION
#define DEW_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace dew::cuda::flash {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowTile = 64;    // query rows (forward, dQ) or keys (dK/dV) per block: 16 per warp
constexpr int kKeyTile = 64;    // keys per step of the forward and dQ
constexpr int kQueryTile = 32;  // queries per step of dK/dV
constexpr int kPad = 8;         // bf16 of padding per shared row

#ifndef DEW_CUDA_EMULATION
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (the lower 16 bits) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8 x 8 bf16 matrices: thread i gives the address of row i % 8 of matrix i / 8 (16 bytes, 16-byte aligned);
// register j gets matrix j's row g, columns 2c and 2c + 1 (the A and B fragments' order).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// Four 8 x 8 bf16 matrices, transposed: thread i gives the address of row i % 8 of matrix i / 8 (16 bytes,
// 16-byte aligned); register j gets matrix j's elements (2c, g) and (2c + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Asynchronous 16-byte copies global -> shared (cp.async.cg, sm_80; L2 only, no registers), so the next tile
// streams in while the current one is multiplied. valid = false zero-fills (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

// The A fragment of rows [r0, r0 + 16), columns [16 kc, 16 kc + 16) of a shared tile with row stride ld: one
// ldmatrix (matrices: rows r0 / r0 + 8 by columns 16 kc / 16 kc + 8, in a[0..3]'s order).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int kc) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(a, tile + (r0 + 8 * (m & 1) + r) * ld + kc * 16 + 8 * (m >> 1));
}
// The B fragments (k = feature, n = row) of rows [n0, n0 + 16), features [16 kc, 16 kc + 16) of a shared tile,
// for the product with a row-major tile's transpose (Q K^T, dO V^T, K Q^T, V dO^T): b[0], b[1] for the n-tile of
// rows n0 .. n0 + 7, b[2], b[3] for n0 + 8 .. n0 + 15; one ldmatrix.
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int kc) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(b, tile + (n0 + 8 * (m >> 1) + r) * ld + kc * 16 + 8 * (m & 1));
}
// The B fragments (k = row, n = feature) of rows [16 kr, 16 kr + 16), features [f0, f0 + 16) of a shared tile:
// b[0], b[1] for features f0 .. f0 + 7, b[2], b[3] for f0 + 8 .. f0 + 15 (P V, dS K, P^T dO, dS^T Q).
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], const bf16* tile, int ld, int kr, int f0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(b, tile + (kr * 16 + 8 * (m & 1) + r) * ld + f0 + 8 * (m >> 1));
}

// The A fragment of 16 rows x columns [16 kr, 16 kr + 16) from C accumulators c[n-tile][4] (n-tiles 2 kr and
// 2 kr + 1), rounded to bf16: the C layout of a tile pair is the A layout (flash_attention.cu's top comment). P and
// dS enter their second products this way.
template <int N>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kr) {
  a[0] = pack_bf16(c[2 * kr][0], c[2 * kr][1]);
  a[1] = pack_bf16(c[2 * kr][2], c[2 * kr][3]);
  a[2] = pack_bf16(c[2 * kr + 1][0], c[2 * kr + 1][1]);
  a[3] = pack_bf16(c[2 * kr + 1][2], c[2 * kr + 1][3]);
}
// acc += a times rows [16 kr, 16 kr + 16) x features [0, D) of a shared tile (k along the tile's rows): P V, dS K,
// P^T dO, dS^T Q.
template <int D>
__device__ __forceinline__ void mma_tile_rows(float (&acc)[D / 8][4], const uint32_t (&a)[4], const bf16* tile, int ld,
                                              int kr) {
#pragma unroll
  for (int nd = 0; nd < D / 8; nd += 2) {
    uint32_t b4[4];
    load_b_cols(b4, tile, ld, kr, nd * 8);
    mma_bf16(acc[nd], a, b4[0], b4[1]);
    mma_bf16(acc[nd + 1], a, b4[2], b4[3]);
  }
}
// s1 = A1 B1^T and s2 = A2 B2^T for the warp's 16 rows [rw, rw + 16) of the shared tiles a1, a2 and the N rows of
// b1, b2, over features [0, D): dQ's S = Q K^T and dP = dO V^T, dK/dV's S^T = K Q^T and dP^T = V dO^T (one A
// load per feature block for both products' n-tiles).
template <int D, int N>
__device__ __forceinline__ void two_products_abt(float (&s1)[N / 8][4], float (&s2)[N / 8][4], const bf16* a1,
                                                 const bf16* b1, const bf16* a2, const bf16* b2, int ld, int rw) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s1[nt][e] = s2[nt][e] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a1f[4], a2f[4];
    load_a(a1f, a1, ld, rw, kc);
    load_a(a2f, a2, ld, rw, kc);
#pragma unroll
    for (int nt = 0; nt < N / 8; nt += 2) {
      uint32_t b[4];
      load_b_rows(b, b1, ld, nt * 8, kc);
      mma_bf16(s1[nt], a1f, b[0], b[1]);
      mma_bf16(s1[nt + 1], a1f, b[2], b[3]);
      load_b_rows(b, b2, ld, nt * 8, kc);
      mma_bf16(s2[nt], a2f, b[0], b[1]);
      mma_bf16(s2[nt + 1], a2f, b[2], b[3]);
    }
  }
}

// Rows [r0, r0 + R) of a strided bf16 matrix (row i at base + i * stride, D contiguous elements) into a shared
// tile [R][D + kPad], 16 bytes per thread and step; rows at or past `rows` are zero.
template <int D, int R>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* base, int64_t stride, int64_t r0, int64_t rows) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < R * kChunks; i += kThreads) {
    const int r = i / kChunks, f = (i % kChunks) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < rows) v = *reinterpret_cast<const uint4*>(base + (r0 + r) * stride + f);
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + f) = v;
  }
}

// load_tile's rows through cp.async: they land by the matching cp_async_wait (then a barrier shows them to all).
template <int D, int R>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* base, int64_t stride, int64_t r0,
                                                int64_t rows) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < R * kChunks; i += kThreads) {
    const int r = i / kChunks, f = (i % kChunks) * 8;
    const bool valid = r0 + r < rows;
    cp_async16(tile + r * (D + kPad) + f, valid ? base + (r0 + r) * stride + f : base, valid);
  }
}

// Whether query t sees key s (attention.cu's rule: causal, window, documents; rows past T, keys past S never).
__device__ __forceinline__ bool sees(const AttentionParams& p, const int32_t* seg_row, int64_t t, int64_t s, int64_t T,
                                     int64_t S) {
  if (t >= T || s >= S) return false;
  const int64_t pos = p.q_offset + t;
  if (p.causal && s > pos) return false;
  if (p.window > 0 && s <= pos - p.window) return false;
  return seg_row == nullptr || (seg_row[pos] != 0 && seg_row[s] == seg_row[pos]);
}
// The causal and window ranges and the edges (sees() without segment ids) as spans of one thread's tile
// columns: offsets j from `first` (the thread's first column) with lo <= j <= hi visible, empty past the
// rows; clamped, so 32-bit compares against compile-time offsets test each score (the int64 rule took ~20
// instructions a score on the diagonal tiles).
struct Span {
  int lo, hi;
};
__device__ __forceinline__ Span clamp_span(int64_t lo, int64_t hi, int64_t first) {
  constexpr int64_t kFar = int64_t(1) << 20;
  return Span{int(max(int64_t(-1), min(kFar, lo - first))), int(max(int64_t(-1), min(kFar, hi - first)))};
}
// The keys query t sees.
__device__ __forceinline__ Span key_span(const AttentionParams& p, int64_t t, int64_t first, int64_t T, int64_t S) {
  if (t >= T) return Span{1, 0};
  const int64_t pos = p.q_offset + t;
  int64_t lo = 0, hi = S - 1;
  if (p.causal) hi = min(hi, pos);
  if (p.window > 0) lo = max(lo, pos - p.window + 1);
  return clamp_span(lo, hi, first);
}
// The queries that see key s.
__device__ __forceinline__ Span query_span(const AttentionParams& p, int64_t s, int64_t first, int64_t T, int64_t S) {
  if (s >= S) return Span{1, 0};
  int64_t lo = 0, hi = T - 1;
  if (p.causal) lo = max(lo, s - p.q_offset);
  if (p.window > 0) hi = min(hi, s - p.q_offset + p.window - 1);
  return clamp_span(lo, hi, first);
}
// x[nt][e] = fill where a C-fragment tile's score is hidden: rows (e < 2: a, else b) and columns first +
// nt * 8 + (e & 1) of the thread; visible(row a?, column offset) is the rule with segment ids, the spans without.
template <int N, class Visible>
__device__ __forceinline__ void mask_scores(float (&x)[N / 8][4], float fill, bool segmented, Span a, Span b,
                                            Visible&& visible) {
  if (segmented) {
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!visible(e < 2, nt * 8 + (e & 1))) x[nt][e] = fill;
    return;
  }
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = nt * 8 + (e & 1);
      const Span& r = e < 2 ? a : b;
      if (j < r.lo || j > r.hi) x[nt][e] = fill;
    }
}

__device__ __forceinline__ float capped(float raw, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(raw / softcap) : raw;
}
// d capped / d raw.
__device__ __forceinline__ float cap_slope(float raw, float softcap) {
  if (softcap <= 0.0f) return 1.0f;
  const float th = tanhf(raw / softcap);
  return 1.0f - th * th;
}

// The softmax's units. A score enters exp2 as u * to_log2 minus its row's base: u is the raw product q.k when the
// scale is positive and there is no softcap (to_log2 = scale log2 e: one FFMA and one MUFU.EX2 per score, the row
// maximum taken on the raw products), else the scaled and capped score (prescale; to_log2 = log2 e). natural
// turns u into natural-log units (lse). The branches on it are uniform and stay outside the per-score loops, so
// those loops are straight-line code the compiler interleaves (a branch per score serialised their latencies).
constexpr float kLog2e = 1.4426950408889634f;
struct ScoreUnits {
  bool prescale;
  float to_log2, natural;
};
__device__ __forceinline__ ScoreUnits score_units(const AttentionParams& p) {
  const bool pre = p.softcap > 0.0f || !(p.scale > 0.0f);
  return ScoreUnits{pre, pre ? kLog2e : p.scale * kLog2e, pre ? 1.0f : p.scale};
}
// An lse in natural-log units as the backward's exp2 base: lse log2 e, or +inf for a row that sees no key (so
// every P of it is exp2(-inf) = 0).
__device__ __forceinline__ float lse_base(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// Whether the causal and window ranges and the edges let every query of [t0, t0 + R) see every key of
// [s0, s0 + C) (segment ids aside). Uniform over the block.
template <int R, int C>
__device__ __forceinline__ bool tile_in_range(const AttentionParams& p, int64_t t0, int64_t s0, int64_t T, int64_t S) {
  if (t0 + R > T || s0 + C > S) return false;
  if (p.causal && s0 + C - 1 > p.q_offset + t0) return false;                  // the last key past the first query
  if (p.window > 0 && s0 <= p.q_offset + t0 + R - 1 - p.window) return false;  // the first key out of the last's window
  return true;
}

// The documents of n consecutive positions [first, first + n) of a row of segment ids, `valid` of them inside it
// (the rest past its end): the smallest and largest nonzero id (lo > hi when there is none) and whether every
// position is valid with a nonzero id. Every thread of the block calls it and gets the same answer; `red` is 8
// ints of shared memory; barriers inside and at the end.
struct SegRange {
  int lo, hi;
  bool all_nonzero;
};
__device__ __forceinline__ SegRange seg_range(const int32_t* seg_row, int64_t first, int valid, int n, int* red) {
  const int i = threadIdx.x, warp = i >> 5, lane = i & 31;
  const int v = i < valid ? seg_row[first + i] : 0;
  int lo = i < n && v != 0 ? v : INT_MAX, hi = i < n && v != 0 ? v : INT_MIN;
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (lane == 0) red[warp] = lo, red[kWarps + warp] = hi;
  const bool some_zero = __syncthreads_or(i < n && v == 0);  // also orders red's writes before the reads
  SegRange r{INT_MAX, INT_MIN, !some_zero};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r.lo = min(r.lo, red[w]), r.hi = max(r.hi, red[kWarps + w]);
  __syncthreads();  // red is read by everyone before the next call writes it
  return r;
}

// How a tile of queries (their documents q) and keys (k) is masked: hidden (no query sees a key: skipped),
// whole (every query sees every key: no per-element test), or per element. Without segment ids q and k are
// unused; with them, the tile is hidden when the two id ranges do not meet, and whole only inside one document.
enum class TileMask { hidden, whole, per_element };
template <int R, int C>
__device__ __forceinline__ TileMask tile_mask(const AttentionParams& p, bool segmented, const SegRange& q,
                                              const SegRange& k, int64_t t0, int64_t s0, int64_t T, int64_t S) {
  const bool in_range = tile_in_range<R, C>(p, t0, s0, T, S);
  if (!segmented) return in_range ? TileMask::whole : TileMask::per_element;
  if (q.lo > q.hi || k.lo > k.hi || k.hi < q.lo || k.lo > q.hi) return TileMask::hidden;
  const bool one_doc = q.all_nonzero && k.all_nonzero && q.lo == q.hi && k.lo == k.hi && q.lo == k.lo;
  return in_range && one_doc ? TileMask::whole : TileMask::per_element;
}

// The first key tile at or after s0 (a multiple of kKeyTile) up to s_hi that the block's query rows [t0, t0 + 64)
// (documents q_docs) do not wholly miss, with its mask in `mask`; s_hi + 1 when there is none. Uniform over the
// block (seg_range's barriers with segment ids).
__device__ __forceinline__ int64_t next_key_tile(const AttentionParams& p, const int32_t* seg_row,
                                                 const SegRange& q_docs, const AttnDims& d, int64_t t0, int64_t s0,
                                                 int64_t s_hi, int* red, TileMask& mask) {
  for (; s0 <= s_hi; s0 += kKeyTile) {
    const int k_valid = int(min(int64_t(kKeyTile), d.S - s0));
    const SegRange k_docs = seg_row ? seg_range(seg_row, s0, k_valid, kKeyTile, red) : SegRange{};
    mask = tile_mask<kRowTile, kKeyTile>(p, seg_row != nullptr, q_docs, k_docs, t0, s0, d.T, d.S);
    if (mask != TileMask::hidden) return s0;
  }
  return s_hi + 1;
}

// Keys [lo, hi] some query of [t0, t1] may see (causal / window only).
__device__ __forceinline__ void key_range(const AttentionParams& p, int64_t t0, int64_t t1, int64_t S, int64_t& lo,
                                          int64_t& hi) {
  lo = 0;
  hi = S - 1;
  if (p.causal && p.q_offset + t1 < hi) hi = p.q_offset + t1;
  if (p.window > 0 && p.q_offset + t0 - p.window + 1 > lo) lo = p.q_offset + t0 - p.window + 1;
}

// Stores a 16 x D accumulator row pair (rows ta, ta + 8 of the thread's fragments) times `mul[i]` as bf16 into
// rows at row_ptr(i) (nullptr: not stored).
template <int D>
__device__ __forceinline__ void store_rows(bf16* row0, bf16* row1, const float (&acc)[D / 8][4], float mul0,
                                           float mul1) {
  const int c = threadIdx.x & 3;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    const int f = nd * 8 + 2 * c;
    if (row0) {
      row0[f] = to_bf16(acc[nd][0] * mul0);
      row0[f + 1] = to_bf16(acc[nd][1] * mul0);
    }
    if (row1) {
      row1[f] = to_bf16(acc[nd][2] * mul1);
      row1[f + 1] = to_bf16(acc[nd][3] * mul1);
    }
  }
}

// The first query row of a forward or dQ block: the last tiles first, since under a causal mask they see the most
// keys (the longest blocks start first and the grid's tail is short ones).
__device__ __forceinline__ int64_t query_tile_start() { return int64_t(gridDim.y - 1 - blockIdx.y) * kRowTile; }

// Blocks per SM the kernels are compiled for (__launch_bounds__): 3 with 64-wide heads, at most 168 registers a
// thread, so 12 warps an SM hide the mma, shared-memory and exp2 latencies (the forward fits without spilling; the
// backward kernels spill a few accumulators to L1 and still gain: on an H200, GPT-2-small's attention forward +
// backward 0.543 ms unbounded (201-235 registers, 8 warps an SM), 0.481 ms bounded); 3 with 32-wide heads (they
// fit without spilling); 2 with 128-wide heads.
template <int D>
constexpr int min_blocks() {
  return D <= 64 ? 3 : 2;
}

// ---------------------------------------------------------------- forward
// grid (B * Hq, ceil(T / 64)); shared: the Q tile [64][D + kPad], then two K and two V tiles (double-buffered).
template <int D>
__global__ void __launch_bounds__(kThreads, min_blocks<D>())
    flash_forward_kernel(const bf16* q, const bf16* k, const bf16* v, const int32_t* seg, bf16* out, float* lse,
                         AttnDims d, AttentionParams p) {
  constexpr int ld = D + kPad;
  DEW_DYNAMIC_SMEM(smem);
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  // buffer j (0, 1) of K at Kbuf(j), of V at Vbuf(j): arithmetic, not an array (a run-time index would put it
  // in local memory)
  const auto Kbuf = [&](int j) { return Qs + (kRowTile + j * kKeyTile) * ld; };
  const auto Vbuf = [&](int j) { return Qs + (kRowTile + (2 + j) * kKeyTile) * ld; };
  const int64_t b = int64_t(blockIdx.x) / d.Hq, h = int64_t(blockIdx.x) % d.Hq, hk = h / (d.Hq / d.Hkv);
  const int64_t t0 = query_tile_start();
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = warp * 16;
  const int64_t qstride = d.Hq * D, kstride = d.Hkv * D;
  const bf16* kb = k + (b * d.S * d.Hkv + hk) * D;
  const bf16* vb = v + (b * d.S * d.Hkv + hk) * D;
  const int32_t* seg_row = seg ? seg + b * d.S : nullptr;

  __shared__ int red[2 * kWarps];
  const int q_valid = int(min(int64_t(kRowTile), d.T - t0));
  const SegRange q_docs = seg_row ? seg_range(seg_row, p.q_offset + t0, q_valid, kRowTile, red) : SegRange{};
  int64_t s_lo, s_hi;
  key_range(p, t0, t0 + q_valid - 1, d.S, s_lo, s_hi);
  // The first visible key tile's copies start before Q's (synchronous) load.
  TileMask mask = TileMask::hidden, next_mask = TileMask::hidden;
  int64_t s0 = next_key_tile(p, seg_row, q_docs, d, t0, s_lo / kKeyTile * kKeyTile, s_hi, red, mask);
  if (s0 <= s_hi) {
    load_tile_async<D, kKeyTile>(Kbuf(0), kb, kstride, s0, d.S);
    load_tile_async<D, kKeyTile>(Vbuf(0), vb, kstride, s0, d.S);
  }
  cp_async_commit();

  load_tile<D, kRowTile>(Qs, q + (b * d.T * d.Hq + h) * D, qstride, t0, d.T);
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) load_a(qa[kc], Qs, ld, rw, kc);

  const int64_t ta = t0 + rw + g, tb = ta + 8;  // this thread's two query rows
  const ScoreUnits units = score_units(p);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;

  // Tile i in buffer i % 2: the next visible tile's copies are issued into the other buffer (free since the
  // barrier that ended the iteration before), then this tile's are awaited.
  for (int buf = 0; s0 <= s_hi; buf ^= 1) {
    const int64_t s1 = next_key_tile(p, seg_row, q_docs, d, t0, s0 + kKeyTile, s_hi, red, next_mask);
    if (s1 <= s_hi) {
      load_tile_async<D, kKeyTile>(Kbuf(buf ^ 1), kb, kstride, s1, d.S);
      load_tile_async<D, kKeyTile>(Vbuf(buf ^ 1), vb, kstride, s1, d.S);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of tile s0 have landed (s1's may be in flight)
    __syncthreads();     // and every thread's
    const bf16* Ks = Kbuf(buf);
    const bf16* Vs = Vbuf(buf);

    float sc[kKeyTile / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; nt += 2) {
        uint32_t b[4];
        load_b_rows(b, Ks, ld, nt * 8, kc);
        mma_bf16(sc[nt], qa[kc], b[0], b[1]);
        mma_bf16(sc[nt + 1], qa[kc], b[2], b[3]);
      }

    // u (score_units) in sc; hidden keys -inf; the row maxima of u
    if (units.prescale)
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = capped(p.scale * sc[nt][e], p.softcap);
    if (mask != TileMask::whole) {
      const int64_t first = s0 + 2 * c;
      mask_scores<kKeyTile>(sc, -INFINITY, seg_row != nullptr, key_span(p, ta, first, d.T, d.S),
                            key_span(p, tb, first, d.T, d.S),
                            [&](bool a, int j) { return sees(p, seg_row, a ? ta : tb, first + j, d.T, d.S); });
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[nt][0], sc[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[nt][2], sc[nt][3]));
    }
    float base[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // the row's maximum over the 4 threads holding it
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      // no key seen yet: every exp2 below is exp2(-inf) = 0
      base[i] = m_new == -INFINITY ? 0.0f : m_new * units.to_log2;
      alpha[i] = exp2f(fmaf(m[i], units.to_log2, -base[i]));
      m[i] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(fmaf(sc[nt][e], units.to_log2, -base[e >> 1]));
        sc[nt][e] = pe;
        rs[e >> 1] += pe;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }
#pragma unroll
    for (int kr = 0; kr < kKeyTile / 16; ++kr) {
      uint32_t pa[4];
      c_to_a(pa, sc, kr);
      mma_tile_rows<D>(o, pa, Vs, ld, kr);
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    s0 = s1;
    mask = next_mask;
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  bf16* row0 = ta < d.T ? out + ((b * d.T + ta) * d.Hq + h) * D : nullptr;
  bf16* row1 = tb < d.T ? out + ((b * d.T + tb) * d.Hq + h) * D : nullptr;
  store_rows<D>(row0, row1, o, l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f);
  if (c == 0) {
    float* lrow = lse + (b * d.Hq + h) * d.T;
    if (ta < d.T) lrow[ta] = l[0] > 0.0f ? m[0] * units.natural + logf(l[0]) : -INFINITY;
    if (tb < d.T) lrow[tb] = l[1] > 0.0f ? m[1] * units.natural + logf(l[1]) : -INFINITY;
  }
}

// ---------------------------------------------------------------- backward
// Di[r] = sum over features of dO * O for rows r = (b * Hq + h) * T + t (lse's order); one warp per row.
template <int D>
__global__ void flash_di_kernel(const bf16* out, const bf16* dout, float* Di, AttnDims d) {
  const int64_t rows = d.B * d.Hq * d.T;
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t t = r % d.T, bh = r / d.T, h = bh % d.Hq, b = bh / d.Hq;
    const int64_t off = ((b * d.T + t) * d.Hq + h) * D;
    float s = 0.0f;
#pragma unroll
    for (int f = lane; f < D; f += 32) s += ld(out + off, f) * ld(dout + off, f);
    s = warp_sum(s);
    if (lane == 0) Di[r] = s;
  }
}

// dQ = scale * sum over visible keys of dS K, dS = P (dP - Di) (times the softcap's slope), P = exp(score - lse),
// dP = dO V^T. grid (B * Hq, ceil(T / 64)); shared: Q, dO, K, V tiles [64][D + kPad].
template <int D>
__global__ void __launch_bounds__(kThreads, min_blocks<D>())
    flash_dq_kernel(const bf16* q, const bf16* k, const bf16* v, const int32_t* seg, const float* lse, const bf16* dout,
                    const float* Di, bf16* dq, AttnDims d, AttentionParams p) {
  constexpr int ld = D + kPad;
  DEW_DYNAMIC_SMEM(smem);
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Gs = Qs + kRowTile * ld;
  const auto Kbuf = [&](int j) { return Gs + (kRowTile + j * kKeyTile) * ld; };  // as in the forward
  const auto Vbuf = [&](int j) { return Gs + (kRowTile + (2 + j) * kKeyTile) * ld; };
  const int64_t b = int64_t(blockIdx.x) / d.Hq, h = int64_t(blockIdx.x) % d.Hq, hk = h / (d.Hq / d.Hkv);
  const int64_t t0 = query_tile_start();
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = warp * 16;
  const int64_t qstride = d.Hq * D, kstride = d.Hkv * D;
  const bf16* kb = k + (b * d.S * d.Hkv + hk) * D;
  const bf16* vb = v + (b * d.S * d.Hkv + hk) * D;
  const int32_t* seg_row = seg ? seg + b * d.S : nullptr;

  __shared__ int red[2 * kWarps];
  const int q_valid = int(min(int64_t(kRowTile), d.T - t0));
  const SegRange q_docs = seg_row ? seg_range(seg_row, p.q_offset + t0, q_valid, kRowTile, red) : SegRange{};
  int64_t s_lo, s_hi;
  key_range(p, t0, t0 + q_valid - 1, d.S, s_lo, s_hi);
  TileMask mask = TileMask::hidden, next_mask = TileMask::hidden;
  int64_t s0 = next_key_tile(p, seg_row, q_docs, d, t0, s_lo / kKeyTile * kKeyTile, s_hi, red, mask);
  if (s0 <= s_hi) {
    load_tile_async<D, kKeyTile>(Kbuf(0), kb, kstride, s0, d.S);
    load_tile_async<D, kKeyTile>(Vbuf(0), vb, kstride, s0, d.S);
  }
  cp_async_commit();

  load_tile<D, kRowTile>(Qs, q + (b * d.T * d.Hq + h) * D, qstride, t0, d.T);
  load_tile<D, kRowTile>(Gs, dout + (b * d.T * d.Hq + h) * D, qstride, t0, d.T);
  const int64_t ta = t0 + rw + g, tb = ta + 8;
  const float* lrow = lse + (b * d.Hq + h) * d.T;
  const float* drow = Di + (b * d.Hq + h) * d.T;
  const float L2[2] = {lse_base(ta < d.T ? lrow[ta] : -INFINITY), lse_base(tb < d.T ? lrow[tb] : -INFINITY)};
  const ScoreUnits units = score_units(p);
  const float Dr[2] = {ta < d.T ? drow[ta] : 0.0f, tb < d.T ? drow[tb] : 0.0f};
  float acc[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

  // Tile i in buffer i % 2, as in the forward; the first wait's barrier also shows Q and dO to every warp.
  for (int buf = 0; s0 <= s_hi; buf ^= 1) {
    const int64_t s1 = next_key_tile(p, seg_row, q_docs, d, t0, s0 + kKeyTile, s_hi, red, next_mask);
    if (s1 <= s_hi) {
      load_tile_async<D, kKeyTile>(Kbuf(buf ^ 1), kb, kstride, s1, d.S);
      load_tile_async<D, kKeyTile>(Vbuf(buf ^ 1), vb, kstride, s1, d.S);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* Ks = Kbuf(buf);
    const bf16* Vs = Vbuf(buf);

    float sc[kKeyTile / 8][4], dp[kKeyTile / 8][4];
    two_products_abt<D, kKeyTile>(sc, dp, Qs, Ks, Gs, Vs, ld, rw);  // S = Q K^T, dP = dO V^T
    // dS into sc: P = exp2(u to_log2 - lse log2 e) (0 for a row without keys), then zero where a key is hidden
    if (units.prescale)
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float raw = p.scale * sc[nt][e];
          const float P = exp2f(fmaf(capped(raw, p.softcap), kLog2e, -L2[e >> 1]));
          sc[nt][e] = P * (dp[nt][e] - Dr[e >> 1]) * cap_slope(raw, p.softcap);
        }
    else
#pragma unroll
      for (int nt = 0; nt < kKeyTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float P = exp2f(fmaf(sc[nt][e], units.to_log2, -L2[e >> 1]));
          sc[nt][e] = P * (dp[nt][e] - Dr[e >> 1]);
        }
    if (mask != TileMask::whole) {
      const int64_t first = s0 + 2 * c;
      mask_scores<kKeyTile>(sc, 0.0f, seg_row != nullptr, key_span(p, ta, first, d.T, d.S),
                            key_span(p, tb, first, d.T, d.S),
                            [&](bool a, int j) { return sees(p, seg_row, a ? ta : tb, first + j, d.T, d.S); });
    }
#pragma unroll
    for (int kr = 0; kr < kKeyTile / 16; ++kr) {
      uint32_t da[4];
      c_to_a(da, sc, kr);
      mma_tile_rows<D>(acc, da, Ks, ld, kr);
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    s0 = s1;
    mask = next_mask;
  }
  bf16* row0 = ta < d.T ? dq + ((b * d.T + ta) * d.Hq + h) * D : nullptr;
  bf16* row1 = tb < d.T ? dq + ((b * d.T + tb) * d.Hq + h) * D : nullptr;
  store_rows<D>(row0, row1, acc, p.scale, p.scale);
}

// dV = sum over the queries that see the key (every head of its group) of P dO, dK = scale * sum of dS Q.
// grid (B * Hkv, ceil(S / 64)); shared: K, V tiles [64][D + kPad], Q, dO tiles [32][D + kPad], lse and Di of
// the query tile.
template <int D>
__global__ void __launch_bounds__(kThreads, min_blocks<D>())
    flash_dkdv_kernel(const bf16* q, const bf16* k, const bf16* v, const int32_t* seg, const float* lse,
                      const bf16* dout, const float* Di, bf16* dk, bf16* dv, AttnDims d, AttentionParams p) {
  constexpr int ld = D + kPad;
  DEW_DYNAMIC_SMEM(smem);
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kRowTile * ld;
  // buffer j (0, 1) of Q, dO, lse and Di (arithmetic, as in the forward)
  const auto Qbuf = [&](int j) { return Vs + (kRowTile + j * kQueryTile) * ld; };
  const auto Gbuf = [&](int j) { return Vs + (kRowTile + (2 + j) * kQueryTile) * ld; };
  float* const stats = reinterpret_cast<float*>(Vs + (kRowTile + 4 * kQueryTile) * ld);
  const auto Lbuf = [&](int j) { return stats + j * kQueryTile; };
  const auto Dbuf = [&](int j) { return stats + (2 + j) * kQueryTile; };
  const int64_t b = int64_t(blockIdx.x) / d.Hkv, hk = int64_t(blockIdx.x) % d.Hkv, group = d.Hq / d.Hkv;
  const int64_t s0 = int64_t(blockIdx.y) * kRowTile;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = warp * 16;
  const int64_t qstride = d.Hq * D, kstride = d.Hkv * D;
  const int32_t* seg_row = seg ? seg + b * d.S : nullptr;

  load_tile<D, kRowTile>(Ks, k + (b * d.S * d.Hkv + hk) * D, kstride, s0, d.S);
  load_tile<D, kRowTile>(Vs, v + (b * d.S * d.Hkv + hk) * D, kstride, s0, d.S);
  __shared__ int red[2 * kWarps];
  const int k_valid = int(min(int64_t(kRowTile), d.S - s0));
  const SegRange k_docs = seg_row ? seg_range(seg_row, s0, k_valid, kRowTile, red) : SegRange{};
  const int64_t sa = s0 + rw + g, sb = sa + 8;  // this thread's two key rows
  const ScoreUnits units = score_units(p);
  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[nd][e] = dva[nd][e] = 0.0f;

  // Queries [t_lo, t_hi] that may see a key of [s0, s_last] (causal / window only).
  const int64_t s_last = min(d.S, s0 + kRowTile) - 1;
  int64_t t_lo = 0, t_hi = d.T - 1;
  if (p.causal && s0 - p.q_offset > t_lo) t_lo = s0 - p.q_offset;
  if (p.window > 0 && s_last + p.window - 1 - p.q_offset < t_hi) t_hi = s_last + p.window - 1 - p.q_offset;
  // The (head gi of the group, query tile t0) pairs in order, hidden ones skipped (gi == group past the end);
  // pair i's Q, dO, lse and Di in buffer i % 2, the next pair's issued before this one's are awaited.
  const int64_t t_first = t_lo / kQueryTile * kQueryTile;
  const auto seek = [&](int64_t& gi, int64_t& t0, TileMask& mask) {
    while (gi < group) {
      if (t0 > t_hi) {
        ++gi;
        t0 = t_first;
        continue;
      }
      const int q_valid = int(min(int64_t(kQueryTile), d.T - t0));
      const SegRange q_docs = seg_row ? seg_range(seg_row, p.q_offset + t0, q_valid, kQueryTile, red) : SegRange{};
      mask = tile_mask<kQueryTile, kRowTile>(p, seg_row != nullptr, q_docs, k_docs, t0, s0, d.T, d.S);
      if (mask != TileMask::hidden) return;
      t0 += kQueryTile;
    }
  };
  const auto issue = [&](int into, int64_t gi, int64_t t0) {
    const int64_t h = hk * group + gi;
    load_tile_async<D, kQueryTile>(Qbuf(into), q + (b * d.T * d.Hq + h) * D, qstride, t0, d.T);
    load_tile_async<D, kQueryTile>(Gbuf(into), dout + (b * d.T * d.Hq + h) * D, qstride, t0, d.T);
    const float* lrow = lse + (b * d.Hq + h) * d.T;
    const float* drow = Di + (b * d.Hq + h) * d.T;
    for (int i = threadIdx.x; i < kQueryTile; i += kThreads) {
      const bool in = t0 + i < d.T;
      Lbuf(into)[i] = lse_base(in ? lrow[t0 + i] : -INFINITY);
      Dbuf(into)[i] = in ? drow[t0 + i] : 0.0f;
    }
  };
  int64_t gi = 0, t0 = t_first;
  TileMask mask = TileMask::hidden, next_mask = TileMask::hidden;
  seek(gi, t0, mask);
  if (gi < group) issue(0, gi, t0);
  cp_async_commit();
  for (int buf = 0; gi < group; buf ^= 1) {
    int64_t gi1 = gi, t1 = t0 + kQueryTile;
    seek(gi1, t1, next_mask);
    if (gi1 < group) issue(buf ^ 1, gi1, t1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // every thread's copies of this pair (and, the first time, K and V) are visible
    const bf16* Qs = Qbuf(buf);
    const bf16* Gs = Gbuf(buf);
    const float* Ls = Lbuf(buf);
    const float* Ds = Dbuf(buf);

    float st[kQueryTile / 8][4], dpt[kQueryTile / 8][4];
    two_products_abt<D, kQueryTile>(st, dpt, Ks, Qs, Vs, Gs, ld, rw);  // S^T = K Q^T, dP^T = V dO^T
    // P into st, dS into dpt (queries along the columns: their lse base and Di from shared), then zeros where
    // a query does not see the key
    if (units.prescale)
#pragma unroll
      for (int nt = 0; nt < kQueryTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tl = nt * 8 + 2 * c + (e & 1);
          const float raw = p.scale * st[nt][e];
          const float P = exp2f(fmaf(capped(raw, p.softcap), kLog2e, -Ls[tl]));
          st[nt][e] = P;
          dpt[nt][e] = P * (dpt[nt][e] - Ds[tl]) * cap_slope(raw, p.softcap);
        }
    else
#pragma unroll
      for (int nt = 0; nt < kQueryTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tl = nt * 8 + 2 * c + (e & 1);
          const float P = exp2f(fmaf(st[nt][e], units.to_log2, -Ls[tl]));
          st[nt][e] = P;
          dpt[nt][e] = P * (dpt[nt][e] - Ds[tl]);
        }
    if (mask != TileMask::whole) {
      const int64_t first = t0 + 2 * c;
      const Span a = query_span(p, sa, first, d.T, d.S), b = query_span(p, sb, first, d.T, d.S);
      const auto visible = [&](bool ra, int j) { return sees(p, seg_row, first + j, ra ? sa : sb, d.T, d.S); };
      mask_scores<kQueryTile>(st, 0.0f, seg_row != nullptr, a, b, visible);
      mask_scores<kQueryTile>(dpt, 0.0f, seg_row != nullptr, a, b, visible);
    }
#pragma unroll
    for (int kr = 0; kr < kQueryTile / 16; ++kr) {
      uint32_t pa[4], da[4];
      c_to_a(pa, st, kr);
      c_to_a(da, dpt, kr);
      mma_tile_rows<D>(dva, pa, Gs, ld, kr);  // dV += P^T dO
      mma_tile_rows<D>(dka, da, Qs, ld, kr);  // dK += dS^T Q (scaled on store)
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    gi = gi1;
    t0 = t1;
    mask = next_mask;
  }
  bf16* k0 = sa < d.S ? dk + ((b * d.S + sa) * d.Hkv + hk) * D : nullptr;
  bf16* k1 = sb < d.S ? dk + ((b * d.S + sb) * d.Hkv + hk) * D : nullptr;
  store_rows<D>(k0, k1, dka, p.scale, p.scale);
  bf16* v0 = sa < d.S ? dv + ((b * d.S + sa) * d.Hkv + hk) * D : nullptr;
  bf16* v1 = sb < d.S ? dv + ((b * d.S + sb) * d.Hkv + hk) * D : nullptr;
  store_rows<D>(v0, v1, dva, 1.0f, 1.0f);
}

// Shared bytes per block of each kernel.
template <int D>
constexpr size_t forward_smem() {  // Q, 2 x (K, V)
  return size_t(kRowTile + 4 * kKeyTile) * (D + kPad) * sizeof(bf16);
}
template <int D>
constexpr size_t dq_smem() {  // Q, dO, 2 x (K, V)
  return size_t(2 * kRowTile + 4 * kKeyTile) * (D + kPad) * sizeof(bf16);
}
template <int D>
constexpr size_t dkdv_smem() {  // K, V, 2 x (Q, dO, lse, Di)
  return size_t(2 * kRowTile + 4 * kQueryTile) * (D + kPad) * sizeof(bf16) + 4 * kQueryTile * sizeof(float);
}

}  // namespace dew::cuda::flash
