// core/train/optim_sgd.cpp — the optimizer "sgd" (PyTorch semantics) over the fused sgd_update kernel.
// Invariants: the momentum buffer exists only when momentum > 0 (checkpoint slot "momentum"); each
// parameter's update uses its group's lr and weight-decay scales.
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/optim.hpp"
#include "registry/builtins.hpp"

namespace dew {

namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const Options& o) {
    momentum_ = float(o.get_double("momentum", 0.0));
    dampening_ = float(o.get_double("dampening", 0.0));
    weight_decay_ = float(o.get_double("weight_decay", 0.0));
    nesterov_ = o.get_bool("nesterov", false);
    DEW_USAGE_CHECK(momentum_ >= 0 && momentum_ < 1, "option 'optim.momentum' must be in [0, 1)");
    DEW_USAGE_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
                    "optim.nesterov needs momentum > 0 and dampening = 0");
  }
  void init(const std::vector<OptimParam>& params) override {
    params_ = params;
    if (momentum_ > 0) buf_ = zeros_like(params);
  }
  void update(float lr, float grad_scale, int64_t step) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      const OptimParam& op = params_[i];
      Tensor p = op.tensor;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      SgdParams sp{lr * op.lr_scale, momentum_, dampening_, weight_decay_ * op.weight_decay_scale,
                   grad_scale,       nesterov_, step};
      Tensor none;
      p.backend().sgd_update(p, g, momentum_ > 0 ? buf_[i].second : none, sp);
    }
  }
  std::map<std::string, NamedTensors> state() const override {
    if (momentum_ > 0) return {{"momentum", buf_}};
    return {};
  }
  std::string name() const override { return "sgd"; }

 private:
  float momentum_, dampening_, weight_decay_;
  bool nesterov_;
  std::vector<OptimParam> params_;
  NamedTensors buf_;
};

}  // namespace

void register_sgd_optimizer(Registrar& registrar) {
  registrar.add<Optimizer>({
      .name = "sgd",
      .description = "stochastic gradient descent with optional (Nesterov) momentum, PyTorch semantics",
      .factory = [](const Options& o) { return std::make_shared<Sgd>(o); },
      .options = {{"momentum", "0", "momentum factor in [0, 1)"},
                  {"dampening", "0", "dampening of the momentum"},
                  {"nesterov", "false", "Nesterov momentum (needs momentum > 0, dampening 0)"},
                  {"weight_decay", "0", "L2 penalty added to the gradient"}},
  });
}

}  // namespace dew
