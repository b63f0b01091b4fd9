// cuda/attention.cu — fused scaled dot-product attention (causal, sliding window, GQA, softcap,
// q_offset) and its backward, without materialising the score matrix.
// Layout: q [B, T, Hq, Dk], k [B, S, Hkv, Dk], v [B, S, Hkv, Dv], out [B, T, Hq, Dv], lse f32 [B, Hq, T];
// head widths up to kAttnMaxHeadDim (256), each lane of a warp holding features lane, lane + 32, ...
// Forward: one warp per query row, a single pass over the visible keys with the online softmax
// (running max and sum, rescaled accumulator); lse = max + log(sum); a row without a visible key
// writes zeros and lse = -inf.
// Backward (flash-style, recomputing P = exp(score - lse) from the saved lse; Di = rowsum(dO * O)):
//   kernel 1, one warp per query row: Di, and dQ = scale * sum_s dS_s K_s;
//   kernel 2, one warp per key row: dV = sum_{t, h in group} P dO_t, dK = scale * sum dS Q_t;
//   dS = P (dO . V_s - Di), times 1 - tanh^2(r / c) under a softcap c (r the raw scaled score).
// Documents (seg, segment ids [B, S], or nullptr): key s is also hidden from query t unless
// seg[s] == seg[q_offset + t] != 0; every key of the causal / window range is tested (this kernel has no
// tiles to skip), so any segment layout is exact.
// Max logit (QK-Clip): one warp per query row writes the row's largest visible raw score (before softcap) to
//   scratch, then one thread per query head takes the max over its B * T rows, in order.
// bf16 K/V under f32 q (a bf16 decode cache, dew/kernel_table.hpp): the forward's K/V element type is its own
// template parameter, each element widened (exactly) as it is loaded; the arithmetic is the f32 kernel's.
// Every output row is written by exactly one warp (deterministic, no atomics). This is the "one correct
// path first" implementation: simple and exact, not yet a tensor-core kernel (see docs/cuda.md).
#include "device.cuh"

namespace dew::cuda {

namespace {

constexpr int kChunks = kAttnMaxHeadDim / 32;
constexpr int kWarps = 4;  // warps per block

struct Vis {
  int64_t lo, hi;  // visible keys [lo, hi] (empty when lo > hi)
};
__device__ __forceinline__ Vis visible_keys(const AttentionParams& p, int64_t t, int64_t S) {
  const int64_t pos = p.q_offset + t;
  int64_t lo = 0, hi = S - 1;
  if (p.causal && pos < hi) hi = pos;
  if (p.window > 0 && pos - p.window + 1 > lo) lo = pos - p.window + 1;
  return {lo, hi};
}

// Whether key s is in query position pos's document (always, without segment ids).
__device__ __forceinline__ bool same_doc(const int32_t* seg_row, int64_t pos, int64_t s) {
  return seg_row == nullptr || (seg_row[pos] != 0 && seg_row[s] == seg_row[pos]);
}

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
__device__ __forceinline__ float cap(float r, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(r / softcap) : r;
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
    float qr[kChunks], acc[kChunks];
    load_row(q + ((b * d.T + t) * d.Hq + h) * d.Dk, d.Dk, qr);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[c] = 0.0f;
    const Vis vis = visible_keys(p, t, d.S);
    const int32_t* seg_row = seg ? seg + b * d.S : nullptr;
    float m = -INFINITY, l = 0.0f;
    bool any = false;
    for (int64_t s = vis.lo; s <= vis.hi; ++s) {
      if (!same_doc(seg_row, p.q_offset + t, s)) continue;
      any = true;
      const int64_t kv = (b * d.S + s) * d.Hkv + hk;
      const float sc = cap(p.scale * dot_row(qr, k + kv * d.Dk, d.Dk), p.softcap);
      const float m_new = fmaxf(m, sc);
      const float corr = expf(m - m_new), pr = expf(sc - m_new);
      l = l * corr + pr;
      const KV* vr = v + kv * d.Dv;
      const int lane = threadIdx.x & 31;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t dd = lane + 32 * c;
        acc[c] = acc[c] * corr + (dd < d.Dv ? pr * ld(vr, dd) : 0.0f);
      }
      m = m_new;
    }
    store_row(out + ((b * d.T + t) * d.Hq + h) * d.Dv, d.Dv, acc, any ? 1.0f / l : 0.0f);
    if ((threadIdx.x & 31) == 0) lse[r] = any ? m + logf(l) : -INFINITY;
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

inline unsigned warp_blocks(int64_t rows) { return blocks_for(rows, kWarps, 65535LL * 16); }

}  // namespace

void launch_attention(cudaStream_t s, ST t, ST kv, const void* q, const void* k, const void* v, const int32_t* seg,
                      void* out, float* lse, const AttnDims& d, const AttentionParams& p) {
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows == 0) return;
  if (t == ST::f32 && kv == ST::bf16)  // f32 q over a bf16 K/V cache
    attention_kernel<float, bf16><<<warp_blocks(rows), 32 * kWarps, 0, s>>>(
        static_cast<const float*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), seg,
        static_cast<float*>(out), lse, d, p);
  else
    DEW_CUDA_DISPATCH(t, T,
                      attention_kernel<T, T><<<warp_blocks(rows), 32 * kWarps, 0, s>>>(
                          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), seg,
                          static_cast<T*>(out), lse, d, p));
  check_launch("attention");
}

void launch_attention_backward(cudaStream_t s, ST t, const void* q, const void* k, const void* v, const int32_t* seg,
                               const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv, const AttnDims& d,
                               const AttentionParams& p, float* scratch) {
  const int64_t qrows = d.B * d.Hq * d.T, krows = d.B * d.Hkv * d.S;
  DEW_CUDA_DISPATCH(t, T, {
    const T* qs = static_cast<const T*>(q);
    const T* ks = static_cast<const T*>(k);
    const T* vs = static_cast<const T*>(v);
    const T* gs = static_cast<const T*>(dout);
    if (qrows > 0)
      attention_dq_kernel<T><<<warp_blocks(qrows), 32 * kWarps, 0, s>>>(qs, ks, vs, seg, static_cast<const T*>(out), lse, gs,
                                                                        static_cast<T*>(dq), scratch, d, p);
    if (krows > 0)
      attention_dkdv_kernel<T><<<warp_blocks(krows), 32 * kWarps, 0, s>>>(
          qs, ks, vs, seg, lse, gs, scratch, static_cast<T*>(dk), static_cast<T*>(dv), d, p);
  });
  check_launch("attention_backward");
}

void launch_attention_max_logit(cudaStream_t s, ST t, const void* q, const void* k, const int32_t* seg, float* out,
                                const AttnDims& d, const AttentionParams& p, float* scratch) {
  if (d.Hq == 0) return;
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows > 0)
    DEW_CUDA_DISPATCH(t, T,
                      attention_row_max_kernel<T><<<warp_blocks(rows), 32 * kWarps, 0, s>>>(
                          static_cast<const T*>(q), static_cast<const T*>(k), seg, scratch, d, p));
  head_max_kernel<<<unsigned((d.Hq + 127) / 128), 128, 0, s>>>(scratch, out, d);
  check_launch("attention_max_logit");
}

}  // namespace dew::cuda
