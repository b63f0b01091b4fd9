// dew/kernel_table.hpp — the kernel algebra as one table: every kernel a backend implements, with its
// parameters, in one place (version DEW_KERNEL_ALGEBRA_VERSION, dew/plugin.h).
//
// DEW_KERNEL_TABLE(X) calls X(name, (parameter list), (argument names)) once per kernel, in the order of
// the Kernel enum. Everything that lists kernels is generated from it (dew/backend.hpp):
//   * the Kernel enum and kernel_name()                  (core/tensor/kernels.cpp)
//   * Backend's pure virtual kernels                     (dew/backend.hpp)
//   * DEW_KERNEL_OVERRIDES: a backend's declarations    (plugins/backends/*/…_backend.hpp)
//   * ProfilingBackend's timed forwarding                (dew/profile.hpp)
//   * the conformance suite's coverage check             (tools/dew-conformance: a case per Kernel)
// Adding a kernel: an entry here (with its contract in the comment above it), one definition per backend
// (ref, cpu, cuda), a conformance case, and the differentiable op in core/ops; bump
// DEW_KERNEL_ALGEBRA_VERSION in dew/plugin.h (plugins built on another table are refused at load).
//
// Kernel parameter structs (MatmulParams, ...) and the general rules (contiguous tensors, outputs
// allocated by the core, no aliasing but for elementwise kernels) are in dew/backend.hpp.
#pragma once

// clang-format off
#define DEW_KERNEL_TABLE(X)                                                                                      \
  /* out = value (any dtype) */                                                                                  \
  X(fill, (Tensor& out, double value), (out, value))                                                             \
  /* any dtype -> any dtype, same numel */                                                                       \
  X(cast, (const Tensor& x, Tensor& out), (x, out))                                                              \
  X(strided_copy, (const Tensor& src, Tensor& dst, const StridedCopyParams& p), (src, dst, p))                   \
  /* out = act(alpha op(a) op(b) + bias) + beta out (MatmulParams, dew/backend.hpp); a, b, bias, out of one   */ \
  /* float dtype, but for two forms (dew/kernel_contracts.hpp): the weight-only one (f32 a against a bf16 or  */ \
  /* int8 decode weight, is_weight_only_matmul) and the widened product (half a and b into an f32 out, no     */ \
  /* bias or activation: the f32 accumulation stored unrounded, is_widened_matmul)                            */ \
  X(matmul, (const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p),          \
    (a, b, bias, out, p))                                                                                        \
  X(unary, (const Tensor& x, Tensor& out, const UnaryParams& p), (x, out, p))                                    \
  /* dx = dy * d op(x) / dx; dx may alias x (element by element)                                             */ \
  X(unary_backward, (const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p), (x, dy, dx, p))       \
  /* unary_backward's dx, and dsum [D] = the sums of dx over its rows (D = x's last axis, rows = numel / D):  */ \
  /* an activation's backward and the bias gradient of the linear layer that feeds it, in one pass (dx as    */ \
  /* unary_backward writes it; dsum summed as reduce sums: in f64 on ref and cpu). Overwritten; dx may alias */ \
  /* x (as unary_backward's), dsum aliases nothing                                                            */ \
  X(unary_backward_sum, (const Tensor& x, const Tensor& dy, Tensor& dx, Tensor& dsum, const UnaryParams& p),     \
    (x, dy, dx, dsum, p))                                                                                        \
  X(binary, (const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op), (a, b, out, op))                       \
  /* out = act(gate) * up: the gated MLP's GLU (SwiGLU with silu, GeGLU with gelu / gelu_tanh, plain        */ \
  /* bilinear with none). gate, up, out: one size and float dtype. Rounds as mul(unary(gate), up) does in    */ \
  /* f32 / f64: act(gate) (backward: dy * up) in the dtype before the product; a half dtype keeps those in  */ \
  /* f32 and rounds the outputs once. Elementwise: out may alias gate or up.                                */ \
  X(gated_activation, (const Tensor& gate, const Tensor& up, Tensor& out, Activation act), (gate, up, out, act))  \
  /* dgate = dy * up * act'(gate), dup = dy * act(gate), both overwritten (dgate may alias gate, dup up) */       \
  X(gated_activation_backward, (const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,          \
                                Tensor& dup, Activation act), (gate, up, dy, dgate, dup, act))                  \
  /* y = x + gate[g] * f, adaLN-Zero's gated residual: x, f, y [rows, D] (any leading shape), gate [G, D],   */ \
  /* rows % G == 0, row r uses gate row r / (rows / G) (one sample's tokens a group); one float dtype. Rounds */ \
  /* as add(x, mul(f, gate)) does: the product in the dtype, then the sum (a half dtype: f32, rounded once). */ \
  /* Elementwise: y may alias x or f.                                                                        */ \
  X(gated_residual, (const Tensor& x, const Tensor& f, const Tensor& gate, Tensor& y), (x, f, gate, y))          \
  /* df = dy * gate[g] and dgate [G, D] = the sums over each group's rows of dy * f (each product rounded to */ \
  /* the dtype, as mul's, summed as reduce sums: in f64 on ref and cpu), both overwritten; no aliasing.      */ \
  /* (dx = dy: the op passes the gradient through.)                                                          */ \
  X(gated_residual_backward, (const Tensor& f, const Tensor& gate, const Tensor& dy, Tensor& df, Tensor& dgate), \
    (f, gate, dy, df, dgate))                                                                                    \
  X(reduce, (const Tensor& x, Tensor& out, const ReduceParams& p), (x, out, p))                                  \
  /* out [n] (xs' dtype) = each xs[i]'s sum of squares over all its elements: the bits reduce(xs[i] as [1, numel, */ \
  /* 1], sumsq) writes (0 for an empty one). xs of one float dtype; out aliases none of them. A model's gradients  */ \
  /* (the global norm) in one call: on a device a few launches, not one or two per tensor                       */ \
  X(sum_squares_group, (const std::vector<Tensor>& xs, Tensor& out), (xs, out))                                  \
  /* along the last axis; rows = numel / last */                                                                 \
  X(softmax, (const Tensor& x, Tensor& y), (x, y))                                                               \
  X(softmax_backward, (const Tensor& y, const Tensor& dy, Tensor& dx), (y, dy, dx))                              \
  X(log_softmax, (const Tensor& x, Tensor& y), (x, y))                                                           \
  X(log_softmax_backward, (const Tensor& y, const Tensor& dy, Tensor& dx), (y, dy, dx))                          \
  /* x [rows, D] (any leading shape); weight, bias [D], [G, D] or undefined; mean, rstd f32 [rows]. [G, D]:   */ \
  /* rows % G == 0 and row r uses row r / (rows / G) of weight / bias (G equal runs of rows: adaLN's         */ \
  /* per-sample modulation in one call); weight and bias have one shape when both are defined               */ \
  X(layer_norm, (const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,             \
                 Tensor& rstd, float eps), (x, weight, bias, y, mean, rstd, eps))                                \
  /* dweight / dbias (when defined) are overwritten with this call's gradient. Groups as in the forward:     */ \
  /* weight, dweight and dbias, those defined, all [D] or all [G, D] (group g's rows summed into row g)      */ \
  X(layer_norm_backward, (const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,         \
                          const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias),                         \
    (x, weight, mean, rstd, dy, dx, dweight, dbias))                                                             \
  /* y = x * rstd * (weight + weight_offset); rstd f32 [rows] = 1 / sqrt(mean(x^2) + eps) */                     \
  X(rms_norm, (const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps, float weight_offset),  \
    (x, weight, y, rstd, eps, weight_offset))                                                                    \
  /* accumulate: dx already holds a gradient of x (the sum of its other readers': dew::accumulation_target) and */ \
  /* gets this call's added, dx = dx + dx_call with dx_call rounded to dx's dtype first: exactly the bits of    */ \
  /* the call into a fresh dx and a binary add; dx then aliases neither x nor dy                             */ \
  X(rms_norm_backward, (const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, Tensor& dx, \
                        Tensor& dweight, float weight_offset, bool accumulate),                                  \
    (x, weight, rstd, dy, dx, dweight, weight_offset, accumulate))                                               \
  /* x [N, C, *spatial] (NCHW); statistics over (C/groups, spatial) per (n, group); weight, bias [C];         */ \
  /* mean, rstd [N, groups]                                                                                   */ \
  X(group_norm, (const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,             \
                 Tensor& rstd, int64_t groups, float eps), (x, weight, bias, y, mean, rstd, groups, eps))        \
  X(group_norm_backward, (const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,         \
                          const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups),         \
    (x, weight, mean, rstd, dy, dx, dweight, dbias, groups))                                                     \
  /* src [Bs, R, D] with Bs in {1, B}; idx i32 [B, K]; out [B, K, D] = src[b or 0, idx[b, k], :]; an index    */ \
  /* outside [0, R) throws. scatter_add_rows accumulates (+=) dout rows into dsrc.                            */ \
  X(gather_rows, (const Tensor& src, const Tensor& idx, Tensor& out), (src, idx, out))                           \
  X(scatter_add_rows, (const Tensor& dout, const Tensor& idx, Tensor& dsrc), (dout, idx, dsrc))                  \
  X(rope, (const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p), (x, positions, out, p))   \
  /* segment_ids: undefined (one document) or i32 [B, S], document masking (AttentionParams, dew/backend.hpp) */ \
  /* q, k, v, out of one floating dtype, or f32 q and out over bf16 k and v (a bf16 decode cache: K/V         */ \
  /* widened exactly on read, f32 arithmetic; asked as supports(attention, bf16)). The backward: one dtype    */ \
  X(attention, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, Tensor& out,       \
                Tensor& lse, const AttentionParams& p), (q, k, v, segment_ids, out, lse, p))                     \
  /* dq, dk, dv are overwritten */                                                                               \
  X(attention_backward, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,          \
                         const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,       \
                         Tensor& dv, const AttentionParams& p),                                                  \
    (q, k, v, segment_ids, out, lse, dout, dq, dk, dv, p))                                                       \
  /* Decoding rows over a slot cache (a server's batch: each row its own sequence). k_cache, v_cache         */ \
  /* [n_slots, C, Hkv, D]; q, out [N, 1, Hq, D]; k_new, v_new [N, 1, Hkv, D] of the cache's dtype; slots and    */ \
  /* positions: N distinct slots and 0 <= positions[n] < C. Writes row n's k_new, v_new at [slots[n],           */ \
  /* positions[n]] of the caches, then out[n] = attention of q[n] over that slot's keys 0 .. positions[n] (q at */ \
  /* position positions[n]; p's scale, window and softcap; causal and q_offset are implied): the bits of        */ \
  /* `attention` on that row alone over the slot's prefix (served = solo). Dtypes as attention's forward: one   */ \
  /* float dtype, or f32 q and out over a bf16 cache. A row reads and writes its own slot only; other slots   */ \
  /* are untouched (core/tensor/kernel_groups.cpp: the shared check and the row-by-row form).                 */ \
  X(attention_slots, (const Tensor& q, const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& slots, \
                      const std::vector<int64_t>& positions, Tensor& k_cache, Tensor& v_cache, Tensor& out,    \
                      const AttentionParams& p), (q, k_new, v_new, slots, positions, k_cache, v_cache, out, p)) \
  X(conv2d, (const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p),            \
    (x, w, bias, y, p))                                                                                          \
  /* dx's shape names the input size (it disambiguates strided convolutions) */                                  \
  X(conv2d_backward_data, (const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p), (dy, w, dx, p)) \
  /* dbias (when defined) [O] = sum of dy over N, OH, OW */                                                      \
  X(conv2d_backward_weight, (const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const Conv2dParams& p), \
    (x, dy, dw, dbias, p))                                                                                       \
  /* QK-Clip's statistic (placed here, away from the attention entries). q [B, T, Hq, D], k [B, S, Hkv, D]  */ \
  /* and the visibility of AttentionParams and segment_ids (as `attention`: documents of packed rows, or    */ \
  /* undefined) -> out f32 [Hq] = per query head, the largest raw score scale * q.k over every batch row, query */ \
  /* and key it sees (before softcap; -inf when it sees none). Its own kernel, not an output of `attention`: */ \
  /* only QK-Clip runs it, so the forward's signature and hot loops stay as they are, and the max of raw    */ \
  /* scores is independent of softcap and of the online softmax.                                            */ \
  X(attention_max_logit, (const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,            \
                          const AttentionParams& p), (q, k, segment_ids, out, p))                                \
  X(cross_entropy, (const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,                      \
                    const CrossEntropyParams& p), (logits, targets, loss, lse, p))                               \
  /* dlogits may be logits (in place: linear_cross_entropy's chunks; each element is read before it is written) */ \
  X(cross_entropy_backward, (const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss, \
                             Tensor& dlogits, const CrossEntropyParams& p), (logits, targets, lse, dloss, dlogits, p)) \
  X(adamw_update, (Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p),               \
    (param, grad, m, v, p))                                                                                      \
  /* adamw_update over many parameters in one call: each slot updated exactly as adamw_update(slot.param,    */ \
  /* slot.grad, slot.m, slot.v, p with lr = slot.lr, weight_decay = slot.weight_decay), the same bits. Every */ \
  /* slot's tensors have one float dtype; slots hold distinct tensors (no aliasing across slots). What it    */ \
  /* buys is launches: a device updates a model's hundreds of tensors in a few (PyTorch's fused AdamW)        */ \
  X(adamw_update_group, (std::vector<AdamWSlot>& slots, const AdamWParams& p), (slots, p))                      \
  /* Each slot's average += weight * (target - average), in place, with the bits of binary(target, average, d,   */ \
  /* sub); unary(d, d, affine {weight, 0}); binary(average, d, average, add) on that slot: every step rounded to  */ \
  /* the dtype (lerp_each, dew/backend.hpp). One float dtype; averages overlap nothing else the call touches.     */ \
  /* An EMA of a model's weights in one pass over each tensor, and on a device in a few launches                */ \
  X(lerp_group, (std::vector<LerpSlot>& slots, float weight), (slots, weight))                                   \
  /* momentum_buf is undefined when p.momentum == 0 */                                                           \
  X(sgd_update, (Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p),                   \
    (param, grad, momentum_buf, p))                                                                              \
  X(lamb_update, (Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p),                 \
    (param, grad, m, v, p))                                                                                      \
  X(random, (Tensor& out, const RandomParams& p), (out, p))                                                      \
  X(dropout, (const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p), (x, y, mask, p))                \
  /* x [rows, D] -> out i32 [rows]: the first index of the largest value */                                      \
  X(argmax, (const Tensor& x, Tensor& out), (x, out))
// clang-format on

// Inside a backend class: `void <kernel>(...) override;` for every kernel of the table.
#define DEW_KERNEL_OVERRIDE_DECLARATION_(name, params, args) void name params override;
#define DEW_KERNEL_OVERRIDES DEW_KERNEL_TABLE(DEW_KERNEL_OVERRIDE_DECLARATION_)
