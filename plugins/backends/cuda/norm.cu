// cuda/norm.cu — layer norm, RMS norm and group norm with their backwards.
// Invariants: layer and RMS norm run one warp per row (8 rows a block, no block barriers: a block per row of
// 1,024 threads left a GPT-2 row of 768 latency-bound at ~10x the time its bytes need); a lane takes the row's
// 8-element chunks lane, lane + 32, ..., read as one 16-byte load (bf16) or two (f32) when D % 8 == 0 and every
// pointer is 16-byte aligned, else element by element in the same order, so a row's sums and results do not
// depend on which path its alignment picked. Group norm runs one block per (n, group). Statistics in f32 from
// two passes (mean, then the biased variance of x - mean), saved as f32; weight/bias may be null (scale 1, shift 0; RMS
// norm's weight_offset shifts only a weight that exists). Weight/bias gradients are column sums over rows: each block
// of a first kernel sums one slice of rows into f32 scratch, a second kernel adds the slices in a fixed order
// (deterministic, no atomics) and overwrites dweight/dbias. Backward of a normalisation over M values with xhat = (x -
// mean) * rstd and g = dy * scale:
//   layer/group norm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat));   rms: dx = rstd * (g - xhat * mean(g *
//   xhat)).
// g is rounded on its own (__fmul_rn: nvcc would otherwise contract g - mean(g) into fma(dy, scale, -mean(g)),
// whose unrounded product leaves dx != 0 where it is exactly 0, e.g. a row of one value).
#include "device.cuh"

namespace dew::cuda {

// ---------------------------------------------------------------- column sums (weight/bias gradients)

namespace {

constexpr int64_t kColThreads = 256;

// Row slices: parts(rows) slices of ceil(rows / parts) rows each.
inline int64_t parts_for(int64_t rows) {
  int64_t p = (rows + 63) / 64;
  if (p > 256) p = 256;
  return p < 1 ? 1 : p;
}

// scratch[p * D + j] = sum over the rows of slice p of dy[r, j] * xhat(r, j); scratch[(P + p) * D + j] =
// sum of dy[r, j] (when with_bias). xhat = (x - mean[r]) * rstd[r] (mean null: x * rstd[r]).
template <class T>
__global__ void col_partials_kernel(const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                                    int64_t D, int64_t P, float* scratch, bool with_bias) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t p = blockIdx.y;
  if (j >= D) return;
  const int64_t per = (rows + P - 1) / P;
  const int64_t r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = ld(dy, r * D + j);
    const float xv = ld(x, r * D + j);
    const float xhat = (mean ? xv - mean[r] : xv) * rstd[r];
    sw += g * xhat;
    sb += g;
  }
  scratch[p * D + j] = sw;
  if (with_bias) scratch[(P + p) * D + j] = sb;
}

template <class T>
__global__ void col_finish_kernel(const float* scratch, int64_t P, int64_t D, T* dw, T* db) {
  DEW_GRID_STRIDE(j, D) {
    if (dw) {
      float acc = 0.0f;
      for (int64_t p = 0; p < P; ++p) acc += scratch[p * D + j];
      st(dw, j, acc);
    }
    if (db) {
      float acc = 0.0f;
      for (int64_t p = 0; p < P; ++p) acc += scratch[(P + p) * D + j];
      st(db, j, acc);
    }
  }
}

template <class T>
void column_grads(cudaStream_t s, const T* x, const T* dy, const float* mean, const float* rstd, int64_t rows,
                  int64_t D, T* dw, T* db, float* scratch) {
  if (!dw && !db) return;
  const int64_t P = parts_for(rows);
  const dim3 grid(unsigned((D + kColThreads - 1) / kColThreads), unsigned(P));
  DEW_LAUNCH(grid, unsigned(kColThreads), 0, s, col_partials_kernel<T>)
  (x, dy, mean, rstd, rows, D, P, scratch, db != nullptr);
  DEW_LAUNCH(blocks_for(D), 256, 0, s, col_finish_kernel<T>)(scratch, P, D, dw, db);
}

}  // namespace

int64_t norm_scratch_floats(int64_t rows, int64_t D) { return 2 * parts_for(rows) * (D < 1 ? 1 : D); }

// ---------------------------------------------------------------- layer norm

namespace {

constexpr int kRowWarps = 8;  // rows (warps) per block of the warp-per-row kernels

// Elements [j, j + 8) of a row of n as f32: device.cuh's 16-byte load8 when kVec (the launchers set it where
// device.cuh's vectorisable(D, pointers) holds: then j + 8 <= n and p + j is 16-byte aligned), else one by one
// with 0 past n.
template <class T, bool kVec>
__device__ __forceinline__ void row_load8(const T* p, int64_t j, int64_t n, float (&v)[8]) {
  if constexpr (kVec) {
    load8(p, j, v);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = j + k < n ? ld(p, j + k) : 0.0f;
  }
}
// Stores v into elements [j, j + 8) of a row of n (as row_load8: vectorised when kVec, else only those below n).
template <class T, bool kVec>
__device__ __forceinline__ void row_store8(T* p, int64_t j, int64_t n, const float (&v)[8]) {
  if constexpr (kVec) {
    store8(p, j, v);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (j + k < n) st(p, j + k, v[k]);
  }
}
// The row's weights (1 when w is null) plus offset, as row_load8.
template <class T, bool kVec>
__device__ __forceinline__ void row_load8_scale(const T* w, int64_t j, int64_t n, float offset, float (&v)[8]) {
  if (w) {
    row_load8<T, kVec>(w, j, n, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] += offset;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 1.0f;
  }
}
inline unsigned warp_row_blocks(int64_t rows) { return blocks_for(rows, kRowWarps); }
// Runs the statement with the constant kVec = vec (the vectorised or the element-wise instantiation).
#define DEW_ROWS_VEC(vec, kVec, ...) \
  do {                               \
    if (vec) {                       \
      constexpr bool kVec = true;    \
      __VA_ARGS__;                   \
    } else {                         \
      constexpr bool kVec = false;   \
      __VA_ARGS__;                   \
    }                                \
  } while (0)

template <class T, bool kVec>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t rows,
                                  int64_t D, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5); r < rows;
       r += int64_t(gridDim.x) * kRowWarps) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float sum = 0.0f, v[8];
    for (int64_t j = 8 * lane; j < D; j += 256) {
      row_load8<T, kVec>(xr, j, D, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += v[k];
    }
    const float mu = warp_sum(sum) / float(D);
    float var = 0.0f;
    for (int64_t j = 8 * lane; j < D; j += 256) {
      row_load8<T, kVec>(xr, j, D, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float c = j + k < D ? v[k] - mu : 0.0f;
        var += c * c;
      }
    }
    var = warp_sum(var) / float(D);
    const float rs = 1.0f / sqrtf(var + eps);
    for (int64_t j = 8 * lane; j < D; j += 256) {
      float sc[8], sh[8];
      row_load8<T, kVec>(xr, j, D, v);
      row_load8_scale<T, kVec>(w, j, D, 0.0f, sc);
      if (b)
        row_load8<T, kVec>(b, j, D, sh);
      else
#pragma unroll
        for (int k = 0; k < 8; ++k) sh[k] = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = (v[k] - mu) * rs * sc[k] + sh[k];
      row_store8<T, kVec>(yr, j, D, v);
    }
    if (lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// dx of layer norm (center = true) or RMS norm (center = false; mean null, scale = w + offset).
template <class T, bool kVec>
__global__ void norm_dx_kernel(const T* x, const T* w, const float* mean, const float* rstd, const T* dy, T* dx,
                               int64_t rows, int64_t D, float offset, bool center, bool accumulate) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5); r < rows;
       r += int64_t(gridDim.x) * kRowWarps) {
    const T* xr = x + r * D;
    const T* gr = dy + r * D;
    T* dxr = dx + r * D;
    const float mu = center ? mean[r] : 0.0f, rs = rstd[r];
    // g = dy * scale and xhat of the chunk at j (g is 0 past D: dy reads 0 there)
    const auto chunk = [&](int64_t j, float(&g)[8], float(&xhat)[8]) {
      float sc[8];
      row_load8<T, kVec>(xr, j, D, xhat);
      row_load8<T, kVec>(gr, j, D, g);
      row_load8_scale<T, kVec>(w, j, D, offset, sc);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        g[k] = __fmul_rn(g[k], sc[k]);
        xhat[k] = (xhat[k] - mu) * rs;
      }
    };
    float sg = 0.0f, sgx = 0.0f, g[8], xhat[8];
    for (int64_t j = 8 * lane; j < D; j += 256) {
      chunk(j, g, xhat);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        sg += g[k];
        sgx += g[k] * xhat[k];
      }
    }
    const float mean_g = center ? warp_sum(sg) / float(D) : 0.0f;
    const float mean_gx = warp_sum(sgx) / float(D);
    for (int64_t j = 8 * lane; j < D; j += 256) {
      chunk(j, g, xhat);
#pragma unroll
      for (int k = 0; k < 8; ++k) g[k] = rs * (g[k] - mean_g - xhat[k] * mean_gx);
      if (accumulate) {  // dx + (this dx rounded to T), added as the binary add kernel adds: its bits
        float sum[8];
        row_load8<T, kVec>(dxr, j, D, sum);
#pragma unroll
        for (int k = 0; k < 8; ++k) g[k] = __fadd_rn(sum[k], rounded_as<T>(g[k]));
      }
      row_store8<T, kVec>(dxr, j, D, g);
    }
  }
}

template <class T, bool kVec>
__global__ void rms_norm_kernel(const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t D, float eps,
                                float offset) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5); r < rows;
       r += int64_t(gridDim.x) * kRowWarps) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float ss = 0.0f, v[8], sc[8];
    for (int64_t j = 8 * lane; j < D; j += 256) {
      row_load8<T, kVec>(xr, j, D, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += v[k] * v[k];
    }
    const float rs = 1.0f / sqrtf(warp_sum(ss) / float(D) + eps);
    for (int64_t j = 8 * lane; j < D; j += 256) {
      row_load8<T, kVec>(xr, j, D, v);
      row_load8_scale<T, kVec>(w, j, D, offset, sc);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = v[k] * rs * sc[k];
      row_store8<T, kVec>(yr, j, D, v);
    }
    if (lane == 0) rstd[r] = rs;
  }
}

}  // namespace

void launch_layer_norm(cudaStream_t s, ST t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t D, float eps) {
  if (rows == 0) return;
  const bool vec = vectorisable(D, {x, w, b, y});
  DEW_CUDA_DISPATCH(t, T,
                    DEW_ROWS_VEC(vec, kVec,
                                 DEW_LAUNCH(warp_row_blocks(rows), 32 * kRowWarps, 0, s, layer_norm_kernel<T, kVec>)(
                                     static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                                     static_cast<T*>(y), mean, rstd, rows, D, eps)));
  check_launch("layer_norm");
}

void launch_layer_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* mean,
                                const float* rstd, const void* dy, void* dx, void* dw, void* db, int64_t rows,
                                int64_t D, float* scratch) {
  DEW_CUDA_DISPATCH(t, T, {
    const T* xs = static_cast<const T*>(x);
    const T* gs = static_cast<const T*>(dy);
    if (rows > 0)
      DEW_ROWS_VEC(vectorisable(D, {x, w, dy, dx}), kVec,
                   DEW_LAUNCH(warp_row_blocks(rows), 32 * kRowWarps, 0, s, norm_dx_kernel<T, kVec>)(
                       xs, static_cast<const T*>(w), mean, rstd, gs, static_cast<T*>(dx), rows, D, 0.0f, true, false));
    column_grads<T>(s, xs, gs, mean, rstd, rows, D, static_cast<T*>(dw), static_cast<T*>(db), scratch);
  });
  check_launch("layer_norm_backward");
}

void launch_rms_norm(cudaStream_t s, ST t, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t D,
                     float eps, float offset) {
  if (rows == 0) return;
  const bool vec = vectorisable(D, {x, w, y});
  DEW_CUDA_DISPATCH(t, T,
                    DEW_ROWS_VEC(vec, kVec,
                                 DEW_LAUNCH(warp_row_blocks(rows), 32 * kRowWarps, 0, s, rms_norm_kernel<T, kVec>)(
                                     static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, rows,
                                     D, eps, offset)));
  check_launch("rms_norm");
}

void launch_rms_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* rstd, const void* dy,
                              void* dx, void* dw, int64_t rows, int64_t D, float offset, bool accumulate,
                              float* scratch) {
  DEW_CUDA_DISPATCH(t, T, {
    const T* xs = static_cast<const T*>(x);
    const T* gs = static_cast<const T*>(dy);
    if (rows > 0)
      DEW_ROWS_VEC(vectorisable(D, {x, w, dy, dx}), kVec,
                   DEW_LAUNCH(warp_row_blocks(rows), 32 * kRowWarps, 0, s, norm_dx_kernel<T, kVec>)(
                       xs, static_cast<const T*>(w), nullptr, rstd, gs, static_cast<T*>(dx), rows, D, offset, false,
                       accumulate));
    column_grads<T>(s, xs, gs, nullptr, rstd, rows, D, static_cast<T*>(dw), nullptr, scratch);
  });
  check_launch("rms_norm_backward");
}

// ---------------------------------------------------------------- group norm (NCHW)

namespace {

// One block per (n, g): the group's Cg * HW values are contiguous.
template <class T>
__global__ void group_norm_kernel(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t N,
                                  int64_t C, int64_t HW, int64_t G, float eps) {
  __shared__ float shared[32];
  const int64_t Cg = C / G, M = Cg * HW;
  for (int64_t ng = blockIdx.x; ng < N * G; ng += gridDim.x) {
    const int64_t n = ng / G, g = ng % G;
    const int64_t base = (n * C + g * Cg) * HW;
    const T* xg = x + base;
    T* yg = y + base;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) sum += ld(xg, i);
    const float mu = block_sum(sum, shared) / float(M);
    float var = 0.0f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
      const float c = ld(xg, i) - mu;
      var += c * c;
    }
    const float rs = 1.0f / sqrtf(block_sum(var, shared) / float(M) + eps);
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
      const int64_t c = g * Cg + i / HW;
      st(yg, i, (ld(xg, i) - mu) * rs * (w ? ld(w, c) : 1.0f) + (b ? ld(b, c) : 0.0f));
    }
    if (threadIdx.x == 0) {
      mean[ng] = mu;
      rstd[ng] = rs;
    }
  }
}

template <class T>
__global__ void group_norm_dx_kernel(const T* x, const T* w, const float* mean, const float* rstd, const T* dy, T* dx,
                                     int64_t N, int64_t C, int64_t HW, int64_t G) {
  __shared__ float shared[32];
  const int64_t Cg = C / G, M = Cg * HW;
  for (int64_t ng = blockIdx.x; ng < N * G; ng += gridDim.x) {
    const int64_t n = ng / G, g = ng % G;
    const int64_t base = (n * C + g * Cg) * HW;
    const float mu = mean[ng], rs = rstd[ng];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
      const int64_t c = g * Cg + i / HW;
      const float gi = ld(dy, base + i) * (w ? ld(w, c) : 1.0f), xhat = (ld(x, base + i) - mu) * rs;
      sg += gi;
      sgx += gi * xhat;
    }
    const float mean_g = block_sum(sg, shared) / float(M);
    const float mean_gx = block_sum(sgx, shared) / float(M);
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
      const int64_t c = g * Cg + i / HW;
      const float gi = ld(dy, base + i) * (w ? ld(w, c) : 1.0f), xhat = (ld(x, base + i) - mu) * rs;
      st(dx, base + i, rs * (gi - mean_g - xhat * mean_gx));
    }
  }
}

// scratch[n * C + c] = sum over hw of dy * xhat; scratch[N * C + n * C + c] = sum of dy. One block per (n, c).
template <class T>
__global__ void group_norm_partials_kernel(const T* x, const float* mean, const float* rstd, const T* dy, int64_t N,
                                           int64_t C, int64_t HW, int64_t G, float* scratch) {
  __shared__ float shared[32];
  const int64_t Cg = C / G;
  for (int64_t nc = blockIdx.x; nc < N * C; nc += gridDim.x) {
    const int64_t n = nc / C, c = nc % C, ng = n * G + c / Cg;
    const float mu = mean[ng], rs = rstd[ng];
    float sw = 0.0f, sb = 0.0f;
    for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) {
      const float g = ld(dy, nc * HW + i);
      sw += g * (ld(x, nc * HW + i) - mu) * rs;
      sb += g;
    }
    sw = block_sum(sw, shared);
    sb = block_sum(sb, shared);
    if (threadIdx.x == 0) {
      scratch[nc] = sw;
      scratch[N * C + nc] = sb;
    }
  }
}

template <class T>
__global__ void group_norm_finish_kernel(const float* scratch, int64_t N, int64_t C, T* dw, T* db) {
  DEW_GRID_STRIDE(c, C) {
    float aw = 0.0f, ab = 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      aw += scratch[n * C + c];
      ab += scratch[N * C + n * C + c];
    }
    if (dw) st(dw, c, aw);
    if (db) st(db, c, ab);
  }
}

}  // namespace

void launch_group_norm(cudaStream_t s, ST t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t N, int64_t C, int64_t HW, int64_t G, float eps) {
  if (N * G == 0) return;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(row_grid(N * G), row_threads((C / G) * HW), 0, s, group_norm_kernel<T>)(
                        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                        static_cast<T*>(y), mean, rstd, N, C, HW, G, eps));
  check_launch("group_norm");
}

void launch_group_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* mean,
                                const float* rstd, const void* dy, void* dx, void* dw, void* db, int64_t N, int64_t C,
                                int64_t HW, int64_t G, float* scratch) {
  if (N * G == 0) return;
  DEW_CUDA_DISPATCH(t, T, {
    const T* xs = static_cast<const T*>(x);
    const T* gs = static_cast<const T*>(dy);
    DEW_LAUNCH(row_grid(N * G), row_threads((C / G) * HW), 0, s, group_norm_dx_kernel<T>)
    (xs, static_cast<const T*>(w), mean, rstd, gs, static_cast<T*>(dx), N, C, HW, G);
    if (dw || db) {
      DEW_LAUNCH(row_grid(N * C), row_threads(HW), 0, s, group_norm_partials_kernel<T>)
      (xs, mean, rstd, gs, N, C, HW, G, scratch);
      DEW_LAUNCH(blocks_for(C), 256, 0, s, group_norm_finish_kernel<T>)
      (scratch, N, C, static_cast<T*>(dw), static_cast<T*>(db));
    }
  });
  check_launch("group_norm_backward");
}

}  // namespace dew::cuda
