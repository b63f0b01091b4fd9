// cuda/kernels.cuh — the launchers of the cuda backend's own CUDA kernels (one .cu file per family).
//
// This header is shared by the host code (g++) and the .cu files (nvcc). Launchers take raw device
// pointers, sizes that the host code has already validated (cuda_backend.cpp / checks.cpp), and the
// backend's one stream; they only enqueue work (no host synchronisation, no allocation: scratch space
// is passed in). Floating compute kernels take their storage type as ST (f32 or bf16) and compute in
// f32; statistics (mean, rstd, lse, per-row losses) are f32.
// Device-side argument errors (an index or target out of range) cannot throw: the kernel records the
// first one in the backend's error word (ErrWord) and the host raises it at the next
// synchronisation point (synchronize(), copy_to_host()). The word lives in device memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "dew/backend.hpp"

namespace dew::cuda {

// Storage type of a floating compute kernel's tensors.
enum class ST : uint8_t { f32, bf16 };

// The error word: code 0 = no error; otherwise the first error's code and up to three integers.
struct ErrWord {
  int code;
  int pad;
  long long a, b, c;
};
enum ErrCode : int { kErrNone = 0, kErrGatherIndex = 1, kErrScatterIndex = 2, kErrTarget = 3 };

constexpr int kMaxRank = 8;  // strided_copy / binary broadcasting after coalescing
struct StridedDesc {
  int rank;
  int64_t shape[kMaxRank];
  int64_t a[kMaxRank];  // strides (elements) of the first operand / source
  int64_t b[kMaxRank];  // strides of the second operand / destination
};

// ---- elementwise.cu ----
void launch_fill(cudaStream_t s, void* p, int64_t n, int elem_size, uint64_t pattern);
void launch_cast(cudaStream_t s, const void* x, DType from, void* out, DType to, int64_t n);
void launch_strided_copy(cudaStream_t s, const void* src, void* dst, int elem_size, const StridedDesc& d,
                         int64_t src_offset, int64_t dst_offset, int64_t count);
void launch_unary(cudaStream_t s, ST t, const void* x, void* out, int64_t n, UnaryOp op, float alpha, float beta);
void launch_unary_backward(cudaStream_t s, ST t, const void* x, const void* dy, void* dx, int64_t n, UnaryOp op,
                           float alpha, float beta);
void launch_gated_activation(cudaStream_t s, ST t, const void* gate, const void* up, void* out, int64_t n,
                             Activation act);
void launch_gated_activation_backward(cudaStream_t s, ST t, const void* gate, const void* up, const void* dy,
                                      void* dgate, void* dup, int64_t n, Activation act);
// y = x + gate[r / per] * f over [rows, d]; backward: df = dy * gate[g], dgate [rows / per, d] = column sums
// of dy * f over each group's per rows (one thread per (group, column), rows in order, in f32).
void launch_gated_residual(cudaStream_t s, ST t, const void* x, const void* f, const void* gate, void* y, int64_t rows,
                           int64_t d, int64_t per);
void launch_gated_residual_backward(cudaStream_t s, ST t, const void* f, const void* gate, const void* dy, void* df,
                                    void* dgate, int64_t rows, int64_t d, int64_t per);
// out[i] (dtype out_dtype) = op(a[...], b[...]); d.a / d.b are broadcast strides over d.shape (out's shape).
// same_shape: a, b and out have identical shapes (no index arithmetic).
void launch_binary(cudaStream_t s, ST t, const void* a, const void* b, void* out, DType out_dtype, BinaryOp op,
                   const StridedDesc& d, int64_t n, bool same_shape);
// Scratch for the column sums' row slices: reduce_scratch_doubles(outer, reduce, inner) doubles (0: none needed).
int64_t reduce_scratch_doubles(int64_t outer, int64_t reduce, int64_t inner);
// sum_squares_group: each tensor's sum of squares with reduce's own split (so its bits), all tensors in launches of up
// to kSquaresGroupSlots: one pass over (tensor, slice) blocks into scratch, one combining each tensor's slices.
// Scratch: sum_squares_group_scratch_doubles(ns, count) doubles.
constexpr int kSquaresGroupSlots = 64;
int64_t sum_squares_group_scratch_doubles(const int64_t* ns, int64_t count);
void launch_sum_squares_group(cudaStream_t s, ST t, const void* const* xs, const int64_t* ns, int64_t count, void* out,
                              double* scratch);
void launch_reduce(cudaStream_t s, ST t, const void* x, void* out, int64_t outer, int64_t reduce, int64_t inner,
                   ReduceOp op, double* scratch);
void launch_argmax(cudaStream_t s, ST t, const void* x, int32_t* out, int64_t rows, int64_t D);
// out[r, j] = act(keep * out[r, j] + bias[j]) over rows x n (bias may be null; keep == 0 never reads out):
// the matmul epilogues cuBLASLt cannot fuse (gelu with erf, silu: keep = 1) and the k == 0 product
// (keep = beta).
void launch_bias_act(cudaStream_t s, ST t, void* out, const void* bias, int64_t rows, int64_t n, Activation act,
                     float keep);
// y[n, o, :] += bias[o]
void launch_channel_bias_add(cudaStream_t s, ST t, void* y, const void* bias, int64_t N, int64_t O, int64_t HW);
// dbias[o] = sum over n, hw of dy[n, o, hw]
void launch_channel_bias_grad(cudaStream_t s, ST t, const void* dy, void* dbias, int64_t N, int64_t O, int64_t HW);

// ---- softmax.cu ----
void launch_softmax(cudaStream_t s, ST t, const void* x, void* y, int64_t rows, int64_t D, bool log);
void launch_softmax_backward(cudaStream_t s, ST t, const void* y, const void* dy, void* dx, int64_t rows, int64_t D,
                             bool log);

// ---- norm.cu ----
// Scratch for the weight/bias gradients: norm_scratch_floats(rows, D) floats.
int64_t norm_scratch_floats(int64_t rows, int64_t D);
void launch_layer_norm(cudaStream_t s, ST t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t D, float eps);
void launch_layer_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* mean,
                                const float* rstd, const void* dy, void* dx, void* dw, void* db, int64_t rows,
                                int64_t D, float* scratch);
void launch_rms_norm(cudaStream_t s, ST t, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t D,
                     float eps, float offset);
// accumulate: dx += this call's dx (rounded to T first), as kernel_table.hpp's rms_norm_backward
void launch_rms_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* rstd, const void* dy,
                              void* dx, void* dw, int64_t rows, int64_t D, float offset, bool accumulate,
                              float* scratch);
void launch_group_norm(cudaStream_t s, ST t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t N, int64_t C, int64_t HW, int64_t G, float eps);
// scratch: 2 * N * C floats.
void launch_group_norm_backward(cudaStream_t s, ST t, const void* x, const void* w, const float* mean,
                                const float* rstd, const void* dy, void* dx, void* dw, void* db, int64_t N, int64_t C,
                                int64_t HW, int64_t G, float* scratch);

// ---- embedding_rope.cu ----
void launch_gather_rows(cudaStream_t s, const void* src, const int32_t* idx, void* out, int64_t Bs, int64_t R,
                        int64_t D, int64_t B, int64_t K, int elem_size, ErrWord* err);
// f32: atomics straight into dsrc. bf16: into `acc` (f32, Bs * R * D, zeroed here), then added to dsrc.
void launch_scatter_add_rows(cudaStream_t s, ST t, const void* dout, const int32_t* idx, void* dsrc, int64_t Bs,
                             int64_t R, int64_t D, int64_t B, int64_t K, float* acc, ErrWord* err);
// The rotation frequency of each pair (contracts::rope_frequency, computed on the host), passed by value as the
// kernel's argument: rotary_dim / 2 <= kMaxPairs.
struct RopeFrequencies {
  static constexpr int64_t kMaxPairs = 256;
  double f[kMaxPairs];
};
void launch_rope(cudaStream_t s, ST t, const void* x, const int32_t* pos, void* out, int64_t B, int64_t T, int64_t H,
                 int64_t D, int64_t rotary_dim, const RopeFrequencies& freqs, bool inverse, bool per_batch);

// ---- attention.cu ----
constexpr int kAttnMaxHeadDim = 256;
struct AttnDims {
  int64_t B, T, S, Hq, Hkv, Dk, Dv;
};
// seg: segment ids [B, S] on the device, or nullptr (one document); see AttentionParams. t: q and out; kv: k and v
// (t, or bf16 under f32 t: a bf16 decode cache).
void launch_attention(cudaStream_t s, ST t, ST kv, const void* q, const void* k, const void* v, const int32_t* seg,
                      void* out, float* lse, const AttnDims& d, const AttentionParams& p);
// attention_slots (dew/kernel_table.hpp) by the warp kernel: n rows of q / out [n, Hq, D] (t: f32; kv: the caches',
// f32 or bf16), k_new / v_new [n, Hkv, D] written at [slots[i], positions[i]] of the caches [*, C, Hkv, D] first;
// lse: n * Hq floats of scratch. Each row's out has the bits launch_attention gives it alone over its slot's prefix.
void launch_attention_slots(cudaStream_t s, ST t, ST kv, const void* q, const void* k_new, const void* v_new,
                            void* k_cache, void* v_cache, void* out, float* lse, const std::vector<int64_t>& slots,
                            const std::vector<int64_t>& positions, int64_t C, int64_t Hq, int64_t Hkv, int64_t D,
                            const AttentionParams& p);
// scratch: B * Hq * T floats (rowsum(dO * O)).
void launch_attention_backward(cudaStream_t s, ST t, const void* q, const void* k, const void* v, const int32_t* seg,
                               const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv, const AttnDims& d,
                               const AttentionParams& p, float* scratch);
// ---- flash_attention.cu: the tensor-core forward and backward (bf16 q, k, v, out; Dk == Dv in {64, 128}) ----
// Whether they take this call: the dtypes and head width above, the grid's limits, and every pointer 16-byte
// aligned. The launchers' arguments are launch_attention's / launch_attention_backward's.
bool flash_attention_applies(ST t, ST kv, const AttnDims& d, std::initializer_list<const void*> ptrs);
void launch_flash_attention(cudaStream_t s, const void* q, const void* k, const void* v, const int32_t* seg, void* out,
                            float* lse, const AttnDims& d, const AttentionParams& p);
void launch_flash_attention_backward(cudaStream_t s, const void* q, const void* k, const void* v, const int32_t* seg,
                                     const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                                     const AttnDims& d, const AttentionParams& p, float* scratch);
// out f32 [Hq]: each query head's largest visible raw score; scratch: B * Hq * T floats (the row maxima).
void launch_attention_max_logit(cudaStream_t s, ST t, const void* q, const void* k, const int32_t* seg, float* out,
                                const AttnDims& d, const AttentionParams& p, float* scratch);

// ---- attention_products.cu: the row kernels of the f32 attention by products (attention_products.cpp) ----
// A chunk: batch b, query rows [t0, t0 + tc) of every query head, keys [s0, s0 + nc); scratch rows [Hq][tc][nc].
struct ProductsChunk {
  int64_t b, t0, tc, s0, nc;
};
// sc: scale * q.k in, P out (masked softmax; hidden keys 0); lse [B, Hq, T] written for the chunk's rows.
void launch_products_softmax(cudaStream_t s, float* sc, const int32_t* seg, float* lse, const ProductsChunk& c,
                             const AttnDims& d, const AttentionParams& p);
// sc: scale * q.k in, P = exp(cap(score) - lse) out (hidden keys 0).
void launch_products_probs(cudaStream_t s, float* sc, const int32_t* seg, const float* lse, const ProductsChunk& c,
                           const AttnDims& d, const AttentionParams& p);
// dp: dO . V in, dS = P (dp - rowsum(dO * O)) (times the softcap's derivative) out.
void launch_products_dscore(cudaStream_t s, const float* P, float* dp, const float* out, const float* dout,
                            const float* lse, const ProductsChunk& c, const AttnDims& d, const AttentionParams& p);

// ---- loss.cu, optim.cu ----
void launch_cross_entropy(cudaStream_t s, ST t, const void* logits, const int32_t* targets, float* loss, float* lse,
                          int64_t N, int64_t V, int64_t ignore_index, ErrWord* err);
void launch_cross_entropy_backward(cudaStream_t s, ST t, const void* logits, const int32_t* targets, const float* lse,
                                   const float* dloss, void* dlogits, int64_t N, int64_t V, int64_t ignore_index);
void launch_adamw(cudaStream_t s, ST t, void* param, const void* grad, void* m, void* v, int64_t n,
                  const AdamWParams& p);
// adamw_update_group: one tensor of the group (pointers already checked: check_adamw_group).
struct AdamGroupSlot {
  void* param;
  const void* grad;
  void* m;
  void* v;
  int64_t n;
  float lr, weight_decay;
};
// Enqueues the whole group in launches of at most kAdamGroupSlots tensors (their list travels in the kernel's
// arguments, under the 4 KiB every CUDA version takes).
constexpr int kAdamGroupSlots = 48;
void launch_adamw_group(cudaStream_t s, ST t, const AdamGroupSlot* slots, int64_t count, const AdamWParams& p);
// lerp_group: one pair of the group (checked: check_lerp_group), enqueued in launches of at most kLerpGroupSlots.
struct LerpGroupSlot {
  void* average;
  const void* target;
  int64_t n;
};
constexpr int kLerpGroupSlots = 96;
void launch_lerp_group(cudaStream_t s, ST t, const LerpGroupSlot* slots, int64_t count, float weight);
void launch_sgd(cudaStream_t s, ST t, void* param, const void* grad, void* buf, int64_t n, const SgdParams& p);
// scratch: lamb_scratch_floats(n) floats.
int64_t lamb_scratch_floats(int64_t n);
void launch_lamb(cudaStream_t s, ST t, void* param, const void* grad, void* m, void* v, int64_t n, const LambParams& p,
                 float* scratch);

// ---- random.cu ----
// out dtype f32 or bf16 (the value is computed as ref does, in double, and rounded once).
void launch_random(cudaStream_t s, ST t, void* out, int64_t n, const RandomParams& p);
void launch_dropout(cudaStream_t s, ST t, const void* x, void* y, void* mask, int64_t n, const DropoutParams& p);

}  // namespace dew::cuda
