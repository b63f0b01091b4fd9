// core/nn/module.cpp — Module bookkeeping: named parameters, initialisation by name, train/eval mode.
#include <cmath>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/random.hpp"
#include "ops/kernel_call.hpp"

namespace dew::nn {

void init_tensor(Tensor& t, const Init& init, uint64_t seed, uint64_t stream) {
  if (t.numel() == 0) return;
  NoGradGuard no_grad;
  switch (init.kind) {
    case Init::automatic:
    case Init::zeros:
      detail::kernels(t).fill(t, 0.0);
      return;
    case Init::ones:
      detail::kernels(t).fill(t, 1.0);
      return;
    case Init::constant:
      detail::kernels(t).fill(t, init.a);
      return;
    case Init::normal:
      t.copy_(Tensor::normal(t.shape(), init.a, init.b, seed, stream, t.backend_ptr(), t.dtype()));
      return;
    case Init::uniform:
      t.copy_(Tensor::uniform(t.shape(), init.a, init.b, seed, stream, t.backend_ptr(), t.dtype()));
      return;
  }
}

Module::Module() {
  if (has_default_backend()) backend_ = default_backend();
}

const BackendPtr& Module::backend() const {
  // No backend at construction: default_backend() gives the error and its hint.
  return backend_ ? backend_ : default_backend();
}

Tensor Module::register_parameter(const std::string& name, const Shape& shape, Init init) {
  if (!backend_) backend_ = default_backend();  // made before any default backend was set
  DEW_CHECK(init.kind != Init::automatic, "internal: parameter '", name, "' has no init rule");
  Tensor t = Tensor::empty(shape, dtype_, backend_);
  init_tensor(t, init, 0, philox::stream_of(name.c_str()));
  t.set_requires_grad(true);
  params_.push_back({name, t, init});
  return t;
}

void Module::remove_parameter(const std::string& name) {
  for (auto it = params_.begin(); it != params_.end(); ++it)
    if (it->name == name) {
      params_.erase(it);
      return;
    }
  DEW_CHECK(false, "internal: no parameter '", name, "' to remove");
}

void Module::for_each_module(const std::function<void(const std::string& path, Module& m)>& fn,
                             const std::string& prefix) {
  fn(prefix, *this);
  for (const auto& [name, child] : children_)
    if (child) child->for_each_module(fn, name.empty() ? prefix : prefix.empty() ? name : prefix + "." + name);
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const Param& p : params_) out.emplace_back(prefix + p.name, p.tensor);
  for (const auto& [name, child] : children_)
    if (child) child->collect(name.empty() ? prefix : prefix + name + ".", out);
}

void Module::collect_params(const std::string& prefix, std::vector<std::pair<std::string, const Param*>>& out) const {
  for (const Param& p : params_) out.emplace_back(prefix + p.name, &p);
  for (const auto& [name, child] : children_)
    if (child) child->collect_params(name.empty() ? prefix : prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::initialize(uint64_t seed) {
  std::vector<std::pair<std::string, const Param*>> all;
  collect_params("", all);
  for (auto& [name, p] : all) {
    Tensor t = p->tensor;
    init_tensor(t, p->init, seed, philox::stream_of(name.c_str()));
  }
}

void Module::set_training(bool on) {
  training_ = on;
  for (auto& [n, c] : children_)
    if (c) c->set_training(on);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

}  // namespace dew::nn
