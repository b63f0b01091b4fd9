// dew/lora.hpp — fine-tuning part of a model: LoRA adapters ([lora]) and frozen parameters ([optim] freeze).
//
// [lora] rank = r (> 0 turns it on), alpha (default r: scale 1), rslora (false: scale alpha / r; true:
// alpha / sqrt(r)), dropout (0: PEFT's lora_dropout, on the adapters' inputs while training), targets (globs over the
// paths of the main model's nn::Linear modules, e.g. "*.q_proj,
// *.v_proj"; default all-linear: every Linear outside a head), train (globs over parameter names trained
// besides the adapters, e.g. "*norm*" or "lm_head.weight"; default none). Every other parameter is frozen.
// [optim] freeze (globs over parameter names, without [lora]): those parameters are frozen, the rest trained.
//
// Invariants: a frozen parameter has requires_grad false, so no gradient is formed for it, and the trainer
// gives it no optimizer state, EMA, gradient bucket or shard; checkpoints hold every parameter (adapters
// under their PEFT names "<linear>.lora_A.weight" / "lora_B.weight"), so resume, eval, sample, serve and
// export rebuild the same model. Inference (eval, sample, serve, export) merges the adapters into their
// weights after loading: what runs and what is exported is a plain model of the base architecture.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dew/config.hpp"
#include "dew/nn.hpp"
#include "dew/objective.hpp"

namespace dew {

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 0;
  bool rslora = false;
  double dropout = 0;                // on the adapters' inputs while training (nn::Linear::set_lora_dropout)
  std::vector<std::string> targets;  // empty: all-linear
  std::vector<std::string> train;
  float scale() const;
  // Reads [lora] (every key, also when rank is 0, so a misspelt key is still refused).
  static LoraOptions read(Options& section);
};

// Attaches an adapter to every nn::Linear of `model` whose module path matches the targets; A is
// initialised from `seed` and the parameter's path. With dropout, `model` must be a dew::Model: its random_key()
// keys the masks. Refuses targets that match no Linear (listing some
// paths that would) and a head (a fused loss head reads its weight directly). Returns the adapted paths.
std::vector<std::string> attach_lora(nn::Module& model, const LoraOptions& options, uint64_t seed);

// Folds every adapter of `model` into its Linear's weight and removes it; returns how many were merged.
int merge_lora(nn::Module& model);

// Whether a parameter name is an adapter's ("....lora_A.weight" / "....lora_B.weight").
bool is_lora_parameter(const std::string& name);

// Splits `params` into (trained, frozen) by the rules above (`freeze`: [optim] freeze's globs); sets
// requires_grad false on the frozen. Refuses a glob that matches nothing and a split that trains nothing.
std::pair<NamedTensors, NamedTensors> split_frozen(const NamedTensors& params, const LoraOptions& lora,
                                                   const std::vector<std::string>& freeze);

// What a run's config asks of its built objective: [lora]'s adapters attached to the main model, then its
// parameters split into trained and frozen ([lora] / [optim] freeze). Every command that builds a run
// (train, eval, sample, serve, export) calls this after Objective::build, so the checkpoint's names match.
struct FineTuning {
  LoraOptions lora;                     // as read from [lora] (rank 0: none)
  std::vector<std::string> lora_paths;  // the adapted Linear modules (empty: no adapters)
  NamedTensors trained, frozen;
  // The EMA's tensors among `ema_parameters` (Objective::ema_parameters): the trained ones.
  NamedTensors trained_only(const NamedTensors& ema_parameters) const;
};
FineTuning prepare_fine_tuning(Config& config, Objective& objective, uint64_t seed);

}  // namespace dew
