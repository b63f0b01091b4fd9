// core/train/reference_policy.cpp — dew::ReferencePolicy (dew/reference_policy.hpp): the starting weights as a frozen
// copy or as the LoRA policy's base, for the dpo and grpo objectives.
#include "dew/reference_policy.hpp"

#include <map>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/lora.hpp"
#include "dew/nn.hpp"

namespace dew {

ReferencePolicy::ReferencePolicy(Model& policy, const Options& model_options, const std::string& mode, uint64_t seed,
                                 const char* option)
    : policy_(policy), model_options_(model_options), mode_(mode) {
  DEW_USAGE_CHECK(mode_ == "auto" || mode_ == "copy", "option '", option, "' must be auto or copy, got '", mode_, "'");
  copy_ = create_model(model_options_);  // overwritten by the starting weights at freeze()
  copy_->initialize(seed);
  copy_->set_training(false);
  backend_ = default_backend();
  ready_ = Tensor::full({1}, 0.0, DType::f32, backend_);
}

ReferencePolicy::Kind ReferencePolicy::kind() {
  if (mode_ != "auto" || base_copied_) return Kind::copy;
  bool adapters = false;
  for (const auto& [n, t] : policy_.named_parameters()) {
    const bool lora = is_lora_parameter(n);
    if (t.requires_grad() && !lora) return Kind::copy;
    adapters = adapters || lora;
  }
  if (!adapters) return Kind::copy;
  copy_.reset();  // the base serves: the copy's memory is the point
  return Kind::base;
}

void ReferencePolicy::copy_policy_into_reference() {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> src;
  for (auto& [n, t] : policy_.named_parameters()) src.emplace(n, t);
  for (auto& [n, t] : copy_->named_parameters()) {
    auto it = src.find(n);
    DEW_INTERNAL_ASSERT(it != src.end());
    t.copy_(it->second);
  }
}

// By name: a policy with LoRA adapters and mode copy has the copy's parameters and its adapters, whose B = 0 leaves
// the policy equal to the reference at the first step.
void ReferencePolicy::freeze() {
  if (ready_.item() != 0.0) return;
  if (kind() == Kind::copy) copy_policy_into_reference();
  ready_.copy_(Tensor::full({1}, 1.0, DType::f32, backend_));
}

NamedTensors ReferencePolicy::state() {
  NamedTensors s;
  if (kind() == Kind::copy)
    for (auto& [n, t] : copy_->named_parameters()) s.emplace_back("reference." + n, t);
  s.emplace_back("reference_ready", ready_);
  return s;
}

void ReferencePolicy::run(const std::function<void(Model&)>& fn) {
  NoGradGuard no_grad;
  if (kind() == Kind::copy) {
    fn(*copy_);
    return;
  }
  nn::LoraAdaptersOff base;
  const bool was = policy_.training();
  policy_.set_training(false);
  try {
    fn(policy_);
  } catch (...) {
    policy_.set_training(was);
    throw;
  }
  policy_.set_training(was);
}

void ReferencePolicy::before_adapters_merged() {
  if (kind() != Kind::base) return;
  NoGradGuard no_grad;
  copy_ = create_model(model_options_);
  copy_->initialize(0);  // every parameter is overwritten below
  copy_->set_training(false);
  copy_policy_into_reference();
  base_copied_ = true;
}

}  // namespace dew
