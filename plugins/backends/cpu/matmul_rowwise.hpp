// cpu/matmul_rowwise.hpp — the row-wise products of the decode path (matmul_rowwise.cpp): y = x W^T for a
// few rows of x against a row-major weight, f32, bf16 or int8 weights, f32 accumulation, one ISA path per call,
// with the linear layer's epilogue (bias, alpha, activation) fused in.
#pragma once

#include <cstdint>

#include "dew/backend.hpp"
#include "isa.hpp"

namespace dew::cpu {

// y[r * n + j] = dot(x[r, :], w[j, :]) for r < m, j < n; x [m, k] f32, w [n, k] (f32, or bf16 bits widened
// exactly to f32), y [m, n]. Every y[r, j] is summed the same way whatever m, r, the thread count and the
// column blocking are (so a row decoded alone equals the same row batched with others, bit for bit), and
// the same way on the avx512 and avx2 paths (two 16-lane FMA accumulators over alternate blocks of 16, added
// lane by lane, a fixed tree over the lanes, then the k % 16 tail in order). OpenMP over blocks of output columns when the product is big.
// The epilogue, applied by the thread that made the columns, right after them: y[r, j] = act(alpha * y[r, j] +
// bias[j]) (bias optional), per element; silu and gelu_tanh are the elementwise family's expressions
// (cpu_backend.hpp: fast_exp), gelu uses std::erf. alpha * y + bias is one FMA on avx512 and avx2 (the same bits
// on both), two roundings on portable; with alpha = 1 and no bias and no activation nothing is touched.
struct RowwiseEpilogue {
  const float* bias = nullptr;  // [n] or null
  float alpha = 1.0f;
  Activation act = Activation::none;
};
void rowwise_dot_f32(Isa isa, const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                     const RowwiseEpilogue& ep = {});
void rowwise_dot_bf16(Isa isa, const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                      const RowwiseEpilogue& ep = {});
// A weight in panels (Backend::decode_panel_rows, dew/tensor.hpp): w holds n / kPanelRows panels of kPanelRows rows
// (n % kPanelRows == 0), each column-major: weight (j, i) at ((j / 32) * k + i) * 32 + j % 32, so a decode step
// reads it in address order as one stream (the row-major form streams J rows side by side). y[r, j] = e + o, where
// e is the FMA chain x[r, i] w[j, i] + ... over the even columns i in order and o over the odd ones, the same way
// whatever m, r, the thread count and the path are (avx512 and avx2 agree bit for bit; portable rounds each
// product); then the epilogue as above. Not the row-major path's sums: a weight's layout picks its kernel.
// `prefetch` (bf16): every pass also prefetches the weight kPanelPrefetchBytes ahead into L2, for weights streamed
// from memory rather than the last-level cache (CpuBackend::decode_weights_placed): the bf16 kernel's work per byte
// leaves fewer reads in flight than the memory needs (gpt2-small's bf16 token on the Emerald Rapids Xeon, 247 MB:
// 21-22 -> 17-18.5 ms), while on cache-resident weights the extra instructions cost a few % (char-small's bf16
// token +4-10 %). f32 panels stream at the memory's rate without it. A hint only: no value changes.
constexpr int64_t kPanelRows = 32;
constexpr int64_t kPanelPrefetchBytes = 8192;
void panel_dot_f32(Isa isa, const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                   const RowwiseEpilogue& ep = {});
void panel_dot_bf16(Isa isa, const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                    const RowwiseEpilogue& ep = {}, bool prefetch = false);
// An int8 weight (dew/tensor.hpp's quantized tensor): w [n, k] int8 in `groups` groups of k / groups columns per
// row, the scale of row j's group g at scales[j * groups + g]. Two forms, chosen per call by rowwise_dot_i8:
// * integer blocks, when 32 divides k / groups (the weight's layout alone decides): each row of x is rounded once to int16 per
//   block of 32 columns (scale absmax / 32767, round to nearest even: a relative error of at most 2^-16 of the
//   block's largest |x|, 256 times finer than the weights' own int8 steps), each block's dot is exact integer
//   arithmetic (vpmaddwd: 16 lanes of adjacent column pairs), converted exactly to f32 and scaled by
//   weight scale * x scale into two alternating 16-lane f32 accumulators (dot_block_q8i). A block of x holding
//   a NaN or an infinity gets a NaN scale, so its row's outputs are NaN;
// * f32 widening otherwise (groups of other lengths): each group's dot summed like the f32 path's (16 lanes,
//   then its k / groups % 16 tail in order) and scaled lane by lane (dot_block_q8).
// Either way the invariants above hold: the form depends on the weight only, every sum on x's own row.
struct QuantScales {
  const float* scales = nullptr;
  int64_t groups = 1;
  const int16_t* xq = nullptr;  // integer form: x rounded, [m, k], and its block scales [m, k / 32]
  const float* xs = nullptr;
};
void rowwise_dot_i8(Isa isa, const float* x, const int8_t* w, const QuantScales& scales, float* y, int64_t m,
                    int64_t n, int64_t k, const RowwiseEpilogue& ep = {});

}  // namespace dew::cpu
