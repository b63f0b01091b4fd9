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
// Every output row is written by exactly one warp (deterministic, no atomics). Simple and exact, no tensor cores:
// the backend sends bf16 calls at head widths 64 and 128 to flash_attention.cu, large f32 calls to
// attention_products.cpp (cuBLASLt products; `attention = warp` keeps them here), everything else here.
// The kernels are in attention.cuh (tests/backends_cuda run their source on the CPU too); this file: the launchers.
#include "attention.cuh"

namespace dew::cuda {

namespace {

using namespace warp_attention;

inline unsigned warp_blocks(int64_t rows) { return blocks_for(rows, kWarps, 65535LL * 16); }

}  // namespace

void launch_attention(cudaStream_t s, ST t, ST kv, const void* q, const void* k, const void* v, const int32_t* seg,
                      void* out, float* lse, const AttnDims& d, const AttentionParams& p) {
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows == 0) return;
  if (t == ST::f32 && kv == ST::bf16)  // f32 q over a bf16 K/V cache
    DEW_LAUNCH(warp_blocks(rows), 32 * kWarps, 0, s, attention_kernel<float, bf16>)
    (static_cast<const float*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), seg,
     static_cast<float*>(out), lse, d, p);
  else
    DEW_CUDA_DISPATCH(t, T,
                      DEW_LAUNCH(warp_blocks(rows), 32 * kWarps, 0, s, attention_kernel<T, T>)(
                          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), seg,
                          static_cast<T*>(out), lse, d, p));
  check_launch("attention");
}

void launch_attention_slots(cudaStream_t s, ST t, ST kv, const void* q, const void* k_new, const void* v_new,
                            void* k_cache, void* v_cache, void* out, float* lse, const std::vector<int64_t>& slots,
                            const std::vector<int64_t>& positions, int64_t C, int64_t Hq, int64_t Hkv, int64_t D,
                            const AttentionParams& p) {
  DEW_CHECK(t == ST::f32, "cuda attention_slots: the warp kernel's slot rows take f32 q");
  const int64_t n = int64_t(slots.size()), row = Hkv * D;
  // A chunk's writes, then its attention (a row reads only its own slot, so chunks may go in any order).
  for (int64_t i0 = 0; i0 < n; i0 += kSlotRows) {
    const int64_t m = std::min<int64_t>(kSlotRows, n - i0);
    SlotRows rows{};
    for (int64_t i = 0; i < m; ++i) {
      rows.slot[i] = int32_t(slots[size_t(i0 + i)]);
      rows.pos[i] = int32_t(positions[size_t(i0 + i)]);
    }
    const auto launch = [&](auto kv_tag) {
      using KV = decltype(kv_tag);
      const KV* kn = static_cast<const KV*>(k_new) + i0 * row;
      const KV* vn = static_cast<const KV*>(v_new) + i0 * row;
      DEW_LAUNCH(blocks_for(m * row), 256, 0, s, slot_write_kernel<KV>)
      (kn, vn, static_cast<KV*>(k_cache), static_cast<KV*>(v_cache), rows, m, row, C);
      DEW_LAUNCH(warp_blocks(m * Hq), 32 * kWarps, 0, s, attention_slots_kernel<float, KV>)
      (static_cast<const float*>(q) + i0 * Hq * D, static_cast<const KV*>(k_cache), static_cast<const KV*>(v_cache),
       static_cast<float*>(out) + i0 * Hq * D, lse + i0 * Hq, rows, m, C, Hq, Hkv, D, p);
    };
    if (kv == ST::bf16)
      launch(bf16{});
    else
      launch(float{});
  }
  check_launch("attention_slots");
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
      DEW_LAUNCH(warp_blocks(qrows), 32 * kWarps, 0, s, attention_dq_kernel<T>)
      (qs, ks, vs, seg, static_cast<const T*>(out), lse, gs, static_cast<T*>(dq), scratch, d, p);
    if (krows > 0)
      DEW_LAUNCH(warp_blocks(krows), 32 * kWarps, 0, s, attention_dkdv_kernel<T>)
      (qs, ks, vs, seg, lse, gs, scratch, static_cast<T*>(dk), static_cast<T*>(dv), d, p);
  });
  check_launch("attention_backward");
}

void launch_attention_max_logit(cudaStream_t s, ST t, const void* q, const void* k, const int32_t* seg, float* out,
                                const AttnDims& d, const AttentionParams& p, float* scratch) {
  if (d.Hq == 0) return;
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows > 0)
    DEW_CUDA_DISPATCH(t, T,
                      DEW_LAUNCH(warp_blocks(rows), 32 * kWarps, 0, s, attention_row_max_kernel<T>)(
                          static_cast<const T*>(q), static_cast<const T*>(k), seg, scratch, d, p));
  DEW_LAUNCH(unsigned((d.Hq + 127) / 128), 128, 0, s, head_max_kernel)(scratch, out, d);
  check_launch("attention_max_logit");
}

}  // namespace dew::cuda
