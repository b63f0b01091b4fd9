// cpu/loss.cpp — fused cross-entropy over logits [N, V] (f32), forward and backward.
//
// Hand-written because fusing is the point: the forward reads each logits row from memory once (its max; the
// sum of exp(logit - max) then reads it from L2), so softmax is never materialised; lse = max + log(sum),
// loss = lse - logit[target] (0 when ignored). The backward writes dlogits = (exp(logit - lse) -
// onehot(target)) * dloss[n] in one pass (zero rows where ignored). Sums of exp accumulate in f32 lanes per
// block of 1,024 logits, added into a double per row. A target outside [0, V) that is not ignore_index throws
// before anything is written.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`, on vec16.hpp's 16-lane vectors (native
//   on every path: the same lanes and the same order of operations, so loss, lse and dlogits agree between paths
//   but for avx2 / avx512's contraction into FMAs, which the portable path lacks; tests/backends_cpu bounds it),
//   each path run-to-run and resume deterministic. The exp is vec16's vexp (Cephes expf, ~1e-7; exactly 0 below
//   -87) and fast_exp for the tail of a row.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <immintrin.h>  // vec16.hpp's avx2 bf16 load

#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector arguments: everything below is inlined

#define DEW_CPU_ISA_SELF "loss.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(cross_entropy, (const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse, const CrossEntropyParams& p), (logits, targets, loss, lse, p))
DEW_CPU_ISA_KERNEL(cross_entropy_backward, (const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p), (logits, targets, lse, dloss, dlogits, p))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but vec16.hpp)

#include "vec16.hpp"  // 16-lane vectors native on every path, and vexp

namespace {

void check_targets(const int32_t* t, int64_t n, int64_t v, int64_t ignore, const char* kernel) {
  for (int64_t i = 0; i < n; ++i)
    DEW_CHECK(t[i] == ignore || (t[i] >= 0 && t[i] < v), "cpu ", kernel, ": target ", t[i], " of row ", i,
              " is outside [0, ", v, ") and not ignore_index ", ignore);
}

// log(sum_j exp(x_j)) of one row: its max in one pass (16 lanes, 4 vectors in flight), then the sum of
// exp(x - max) in a second (the row is in L2 by then: 200 KB at 50,304 ids), in f32 lanes per block of 1,024
// added into a double. The old single pass (chunks of 512, a running max rescaling a double sum, an `omp simd`
// loop over the scalar fast_exp) ran at 4.6-4.9 GB/s on one Emerald Rapids core ([2048, 50304]: 83-90 ms,
// `dew-bench kernels --only loss`): GCC if-converted fast_exp's clamps into masked copies of the polynomial,
// ~45 instructions a vector. A NaN logit is skipped by the max but poisons the sum (exp(NaN) = NaN), so it
// propagates; a +inf logit gives +inf, a row of -inf -inf.
inline float row_lse(const float* x, int64_t v) {
  constexpr int64_t L = 16, kBlock = 1024;
  float m = -INFINITY;
  int64_t j = 0;
  if (v >= 4 * L) {
    vf m4[4] = {vset(-INFINITY), vset(-INFINITY), vset(-INFINITY), vset(-INFINITY)};
    for (; j + 4 * L <= v; j += 4 * L)
      for (int k = 0; k < 4; ++k) m4[k] = vmax(vload(x + j + k * L), m4[k]);
    alignas(64) float lanes[L];
    vstore(lanes, vmax(vmax(m4[0], m4[1]), vmax(m4[2], m4[3])));
    for (int64_t k = 0; k < L; ++k) m = lanes[k] > m ? lanes[k] : m;
  }
  for (; j < v; ++j) m = x[j] > m ? x[j] : m;
  if (m == INFINITY || m == -INFINITY) return m;
  const vf mv = vset(m);
  double s = 0.0;
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    const int64_t j1 = std::min(v, j0 + kBlock);
    vf acc[4] = {vf{}, vf{}, vf{}, vf{}};
    int64_t i = j0;
    for (; i + 4 * L <= j1; i += 4 * L)
      for (int k = 0; k < 4; ++k) acc[k] += vexp_upto88(vload(x + i + k * L) - mv);
    float cs = hsum16((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < j1; ++i) cs += fast_exp(x[i] - m);
    s += double(cs);
  }
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
      const float target = row[t[i]];  // read before the row is written: dlogits may be logits (in place)
      const vf zv = vset(z), gv = vset(gi);
      int64_t j = 0;
      for (; j + 16 <= v; j += 16) vstore(dr + j, vexp(vload(row + j) - zv) * gv);
      for (; j < v; ++j) dr[j] = fast_exp(row[j] - z) * gi;
      dr[t[i]] = (fast_exp(target - z) - 1.0f) * gi;
    }
  });
}

#endif  // DEW_CPU_ISA
