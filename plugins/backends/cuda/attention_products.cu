// cuda/attention_products.cu — the row kernels of the f32 attention made of cuBLASLt products
// (attention_products.cpp drives them; what the whole computes: its top comment).
// Each kernel walks score rows of one chunk: a chunk is batch b, query rows [t0, t0 + tc) of every query head, keys
// [s0, s0 + nc); its scratch rows are laid out [Hq][tc][nc] (row r = h * tc + i is query t0 + i of head h) and the
// lse is dew's [B, Hq, T]. One block per row (grid-stride), sums and maxima in f32 by block_sum / block_max.
// Invariants:
//  * the mask is the warp kernel's own (attention_mask.cuh: visible_keys, same_doc, cap), applied per element: a
//    hidden key gets P = 0 and dS = 0 whatever the product wrote there, so a chunk's key range may be any superset
//    of what its rows see;
//  * a row with no visible key writes P = 0 (so O = P V = 0) and lse = -inf, and its backward P and dS are 0;
//  * every element of a chunk's scratch rows [0, nc) is written (the products read all of them).
#include "attention_mask.cuh"
#include "device.cuh"

namespace dew::cuda {

namespace {

using attention_mask::cap;
using attention_mask::same_doc;
using attention_mask::Vis;
using attention_mask::visible_keys;

struct RowAt {
  int64_t h, t;
  Vis vis;  // visible keys of the row, as column indices j = s - s0 (may be empty)
};
__device__ __forceinline__ RowAt row_at(int64_t r, const ProductsChunk& c, const AttnDims& d,
                                        const AttentionParams& p) {
  const int64_t h = r / c.tc, t = c.t0 + r % c.tc;
  Vis v = visible_keys(p, t, d.S);
  v.lo = (v.lo > c.s0 ? v.lo : c.s0) - c.s0;
  v.hi = (v.hi < c.s0 + c.nc - 1 ? v.hi : c.s0 + c.nc - 1) - c.s0;
  return {h, t, v};
}

// In: sc = scale * q.k for the chunk. Out: sc = P (softmax over the visible keys, 0 elsewhere), lse.
__global__ void products_softmax_kernel(float* sc, const int32_t* seg, float* lse, ProductsChunk c, AttnDims d,
                                        AttentionParams p) {
  __shared__ float shared[32];
  const int64_t rows = d.Hq * c.tc;
  const int32_t* seg_row = seg ? seg + c.b * d.S : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const RowAt a = row_at(r, c, d, p);
    const int64_t pos = p.q_offset + a.t;
    float* row = sc + r * c.nc;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < c.nc; j += blockDim.x) {
      const bool vis = j >= a.vis.lo && j <= a.vis.hi && same_doc(seg_row, pos, c.s0 + j);
      const float x = vis ? cap(row[j], p.softcap) : -INFINITY;
      row[j] = x;
      mx = fmaxf(mx, x);
    }
    mx = block_max(mx, shared);
    float sum = 0.0f;
    if (mx != -INFINITY)
      for (int64_t j = threadIdx.x; j < c.nc; j += blockDim.x) sum += expf(row[j] - mx);
    sum = block_sum(sum, shared);
    const float inv = mx != -INFINITY ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < c.nc; j += blockDim.x) row[j] = mx != -INFINITY ? expf(row[j] - mx) * inv : 0.0f;
    if (threadIdx.x == 0) lse[(c.b * d.Hq + a.h) * d.T + a.t] = mx != -INFINITY ? mx + logf(sum) : -INFINITY;
  }
}

// In: sc = scale * q.k. Out: sc = P = exp(cap(score) - lse) on visible keys, 0 elsewhere (and on rows with lse -inf).
__global__ void products_probs_kernel(float* sc, const int32_t* seg, const float* lse, ProductsChunk c, AttnDims d,
                                      AttentionParams p) {
  const int64_t rows = d.Hq * c.tc;
  const int32_t* seg_row = seg ? seg + c.b * d.S : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const RowAt a = row_at(r, c, d, p);
    const int64_t pos = p.q_offset + a.t;
    const float L = lse[(c.b * d.Hq + a.h) * d.T + a.t];
    float* row = sc + r * c.nc;
    for (int64_t j = threadIdx.x; j < c.nc; j += blockDim.x) {
      const bool vis = L != -INFINITY && j >= a.vis.lo && j <= a.vis.hi && same_doc(seg_row, pos, c.s0 + j);
      row[j] = vis ? expf(cap(row[j], p.softcap) - L) : 0.0f;
    }
  }
}

// In: P, dp = dO . V. Out: dp = dS = P (dp - Di), Di = rowsum(dO * O), times 1 - tanh^2 under a softcap (the tanh
// read back from P: cap(score) = log P + lse). P = 0 (hidden keys, underflow) gives dS = 0.
__global__ void products_dscore_kernel(const float* P, float* dp, const float* out, const float* dout, const float* lse,
                                       ProductsChunk c, AttnDims d, AttentionParams p) {
  __shared__ float shared[32];
  const int64_t rows = d.Hq * c.tc;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t h = r / c.tc, t = c.t0 + r % c.tc;
    const int64_t orow = ((c.b * d.T + t) * d.Hq + h) * d.Dv;
    float di = 0.0f;
    for (int64_t e = threadIdx.x; e < d.Dv; e += blockDim.x) di += dout[orow + e] * out[orow + e];
    di = block_sum(di, shared);
    const float L = lse[(c.b * d.Hq + h) * d.T + t];
    const float* prow = P + r * c.nc;
    float* row = dp + r * c.nc;
    for (int64_t j = threadIdx.x; j < c.nc; j += blockDim.x) {
      const float pr = prow[j];
      float ds = pr > 0.0f ? pr * (row[j] - di) : 0.0f;
      if (p.softcap > 0.0f && pr > 0.0f) {
        const float th = (logf(pr) + L) / p.softcap;
        ds *= 1.0f - th * th;
      }
      row[j] = ds;
    }
  }
}

}  // namespace

void launch_products_softmax(cudaStream_t s, float* sc, const int32_t* seg, float* lse, const ProductsChunk& c,
                             const AttnDims& d, const AttentionParams& p) {
  const int64_t rows = d.Hq * c.tc;
  if (rows * c.nc == 0) return;
  DEW_LAUNCH(row_grid(rows), row_threads(c.nc), 0, s, products_softmax_kernel)(sc, seg, lse, c, d, p);
  check_launch("attention (products): softmax");
}

void launch_products_probs(cudaStream_t s, float* sc, const int32_t* seg, const float* lse, const ProductsChunk& c,
                           const AttnDims& d, const AttentionParams& p) {
  const int64_t rows = d.Hq * c.tc;
  if (rows * c.nc == 0) return;
  DEW_LAUNCH(row_grid(rows), row_threads(c.nc), 0, s, products_probs_kernel)(sc, seg, lse, c, d, p);
  check_launch("attention_backward (products): probabilities");
}

void launch_products_dscore(cudaStream_t s, const float* P, float* dp, const float* out, const float* dout,
                            const float* lse, const ProductsChunk& c, const AttnDims& d, const AttentionParams& p) {
  const int64_t rows = d.Hq * c.tc;
  if (rows * c.nc == 0) return;
  DEW_LAUNCH(row_grid(rows), row_threads(c.nc > d.Dv ? c.nc : d.Dv), 0, s, products_dscore_kernel)
  (P, dp, out, dout, lse, c, d, p);
  check_launch("attention_backward (products): dS");
}

}  // namespace dew::cuda
