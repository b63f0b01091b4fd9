// cuda/loss.cu — fused cross-entropy over logits (forward, backward).
// Invariants: one block per row (max, sum of exp, lse = max + log(sum)); a target outside [0, V) that is
// not ignore_index is recorded in the error word (raised at the next synchronisation) and its row's loss
// is NaN.
#include <cmath>

#include "device.cuh"

namespace dew::cuda {

namespace {

template <class T>
__global__ void ce_kernel(const T* logits, const int32_t* targets, float* loss, float* lse, int64_t N, int64_t V,
                          int64_t ignore, ErrWord* err) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld(row, j));
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(ld(row, j) - mx);
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) {
      const float L = mx + logf(sum);
      const int64_t t = targets[n];
      lse[n] = L;
      if (t == ignore) {
        loss[n] = 0.0f;
      } else if (t < 0 || t >= V) {
        report(err, kErrTarget, t, n, V);
        loss[n] = NAN;
      } else {
        loss[n] = L - ld(row, t);
      }
    }
  }
}

template <class T>
__global__ void ce_backward_kernel(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                                   T* dlogits, int64_t N, int64_t V, int64_t ignore) {
  DEW_GRID_STRIDE(i, N * V) {
    const int64_t n = i / V, j = i % V;
    const int64_t t = targets[n];
    const float v = t == ignore ? 0.0f : (expf(ld(logits, i) - lse[n]) - (j == t ? 1.0f : 0.0f)) * dloss[n];
    st(dlogits, i, v);
  }
}

}  // namespace

void launch_cross_entropy(cudaStream_t s, ST t, const void* logits, const int32_t* targets, float* loss, float* lse,
                          int64_t N, int64_t V, int64_t ignore_index, ErrWord* err) {
  if (N == 0) return;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(grid_rows(N > 65535 * 8 ? 65535 * 8 : N), row_threads(V), 0, s, ce_kernel<T>)(
                        static_cast<const T*>(logits), targets, loss, lse, N, V, ignore_index, err));
  check_launch("cross_entropy");
}

void launch_cross_entropy_backward(cudaStream_t s, ST t, const void* logits, const int32_t* targets, const float* lse,
                                   const float* dloss, void* dlogits, int64_t N, int64_t V, int64_t ignore_index) {
  if (N * V == 0) return;
  DEW_CUDA_DISPATCH(
      t, T,
      DEW_LAUNCH(blocks_for(N * V), 256, 0, s, ce_backward_kernel<T>)(
          static_cast<const T*>(logits), targets, lse, dloss, static_cast<T*>(dlogits), N, V, ignore_index));
  check_launch("cross_entropy_backward");
}

}  // namespace dew::cuda
