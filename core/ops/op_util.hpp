// core/ops/op_util.hpp — private helpers shared by the op implementations (not part of the SDK).
#pragma once
#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"

namespace dew::detail {

inline Tensor empty_like(const Tensor& x) { return Tensor::empty(x.shape(), x.dtype(), x.backend_ptr()); }
inline Tensor empty_as(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.dtype(), x.backend_ptr()); }
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

}  // namespace dew::detail
