// examples/lion_optimizer/lion.cpp — the whole plugin: the Lion optimizer (Chen et al. 2023, "Symbolic
// Discovery of Optimization Algorithms", Algorithm 2) registered as optimizer 'lion'.
//
//   c = b1 m + (1 - b1) g          the interpolated direction
//   p = p (1 - lr wd) - lr sign(c) decoupled weight decay, then a step of the same size in every coordinate
//   m = b2 m + (1 - b2) g          the momentum is updated after the step, with the second rate
//
// g is the gradient times grad_scale (the trainer's global-norm clipping); sign(0) = 0. Written with the
// SDK's tensor ops (dew/ops.hpp) under a NoGradGuard, so it runs on every backend; the state is one slot,
// "m", which the trainer checkpoints and restores (a resumed run is bit-exact).
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/ops.hpp>
#include <dew/optim.hpp>
#include <dew/registry.hpp>
#include <memory>
#include <string>
#include <vector>

namespace {

class Lion final : public dew::Optimizer {
 public:
  explicit Lion(const dew::Options& o) {
    const std::vector<double> betas = o.get_doubles("betas", {0.9, 0.99});
    DEW_USAGE_CHECK(betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1,
                    "option 'optim.betas' must be two numbers in [0, 1), e.g. 0.9, 0.99");
    beta1_ = float(betas[0]);
    beta2_ = float(betas[1]);
    weight_decay_ = float(o.get_double("weight_decay", 0.0));
    DEW_USAGE_CHECK(weight_decay_ >= 0, "option 'optim.weight_decay' must be >= 0");
  }

  void init(const std::vector<dew::OptimParam>& params) override {
    params_ = params;
    m_ = dew::zeros_like(params);
  }

  void update(float lr, float grad_scale, int64_t /*step*/) override {
    dew::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      dew::Tensor p = params_[i].tensor;
      const dew::Tensor g = p.grad();
      if (!g.defined()) continue;
      dew::Tensor& m = m_[i].second;
      const float plr = lr * params_[i].lr_scale, wd = weight_decay_ * params_[i].weight_decay_scale;
      const dew::Tensor zero = dew::Tensor::zeros({1}, p.dtype(), p.backend_ptr());
      const dew::Tensor c = m * beta1_ + g * ((1.0f - beta1_) * grad_scale);
      const dew::Tensor sign = dew::compare(c, zero, dew::BinaryOp::gt) - dew::compare(c, zero, dew::BinaryOp::lt);
      p.copy_(p * (1.0f - plr * wd) - sign * plr);
      m.copy_(m * beta2_ + g * ((1.0f - beta2_) * grad_scale));
    }
  }

  std::map<std::string, dew::NamedTensors> state() const override { return {{"m", m_}}; }
  std::string name() const override { return "lion"; }

 private:
  float beta1_ = 0.9f, beta2_ = 0.99f, weight_decay_ = 0.0f;
  std::vector<dew::OptimParam> params_;
  dew::NamedTensors m_;
};

}  // namespace

DEW_PLUGIN("lion", "0.1.0") {
  registrar.add<dew::Optimizer>({
      .name = "lion",
      .description = "Lion (Chen et al. 2023): the sign of an interpolated momentum (an out-of-tree example plugin)",
      .factory = [](const dew::Options& o) { return std::make_shared<Lion>(o); },
      .options = {{"betas", "0.9, 0.99", "b1 interpolates the step's direction, b2 updates the momentum"},
                  {"weight_decay", "0", "decoupled weight decay (times lr); Lion wants 3-10x AdamW's"}},
  });
}
