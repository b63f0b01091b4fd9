// cuda/softmax.cu — softmax / log-softmax along the last axis and their backwards.
// Invariants: one block per row; the row maximum is subtracted before exp; sums in f32.
#include "device.cuh"

namespace dew::cuda {

namespace {

template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t rows, int64_t D, bool log) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) mx = fmaxf(mx, ld(xr, j));
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += expf(ld(xr, j) - mx);
    sum = block_sum(sum, shared);
    const float log_sum = logf(sum), inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float z = ld(xr, j) - mx;
      st(yr, j, log ? z - log_sum : expf(z) * inv);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows, int64_t D, bool log) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* yr = y + r * D;
    const T* gr = dy + r * D;
    T* xr = dx + r * D;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += log ? ld(gr, j) : ld(gr, j) * ld(yr, j);
    dot = block_sum(dot, shared);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float yv = ld(yr, j), g = ld(gr, j);
      st(xr, j, log ? g - expf(yv) * dot : yv * (g - dot));
    }
  }
}

}  // namespace

void launch_softmax(cudaStream_t s, ST t, const void* x, void* y, int64_t rows, int64_t D, bool log) {
  if (rows * D == 0) return;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(row_grid(rows), row_threads(D), 0, s, softmax_kernel<T>)(
                        static_cast<const T*>(x), static_cast<T*>(y), rows, D, log));
  check_launch("softmax");
}

void launch_softmax_backward(cudaStream_t s, ST t, const void* y, const void* dy, void* dx, int64_t rows, int64_t D,
                             bool log) {
  if (rows * D == 0) return;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(row_grid(rows), row_threads(D), 0, s, softmax_backward_kernel<T>)(
                        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), rows, D, log));
  check_launch("softmax_backward");
}

}  // namespace dew::cuda
