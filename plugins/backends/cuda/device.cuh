// cuda/device.cuh — device helpers shared by the .cu files: element load/store for the storage types, grid
// sizing, warp/block reductions, the type dispatch of the launchers, the launch macro and the launch check.
// Invariants: every kernel computes in f32 and rounds once on store; bf16 rounding is dew's (round to nearest
// even, dew/dtype.hpp), so cuda and the host backends round identically.
// Two compilers read this file: nvcc (the plugin), and g++ with tests/backends_cuda/cuda_emulation.hpp included
// first (DEW_CUDA_EMULATION: the plugin's sources run on the CPU, threads as fibers). The emulation provides the
// platform part (bf16, ld / st / to_bf16, the CUDA built-ins and intrinsics, DEW_LAUNCH); everything after it
// here is one source for both.
#pragma once
#ifndef DEW_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "dew/error.hpp"
#include "kernels.cuh"

namespace dew::cuda {

#ifndef DEW_CUDA_EMULATION
using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
// dew's f32 -> bf16: round to nearest even on the bits, quiet NaN kept (dew/dtype.hpp f32_to_bf16).
__device__ __forceinline__ bf16 to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  uint16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h = uint16_t((u >> 16) | 0x40);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    h = uint16_t(u >> 16);
  }
  return __ushort_as_bfloat16(h);
}
__device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = to_bf16(v); }

// A kernel launch: DEW_LAUNCH(grid, threads, shared bytes, stream, kernel)(arguments...). The emulation runs the
// same launch on the CPU (cuda_emulation.hpp), checking the configuration as the driver would.
#define DEW_LAUNCH(grid, threads, smem, stream, ...) __VA_ARGS__<<<grid, threads, smem, stream>>>
#endif

// v as st() stores it into a T, read back (f32: v itself).
template <class T>
__device__ __forceinline__ float rounded_as(float v) {
  T t;
  st(&t, 0, v);
  return ld(&t, 0);
}

// Blocks for n elements with `threads` per block, capped (kernels loop grid-stride).
inline unsigned blocks_for(int64_t n, int threads = 256, int64_t cap = 65535 * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return unsigned(b);
}
inline unsigned grid_rows(int64_t rows) { return unsigned(rows < 1 ? 1 : (rows > 2147483647 ? 2147483647 : rows)); }
// Blocks for a one-block-per-row kernel (softmax, the norms): rows, at most 65535 * 8 (grid-stride past that).
inline unsigned row_grid(int64_t rows) { return grid_rows(rows > 65535 * 8 ? 65535 * 8 : rows); }

#define DEW_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Throws dew::Error when the last launch failed (bad configuration); asynchronous faults surface at the
// next synchronisation.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  DEW_CHECK(e == cudaSuccess, "cuda: launching ", what, " failed: ", cudaGetErrorString(e));
}

// Calls the body with T = float or bf16 for the storage type.
#define DEW_CUDA_DISPATCH(st_value, T, ...) \
  do {                                      \
    if ((st_value) == ST::f32) {            \
      using T = float;                      \
      __VA_ARGS__;                          \
    } else {                                \
      using T = ::dew::cuda::bf16;          \
      __VA_ARGS__;                          \
    }                                       \
  } while (0)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats; the call ends with a barrier so it can be reused at once.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared[lane] : 0.0f;
  r = warp_sum(r);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

// Eight consecutive elements [j, j + 8) as f32, and back, through 16-byte accesses (one uint4 of bf16, two of
// f32; scalar 2- and 4-byte accesses keep too few bytes in flight to reach the memory bandwidth). p + j must be
// 16-byte aligned. The bytes become T through memcpy (no aliasing); values are ld / st's, so a kernel's vectorised
// path gives the bits of its element-wise one.
template <class T>
__device__ __forceinline__ void load8(const T* p, int64_t j, float (&v)[8]) {
  uint4 u[sizeof(T) / 2];
#pragma unroll
  for (int q = 0; q < int(sizeof(T)) / 2; ++q) u[q] = reinterpret_cast<const uint4*>(p + j)[q];
  T tmp[8];
  memcpy(tmp, u, sizeof tmp);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = ld(tmp, k);
}
template <class T>
__device__ __forceinline__ void store8(T* p, int64_t j, const float (&v)[8]) {
  T tmp[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) st(tmp, k, v[k]);
  uint4 u[sizeof(T) / 2];
  memcpy(u, tmp, sizeof tmp);
#pragma unroll
  for (int q = 0; q < int(sizeof(T)) / 2; ++q) reinterpret_cast<uint4*>(p + j)[q] = u[q];
}
// Whether n elements behind these pointers (null ones ignored) can go eight at a time: n % 8 == 0, all 16-byte
// aligned.
inline bool vectorisable(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && (reinterpret_cast<uintptr_t>(p) & 15u) != 0) return false;
  return true;
}

// Threads per block for a row of D elements processed by one block.
inline int row_threads(int64_t D) {
  if (D <= 64) return 64;
  if (D <= 128) return 128;
  if (D <= 256) return 256;
  if (D <= 512) return 512;
  return 1024;
}

// Records the first device-side argument error (see ErrWord in kernels.cuh).
__device__ __forceinline__ void report(ErrWord* err, int code, long long a, long long b, long long c) {
  if (atomicCAS(&err->code, 0, -1) == 0) {
    err->a = a;
    err->b = b;
    err->c = c;
    __threadfence();
    atomicExch(&err->code, code);
  }
}

}  // namespace dew::cuda
