// cuda/random.cu — Philox 4x32-10 random fills and dropout, on the exact layout of dew/random.hpp, so the
// cuda backend draws the numbers ref and cpu draw:
//   key = {lo32(seed), hi32(seed)}, counter = {lo32(block), hi32(block), lo32(stream), hi32(stream)};
//   uniform: element g uses block g/4, word g%4, u = (word >> 8) * 2^-24;
//   normal:  element g uses block g/2, words 2(g%2), 2(g%2)+1: u1 = (w0 + 1) 2^-32, u2 = w1 2^-32,
//            z = sqrt(-2 ln u1) cos(2 pi u2) in double, rounded to float.
// The maps a + (b - a) u, a + b z and x / (1 - p) run in double with explicit round-to-nearest
// intrinsics (this file is also compiled with --fmad=false), as ref writes them: uniform values and
// dropout masks equal ref's bit for bit; normal values can differ from the host's by the last bit of a
// double (CUDA's double log/cos are within 1-2 ulp of glibc's), which the f32 rounding nearly always hides.
#include "device.cuh"

namespace dew::cuda {

namespace {

struct Block {
  uint32_t w[4];
};

__device__ __forceinline__ Block philox(uint64_t seed, uint64_t stream, uint64_t block) {
  uint32_t c0 = uint32_t(block), c1 = uint32_t(block >> 32), c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return {{c0, c1, c2, c3}};
}

__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t stream, uint64_t g) {
  const Block b = philox(seed, stream, g >> 2);
  return float(b.w[g & 3] >> 8) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ float normal01(uint64_t seed, uint64_t stream, uint64_t g) {
  const Block b = philox(seed, stream, g >> 1);
  const int w = int(g & 1) * 2;
  const double u1 = __dmul_rn(__dadd_rn(double(b.w[w]), 1.0), 1.0 / 4294967296.0);
  const double u2 = __dmul_rn(double(b.w[w + 1]), 1.0 / 4294967296.0);
  return float(__dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(6.283185307179586, u2))));
}

template <class T>
__global__ void random_kernel(T* out, int64_t n, RandomParams p) {
  const double a = p.a, b = p.b;
  DEW_GRID_STRIDE(i, n) {
    const uint64_t g = p.offset + uint64_t(i);
    double v;
    if (p.dist == Distribution::uniform)
      v = __dadd_rn(a, __dmul_rn(__dsub_rn(b, a), double(uniform01(p.seed, p.stream, g))));
    else
      v = __dadd_rn(a, __dmul_rn(b, double(normal01(p.seed, p.stream, g))));
    st(out, i, float(v));
  }
}

template <class T>
__global__ void dropout_kernel(const T* x, T* y, T* mask, int64_t n, DropoutParams p, double keep_scale) {
  const float keep_f = float(keep_scale);
  DEW_GRID_STRIDE(i, n) {
    const bool kept = uniform01(p.seed, p.stream, p.offset + uint64_t(i)) >= p.p;
    st(mask, i, kept ? keep_f : 0.0f);
    st(y, i, float(__dmul_rn(double(ld(x, i)), kept ? keep_scale : 0.0)));
  }
}

}  // namespace

void launch_random(cudaStream_t s, ST t, void* out, int64_t n, const RandomParams& p) {
  if (n == 0) return;
  DEW_CUDA_DISPATCH(t, T, DEW_LAUNCH(blocks_for(n), 256, 0, s, random_kernel<T>)(static_cast<T*>(out), n, p));
  check_launch("random");
}

void launch_dropout(cudaStream_t s, ST t, const void* x, void* y, void* mask, int64_t n, const DropoutParams& p) {
  if (n == 0) return;
  const double keep_scale = p.p < 1.0f ? 1.0 / (1.0 - double(p.p)) : 0.0;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(blocks_for(n), 256, 0, s, dropout_kernel<T>)(
                        static_cast<const T*>(x), static_cast<T*>(y), static_cast<T*>(mask), n, p, keep_scale));
  check_launch("dropout");
}

}  // namespace dew::cuda
