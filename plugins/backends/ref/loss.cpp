// loss.cpp — fused cross-entropy over logits (forward, backward).
// Invariants: log-sum-exp runs in double; loss/lse may be f32 or f64 (their own dtype); a target outside
// [0, V) that is not ignore_index throws.
#include <algorithm>
#include <limits>
#include <vector>

#include "ref_backend.hpp"

namespace dew::ref {

// ---------------------------------------------------------------- cross-entropy

namespace {

void check_targets(const Tensor& targets, int64_t N, int64_t V, int64_t ignore, Kernel k) {
  expect(targets, DType::i32, N, k, "targets");
  const int32_t* t = targets.data_as<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    DEW_CHECK(t[n] == ignore || (t[n] >= 0 && t[n] < V), "ref.", kernel_name(k), ": target ", t[n], " of row ", n,
              " is outside [0, ", V, ") and is not ignore_index ", ignore);
}

}  // namespace

void RefBackend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                               const CrossEntropyParams& p) {
  constexpr Kernel K = Kernel::cross_entropy;
  dispatch_float(logits.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(logits.ndim() == 2, "ref.cross_entropy: logits ", shape_str(logits.shape()), " are not [N, V]");
    const int64_t N = logits.size(0), V = logits.size(1);
    check_targets(targets, N, V, p.ignore_index, K);
    expect_stat(loss, N, K, "loss");
    expect_stat(lse, N, K, "lse");
    const int32_t* t = targets.data_as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const T* row = logits.data_as<T>() + n * V;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
      double sum = 0;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
      const double L = mx + std::log(sum);
      store_stat(lse, n, L);
      store_stat(loss, n, t[n] == p.ignore_index ? 0.0 : L - double(row[t[n]]));
    }
  });
}

void RefBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                        const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p) {
  constexpr Kernel K = Kernel::cross_entropy_backward;
  dispatch_float(logits.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(logits.ndim() == 2, "ref.cross_entropy_backward: logits ", shape_str(logits.shape()), " are not [N, V]");
    const int64_t N = logits.size(0), V = logits.size(1);
    check_targets(targets, N, V, p.ignore_index, K);
    expect_stat(lse, N, K, "lse");
    expect_stat(dloss, N, K, "dloss");
    expect(dlogits, logits.dtype(), logits.numel(), K, "dlogits");
    const int32_t* t = targets.data_as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const T* row = logits.data_as<T>() + n * V;
      T* drow = dlogits.data_as<T>() + n * V;
      const bool ignored = t[n] == p.ignore_index;
      const double L = load_stat(lse, n), g = load_stat(dloss, n);
      for (int64_t j = 0; j < V; ++j)
        drow[j] = ignored ? T(0) : T((std::exp(double(row[j]) - L) - (j == t[n] ? 1.0 : 0.0)) * g);
    }
  });
}

}  // namespace dew::ref
