// optim.cpp — the fused optimizer updates (AdamW, alone or as a group; SGD; LAMB), in place on param and state.
// Invariants: all optimizer arithmetic runs in double with the f32 hyper-parameters widened once; grad is
// multiplied by grad_scale before anything else.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ref_backend.hpp"

namespace dew::ref {

// ---------------------------------------------------------------- optimizers

namespace {
// Adam's moment update of one element and its bias-corrected direction m^ / (sqrt(v^) + eps), shared by
// AdamW and LAMB (bc1, bc2: 1 - beta^step). The direction comes as its two factors so that each caller keeps
// its own association (AdamW: lr * m^ / d).
struct AdamDirection {
  double m_hat, denominator;
};
struct AdamMoments {
  double b1, b2, bc1, bc2, eps;
  AdamMoments(double beta1, double beta2, double epsilon, int64_t step)
      : b1(beta1), b2(beta2), bc1(1.0 - std::pow(beta1, double(step))), bc2(1.0 - std::pow(beta2, double(step))),
        eps(epsilon) {}
  template <class T>
  AdamDirection direction(T& m, T& v, double g) const {
    const double mi = b1 * double(m) + (1.0 - b1) * g;
    const double vi = b2 * double(v) + (1.0 - b2) * g * g;
    m = T(mi);
    v = T(vi);
    return {mi / bc1, std::sqrt(vi / bc2) + eps};
  }
};
}  // namespace

void RefBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  constexpr Kernel K = Kernel::adamw_update;
  dispatch_float(param.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(grad, param.dtype(), param.numel(), K, "grad");
    expect(m, param.dtype(), param.numel(), K, "m");
    expect(v, param.dtype(), param.numel(), K, "v");
    DEW_CHECK(p.step >= 1, "ref.adamw_update: step ", p.step, " must count from 1");
    const double lr = p.lr, wd = p.weight_decay, scale = p.grad_scale;
    const AdamMoments adam(p.beta1, p.beta2, p.eps, p.step);
    T* w = param.data_as<T>();
    T* ms = m.data_as<T>();
    T* vs = v.data_as<T>();
    const T* gs = grad.data_as<T>();
    for (int64_t i = 0; i < param.numel(); ++i) {
      double x = double(w[i]);
      x -= lr * wd * x;  // decoupled weight decay
      const AdamDirection d = adam.direction(ms[i], vs[i], double(gs[i]) * scale);
      x -= lr * d.m_hat / d.denominator;
      w[i] = T(x);
    }
  });
}

// The definition of the group: adamw_update slot by slot.
void RefBackend::adamw_update_group(std::vector<AdamWSlot>& slots, const AdamWParams& p) {
  adamw_update_each(*this, slots, p);
}

// The definition of the group: sub, affine and add slot by slot.
void RefBackend::lerp_group(std::vector<LerpSlot>& slots, float weight) { lerp_each(*this, slots, weight); }

void RefBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  constexpr Kernel K = Kernel::sgd_update;
  dispatch_float(param.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(grad, param.dtype(), param.numel(), K, "grad");
    const bool use_buf = p.momentum != 0.0f;
    if (use_buf) expect(momentum_buf, param.dtype(), param.numel(), K, "momentum_buf");
    DEW_CHECK(p.step >= 1, "ref.sgd_update: step ", p.step, " must count from 1");
    const double lr = p.lr, mom = p.momentum, damp = p.dampening, wd = p.weight_decay, scale = p.grad_scale;
    T* w = param.data_as<T>();
    const T* gs = grad.data_as<T>();
    T* buf = use_buf ? momentum_buf.data_as<T>() : nullptr;
    for (int64_t i = 0; i < param.numel(); ++i) {
      double g = double(gs[i]) * scale + wd * double(w[i]);
      if (use_buf) {
        const double b = p.step == 1 ? g : mom * double(buf[i]) + (1.0 - damp) * g;
        buf[i] = T(b);
        g = p.nesterov ? g + mom * b : b;
      }
      w[i] = T(double(w[i]) - lr * g);
    }
  });
}

void RefBackend::lamb_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p) {
  constexpr Kernel K = Kernel::lamb_update;
  dispatch_float(param.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(grad, param.dtype(), param.numel(), K, "grad");
    expect(m, param.dtype(), param.numel(), K, "m");
    expect(v, param.dtype(), param.numel(), K, "v");
    DEW_CHECK(p.step >= 1, "ref.lamb_update: step ", p.step, " must count from 1");
    const double lr = p.lr, wd = p.weight_decay, scale = p.grad_scale;
    const AdamMoments adam(p.beta1, p.beta2, p.eps, p.step);
    T* w = param.data_as<T>();
    T* ms = m.data_as<T>();
    T* vs = v.data_as<T>();
    const T* gs = grad.data_as<T>();
    const int64_t n = param.numel();
    // Pass 1: moments, the direction r and the two norms (of p before the update, and of r).
    std::vector<double> r(static_cast<size_t>(n));
    double p_sq = 0, r_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const AdamDirection d = adam.direction(ms[i], vs[i], double(gs[i]) * scale);
      r[size_t(i)] = d.m_hat / d.denominator + wd * double(w[i]);
      p_sq += double(w[i]) * double(w[i]);
      r_sq += r[size_t(i)] * r[size_t(i)];
    }
    const double p_norm = std::sqrt(p_sq), r_norm = std::sqrt(r_sq);
    const double ratio = (p_norm > 0 && r_norm > 0) ? p_norm / r_norm : 1.0;
    // Pass 2: the step.
    for (int64_t i = 0; i < n; ++i) w[i] = T(double(w[i]) - lr * ratio * r[size_t(i)]);
  });
}

}  // namespace dew::ref
