// core/train/optim.cpp — SGD / AdamW / LAMB over the backend's fused update kernels, LR schedules,
// the EMA, and the global gradient norm.
// Invariants: optimizer state is zero-initialised and named like its parameter; updates are in place;
// schedules depend only on the update count, so a resumed run sees the same learning rates.
#include <cmath>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/train.hpp"

namespace dew {

namespace {

NamedTensors zeros_like_all(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) out.emplace_back(name, Tensor::zeros(p.shape(), p.dtype(), p.backend_ptr()));
  return out;
}

std::pair<float, float> read_betas(Options& o, double b1, double b2) {
  const std::vector<double> betas = o.get_doubles("betas", {b1, b2});
  DEW_USAGE_CHECK(betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1,
                  "option 'optim.betas' must be two numbers in [0, 1), e.g. 0.9, 0.999");
  return {float(betas[0]), float(betas[1])};
}

class AdamLike final : public Optimizer {
 public:
  AdamLike(bool lamb, Options& o, const NamedTensors& params) : lamb_(lamb) {
    auto [b1, b2] = read_betas(o, 0.9, lamb ? 0.999 : 0.999);
    beta1_ = b1;
    beta2_ = b2;
    eps_ = float(o.get_double("eps", lamb ? 1e-6 : 1e-8));
    weight_decay_ = float(o.get_double("weight_decay", lamb ? 0.0 : 0.01));
    DEW_USAGE_CHECK(eps_ > 0, "option 'optim.eps' must be positive");
    DEW_USAGE_CHECK(weight_decay_ >= 0, "option 'optim.weight_decay' must be >= 0");
    m_ = zeros_like_all(params);
    v_ = zeros_like_all(params);
  }
  void update(const NamedTensors& params, float lr, float grad_scale, int64_t step) override {
    DEW_INTERNAL_ASSERT(params.size() == m_.size());
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i].second;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (lamb_) {
        LambParams lp{lr, beta1_, beta2_, eps_, weight_decay_, grad_scale, step};
        p.backend().lamb_update(p, g, m_[i].second, v_[i].second, lp);
      } else {
        AdamWParams ap{lr, beta1_, beta2_, eps_, weight_decay_, grad_scale, step};
        p.backend().adamw_update(p, g, m_[i].second, v_[i].second, ap);
      }
    }
  }
  std::map<std::string, NamedTensors> state() const override { return {{"m", m_}, {"v", v_}}; }
  std::string name() const override { return lamb_ ? "lamb" : "adamw"; }

 private:
  bool lamb_;
  float beta1_, beta2_, eps_, weight_decay_;
  NamedTensors m_, v_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(Options& o, const NamedTensors& params) {
    momentum_ = float(o.get_double("momentum", 0.0));
    dampening_ = float(o.get_double("dampening", 0.0));
    weight_decay_ = float(o.get_double("weight_decay", 0.0));
    nesterov_ = o.get_bool("nesterov", false);
    DEW_USAGE_CHECK(momentum_ >= 0 && momentum_ < 1, "option 'optim.momentum' must be in [0, 1)");
    DEW_USAGE_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
                    "optim.nesterov needs momentum > 0 and dampening = 0");
    if (momentum_ > 0) buf_ = zeros_like_all(params);
  }
  void update(const NamedTensors& params, float lr, float grad_scale, int64_t step) override {
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i].second;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      SgdParams sp{lr, momentum_, dampening_, weight_decay_, grad_scale, nesterov_, step};
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
  NamedTensors buf_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(Options& o, const NamedTensors& params) {
  const std::string name = o.get_string("name", "adamw");
  if (name == "adamw") return std::make_unique<AdamLike>(false, o, params);
  if (name == "lamb") return std::make_unique<AdamLike>(true, o, params);
  if (name == "sgd") return std::make_unique<Sgd>(o, params);
  DEW_USAGE_CHECK(false, "unknown optimizer 'optim.name = ", name, "'; known: sgd, adamw, lamb");
  return nullptr;
}

std::function<double(int64_t)> make_schedule(Options& o, double base_lr, int64_t total) {
  const std::string name = o.get_string("name", "constant");
  const int64_t warmup = o.get_int("warmup_steps", 0);
  const double min_lr = o.get_double("min_lr", 0.0);
  DEW_USAGE_CHECK(warmup >= 0, "option 'schedule.warmup_steps' must be >= 0");
  DEW_USAGE_CHECK(min_lr >= 0 && min_lr <= base_lr, "option 'schedule.min_lr' must be in [0, optim.lr]");
  DEW_USAGE_CHECK(name == "constant" || name == "cosine" || name == "linear",
                  "unknown schedule 'schedule.name = ", name, "'; known: constant, cosine, linear");
  return [=](int64_t step) -> double {
    if (warmup > 0 && step < warmup) return base_lr * double(step + 1) / double(warmup);
    if (name == "constant") return base_lr;
    const double span = double(std::max<int64_t>(total - warmup, 1));
    const double t = std::min(1.0, double(step - warmup) / span);
    if (name == "cosine") return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * t));
    return base_lr + (min_lr - base_lr) * t;  // linear decay
  };
}

// ---------------------------------------------------------------- EMA

Ema::Ema(const NamedTensors& params, double max_decay, bool warmup) : max_decay_(max_decay), warmup_(warmup) {
  DEW_USAGE_CHECK(max_decay >= 0 && max_decay < 1, "option 'trainer.ema_decay' must be in [0, 1)");
  for (const auto& [name, p] : params) ema_.emplace_back(name, p.detach().clone());
}

double Ema::decay_at(int64_t step) const {
  if (!warmup_) return max_decay_;
  return std::min(max_decay_, (1.0 + double(step)) / (10.0 + double(step)));
}

void Ema::update(const NamedTensors& params, int64_t step) {
  const float d = float(decay_at(step));
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].second;
    Tensor& e = ema_[i].second;
    Backend& be = p.backend();
    // e += (1 - d) * (p - e)
    Tensor diff = Tensor::empty(p.shape(), p.dtype(), p.backend_ptr());
    be.binary(p, e, diff, BinaryOp::sub);
    be.unary(diff, diff, UnaryParams{UnaryOp::affine, 1.0f - d, 0.0f});
    be.binary(e, diff, e, BinaryOp::add);
  }
}

void Ema::swap_into(const NamedTensors& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i].second;
    Tensor tmp = p.detach().clone();
    p.copy_(ema_[i].second);
    ema_[i].second.copy_(tmp);
  }
}

double global_grad_norm(const NamedTensors& params) {
  double total = 0.0;
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (g.defined()) total += sum_squares(g).item();
  }
  return std::sqrt(total);
}

}  // namespace dew
