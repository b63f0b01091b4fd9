// dew/reference_policy.hpp — the frozen reference policy of preference and RL objectives (dpo's implicit reward,
// grpo's KL penalty): the starting weights of the policy being trained.
//
// Two forms, chosen at the first use (after the trainer attached any LoRA adapters):
//  * base: `mode` auto, LoRA adapters attached and nothing but adapters trained — the policy's frozen base *is* the
//    starting weights, so the reference pass runs the policy itself with its adapters off (dew::nn::LoraAdaptersOff,
//    as TRL with PEFT) and in evaluation mode; no copy is kept (the copy made at construction is dropped).
//  * copy: every other case — a second model made from the same [model] options, overwritten by the policy's
//    parameters (by name) once, right before the first update (freeze()). The copy and the "reference_ready" flag are
//    checkpoint state (state()), so a resumed run, eval and export see the same reference.
// before_adapters_merged() (Objective::before_adapters_merged) turns a base reference into a copy of the base
// weights before inference folds the adapters into the policy.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

class ReferencePolicy {
 public:
  // `policy`: the model trained (it must outlive this); `model_options`: its [model] section (the copy is made from
  // it, initialised from `seed` and then overwritten); `mode`: "auto" or "copy" (anything else: a UsageError naming
  // `option`, the objective's key).
  ReferencePolicy(Model& policy, const Options& model_options, const std::string& mode, uint64_t seed,
                  const char* option = "objective.reference");

  enum class Kind { base, copy };
  Kind kind();
  // Before the first update: copies the policy's parameters into the copy (once; later calls do nothing).
  void freeze();
  // "reference.<parameter>" (a copy only) and "reference_ready" (one f32: 1 once frozen).
  NamedTensors state();
  // Runs fn on the reference without gradients: the copy, or the policy in evaluation mode with its adapters off
  // (its training flag restored after).
  void run(const std::function<void(Model&)>& fn);
  // Objective::before_adapters_merged: a base reference becomes a copy of the policy's base parameters.
  void before_adapters_merged();

 private:
  void copy_policy_into_reference();
  Model& policy_;
  Options model_options_;
  std::string mode_;
  std::shared_ptr<Model> copy_;
  Tensor ready_;
  BackendPtr backend_;
  bool base_copied_ = false;  // before_adapters_merged() made the copy: the adapters-off policy is gone
};

}  // namespace dew
