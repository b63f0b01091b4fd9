// dew/autocast.hpp — mixed precision: the run's precision ([run] precision = f32 | bf16-mixed |
// f16-mixed) and the autocast region the trainer runs a step's forward and loss in (PyTorch autocast
// semantics; the per-op table is docs/precision.md).
//
// Inside an AutocastGuard(h) (h = bf16 or f16) the ops of dew/ops.hpp apply these rules:
//  * matmul-class ops (matmul, linear, conv2d, conv_transpose2d, qkv_attention, attention,
//    packed_attention) cast their f32 operands to h (a differentiable cast: the gradient flows back to
//    the f32 master weight in f32) and compute with f32 accumulation, storing h;
//  * embedding returns h (the gather reads the f32 table, the cast is one pass over the rows);
//  * norms (layer_norm, rms_norm, group_norm, modulated_layer_norm) run in their input's dtype: f32
//    weight / bias / modulation are cast to it; statistics (mean, rstd) stay f32;
//  * elementwise ops whose operands differ (h and f32) compute in f32 (PyTorch's type promotion);
//  * cross_entropy and mse return an f32 loss computed in f32;
//  * every other op keeps its input's dtype; kernels compute in f32 and round once on store.
// Outside a guard ops never cast (mixed dtypes are an error, as before). Backward closures run outside
// the guard and see the dtypes the forward recorded. f64 tensors are never cast.
// Invariants: the state is per thread; a guard restores the previous state (nesting works).
#pragma once
#include <string>
#include <string_view>

#include "dew/dtype.hpp"

namespace dew {

enum class Precision : uint8_t { f32, bf16_mixed, f16_mixed };
const char* precision_name(Precision p);           // "f32", "bf16-mixed", "f16-mixed"
Precision precision_from_name(std::string_view s);  // throws UsageError naming the three
// The dtype activations and matmul operands take under the precision (f32 for f32).
constexpr DType compute_dtype(Precision p) {
  return p == Precision::bf16_mixed ? DType::bf16 : p == Precision::f16_mixed ? DType::f16 : DType::f32;
}

// The autocast dtype of this thread: bf16 or f16 inside a guard, f32 outside.
DType autocast_dtype();
inline bool autocast_enabled() { return autocast_dtype() != DType::f32; }

class AutocastGuard {
 public:
  // half = f32 turns autocast off inside the region (e.g. a loss computed in f32 by hand).
  explicit AutocastGuard(DType half);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

}  // namespace dew
