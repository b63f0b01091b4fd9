// core/train/optim_muon.cpp — the optimizer "muon": Newton–Schulz orthogonalised momentum for the hidden
// matrices (Jordan et al. 2024), AdamW for every other parameter, with the Moonlight scaling (Liu et al.
// 2025, "Muon is Scalable for LLM Training") so that AdamW's learning rate and weight decay carry over.
//
// For a parameter of role `matrix` (a 2-D weight, or a convolution filter viewed as [out, in*kh*kw]) = [A, B]:
//   g   = grad * grad_scale
//   buf = momentum * buf + g                       (slot "momentum")
//   u   = nesterov ? g + momentum * buf : buf
//   O   = newton_schulz5(u)                         (≈ U V^T of u = U S V^T)
//   p   = p * (1 - lr * wd) - lr * rms_scale * sqrt(max(A, B)) * O
// O has RMS ≈ 1/sqrt(max(A, B)), so the step's RMS is ≈ rms_scale * lr (0.2 lr: AdamW's typical update RMS).
// Every other role (embedding, head, norm, bias) gets AdamW (adamw_update_group, after the matrices) with the same
// lr, betas, eps and weight decay as optimizer "adamw" (slots "m", "v"): its update is AdamW's, bit for bit.
//
// "muonclip" is the same optimizer with QK-Clip (Kimi K2, dew/qk_clip.hpp): qk_clip_tau() = optim.tau
// (default 100), which the trainer applies to the attention blocks after every update.
//
// Everything is the kernel algebra (matmul with alpha/beta, unary, binary, reduce) on the parameter's
// backend, so Muon runs on every backend; results are deterministic, so a resume is bit-exact.
#include <algorithm>
#include <cmath>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/optim.hpp"
#include "optim_common.hpp"
#include "registry/builtins.hpp"

namespace dew {

Tensor newton_schulz5(const Tensor& g, int64_t steps) {
  DEW_CHECK(g.ndim() == 2, "newton_schulz5: needs a matrix, got ", shape_str(g.shape()));
  DEW_CHECK(steps >= 0, "newton_schulz5: steps must be >= 0");
  NoGradGuard no_grad;
  constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  const int64_t rows = g.shape()[0], cols = g.shape()[1];
  const bool tall = rows > cols;
  const int64_t n = tall ? cols : rows;  // the side of the Gram matrix: the smaller one
  // X = G / (||G||_F + 1e-7), the scale computed on the device (no host read).
  const Tensor inv_norm = unary(add_scalar(sqrt(sum_squares(g)), 1e-7f), UnaryOp::reciprocal);
  Tensor x = mul(g, inv_norm);
  Backend& be = g.backend();
  const BackendPtr bp = g.backend_ptr();
  Tensor gram = Tensor::empty({n, n}, g.dtype(), bp), poly = Tensor::empty({n, n}, g.dtype(), bp);
  Tensor next = Tensor::empty({rows, cols}, g.dtype(), bp);
  const Tensor none;
  for (int64_t i = 0; i < steps; ++i) {
    // gram = X X^T (wide) or X^T X (tall)
    MatmulParams gp;
    gp.m = n;
    gp.n = n;
    gp.k = tall ? rows : cols;
    gp.trans_a = tall;
    gp.trans_b = !tall;
    be.matmul(x, x, none, gram, gp);
    // poly = b gram + c gram gram
    poly.copy_(gram);
    MatmulParams pp;
    pp.m = pp.n = pp.k = n;
    pp.alpha = c;
    pp.beta = b;
    be.matmul(gram, gram, none, poly, pp);
    // next = a X + poly X (wide) or a X + X poly (tall; poly is symmetric)
    next.copy_(x);
    MatmulParams np;
    np.m = rows;
    np.n = cols;
    np.k = tall ? cols : rows;
    np.beta = a;
    if (tall)
      be.matmul(x, poly, none, next, np);
    else
      be.matmul(poly, x, none, next, np);
    std::swap(x, next);
  }
  return x;
}

namespace {

class Muon final : public Optimizer {
 public:
  Muon(const Options& o, bool clip) : clip_(clip) {
    if (clip_) {
      tau_ = o.get_double("tau", 100.0);
      DEW_USAGE_CHECK(std::isfinite(tau_) && tau_ > 0, "option 'optim.tau' must be a positive max logit, got ", tau_);
    }
    momentum_ = float(o.get_double("momentum", 0.95));
    nesterov_ = o.get_bool("nesterov", true);
    ns_steps_ = o.get_int("ns_steps", 5);
    rms_scale_ = float(o.get_double("rms_scale", 0.2));
    auto [b1, b2] = read_betas(o, 0.9, 0.999);
    beta1_ = b1;
    beta2_ = b2;
    eps_ = float(o.get_double("eps", 1e-8));
    weight_decay_ = float(o.get_double("weight_decay", 0.01));
    DEW_USAGE_CHECK(momentum_ >= 0 && momentum_ < 1, "option 'optim.momentum' must be in [0, 1)");
    DEW_USAGE_CHECK(ns_steps_ >= 1 && ns_steps_ <= 20, "option 'optim.ns_steps' must be in [1, 20]");
    DEW_USAGE_CHECK(rms_scale_ > 0, "option 'optim.rms_scale' must be positive");
    DEW_USAGE_CHECK(eps_ > 0, "option 'optim.eps' must be positive");
    DEW_USAGE_CHECK(weight_decay_ >= 0, "option 'optim.weight_decay' must be >= 0");
  }

  void init(const std::vector<OptimParam>& params) override {
    params_ = params;
    for (const OptimParam& p : params) {
      const bool muon = p.role == ParamRole::matrix;
      DEW_USAGE_CHECK(!muon || p.tensor.ndim() >= 2, "muon: parameter '", p.name, "' ", shape_str(p.tensor.shape()),
                      " has the role matrix but is not a matrix; give it another role (optim.roles.<role>)");
      muon_.push_back(muon);
      const BackendPtr& be = p.tensor.backend_ptr();
      if (muon) {
        momentum_buf_.emplace_back(p.name, Tensor::zeros(p.tensor.shape(), p.tensor.dtype(), be));
        slot_.push_back(momentum_buf_.size() - 1);
      } else {
        m_.emplace_back(p.name, Tensor::zeros(p.tensor.shape(), p.tensor.dtype(), be));
        v_.emplace_back(p.name, Tensor::zeros(p.tensor.shape(), p.tensor.dtype(), be));
        slot_.push_back(m_.size() - 1);
      }
    }
  }

  void update(float lr, float grad_scale, int64_t step) override {
    NoGradGuard no_grad;
    AdamWGroups adamw;
    for (size_t i = 0; i < params_.size(); ++i) {
      const OptimParam& op = params_[i];
      Tensor p = op.tensor;
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      const float plr = lr * op.lr_scale, wd = weight_decay_ * op.weight_decay_scale;
      if (!muon_[i]) {
        adamw.add(p, g, m_[slot_[i]].second, v_[slot_[i]].second, plr, wd);
        continue;
      }
      const int64_t rows = p.shape()[0], cols = p.numel() / rows;
      Tensor& buf = momentum_buf_[slot_[i]].second;
      const Tensor gs = grad_scale == 1.0f ? g : scale(g, grad_scale);
      buf.copy_(add(scale(buf, momentum_), gs));
      const Tensor u = nesterov_ ? add(gs, scale(buf, momentum_)) : buf;
      const Tensor o = newton_schulz5(u.reshape({rows, cols}), ns_steps_);
      const float k = plr * rms_scale_ * std::sqrt(float(std::max(rows, cols)));
      p.copy_(sub(scale(p, 1.0f - plr * wd), scale(o.reshape(p.shape()), k)));
    }
    adamw.run(AdamWParams{lr, beta1_, beta2_, eps_, weight_decay_, grad_scale, step});
  }

  std::map<std::string, NamedTensors> state() const override {
    std::map<std::string, NamedTensors> s;
    if (!momentum_buf_.empty()) s["momentum"] = momentum_buf_;
    if (!m_.empty()) {
      s["m"] = m_;
      s["v"] = v_;
    }
    return s;
  }
  std::string name() const override { return clip_ ? "muonclip" : "muon"; }
  double qk_clip_tau() const override { return clip_ ? tau_ : 0.0; }

 private:
  float momentum_, rms_scale_, beta1_, beta2_, eps_, weight_decay_;
  bool nesterov_, clip_;
  double tau_ = 0.0;
  int64_t ns_steps_;
  std::vector<OptimParam> params_;
  std::vector<bool> muon_;
  std::vector<size_t> slot_;  // index into momentum_buf_ (Muon) or m_ / v_ (AdamW)
  NamedTensors momentum_buf_, m_, v_;
};

}  // namespace

void register_muon_optimizer(Registrar& registrar) {
  const std::vector<OptionSpec> muon_options = {
      {"momentum", "0.95", "Muon's momentum on the matrices"},
      {"nesterov", "true", "Nesterov momentum: orthogonalise g + momentum * buf"},
      {"ns_steps", "5", "quintic Newton-Schulz iterations"},
      {"rms_scale", "0.2", "step RMS per unit lr (Moonlight: AdamW's), via lr * rms_scale * sqrt(max(A, B))"},
      {"weight_decay", "0.01", "decoupled weight decay of every group (times lr), as adamw"},
      {"betas", "0.9, 0.999", "the AdamW part's moment decay rates"},
      {"eps", "1e-8", "the AdamW part's eps"}};
  registrar.add<Optimizer>({
      .name = "muon",
      .description = "Muon: Newton-Schulz orthogonalised momentum on the hidden matrices (Moonlight scaling), "
                     "AdamW on embeddings, head, norms and biases",
      .factory = [](const Options& o) { return std::make_shared<Muon>(o, false); },
      .options = muon_options,
  });
  std::vector<OptionSpec> clip_options = muon_options;
  clip_options.push_back({"tau", "100",
                          "QK-Clip threshold: after each update, the q/k projection rows of every attention query "
                          "group whose max logit s exceeded tau are scaled by sqrt(tau / s)"});
  registrar.add<Optimizer>({
      .name = "muonclip",
      .description = "MuonClip (Kimi K2): muon, plus QK-Clip of the attention heads whose max logit exceeds tau",
      .factory = [](const Options& o) { return std::make_shared<Muon>(o, true); },
      .options = clip_options,
  });
}

}  // namespace dew
