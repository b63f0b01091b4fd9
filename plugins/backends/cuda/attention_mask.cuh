// cuda/attention_mask.cuh — which keys a query row sees, and the softcap: AttentionParams' rule (dew/backend.hpp),
// written once for the kernels that apply it per element (attention.cuh's warp-per-row kernels,
// attention_products.cu's row kernels). Device functions only (no kernels), so any number of .cu files include it.
#pragma once

#include "device.cuh"

namespace dew::cuda::attention_mask {

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

__device__ __forceinline__ float cap(float r, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(r / softcap) : r;
}

}  // namespace dew::cuda::attention_mask
