// cpu/attention_bf16.hpp — the cpu backend's bf16 attention on AVX512-BF16 (vdpbf16ps): bf16 operands, f32
// accumulation (attention_bf16.cpp says exactly which calls it covers and what each step rounds).
//
// Tensors as dew::AttentionParams (dew/backend.hpp) with every data tensor bf16: q, out, dout, dq [B, T, Hq, D],
// k, v, dk, dv [B, S, Hkv, D]; lse f32 [B, Hq, T]; segment_ids undefined or i32 [B, S]. A caller asks
// attention_bf16_fast_covers / attention_bf16_fast_backward_covers first and takes half.cpp's widened path
// otherwise (cpu_backend.hpp: attention_bf16).
// The medium form (matmul_precision = medium: f32 attention whose products take bf16 operands, half.cpp's
// attention_medium): the inputs as above, rounded to bf16 by the caller, and f32 outputs (out; dq, dk, dv): the
// f32 sums the bf16 form rounds once, as they are. The covers functions take f32 q, k for it.
#pragma once
#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace dew::cpu {

// This CPU runs vdpbf16ps (AVX512-BF16 with F, BW, VL, DQ).
bool attention_bf16_fast_cpu();
// The forward kernel covers this call: the CPU has AVX512-BF16, q, k bf16 (or both f32: the medium form)
// [B, T|S, H, D] with D % 16 == 0, D <= 256, T > 4 (shorter queries are decoding rows: the widened row path).
bool attention_bf16_fast_covers(const Tensor& q, const Tensor& k, const AttentionParams& p);
// The backward kernel covers this call at `threads` OpenMP threads: the forward's conditions, and enough
// (batch, kv head) tasks to keep the threads busy (see attention_bf16.cpp).
bool attention_bf16_fast_backward_covers(const Tensor& q, const Tensor& k, const AttentionParams& p, int threads);

void attention_bf16_fast_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                 Tensor& out, Tensor& lse, const AttentionParams& p);
void attention_bf16_fast_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                  Tensor& dv, const AttentionParams& p);

}  // namespace dew::cpu
