// core/train/optim_adamw.cpp — the optimizers "adamw" and "lamb" over the backend's fused update kernels.
// Invariants: state m, v is zero-initialised and named like its parameter; each parameter's update uses
// lr * lr_scale and weight_decay * weight_decay_scale (its group's), so with the default groups the
// update is the fused kernel's exactly. AdamW hands all its tensors to one adamw_update_group call (a few
// launches on a device; the bits of adamw_update on each).
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/optim.hpp"
#include "optim_common.hpp"
#include "registry/builtins.hpp"

namespace dew {

namespace {

class AdamLike final : public Optimizer {
 public:
  AdamLike(bool lamb, const Options& o) : lamb_(lamb) {
    auto [b1, b2] = read_betas(o, 0.9, 0.999);
    beta1_ = b1;
    beta2_ = b2;
    eps_ = float(o.get_double("eps", lamb ? 1e-6 : 1e-8));
    weight_decay_ = float(o.get_double("weight_decay", lamb ? 0.0 : 0.01));
    DEW_USAGE_CHECK(eps_ > 0, "option 'optim.eps' must be positive");
    DEW_USAGE_CHECK(weight_decay_ >= 0, "option 'optim.weight_decay' must be >= 0");
  }
  void init(const std::vector<OptimParam>& params) override {
    params_ = params;
    m_ = zeros_like(params);
    v_ = zeros_like(params);
  }
  void update(float lr, float grad_scale, int64_t step) override {
    AdamWGroups adamw;
    for (size_t i = 0; i < params_.size(); ++i) {
      const OptimParam& op = params_[i];
      Tensor p = op.tensor;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      const float plr = lr * op.lr_scale, wd = weight_decay_ * op.weight_decay_scale;
      if (lamb_) {
        LambParams lp{plr, beta1_, beta2_, eps_, wd, grad_scale, step};
        p.backend().lamb_update(p, g, m_[i].second, v_[i].second, lp);
      } else {
        adamw.add(p, g, m_[i].second, v_[i].second, plr, wd);
      }
    }
    adamw.run(AdamWParams{lr, beta1_, beta2_, eps_, weight_decay_, grad_scale, step});
  }
  std::map<std::string, NamedTensors> state() const override { return {{"m", m_}, {"v", v_}}; }
  std::string name() const override { return lamb_ ? "lamb" : "adamw"; }

 private:
  bool lamb_;
  float beta1_, beta2_, eps_, weight_decay_;
  std::vector<OptimParam> params_;
  NamedTensors m_, v_;
};

}  // namespace

void register_adamw_optimizers(Registrar& registrar) {
  registrar.add<Optimizer>({
      .name = "adamw",
      .description = "Adam with decoupled weight decay (Loshchilov & Hutter 2019), the fused adamw_update_group kernel",
      .factory = [](const Options& o) { return std::make_shared<AdamLike>(false, o); },
      .options = {{"betas", "0.9, 0.999", "the moment decay rates b1, b2"},
                  {"eps", "1e-8", "added to sqrt(v_hat)"},
                  {"weight_decay", "0.01", "decoupled weight decay (times lr)"}},
  });
  registrar.add<Optimizer>({
      .name = "lamb",
      .description = "LAMB (You et al. 2019): the AdamW direction scaled by the layer's trust ratio",
      .factory = [](const Options& o) { return std::make_shared<AdamLike>(true, o); },
      .options = {{"betas", "0.9, 0.999", "the moment decay rates b1, b2"},
                  {"eps", "1e-6", "added to sqrt(v_hat)"},
                  {"weight_decay", "0", "decoupled weight decay, inside the trust ratio"}},
  });
}

}  // namespace dew
