// core/train/matmul_peak.cpp — measure_matmul_peak_gflops (dew/train.hpp): the measured matmul rate that MFU
// divides by, in the trainer's metrics and in dew-bench.
// Invariants: the clock runs only while the backend computes what was asked of it (synchronize() before the
// start and after every product, so an asynchronous device cannot report the rate at which it queues work);
// the product size depends on the backend's kind only, never on a chip's name.
#include <algorithm>
#include <chrono>

#include "dew/autograd.hpp"
#include "dew/ops.hpp"
#include "dew/train.hpp"

namespace dew {

int64_t matmul_peak_size(const Backend& backend) { return backend.host_accessible() ? 512 : 8192; }

double measure_matmul_peak_gflops(const BackendPtr& backend, DType operands) {
  NoGradGuard no_grad;
  const int64_t n = matmul_peak_size(*backend);
  Tensor a = Tensor::uniform({n, n}, -1, 1, 7, 1, backend), b = Tensor::uniform({n, n}, -1, 1, 7, 2, backend);
  if (operands != DType::f32) {
    a = cast(a, operands);
    b = cast(b, operands);
  }
  Tensor c = matmul(a, b);  // warm-up: plans, workspaces, caches
  backend->synchronize();
  int iters = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double secs = 0;
  do {
    c = matmul(a, b);
    backend->synchronize();
    ++iters;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (secs < 0.2 && iters < 2000);
  return 2.0 * double(n) * double(n) * double(n) * iters / std::max(secs, 1e-12) * 1e-9;
}

}  // namespace dew
