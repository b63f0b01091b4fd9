// cpu/optim.cpp — fused AdamW (one tensor, or a group slot by slot), SGD (momentum, dampening, Nesterov) and LAMB
// updates, in place (f32).
//
// One pass over param/grad/m/v per element for AdamW and SGD (memory-bound: each byte is read and
// written once). LAMB needs ||p|| and ||r|| before it can step, so it makes two passes: the first updates
// m, v and accumulates both norms (double, per-thread partials combined in thread order), the second
// recomputes r from the new m, v and applies p -= lr * trust_ratio * r.
// AdamW follows PyTorch: p *= 1 - lr*wd; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), with the bias
// corrections bc = 1 - beta^step computed in double.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. AdamW and SGD are one
//   expression per element, FMA alike on avx512 and avx2: the same bits on both (resume bit-exactness holds
//   across them too); portable differs by FMA roundings. LAMB's norms are double lane sums (the trust ratio
//   agrees in practice, within an ulp by guarantee).
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <cmath>
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "optim.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(adamw_update, (Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p), (param, grad, m, v, p))
DEW_CPU_ISA_KERNEL(sgd_update, (Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p), (param, grad, momentum_buf, p))
DEW_CPU_ISA_KERNEL(lamb_update, (Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p), (param, grad, m, v, p))

// Slot by slot: the update is bound by memory here, and a call costs microseconds next to what it streams.
void CpuBackend::adamw_update_group_kernel(std::vector<AdamWSlot>& slots, const AdamWParams& p) {
  adamw_update_each(*this, slots, p);
}

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

void check_state(const Tensor& param, const Tensor& t, const char* kernel, const char* arg) {
  require_f32(t, kernel, arg);
  DEW_CHECK(t.numel() == param.numel(), "cpu ", kernel, ": ", arg, " ", shape_str(t.shape()), " does not match param ",
            shape_str(param.shape()));
}

// The elementwise updates over [lo, hi), with every pointer and scalar a by-value parameter: in a lambda
// that for_blocks also hands to a parallel region, captured floats are address-taken and may alias the
// float stores, and GCC then leaves the loop scalar.
struct AdamWScalars {
  float b1, b2, c1, c2, eps, scale, step_size, inv_sqrt_bc2, decay;
};
void adamw_range(float* w, const float* g, float* m, float* v, int64_t lo, int64_t hi, AdamWScalars c) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = g[i] * c.scale;
    const float mi = c.b1 * m[i] + c.c1 * gi;
    const float vi = c.b2 * v[i] + c.c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    w[i] = w[i] * c.decay - c.step_size * mi / denom;
  }
}
void sgd_plain_range(float* w, const float* g, int64_t lo, int64_t hi, float lr, float wd, float scale) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) w[i] -= lr * (g[i] * scale + wd * w[i]);
}
void sgd_momentum_range(float* w, const float* g, float* buf, int64_t lo, int64_t hi, float lr, float wd, float scale,
                        float mom, float damp, bool first, bool nesterov) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = g[i] * scale + wd * w[i];
    const float bi = first ? gi : mom * buf[i] + damp * gi;
    buf[i] = bi;
    w[i] -= lr * (nesterov ? gi + mom * bi : bi);
  }
}

}  // namespace

void adamw_update(CpuBackend& self, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  require_f32(param, "adamw_update", "param");
  check_state(param, grad, "adamw_update", "grad");
  check_state(param, m, "adamw_update", "m");
  check_state(param, v, "adamw_update", "v");
  DEW_CHECK(p.step >= 1, "cpu adamw_update: step ", p.step, " must count from 1");
  const int64_t n = param.numel();
  float* w = param.data_as<float>();
  const float* g = grad.data_as<float>();
  float* ms = m.data_as<float>();
  float* vs = v.data_as<float>();
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  const float step_size = float(double(p.lr) / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - p.lr * p.weight_decay;
  const AdamWScalars c{p.beta1,      p.beta2,   1.0f - p.beta1, 1.0f - p.beta2, p.eps,
                       p.grad_scale, step_size, inv_sqrt_bc2,   decay};
  for_blocks(n, parallel_worth(n), [&](int64_t lo, int64_t hi) { adamw_range(w, g, ms, vs, lo, hi, c); });
}

void sgd_update(CpuBackend& self, Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  require_f32(param, "sgd_update", "param");
  check_state(param, grad, "sgd_update", "grad");
  const int64_t n = param.numel();
  float* w = param.data_as<float>();
  const float* g = grad.data_as<float>();
  const float lr = p.lr, wd = p.weight_decay, scale = p.grad_scale, mom = p.momentum, damp = 1.0f - p.dampening;
  if (p.momentum == 0.0f) {
    for_blocks(n, parallel_worth(n), [&](int64_t lo, int64_t hi) { sgd_plain_range(w, g, lo, hi, lr, wd, scale); });
    return;
  }
  check_state(param, momentum_buf, "sgd_update", "momentum_buf");
  float* buf = momentum_buf.data_as<float>();
  const bool first = p.step == 1, nesterov = p.nesterov;
  for_blocks(n, parallel_worth(n), [&](int64_t lo, int64_t hi) {
    sgd_momentum_range(w, g, buf, lo, hi, lr, wd, scale, mom, damp, first, nesterov);
  });
}

void lamb_update(CpuBackend& self, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p) {
  require_f32(param, "lamb_update", "param");
  check_state(param, grad, "lamb_update", "grad");
  check_state(param, m, "lamb_update", "m");
  check_state(param, v, "lamb_update", "v");
  DEW_CHECK(p.step >= 1, "cpu lamb_update: step ", p.step, " must count from 1");
  const int64_t n = param.numel();
  float* w = param.data_as<float>();
  const float* g = grad.data_as<float>();
  float* ms = m.data_as<float>();
  float* vs = v.data_as<float>();
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(p.beta1), double(p.step))));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(p.beta2), double(p.step))));
  const float b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2, eps = p.eps, wd = p.weight_decay;
  const float scale = p.grad_scale;
  const int nthreads = parallel_worth(n) ? omp_get_max_threads() : 1;
  std::vector<double> pn(size_t(nthreads), 0.0), rn(size_t(nthreads), 0.0);
#pragma omp parallel num_threads(nthreads)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    double sp = 0.0, sr = 0.0;
#pragma omp simd reduction(+ : sp, sr)
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i] * scale;
      const float mi = b1 * ms[i] + c1 * gi;
      const float vi = b2 * vs[i] + c2 * gi * gi;
      ms[i] = mi;
      vs[i] = vi;
      const float r = (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps) + wd * w[i];
      sp += double(w[i]) * double(w[i]);
      sr += double(r) * double(r);
    }
    pn[size_t(t)] = sp;
    rn[size_t(t)] = sr;
  }
  double sp = 0.0, sr = 0.0;
  for (int t = 0; t < nthreads; ++t) {
    sp += pn[size_t(t)];
    sr += rn[size_t(t)];
  }
  const double pnorm = std::sqrt(sp), rnorm = std::sqrt(sr);
  const float ratio = (pnorm > 0.0 && rnorm > 0.0) ? float(pnorm / rnorm) : 1.0f;
  const float step = p.lr * ratio;
#pragma omp parallel for simd schedule(static) num_threads(nthreads)
  for (int64_t i = 0; i < n; ++i) {
    const float r = (ms[i] * inv_bc1) / (std::sqrt(vs[i] * inv_bc2) + eps) + wd * w[i];
    w[i] -= step * r;
  }
}

#endif  // DEW_CPU_ISA
