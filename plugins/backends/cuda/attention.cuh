// cuda/attention.cuh — the kernels of attention.cu (the warp-per-row attention; what they compute: attention.cu's
// top comment), in a header so that tests/backends_cuda/test_attention_emulated.cpp runs the same source on the CPU
// (cuda_emulation.hpp, included first, defines DEW_CUDA_EMULATION and the platform part of device.cuh: ld / st,
// the CUDA built-ins and intrinsics).
#pragma once

#include "attention_mask.cuh"
#include "device.cuh"

namespace dew::cuda::warp_attention {


constexpr int kChunks = kAttnMaxHeadDim / 32;
constexpr int kWarps = 4;  // warps per block

using attention_mask::cap;
using attention_mask::same_doc;
using attention_mask::Vis;
using attention_mask::visible_keys;

template <class T>
__device__ __forceinline__ void load_row(const T* row, int64_t D, float (&r)[kChunks]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    r[c] = d < D ? ld(row, d) : 0.0f;
  }
}
template <class T>
__device__ __forceinline__ float dot_row(const float (&a)[kChunks], const T* row, int64_t D) {
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < D) s += a[c] * ld(row, d);
  }
  return warp_sum(s);
}
template <class T>
__device__ __forceinline__ void store_row(T* row, int64_t D, const float (&r)[kChunks], float scale) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < D) st(row, d, r[c] * scale);
  }
}

// One query row, by one warp: query position q_offset + t over keys 0 .. S - 1 of one sequence (kb, vb: its rows,
// Hkv heads each, seg_row its segment ids or nullptr), the online softmax; out row and lse written. attention_kernel
// and attention_slots_kernel both run it, so a slot row gets the bits of the same row decoded alone.
template <class T, class KV>
__device__ __forceinline__ void attend_row(const T* qrow, const KV* kb, const KV* vb, const int32_t* seg_row, int64_t S,
                                           int64_t Hkv, int64_t hk, int64_t Dk, int64_t Dv, const AttentionParams& p,
                                           int64_t t, T* orow, float* lse_out) {
  float qr[kChunks], acc[kChunks];
  load_row(qrow, Dk, qr);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0.0f;
  const Vis vis = visible_keys(p, t, S);
  float m = -INFINITY, l = 0.0f;
  bool any = false;
  for (int64_t s = vis.lo; s <= vis.hi; ++s) {
    if (!same_doc(seg_row, p.q_offset + t, s)) continue;
    any = true;
    const int64_t kv = s * Hkv + hk;
    const float sc = cap(p.scale * dot_row(qr, kb + kv * Dk, Dk), p.softcap);
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new), pr = expf(sc - m_new);
    l = l * corr + pr;
    const KV* vr = vb + kv * Dv;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t dd = lane + 32 * c;
      acc[c] = acc[c] * corr + (dd < Dv ? pr * ld(vr, dd) : 0.0f);
    }
    m = m_new;
  }
  store_row(orow, Dv, acc, any ? 1.0f / l : 0.0f);
  if ((threadIdx.x & 31) == 0) *lse_out = any ? m + logf(l) : -INFINITY;
}

// Query rows are numbered r = (b * Hq + h) * T + t (the lse layout), so the warps of a block share K/V.
// T: q and out; KV: k and v (T, or bf16 under f32 q).
template <class T, class KV>
__global__ void attention_kernel(const T* q, const KV* k, const KV* v, const int32_t* seg, T* out, float* lse,
                                 AttnDims d, AttentionParams p) {
  const int64_t rows = d.B * d.Hq * d.T;
  const int64_t group = d.Hq / d.Hkv;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t t = r % d.T, bh = r / d.T, h = bh % d.Hq, b = bh / d.Hq, hk = h / group;
    attend_row(q + ((b * d.T + t) * d.Hq + h) * d.Dk, k + b * d.S * d.Hkv * d.Dk, v + b * d.S * d.Hkv * d.Dv,
               seg ? seg + b * d.S : nullptr, d.S, d.Hkv, hk, d.Dk, d.Dv, p, t, out + ((b * d.T + t) * d.Hq + h) * d.Dv,
               lse + r);
  }
}

// attention_slots (dew/kernel_table.hpp): rows n of a decode step over a slot cache [slots, C, Hkv, D], each its own
// sequence. kSlotRows rows a launch: their slots and positions travel in the kernel's arguments.
constexpr int kSlotRows = 128;
struct SlotRows {
  int32_t slot[kSlotRows], pos[kSlotRows];
};

// Row r / row_elems of k_new, v_new ([n, Hkv * D]) into [slot, pos] of the caches.
template <class KV>
__global__ void slot_write_kernel(const KV* k_new, const KV* v_new, KV* k_cache, KV* v_cache, SlotRows rows, int64_t n,
                                  int64_t row_elems, int64_t C) {
  const int64_t total = n * row_elems;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / row_elems, e = i % row_elems;
    const int64_t at = (int64_t(rows.slot[r]) * C + rows.pos[r]) * row_elems + e;
    k_cache[at] = k_new[i];
    v_cache[at] = v_new[i];
  }
}

// One warp per (row, query head), r = n * Hq + h: the row's query at position pos over its slot's keys 0 .. pos, as
// attention_kernel runs the same row alone over the slot's first pos + 1 keys (B = T = 1, q_offset = pos, causal).
template <class T, class KV>
__global__ void attention_slots_kernel(const T* q, const KV* k_cache, const KV* v_cache, T* out, float* lse,
                                       SlotRows rows, int64_t n, int64_t C, int64_t Hq, int64_t Hkv, int64_t D,
                                       AttentionParams p) {
  const int64_t group = Hq / Hkv;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < n * Hq; r += int64_t(gridDim.x) * kWarps) {
    const int64_t b = r / Hq, h = r % Hq, pos = rows.pos[b];
    AttentionParams pr = p;
    pr.causal = true;
    pr.q_offset = pos;
    const int64_t base = int64_t(rows.slot[b]) * C * Hkv * D;
    attend_row(q + (b * Hq + h) * D, k_cache + base, v_cache + base, static_cast<const int32_t*>(nullptr), pos + 1, Hkv,
               h / group, D, D, pr, 0, out + (b * Hq + h) * D, lse + r);
  }
}

template <class T>
__global__ void attention_dq_kernel(const T* q, const T* k, const T* v, const int32_t* seg, const T* out,
                                    const float* lse, const T* dout, T* dq, float* Di_out, AttnDims d,
                                    AttentionParams p) {
  const int64_t rows = d.B * d.Hq * d.T;
  const int64_t group = d.Hq / d.Hkv;
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t t = r % d.T, bh = r / d.T, h = bh % d.Hq, b = bh / d.Hq, hk = h / group;
    const int64_t qrow = (b * d.T + t) * d.Hq + h;
    float qr[kChunks], gr[kChunks], dqr[kChunks];
    load_row(q + qrow * d.Dk, d.Dk, qr);
    load_row(dout + qrow * d.Dv, d.Dv, gr);
    const float Di = dot_row(gr, out + qrow * d.Dv, d.Dv);
    if (lane == 0) Di_out[r] = Di;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dqr[c] = 0.0f;
    const float L = lse[r];
    const Vis vis = visible_keys(p, t, d.S);
    const int32_t* seg_row = seg ? seg + b * d.S : nullptr;
    for (int64_t s = vis.lo; s <= vis.hi; ++s) {
      if (!same_doc(seg_row, p.q_offset + t, s)) continue;
      const int64_t kv = (b * d.S + s) * d.Hkv + hk;
      const T* kr = k + kv * d.Dk;
      const float raw = p.scale * dot_row(qr, kr, d.Dk);
      const float P = expf(cap(raw, p.softcap) - L);
      const float dP = dot_row(gr, v + kv * d.Dv, d.Dv);
      float dS = P * (dP - Di);
      if (p.softcap > 0.0f) {
        const float th = tanhf(raw / p.softcap);
        dS *= 1.0f - th * th;
      }
      const float f = p.scale * dS;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t dd = lane + 32 * c;
        if (dd < d.Dk) dqr[c] += f * ld(kr, dd);
      }
    }
    store_row(dq + qrow * d.Dk, d.Dk, dqr, 1.0f);
  }
}

// Key rows are numbered r = (b * Hkv + hk) * S + s.
template <class T>
__global__ void attention_dkdv_kernel(const T* q, const T* k, const T* v, const int32_t* seg, const float* lse,
                                      const T* dout, const float* Di, T* dk, T* dv, AttnDims d, AttentionParams p) {
  const int64_t rows = d.B * d.Hkv * d.S;
  const int64_t group = d.Hq / d.Hkv;
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t s = r % d.S, bh = r / d.S, hk = bh % d.Hkv, b = bh / d.Hkv;
    const int64_t kv = (b * d.S + s) * d.Hkv + hk;
    float kr[kChunks], vr[kChunks], dkr[kChunks], dvr[kChunks];
    load_row(k + kv * d.Dk, d.Dk, kr);
    load_row(v + kv * d.Dv, d.Dv, vr);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dkr[c] = dvr[c] = 0.0f;
    // Queries that see key s: pos(t) = q_offset + t with (!causal || s <= pos) && (window == 0 || pos - s < window).
    int64_t t_lo = 0, t_hi = d.T - 1;
    if (p.causal && s - p.q_offset > t_lo) t_lo = s - p.q_offset;
    if (p.window > 0 && s + p.window - 1 - p.q_offset < t_hi) t_hi = s + p.window - 1 - p.q_offset;
    const int32_t* seg_row = seg ? seg + b * d.S : nullptr;
    for (int64_t gi = 0; gi < group; ++gi) {
      const int64_t h = hk * group + gi;
      for (int64_t t = t_lo; t <= t_hi; ++t) {
        if (!same_doc(seg_row, p.q_offset + t, s)) continue;
        const int64_t qrow = (b * d.T + t) * d.Hq + h;
        const int64_t lrow = (b * d.Hq + h) * d.T + t;
        const T* qv = q + qrow * d.Dk;
        const T* gv = dout + qrow * d.Dv;
        const float raw = p.scale * dot_row(kr, qv, d.Dk);
        const float P = expf(cap(raw, p.softcap) - lse[lrow]);
        const float dP = dot_row(vr, gv, d.Dv);
        float dS = P * (dP - Di[lrow]);
        if (p.softcap > 0.0f) {
          const float th = tanhf(raw / p.softcap);
          dS *= 1.0f - th * th;
        }
        const float f = p.scale * dS;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int64_t dd = lane + 32 * c;
          if (dd < d.Dv) dvr[c] += P * ld(gv, dd);
          if (dd < d.Dk) dkr[c] += f * ld(qv, dd);
        }
      }
    }
    store_row(dk + kv * d.Dk, d.Dk, dkr, 1.0f);
    store_row(dv + kv * d.Dv, d.Dv, dvr, 1.0f);
  }
}

// Rows r = (b * Hq + h) * T + t as in attention_kernel: rowmax[r] = max over visible s of scale * q.k.
template <class T>
__global__ void attention_row_max_kernel(const T* q, const T* k, const int32_t* seg, float* rowmax, AttnDims d,
                                         AttentionParams p) {
  const int64_t rows = d.B * d.Hq * d.T;
  const int64_t group = d.Hq / d.Hkv;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const int64_t t = r % d.T, bh = r / d.T, h = bh % d.Hq, b = bh / d.Hq, hk = h / group;
    float qr[kChunks];
    load_row(q + ((b * d.T + t) * d.Hq + h) * d.Dk, d.Dk, qr);
    const Vis vis = visible_keys(p, t, d.S);
    const int32_t* seg_row = seg ? seg + b * d.S : nullptr;
    float m = -INFINITY;
    for (int64_t s = vis.lo; s <= vis.hi; ++s) {
      if (!same_doc(seg_row, p.q_offset + t, s)) continue;  // (uniform across the warp: no divergence)
      m = fmaxf(m, p.scale * dot_row(qr, k + ((b * d.S + s) * d.Hkv + hk) * d.Dk, d.Dk));
    }
    if ((threadIdx.x & 31) == 0) rowmax[r] = m;
  }
}

__global__ void head_max_kernel(const float* rowmax, float* out, AttnDims d) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= d.Hq) return;
  float m = -INFINITY;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t) m = fmaxf(m, rowmax[(b * d.Hq + h) * d.T + t]);
  out[h] = m;
}

}  // namespace dew::cuda::warp_attention
