// cpu/attention.hpp — the fused attention kernels of the `cpu` backend (f32, bf16 K/V; see attention.cpp).
//
// Semantics are exactly those of dew::AttentionParams (dew/backend.hpp): q [B, T, Hq, D], k, v [B, S, Hkv, D],
// out [B, T, Hq, D], lse f32 [B, Hq, T]; grouped-query heads, causal with q_offset, sliding window, softcap;
// segment_ids (undefined or i32 [B, S]) masks across documents; a query row with no visible key gives zeros and
// lse = -inf. dq, dk, dv are overwritten. attention_forward also takes k and v in bf16 under f32 q and out (a
// bf16 decode cache): widened exactly, then the f32 kernel's arithmetic (the same bits as on the widened rows).
// `isa`: the instruction-set path (isa.hpp; the cpu backend passes its `isa` option, a test may leave the
// CPU's widest).
#pragma once
#include <cstdint>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"
#include "isa.hpp"

namespace dew::cpu {

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids, Tensor& out,
                       Tensor& lse, const AttentionParams& p, Isa isa = best_isa());
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionParams& p, Isa isa = best_isa());
// attention_slots (dew/kernel_table.hpp) for f32 q over an f32 or bf16 cache, its contract already checked
// (check_attention_slots): the rows' cache writes, then every row's query heads as the decode row tasks above
// (one region over all rows), each row reading its own slot up to its own position: the bits of attention_forward
// on that row alone over the slot's prefix.
void attention_slots_forward(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                             const std::vector<int64_t>& slots, const std::vector<int64_t>& positions, Tensor& k_cache,
                             Tensor& v_cache, Tensor& out, const AttentionParams& p, Isa isa = best_isa());
// out f32 [Hq]: the largest visible raw score scale * q.k of each query head (dew/kernel_table.hpp).
void attention_max_logit(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                         const AttentionParams& p, Isa isa = best_isa());

}  // namespace dew::cpu
