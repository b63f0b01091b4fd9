// cpu/loss.cpp — fused cross-entropy over logits [N, V] (f32), forward and backward.
//
// Hand-written because fusing is the point: the forward reads each logits row once, keeping a running
// (max, sum of exp) per 16-wide lane chunk that is rescaled when the max grows (online log-sum-exp), so
// softmax is never materialised; lse = max + log(sum), loss = lse - logit[target] (0 when ignored).
// The backward writes dlogits = (exp(logit - lse) - onehot(target)) * dloss[n] in one pass (zero rows
// where ignored). Sums of exp accumulate in double per row. A target outside [0, V) that is not
// ignore_index throws before anything is written.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. The row max and the sum of
//   exponentials are f32 lane reductions (16 lanes on avx512, 8 on avx2, 4 portable): loss, lse and dlogits
//   differ between paths in the last bits (within a few ulp; tests/backends_cpu bounds it), and each path is
//   run-to-run and resume deterministic.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <algorithm>
#include <cmath>
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "loss.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(cross_entropy, (const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse, const CrossEntropyParams& p), (logits, targets, loss, lse, p))
DEW_CPU_ISA_KERNEL(cross_entropy_backward, (const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p), (logits, targets, lse, dloss, dlogits, p))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

void check_targets(const int32_t* t, int64_t n, int64_t v, int64_t ignore, const char* kernel) {
  for (int64_t i = 0; i < n; ++i)
    DEW_CHECK(t[i] == ignore || (t[i] >= 0 && t[i] < v), "cpu ", kernel, ": target ", t[i], " of row ", i,
              " is outside [0, ", v, ") and not ignore_index ", ignore);
}

// log(sum_j exp(x_j)) of one row in a single pass: chunks of 512 elements update a running max m and
// rescale the running sum s whenever a chunk raises it.
inline float row_lse(const float* x, int64_t v) {
  constexpr int64_t kChunk = 512;
  float m = -INFINITY;
  double s = 0.0;
  for (int64_t j0 = 0; j0 < v; j0 += kChunk) {
    const int64_t j1 = std::min(v, j0 + kChunk);
    float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
    for (int64_t j = j0; j < j1; ++j) cm = x[j] > cm ? x[j] : cm;
    if (cm > m) {
      if (m != -INFINITY) s *= std::exp(double(m) - double(cm));
      m = cm;
    }
    if (m == -INFINITY) continue;  // everything so far is -inf: contributes nothing
    float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
    for (int64_t j = j0; j < j1; ++j) cs += fast_exp(x[j] - m);
    s += double(cs);
  }
  // A NaN logit is skipped by the max but poisons s through exp(NaN), so it propagates.
  if (m == INFINITY) return INFINITY;
  return m + float(std::log(s));
}

}  // namespace

void cross_entropy(CpuBackend& self, const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                               const CrossEntropyParams& p) {
  if (is_bf16_call(logits)) return cross_entropy_bf16(self, logits, targets, loss, lse, p);  // half.cpp
  require_f32(logits, "cross_entropy", "logits");
  require_i32(targets, "cross_entropy", "targets");
  require_f32(loss, "cross_entropy", "loss");
  require_f32(lse, "cross_entropy", "lse");
  DEW_CHECK(logits.ndim() == 2, "cpu cross_entropy: logits must be [N, V], got ", shape_str(logits.shape()));
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  DEW_CHECK(targets.numel() == n && loss.numel() == n && lse.numel() == n, "cpu cross_entropy: targets/loss/lse need ",
            n, " elements");
  if (n == 0) return;
  DEW_CHECK(v > 0, "cpu cross_entropy: empty vocabulary");
  const int32_t* t = targets.data_as<int32_t>();
  check_targets(t, n, v, p.ignore_index, "cross_entropy");
  const float* x = logits.data_as<float>();
  float* l = loss.data_as<float>();
  float* ls = lse.data_as<float>();
  const int64_t ignore = p.ignore_index;
  for_rows(n, parallel_worth(logits.numel()), [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* row = x + i * v;
      const float z = row_lse(row, v);
      ls[i] = z;
      l[i] = t[i] == ignore ? 0.0f : z - row[t[i]];
    }
  });
}

void cross_entropy_backward(CpuBackend& self, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                        const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p) {
  if (is_bf16_call(logits)) return cross_entropy_backward_bf16(self, logits, targets, lse, dloss, dlogits, p);  // half.cpp
  require_f32(logits, "cross_entropy_backward", "logits");
  require_i32(targets, "cross_entropy_backward", "targets");
  require_f32(lse, "cross_entropy_backward", "lse");
  require_f32(dloss, "cross_entropy_backward", "dloss");
  require_f32(dlogits, "cross_entropy_backward", "dlogits");
  DEW_CHECK(logits.ndim() == 2, "cpu cross_entropy_backward: logits must be [N, V], got ", shape_str(logits.shape()));
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  DEW_CHECK(targets.numel() == n && lse.numel() == n && dloss.numel() == n && dlogits.numel() == n * v,
            "cpu cross_entropy_backward: sizes do not match logits ", shape_str(logits.shape()));
  if (n == 0) return;
  const int32_t* t = targets.data_as<int32_t>();
  check_targets(t, n, v, p.ignore_index, "cross_entropy_backward");
  const float* x = logits.data_as<float>();
  const float* ls = lse.data_as<float>();
  const float* g = dloss.data_as<float>();
  float* dx = dlogits.data_as<float>();
  const int64_t ignore = p.ignore_index;
  for_rows(n, parallel_worth(logits.numel()), [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* dr = dx + i * v;
      if (t[i] == ignore) {
        std::fill(dr, dr + v, 0.0f);
        continue;
      }
      const float* row = x + i * v;
      const float z = ls[i], gi = g[i];
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) dr[j] = fast_exp(row[j] - z) * gi;
      dr[t[i]] = (fast_exp(row[t[i]] - z) - 1.0f) * gi;
    }
  });
}

#endif  // DEW_CPU_ISA
