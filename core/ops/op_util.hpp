// core/ops/op_util.hpp — private helpers shared by the op implementations (not part of the SDK).
#pragma once
#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "kernel_call.hpp"

namespace dew::detail {

inline Tensor empty_like(const Tensor& x) { return Tensor::empty(x.shape(), x.dtype(), x.backend_ptr()); }
inline Tensor empty_as(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.dtype(), x.backend_ptr()); }
// The unary op an Activation applies (act != none): activation() and linear()'s fused backward share it.
inline UnaryOp unary_op_of(Activation act) {
  switch (act) {
    case Activation::relu:
      return UnaryOp::relu;
    case Activation::gelu:
      return UnaryOp::gelu;
    case Activation::gelu_tanh:
      return UnaryOp::gelu_tanh;
    case Activation::silu:
      return UnaryOp::silu;
    case Activation::none:
      break;
  }
  DEW_INTERNAL_ASSERT(false);
  return UnaryOp::relu;
}
// Saved statistics (mean, rstd, lse, per-row losses): f64 for f64 inputs, else f32.
inline DType stat_dtype(const Tensor& x) { return x.dtype() == DType::f64 ? DType::f64 : DType::f32; }
// x / d, with d held in x's dtype (scale() takes a float, which would round d's reciprocal for f64 inputs).
inline Tensor div_scalar(const Tensor& x, double d) { return div(x, Tensor::full({1}, d, x.dtype(), x.backend_ptr())); }

inline void check_same_backend(const Tensor& a, const Tensor& b, const char* op) {
  DEW_CHECK(a.backend_ptr() == b.backend_ptr(), op, ": inputs live on different backends (", a.backend().name(),
            " and ", b.backend().name(), ")");
}
inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  DEW_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch (", dtype_name(a.dtype()), " vs ", dtype_name(b.dtype()),
            ")");
}
inline int norm_axis(int axis, int ndim, const char* op) {
  const int a = axis < 0 ? axis + ndim : axis;
  DEW_CHECK(a >= 0 && a < ndim, op, ": axis ", axis, " out of range for ", ndim, " dimensions");
  return a;
}
inline std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = int(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i) + 1] * s[size_t(i) + 1];
  return st;
}
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// cross_entropy's divisor: max(1, the targets that are not ignore_index), a [1] tensor of `dtype` on the targets'
// backend (core/ops/nn_ops.cpp); linear_cross_entropy shares it.
Tensor cross_entropy_divisor(const Tensor& targets, int64_t ignore_index, DType dtype);

// ---- autocast (dew/autocast.hpp): an op that casts calls itself again with the cast operands ----
// True when autocast is on and one of the defined tensors is f32 (a matmul-class op then casts them).
inline bool autocast_lowers(std::initializer_list<const Tensor*> ts) {
  if (!autocast_enabled()) return false;
  for (const Tensor* t : ts)
    if (t->defined() && t->dtype() == DType::f32) return true;
  return false;
}
// x cast to the autocast dtype when it is f32 and autocast is on (differentiable); otherwise x.
inline Tensor autocast_lower(const Tensor& x) {
  return autocast_enabled() && x.defined() && x.dtype() == DType::f32 ? cast(x, autocast_dtype()) : x;
}
// An operand of a product-class op (linear, matmul, qkv_attention, the fused head losses) as autocast computes with
// it: x cast to the autocast dtype when it is f32, by a cast outside the graph, otherwise x. The op records x itself
// as its input and returns x's gradient in f32 from the widened product (half operands, f32 output,
// dew/kernel_contracts.hpp): no half gradient rounded and cast back by a cast node (a pass and a launch per weight).
// Outside autocast, and for an operand that is not f32, it is x itself: the ops call it unconditionally.
inline Tensor lower_operand(const Tensor& x) {
  return autocast_enabled() && x.defined() && x.dtype() == DType::f32 ? cast(x.detach(), autocast_dtype()) : x;
}
// True when autocast is on and p (a weight, bias or modulation) is defined in another dtype than x.
inline bool autocast_differs(const Tensor& p, const Tensor& x) {
  return autocast_enabled() && p.defined() && p.dtype() != x.dtype() && p.dtype() != DType::f64 &&
         x.dtype() != DType::f64;
}
// p in x's dtype when autocast_differs(p, x); otherwise p.
inline Tensor autocast_like(const Tensor& p, const Tensor& x) {
  return autocast_differs(p, x) ? cast(p, x.dtype()) : p;
}
// Elementwise type promotion under autocast: a half operand meeting an f32 one is widened to f32.
inline Tensor autocast_widen(const Tensor& x, const Tensor& other) {
  return autocast_differs(x, other) && x.dtype() != DType::f32 && other.dtype() == DType::f32 ? cast(x, DType::f32)
                                                                                             : x;
}

// Brackets products that read a common operand, none of which is written in between (Backend::operand_reuse): the
// backend may keep what it did to such an operand for the later products (cpu under matmul_precision = medium: its
// bf16 rounding). Whatever runs inside writes only tensors no product of the bracket reads (fresh outputs, a sum the
// products accumulate into). `open` false: no bracket.
class OperandReuse {
 public:
  OperandReuse(const Tensor& t, bool open) : be_(open ? &t.backend() : nullptr) {
    if (be_) be_->operand_reuse(true);
  }
  ~OperandReuse() {
    if (be_) be_->operand_reuse(false);
  }
  OperandReuse(const OperandReuse&) = delete;
  OperandReuse& operator=(const OperandReuse&) = delete;

 private:
  Backend* be_;
};

}  // namespace dew::detail
