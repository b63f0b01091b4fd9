// cuda/embedding_rope.cu — row gather (embedding lookup), its scatter-add, and rotary position embedding.
// Invariants: indices are i32 and checked on the device: a row whose index is outside [0, R) is not
// written (gather) or not added (scatter), and the first such index is recorded in the error word, which
// the host raises at the next synchronisation. scatter_add_rows accumulates (+=) with f32 atomics (the
// order of additions into one row is not fixed, as in PyTorch's index_add on CUDA); bf16 tables
// accumulate in an f32 buffer and are rounded once. RoPE angles are computed in double, as ref does.
#include "device.cuh"

namespace dew::cuda {

namespace {

template <class W>
__global__ void gather_kernel(const W* src, const int32_t* idx, W* out, int64_t Bs, int64_t R, int64_t Dw, int64_t B,
                              int64_t K, ErrWord* err) {
  DEW_GRID_STRIDE(i, B * K * Dw) {
    const int64_t row = i / Dw, d = i % Dw;  // row = b * K + k
    const int64_t b = row / K;
    const int32_t ix = idx[row];
    if (ix < 0 || ix >= R) {
      if (d == 0) report(err, kErrGatherIndex, ix, row, R);
      continue;
    }
    const int64_t tb = Bs == 1 ? 0 : b;
    out[i] = src[(tb * R + ix) * Dw + d];
  }
}

template <class T>
__global__ void scatter_kernel(const T* dout, const int32_t* idx, float* acc, int64_t Bs, int64_t R, int64_t D,
                               int64_t B, int64_t K, ErrWord* err) {
  DEW_GRID_STRIDE(i, B * K * D) {
    const int64_t row = i / D, d = i % D;
    const int64_t b = row / K;
    const int32_t ix = idx[row];
    if (ix < 0 || ix >= R) {
      if (d == 0) report(err, kErrScatterIndex, ix, row, R);
      continue;
    }
    const int64_t tb = Bs == 1 ? 0 : b;
    atomicAdd(acc + (tb * R + ix) * D + d, ld(dout, i));
  }
}

__global__ void zero_kernel(float* p, int64_t n) { DEW_GRID_STRIDE(i, n) p[i] = 0.0f; }
__global__ void add_into_bf16_kernel(bf16* dst, const float* acc, int64_t n) {
  DEW_GRID_STRIDE(i, n) st(dst, i, ld(dst, i) + acc[i]);
}

}  // namespace

void launch_gather_rows(cudaStream_t s, const void* src, const int32_t* idx, void* out, int64_t Bs, int64_t R,
                        int64_t D, int64_t B, int64_t K, int elem_size, ErrWord* err) {
  const int64_t bytes = D * elem_size;
  if (B * K * D == 0) return;
  // Copy in the widest word that divides the row (rows are contiguous and tensors element-aligned).
  if (bytes % 8 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(out)) % 8 == 0) {
    const int64_t Dw = bytes / 8;
    DEW_LAUNCH(blocks_for(B * K * Dw), 256, 0, s, gather_kernel<uint64_t>)
    (static_cast<const uint64_t*>(src), idx, static_cast<uint64_t*>(out), Bs, R, Dw, B, K, err);
  } else if (bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(out)) % 4 == 0) {
    const int64_t Dw = bytes / 4;
    DEW_LAUNCH(blocks_for(B * K * Dw), 256, 0, s, gather_kernel<uint32_t>)
    (static_cast<const uint32_t*>(src), idx, static_cast<uint32_t*>(out), Bs, R, Dw, B, K, err);
  } else {
    DEW_LAUNCH(blocks_for(B * K * bytes), 256, 0, s, gather_kernel<uint8_t>)
    (static_cast<const uint8_t*>(src), idx, static_cast<uint8_t*>(out), Bs, R, bytes, B, K, err);
  }
  check_launch("gather_rows");
}

void launch_scatter_add_rows(cudaStream_t s, ST t, const void* dout, const int32_t* idx, void* dsrc, int64_t Bs,
                             int64_t R, int64_t D, int64_t B, int64_t K, float* acc, ErrWord* err) {
  if (B * K * D == 0) return;
  if (t == ST::f32) {
    DEW_LAUNCH(blocks_for(B * K * D), 256, 0, s, scatter_kernel<float>)
    (static_cast<const float*>(dout), idx, static_cast<float*>(dsrc), Bs, R, D, B, K, err);
  } else {
    const int64_t n = Bs * R * D;
    DEW_LAUNCH(blocks_for(n), 256, 0, s, zero_kernel)(acc, n);
    DEW_LAUNCH(blocks_for(B * K * D), 256, 0, s, scatter_kernel<bf16>)
    (static_cast<const bf16*>(dout), idx, acc, Bs, R, D, B, K, err);
    DEW_LAUNCH(blocks_for(n), 256, 0, s, add_into_bf16_kernel)(static_cast<bf16*>(dsrc), acc, n);
  }
  check_launch("scatter_add_rows");
}

// ---------------------------------------------------------------- rope

namespace {

template <class T>
__global__ void rope_kernel(const T* x, const int32_t* pos, T* out, int64_t B, int64_t Tn, int64_t H, int64_t D,
                            int64_t rd, RopeFrequencies freqs, double sign, bool per_batch) {
  // One thread per (b, t, j), looping over the H heads: the angle (sincos in double of the position times the
  // host-computed frequency, the kernel argument) depends on the position and j only, so it is computed once for
  // all heads.
  const int64_t half = rd / 2, tail = D - rd, per_head = half + tail;
  DEW_GRID_STRIDE(i, B * Tn * per_head) {
    const int64_t bt = i / per_head, j = i % per_head;  // bt = b * T + t
    const T* xt = x + bt * H * D;
    T* ot = out + bt * H * D;
    if (j >= half) {
      const int64_t f = rd + (j - half);
      for (int64_t h = 0; h < H; ++h) ot[h * D + f] = xt[h * D + f];
      continue;
    }
    const int64_t b = bt / Tn, t = bt % Tn;
    const double position = double(pos[per_batch ? b * Tn + t : t]);
    double sn, cs;
    sincos(sign * position * freqs.f[j], &sn, &cs);
    // Heads in groups of kGroup: the group's loads are all issued before its stores (out may be x, so the
    // compiler keeps each store after the loads that precede it in the source; one head at a time made every
    // head a full memory round trip).
    constexpr int kGroup = 8;
    for (int64_t h0 = 0; h0 < H; h0 += kGroup) {
      const int n = H - h0 < kGroup ? int(H - h0) : kGroup;
      float x1[kGroup], x2[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
        if (g < n) x1[g] = ld(xt, (h0 + g) * D + j), x2[g] = ld(xt, (h0 + g) * D + j + half);
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
        if (g < n) {
          st(ot, (h0 + g) * D + j, float(double(x1[g]) * cs - double(x2[g]) * sn));
          st(ot, (h0 + g) * D + j + half, float(double(x2[g]) * cs + double(x1[g]) * sn));
        }
    }
  }
}

}  // namespace

void launch_rope(cudaStream_t s, ST t, const void* x, const int32_t* pos, void* out, int64_t B, int64_t T, int64_t H,
                 int64_t D, int64_t rotary_dim, const RopeFrequencies& freqs, bool inverse, bool per_batch) {
  const int64_t n = B * T * (rotary_dim / 2 + (D - rotary_dim));
  if (n == 0) return;
  DEW_CUDA_DISPATCH(
      t, TT,
      DEW_LAUNCH(blocks_for(n), 256, 0, s, rope_kernel<TT>)(static_cast<const TT*>(x), pos, static_cast<TT*>(out), B, T,
                                                            H, D, rotary_dim, freqs, inverse ? -1.0 : 1.0, per_batch));
  check_launch("rope");
}

}  // namespace dew::cuda
