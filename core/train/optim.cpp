// core/train/optim.cpp — what every optimizer and schedule shares: parameter roles and groups, creating
// them from the registry (make_optimizer, make_schedule), the EMA and the global gradient norm. The
// optimizers themselves are in optim_<family>.cpp, the schedules in schedules.cpp.
// Invariants: roles and groups depend only on names, shapes and [optim] keys (the same on every rank
// and on resume); the EMA and the norm change nothing but their own outputs.
#include "dew/optim.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"
#include "optim_common.hpp"

namespace dew {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

constexpr ParamRole kRoles[] = {ParamRole::matrix, ParamRole::embedding, ParamRole::head, ParamRole::norm,
                                ParamRole::bias};

}  // namespace

const char* role_name(ParamRole role) {
  switch (role) {
    case ParamRole::matrix:
      return "matrix";
    case ParamRole::embedding:
      return "embedding";
    case ParamRole::head:
      return "head";
    case ParamRole::norm:
      return "norm";
    case ParamRole::bias:
      return "bias";
  }
  return "?";
}

ParamRole role_from_name(const std::string& name) {
  for (ParamRole r : kRoles)
    if (name == role_name(r)) return r;
  DEW_USAGE_CHECK(false, "unknown parameter role '", name, "'; known: matrix, embedding, head, norm, bias");
  return ParamRole::matrix;
}

ParamRole param_role(const std::string& name, const Shape& shape) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = name.find('.', start);
    parts.push_back(lower(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start)));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const std::string& own = parts.back();
  if (shape.size() < 2) {
    const bool bias = own == "bias" || ends_with(own, "_bias");
    return bias ? ParamRole::bias : ParamRole::norm;
  }
  for (const std::string& p : parts)
    if (p.find("embed") != std::string::npos || p == "emb" || p.rfind("emb_", 0) == 0 || ends_with(p, "_emb") ||
        p == "wte" || p == "wpe")
      return ParamRole::embedding;
  for (const std::string& p : parts)
    if (p.find("head") != std::string::npos || p == "output" || p == "classifier") return ParamRole::head;
  if (parts.size() >= 2 && parts[0] == "final_layer" && parts[1] == "linear") return ParamRole::head;
  return ParamRole::matrix;
}

std::vector<OptimParam> optim_params(const Options& o, const NamedTensors& params) {
  std::vector<std::pair<ParamRole, std::vector<std::string>>> overrides;
  std::vector<bool> no_decay(std::size(kRoles), false);
  std::vector<float> lr_scale(std::size(kRoles), 1.0f);
  for (ParamRole r : kRoles) {
    const std::string role = role_name(r);
    if (o.has("roles." + role)) overrides.emplace_back(r, o.get_strings("roles." + role, {}));
    const double s = o.get_double("lr_scale." + role, 1.0);
    DEW_USAGE_CHECK(s >= 0, "option 'optim.lr_scale.", role, "' must be >= 0");
    lr_scale[size_t(r)] = float(s);
  }
  for (const std::string& r : o.get_strings("no_decay", {"norm", "bias", "embedding"})) {
    if (r == "none") continue;
    no_decay[size_t(role_from_name(r))] = true;
  }
  std::vector<OptimParam> out;
  out.reserve(params.size());
  for (const auto& [name, t] : params) {
    OptimParam p;
    p.name = name;
    p.tensor = t;
    p.role = param_role(name, t.shape());
    for (const auto& [role, patterns] : overrides)
      if (matches_any_glob(name, patterns)) {
        p.role = role;
        break;
      }
    p.lr_scale = lr_scale[size_t(p.role)];
    p.weight_decay_scale = no_decay[size_t(p.role)] ? 0.0f : 1.0f;
    out.push_back(std::move(p));
  }
  return out;
}

NamedTensors zeros_like(const std::vector<OptimParam>& params) {
  NamedTensors out;
  for (const OptimParam& p : params)
    out.emplace_back(p.name, Tensor::zeros(p.tensor.shape(), p.tensor.dtype(), p.tensor.backend_ptr()));
  return out;
}

std::pair<float, float> read_betas(const Options& o, double b1, double b2) {
  const std::vector<double> betas = o.get_doubles("betas", {b1, b2});
  DEW_USAGE_CHECK(betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1,
                  "option 'optim.betas' must be two numbers in [0, 1), e.g. 0.9, 0.999");
  return {float(betas[0]), float(betas[1])};
}

void AdamWGroups::run(const AdamWParams& shared) {
  for (size_t begin = 0; begin < slots_.size();) {
    const BackendPtr backend = slots_[begin].param.backend_ptr();
    const DType dtype = slots_[begin].param.dtype();
    size_t end = begin + 1;
    while (end < slots_.size() && slots_[end].param.backend_ptr() == backend && slots_[end].param.dtype() == dtype)
      ++end;
    std::vector<AdamWSlot> run(std::make_move_iterator(slots_.begin() + std::ptrdiff_t(begin)),
                               std::make_move_iterator(slots_.begin() + std::ptrdiff_t(end)));
    backend->adamw_update_group(run, shared);
    begin = end;
  }
  slots_.clear();
}

std::shared_ptr<Optimizer> make_optimizer(const Options& o, const NamedTensors& params) {
  const std::string name = o.get_string("name", "adamw");
  std::shared_ptr<Optimizer> opt = Registry::global().create<Optimizer>(name, o);
  opt->init(optim_params(o, params));
  return opt;
}

std::function<double(int64_t)> make_schedule(const Options& o, double base_lr, int64_t total) {
  const std::string name = o.get_string("name", "constant");
  std::shared_ptr<Schedule> s = Registry::global().create<Schedule>(name, o);
  s->init(base_lr, total);
  return [s](int64_t step) { return s->lr(step); };
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

void lerp_towards(const std::vector<Tensor>& averages, const std::vector<Tensor>& targets, float weight) {
  DEW_CHECK(averages.size() == targets.size(), "lerp_towards: ", averages.size(), " averages but ", targets.size(),
            " targets");
  // One group per backend and dtype, in order of first appearance (slots keep their order inside a group).
  std::vector<std::vector<LerpSlot>> groups;
  for (size_t i = 0; i < averages.size(); ++i) {
    const Tensor &a = averages[i], &t = targets[i];
    DEW_CHECK(a.defined() && t.defined(), "lerp_towards: pair ", i, " lacks a tensor");
    DEW_CHECK(a.backend_ptr() == t.backend_ptr(), "lerp_towards: pair ", i, " lies on two backends (",
              a.backend().name(), ", ", t.backend().name(), ")");
    auto same = [&](const std::vector<LerpSlot>& g) {
      return g[0].average.backend_ptr() == a.backend_ptr() && g[0].average.dtype() == a.dtype();
    };
    auto g = std::find_if(groups.begin(), groups.end(), same);
    if (g == groups.end()) g = groups.insert(groups.end(), std::vector<LerpSlot>{});
    g->push_back({a.detach(), t.detach()});
  }
  for (std::vector<LerpSlot>& g : groups) {
    Backend& be = g[0].average.backend();
    if (be.supports(Kernel::lerp_group, g[0].average.dtype()).ok)
      be.lerp_group(g, weight);
    else
      lerp_each(be, g, weight);
  }
}

void Ema::update(const NamedTensors& params, int64_t step) {
  const float d = float(decay_at(step));
  std::vector<Tensor> averages, targets;
  for (size_t i = 0; i < params.size(); ++i) {
    averages.push_back(ema_[i].second);
    targets.push_back(params[i].second);
  }
  lerp_towards(averages, targets, 1.0f - d);
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
  std::vector<Tensor> grads;
  for (const auto& [name, p] : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(g);
  if (grads.empty()) return 0.0;
  double total = 0.0;
  for (const double sq : sum_squares_each(grads).to_doubles()) total += sq;  // one host read, in parameter order
  return std::sqrt(total);
}

}  // namespace dew
