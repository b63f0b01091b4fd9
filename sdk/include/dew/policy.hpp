// dew/policy.hpp — what the preference and RL objectives (dpo, grpo) share about a causal policy: its tokenizer and
// vocabulary, the per-token log-probabilities of responses, and the frozen reference policy (dpo's implicit reward,
// grpo's KL penalty).
//
// response_token_logprobs(): log pi(ids[r, j + 1] | ids[r, :j + 1]) for the positions a mask marks, 0 elsewhere —
// the cross-entropy kernel's rows (dew::token_logprobs: no [rows, V] log-softmax or one-hot), or with a
// dew::LinearHeadModel whose f32 logits would pass fused_head_mb (or fused_head = "true") dew::linear_token_logprobs,
// the head in chunks, the logits never whole (its backward computes each chunk's logits again).
//
// ReferencePolicy: the starting weights of the policy being trained, in two forms, chosen at the first use (after the
// trainer attached any LoRA adapters):
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

class Config;
class Tokenizer;

// The run's tokenizer — [data] tokenizer, a folder with meta.json (null without one) — with [model] vocab_size filled
// from its meta.json, else from `vocab_size` (the objective's option, 0: none), when the config does not set it;
// refused naming `who` when nothing gives the vocabulary's size.
std::shared_ptr<Tokenizer> policy_tokenizer(Config& config, int64_t vocab_size, const char* who);

struct ResponseLogprobOptions {
  int64_t vocab = 0;                // the logits' width (token ids outside [0, vocab) are refused)
  std::string fused_head = "auto";  // auto | true | false
  double fused_head_mb = 256.0;     // MiB of f32 logits past which auto fuses the head, and per chunk
  const char* who = "policy";       // names the caller in errors
};
// An objective's fused_head (auto | true | false) and fused_head_mb (> 0) options, refused otherwise naming
// 'objective.<key>'; `who` names the objective in later errors (vocab is the caller's to set).
ResponseLogprobOptions read_response_logprob_options(const Options& objective, const char* who);
// Refuses fused_head = true for a model without a linear head (dew::LinearHeadModel); `plugin` names the model.
void check_fused_head(const ResponseLogprobOptions& o, Model& model, const std::string& plugin);
// ids, mask [R, S + 1] (i32; mask 1 on the scored targets) -> f32 [R, S], differentiable through the model.
Tensor response_token_logprobs(Model& model, const Tensor& ids, const Tensor& mask, const ResponseLogprobOptions& o);

class ReferencePolicy {
 public:
  // `policy`: the model trained (it must outlive this); `model_options`: its [model] section (the copy is made from
  // it, initialised from `seed` and then overwritten); `mode`: "auto" or "copy" (anything else: a UsageError naming
  // `option`, the objective's key).
  ReferencePolicy(Model& policy, const Options& model_options, const std::string& mode, uint64_t seed,
                  const char* option = "objective.reference");

  // Refuses a mode other than auto or copy, naming `option` (an objective checks its option at once, whether or not
  // it will make a reference).
  static void check_mode(const std::string& mode, const char* option = "objective.reference");

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
