// cuda/flash_attention.cu — tensor-core attention: bf16 q, k, v, out (lse f32), head width 32, 64 or 128 (Dk == Dv),
// forward and backward, in the FlashAttention-2 form on mma.sync m16n8k16 (bf16 operands, f32 accumulation,
// sm_80 and newer). Everything attention.cu's warp-per-row kernel does: causal, sliding window, GQA, softcap,
// q_offset, segment ids (document masking), a row without a visible key (zeros, lse = -inf).
// Why by hand: cuBLASLt has no fused attention, and cuDNN's (its graph API's SDPA) takes no per-row segment ids
// for packed rows; without tensor cores attention dominates a GPT-2-small step (docs/cuda.md).
//
// Layout: q [B, T, Hq, D], k and v [B, S, Hkv, D], out [B, T, Hq, D], lse [B, Hq, T] (attention.cu's).
// Tiles: 4 warps per block; a warp owns 16 rows. Forward and dQ: a block takes 64 query rows of one (b, h) and
// walks the 64-key tiles its rows can see. dK/dV: a block takes 64 keys of one (b, hk) and walks the 32-query
// tiles of every head of its group that can see them. Masking per tile pair: causal and window ranges skip whole
// tiles; with segment ids, a pair whose query and key document ranges do not meet is skipped too (packed rows
// of short documents do the work of their block-diagonal part); a pair every query sees whole (in range and,
// with segment ids, inside one document) skips the per-element test; the rest test each (query, key). Every
// output element is written by one thread, once: no atomics, deterministic. The streamed tiles (K and V, or Q,
// dO, lse and Di) are double-buffered: the next visible tile's cp.async copies fly while the current one is used.
// The kernels live in flash_attention.cuh (this file: the launchers), so tests/backends_cuda run their source on
// the CPU too (cuda_emulation.hpp).
// Speed (what the H200 profile showed): the per-score work is straight-line code (softmax in exp2 units, one FFMA and
// one MUFU.EX2 a score; the uniform softcap and mask branches sit outside the per-score loops), fragments come by
// ldmatrix, and forward / dQ blocks start with the last query tiles (under a causal mask the longest).
// Numerics: scores and every sum in f32 (the mma accumulators); the online softmax's probabilities P (and the
// backward's dS) are rounded to bf16 to enter the second product, as FlashAttention-2 does: out agrees with an
// f32 computation on the same inputs to bf16 precision (tests/backends_cuda), not bit for bit. Stores round
// with dew's f32 -> bf16 (device.cuh).
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; g = lane / 4, c = lane % 4):
//   A 16 x 16, row-major, 4 registers of 2 bf16: {row g, cols 2c, 2c+1}, {row g+8, same}, {row g, cols 2c+8, +9},
//     {row g+8, cols 2c+8, +9};
//   B 16 x 8 (k x n), 2 registers: {k 2c, 2c+1; n g}, {k 2c+8, 2c+9; n g};
//   C 16 x 8 f32, 4 values: (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1).
// So a C tile pair (keys 16j .. 16j+15) is exactly an A fragment of P, and B = K^T (k = feature, n = key) is
// two contiguous bf16 of a K row in shared memory. B operands whose k runs along rows of a row-major tile
// (V in P V, K in dS K, dO in P^T dO, Q in dS^T Q) are read with ldmatrix .trans. Shared rows are padded by 8
// bf16 (16 bytes), so the 8 rows one instruction reads fall in distinct banks.
#include <initializer_list>

#include "flash_attention.cuh"

namespace dew::cuda {

namespace {

using namespace flash;

// A kernel's dynamic shared memory past the default 48 KiB is opted into per function (and device): set before
// every launch, which costs a host call and no device work.
template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    DEW_CHECK(e == cudaSuccess, "cuda: flash attention needs ", bytes,
              " bytes of shared memory per block: ", cudaGetErrorString(e));
  }
}

template <int D>
void forward(cudaStream_t s, const bf16* q, const bf16* k, const bf16* v, const int32_t* seg, bf16* out, float* lse,
             const AttnDims& d, const AttentionParams& p) {
  constexpr size_t bytes = forward_smem<D>();
  allow_smem(flash_forward_kernel<D>, bytes);
  const dim3 grid(unsigned(d.B * d.Hq), unsigned((d.T + kRowTile - 1) / kRowTile));
  DEW_LAUNCH(grid, kThreads, bytes, s, flash_forward_kernel<D>)(q, k, v, seg, out, lse, d, p);
}

template <int D>
void backward(cudaStream_t s, const bf16* q, const bf16* k, const bf16* v, const int32_t* seg, const bf16* out,
              const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv, const AttnDims& d,
              const AttentionParams& p, float* Di) {
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows > 0)
    DEW_LAUNCH(blocks_for(rows, kWarps, 65535LL * 16), kThreads, 0, s, flash_di_kernel<D>)(out, dout, Di, d);
  if (rows > 0) {
    constexpr size_t bytes = dq_smem<D>();
    allow_smem(flash_dq_kernel<D>, bytes);
    const dim3 grid(unsigned(d.B * d.Hq), unsigned((d.T + kRowTile - 1) / kRowTile));
    DEW_LAUNCH(grid, kThreads, bytes, s, flash_dq_kernel<D>)(q, k, v, seg, lse, dout, Di, dq, d, p);
  }
  if (d.B * d.Hkv * d.S > 0) {
    constexpr size_t bytes = dkdv_smem<D>();
    allow_smem(flash_dkdv_kernel<D>, bytes);
    const dim3 grid(unsigned(d.B * d.Hkv), unsigned((d.S + kRowTile - 1) / kRowTile));
    DEW_LAUNCH(grid, kThreads, bytes, s, flash_dkdv_kernel<D>)(q, k, v, seg, lse, dout, Di, dk, dv, d, p);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool flash_attention_applies(ST t, ST kv, const AttnDims& d, std::initializer_list<const void*> ptrs) {
  if (t != ST::bf16 || kv != ST::bf16 || d.Dk != d.Dv || (d.Dk != 32 && d.Dk != 64 && d.Dk != 128)) return false;
  // grid.x holds B * Hq (or B * Hkv), grid.y the row tiles
  if (d.B * d.Hq > 2147483647LL || (d.T + kRowTile - 1) / kRowTile > 65535 || (d.S + kRowTile - 1) / kRowTile > 65535)
    return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

void launch_flash_attention(cudaStream_t s, const void* q, const void* k, const void* v, const int32_t* seg, void* out,
                            float* lse, const AttnDims& d, const AttentionParams& p) {
  if (d.B * d.Hq * d.T == 0) return;
  const auto* qs = static_cast<const bf16*>(q);
  const auto* ks = static_cast<const bf16*>(k);
  const auto* vs = static_cast<const bf16*>(v);
  auto* os = static_cast<bf16*>(out);
  if (d.Dk == 32)
    forward<32>(s, qs, ks, vs, seg, os, lse, d, p);
  else if (d.Dk == 64)
    forward<64>(s, qs, ks, vs, seg, os, lse, d, p);
  else
    forward<128>(s, qs, ks, vs, seg, os, lse, d, p);
  check_launch("attention (tensor cores)");
}

void launch_flash_attention_backward(cudaStream_t s, const void* q, const void* k, const void* v, const int32_t* seg,
                                     const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                                     const AttnDims& d, const AttentionParams& p, float* scratch) {
  const auto* qs = static_cast<const bf16*>(q);
  const auto* ks = static_cast<const bf16*>(k);
  const auto* vs = static_cast<const bf16*>(v);
  const auto* os = static_cast<const bf16*>(out);
  const auto* gs = static_cast<const bf16*>(dout);
  auto* dqs = static_cast<bf16*>(dq);
  auto* dks = static_cast<bf16*>(dk);
  auto* dvs = static_cast<bf16*>(dv);
  if (d.Dk == 32)
    backward<32>(s, qs, ks, vs, seg, os, lse, gs, dqs, dks, dvs, d, p, scratch);
  else if (d.Dk == 64)
    backward<64>(s, qs, ks, vs, seg, os, lse, gs, dqs, dks, dvs, d, p, scratch);
  else
    backward<128>(s, qs, ks, vs, seg, os, lse, gs, dqs, dks, dvs, d, p, scratch);
  check_launch("attention_backward (tensor cores)");
}

}  // namespace dew::cuda
