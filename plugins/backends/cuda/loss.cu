// cuda/loss.cu — fused cross-entropy over logits (forward, backward).
// Invariants: one block per row. The forward reads its row once: each thread keeps an online (max, sum of
// exp(x - max)) pair over its elements, rescaling the sum when the max grows; the block merges the pairs in a
// fixed order (warp shuffles, then the warps in order), so a row's lse = max + log(sum) is deterministic; it
// equals the two-pass form (max, then the sum of exp) to f32 rounding. The backward writes every element by the
// same expression as before, dlogits = (exp(x - lse) - [j == target]) * dloss (0 on ignored rows), so its bits
// do not depend on the path. Both read the row 8 elements at a time through 16-byte accesses (device.cuh
// load8 / store8) when V % 8 == 0 and the buffers are 16-byte aligned, element by element otherwise: the 50,304
// wide GPT-2 head is ~0.8 GB of bf16 logits per pass, which scalar 2-byte loads (and the old backward's
// 64-bit division per element to find its row) kept far under the memory bandwidth. A target outside [0, V)
// that is not ignore_index is recorded in the error word (raised at the next synchronisation) and its row's
// loss is NaN.
#include <cmath>

#include "device.cuh"

namespace dew::cuda {

namespace {

// The online softmax state of a set of values: m their max (NaNs ignored, as fmaxf does; -inf for none),
// s the sum of exp(x - m). A NaN value makes s NaN; so does +inf (exp(inf - inf)).
struct MaxSum {
  float m = -INFINITY, s = 0.0f;
};
// exp(from - to) for to >= from, 1 when they are equal (so -inf to -inf keeps the sum instead of NaN).
__device__ __forceinline__ float rescale(float from, float to) { return from == to ? 1.0f : expf(from - to); }
// Eight values (or `count` of them) into the state.
__device__ __forceinline__ void absorb(MaxSum& a, const float* v, int count) {
  float cm = a.m;
  for (int k = 0; k < count; ++k) cm = fmaxf(cm, v[k]);
  float s = a.s * rescale(a.m, cm);
  if (cm != -INFINITY)  // all seen so far are -inf: nothing to add (exp(-inf - -inf) would be NaN)
    for (int k = 0; k < count; ++k) s += expf(v[k] - cm);
  a.m = cm;
  a.s = s;
}
__device__ __forceinline__ MaxSum merge(const MaxSum& a, const MaxSum& b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * rescale(a.m, m) + b.s * rescale(b.m, m)};
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
    a = merge(a, b);
  }
  return a;
}

template <class T, bool kVec>
__global__ void ce_kernel(const T* logits, const int32_t* targets, float* loss, float* lse, int64_t N, int64_t V,
                          int64_t ignore, ErrWord* err) {
  __shared__ float sm[32], ss[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;
    MaxSum a;
    if (kVec) {
      for (int64_t j = 8 * int64_t(threadIdx.x); j < V; j += 8 * int64_t(blockDim.x)) {
        float v[8];
        load8(row, j, v);
        absorb(a, v, 8);
      }
    } else {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = ld(row, j);
        absorb(a, &v, 1);
      }
    }
    a = warp_merge(a);
    if (lane == 0) sm[warp] = a.m, ss[warp] = a.s;
    __syncthreads();
    if (threadIdx.x == 0) {
      MaxSum r{sm[0], ss[0]};
      for (int w = 1; w < nwarps; ++w) r = merge(r, MaxSum{sm[w], ss[w]});
      const float L = r.m + logf(r.s);
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
    __syncthreads();
  }
}

__device__ __forceinline__ float ce_grad(float x, float L, int64_t j, int64_t t, float dl) {
  return (expf(x - L) - (j == t ? 1.0f : 0.0f)) * dl;
}

template <class T, bool kVec>
__global__ void ce_backward_kernel(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                                   T* dlogits, int64_t N, int64_t V, int64_t ignore) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const int64_t t = targets[n];
    const float L = lse[n], dl = dloss[n];
    const bool ignored = t == ignore;
    if (kVec) {
      for (int64_t j = 8 * int64_t(threadIdx.x); j < V; j += 8 * int64_t(blockDim.x)) {
        float v[8];
        load8(row, j, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = ignored ? 0.0f : ce_grad(v[k], L, j + k, t, dl);
        store8(drow, j, v);
      }
    } else {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        st(drow, j, ignored ? 0.0f : ce_grad(ld(row, j), L, j, t, dl));
    }
  }
}

// Threads for a row of V elements taken `per` at a time: one per piece, 64 to 1024.
int threads_for(int64_t V, int per) { return row_threads((V + per - 1) / per); }

}  // namespace

void launch_cross_entropy(cudaStream_t s, ST t, const void* logits, const int32_t* targets, float* loss, float* lse,
                          int64_t N, int64_t V, int64_t ignore_index, ErrWord* err) {
  if (N == 0) return;
  const bool vec = vectorisable(V, {logits});
  DEW_CUDA_DISPATCH(t, T, {
    const T* x = static_cast<const T*>(logits);
    if (vec)
      DEW_LAUNCH(row_grid(N), threads_for(V, 8), 0, s, ce_kernel<T, true>)
      (x, targets, loss, lse, N, V, ignore_index, err);
    else
      DEW_LAUNCH(row_grid(N), threads_for(V, 1), 0, s, ce_kernel<T, false>)
      (x, targets, loss, lse, N, V, ignore_index, err);
  });
  check_launch("cross_entropy");
}

void launch_cross_entropy_backward(cudaStream_t s, ST t, const void* logits, const int32_t* targets, const float* lse,
                                   const float* dloss, void* dlogits, int64_t N, int64_t V, int64_t ignore_index) {
  if (N * V == 0) return;
  const bool vec = vectorisable(V, {logits, dlogits});
  DEW_CUDA_DISPATCH(t, T, {
    const T* x = static_cast<const T*>(logits);
    T* dx = static_cast<T*>(dlogits);
    if (vec)
      DEW_LAUNCH(row_grid(N), threads_for(V, 64), 0, s, ce_backward_kernel<T, true>)
      (x, targets, lse, dloss, dx, N, V, ignore_index);
    else
      DEW_LAUNCH(row_grid(N), threads_for(V, 8), 0, s, ce_backward_kernel<T, false>)
      (x, targets, lse, dloss, dx, N, V, ignore_index);
  });
  check_launch("cross_entropy_backward");
}

}  // namespace dew::cuda
