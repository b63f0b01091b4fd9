// softmax.cpp — softmax and log-softmax along the last axis, and their backwards.
// Invariants: rows = numel / last; each row is shifted by its max and summed in double; a row of all
// -inf gives NaN (as PyTorch does). Backwards: softmax dx = y * (dy - sum(dy * y));
// log-softmax dx = dy - exp(y) * sum(dy).
#include <algorithm>
#include <limits>

#include "ref_backend.hpp"

namespace dew::ref {

namespace {

int64_t last_axis(const Tensor& x, Kernel k) {
  DEW_CHECK(x.ndim() >= 1, "ref.", kernel_name(k), ": x ", shape_str(x.shape()), " has no last axis");
  return x.size(-1);
}

template <class T>
void softmax_rows(const Tensor& x, Tensor& y, bool log_space, Kernel k) {
  const int64_t D = last_axis(x, k);
  expect(y, x.dtype(), x.numel(), k, "y");
  if (D == 0) return;
  const int64_t rows = x.numel() / D;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x.data_as<T>() + r * D;
    T* yr = y.data_as<T>() + r * D;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < D; ++j) mx = std::max(mx, double(xr[j]));
    double sum = 0;
    for (int64_t j = 0; j < D; ++j) sum += std::exp(double(xr[j]) - mx);
    const double log_sum = std::log(sum);
    for (int64_t j = 0; j < D; ++j) {
      const double z = double(xr[j]) - mx;
      yr[j] = T(log_space ? z - log_sum : std::exp(z) / sum);
    }
  }
}

template <class T>
void softmax_rows_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log_space, Kernel k) {
  const int64_t D = last_axis(y, k);
  expect(dy, y.dtype(), y.numel(), k, "dy");
  expect(dx, y.dtype(), y.numel(), k, "dx");
  if (D == 0) return;
  const int64_t rows = y.numel() / D;
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y.data_as<T>() + r * D;
    const T* gr = dy.data_as<T>() + r * D;
    T* xr = dx.data_as<T>() + r * D;
    double dot = 0;  // softmax: sum(dy * y); log-softmax: sum(dy)
    for (int64_t j = 0; j < D; ++j) dot += log_space ? double(gr[j]) : double(gr[j]) * double(yr[j]);
    for (int64_t j = 0; j < D; ++j)
      xr[j] = T(log_space ? double(gr[j]) - std::exp(double(yr[j])) * dot : double(yr[j]) * (double(gr[j]) - dot));
  }
}

}  // namespace

void RefBackend::softmax(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), Kernel::softmax,
                 [&](auto tag) { softmax_rows<typename decltype(tag)::type>(x, y, false, Kernel::softmax); });
}

void RefBackend::log_softmax(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), Kernel::log_softmax,
                 [&](auto tag) { softmax_rows<typename decltype(tag)::type>(x, y, true, Kernel::log_softmax); });
}

void RefBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  dispatch_float(y.dtype(), Kernel::softmax_backward, [&](auto tag) {
    softmax_rows_backward<typename decltype(tag)::type>(y, dy, dx, false, Kernel::softmax_backward);
  });
}

void RefBackend::log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  dispatch_float(y.dtype(), Kernel::log_softmax_backward, [&](auto tag) {
    softmax_rows_backward<typename decltype(tag)::type>(y, dy, dx, true, Kernel::log_softmax_backward);
  });
}

}  // namespace dew::ref
