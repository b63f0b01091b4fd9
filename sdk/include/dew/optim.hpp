// dew/optim.hpp — optimizers (registry kind "optimizer") and learning-rate schedules (kind "schedule").
//
// The core registers the optimizers sgd, adamw, lamb and muon and the schedules constant, cosine, linear,
// wsd, exponential, one_cycle and power through its built-in registrar (core/train/); a plugin adds more
// the same way a sampler is added, and `dew-run train --help` shows the options the registration declares.
//
// Optimizer contract:
//  * the factory reads its options (the [optim] section) and refuses bad ones with a UsageError;
//  * init() is called once, before anything else, with every trained parameter in a fixed order; it
//    allocates the state (zeros), named like its parameter, so a checkpoint holds it as
//    optim/<slot>/<parameter name>; state() returns it by slot, in parameter order, and the trainer
//    restores it in place on --resume (a resumed run is bit-exact only if every bit of state is there);
//  * update() changes the parameters in place from their .grad; parameters without a gradient are
//    skipped; it must run on every backend, so it is written with the kernel algebra (the fused update
//    kernels, or matmul / unary / binary / reduce), never through host pointers.
//
// Parameters come with a role (from their name and shape, overridable by name patterns) and a group
// scale: lr_scale multiplies the scheduled learning rate and weight_decay_scale the optimizer's weight
// decay (0 for the no-decay groups). An optimizer honours both; optimizers such as Muon also split the
// parameters by role (see docs/training.md, "Optimizers").
//
// Schedule contract: init(base_lr, total_steps) once (base_lr = optim.lr, total_steps = trainer.steps),
// then lr(step) is a pure function of the number of updates done, so a resumed run sees the same
// learning rates bit for bit.
//
// A plugin:
//   class Lion final : public dew::Optimizer { ... };
//   DEW_PLUGIN("lion", "0.1.0") {
//     registrar.add<dew::Optimizer>({.name = "lion", .description = "...",
//         .factory = [](const dew::Options& o) { return std::make_shared<Lion>(o); },
//         .options = {{"betas", "0.9, 0.99", "..."}}});
//   }
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// What a parameter is to the optimizer. Inferred by param_role(); [optim] roles.<role> = patterns overrides.
enum class ParamRole : uint8_t {
  matrix,     // a hidden weight matrix (or a convolution filter, viewed as [out, in * kh * kw])
  embedding,  // an input table: token / position embeddings
  head,       // the output projection (language-model head, classifier head)
  norm,       // a gain or scale vector (norm weights; every 0-D/1-D tensor not named bias)
  bias,       // a bias vector
};
const char* role_name(ParamRole role);         // "matrix", "embedding", ...
ParamRole role_from_name(const std::string&);  // UsageError listing the roles

// The default role from a parameter's name (its dot-separated components, compared in lower case) and
// shape: ndim < 2 -> bias when the last component is "bias" or ends in "_bias", else norm; ndim >= 2 ->
// embedding when a component contains "embed" (embed_tokens, pos_embed, patch_embed, x_embedder), is
// "emb", starts with "emb_", ends with "_emb" (tok_emb) or is wte / wpe; head when a component contains
// "head" (lm_head, head) or is output / classifier, or the name starts with final_layer.linear; else matrix.
ParamRole param_role(const std::string& name, const Shape& shape);

struct OptimParam {
  std::string name;
  Tensor tensor;  // the parameter (its .grad is what update() reads)
  ParamRole role = ParamRole::matrix;
  float lr_scale = 1.0f;            // multiplies the scheduled learning rate
  float weight_decay_scale = 1.0f;  // multiplies the optimizer's weight decay (0: a no-decay group)
};

// Parameters with their roles and group scales from the [optim] section:
//   roles.<role> = glob, glob   (names matching a pattern get that role; first listed role wins)
//   no_decay = role, role       (roles without weight decay; default: norm, bias, embedding; "none")
//   lr_scale.<role> = x         (default 1)
// Patterns are shell globs over the whole name (`*` any run, `?` one character).
std::vector<OptimParam> optim_params(const Options& optim, const NamedTensors& params);

class Optimizer {
 public:
  static constexpr const char* kind = "optimizer";
  virtual ~Optimizer() = default;
  // Binds the parameters for the optimizer's life and allocates their state (zeros).
  virtual void init(const std::vector<OptimParam>& params) = 0;
  // One update from each parameter's .grad. lr is the scheduled rate (times each parameter's
  // lr_scale); grad_scale multiplies the gradients (global-norm clipping); step counts updates from 1.
  virtual void update(float lr, float grad_scale, int64_t step) = 0;
  // Named state tensors by slot ("m", "v", "momentum"), in parameter order.
  virtual std::map<std::string, NamedTensors> state() const = 0;
  virtual std::string name() const = 0;
  // QK-Clip's threshold (dew/qk_clip.hpp), 0 = off: when positive the trainer records the attention
  // blocks' max logits during each update's forwards and rescales the q/k rows of the heads above it
  // right after update() (muonclip).
  virtual double qk_clip_tau() const { return 0.0; }
};

class Schedule {
 public:
  static constexpr const char* kind = "schedule";
  virtual ~Schedule() = default;
  // Called once: base_lr is optim.lr, total_steps trainer.steps. Refuses inconsistent options (UsageError).
  virtual void init(double base_lr, int64_t total_steps) = 0;
  // The learning rate of the update after `step` updates (0-based).
  virtual double lr(int64_t step) const = 0;
};

// The optimizer named by [optim] name (default adamw) from the registry, bound to `params` (roles and
// groups from optim_params()).
std::shared_ptr<Optimizer> make_optimizer(const Options& optim, const NamedTensors& params);

// The schedule named by [schedule] name (default constant) from the registry: lr(step) for step =
// updates done (0-based), base_lr = optim.lr, total = trainer.steps.
std::function<double(int64_t)> make_schedule(const Options& schedule, double base_lr, int64_t total_steps);

// ---- helpers for optimizer authors ----
// Zero tensors shaped like each parameter, named like it (a state slot).
NamedTensors zeros_like(const std::vector<OptimParam>& params);

// Muon's orthogonalisation (Jordan et al. 2024): X = G / (||G||_F + 1e-7), then `steps` quintic
// Newton-Schulz iterations X <- a X + (b A + c A^2) X with A = X X^T (on the smaller side of G [rows, cols]),
// (a, b, c) = (3.4445, -4.7750, 2.0315). The result approximates U V^T of G = U S V^T, not exactly:
// after 5 steps the singular values s of G / ||G||_F with s >= 0.01 land in [0.68, 1.14] (in [0.68, 1.21]
// for s >= 0.003; smaller ones stay below). Matmul, unary, binary and reduce kernels only: any backend.
Tensor newton_schulz5(const Tensor& g, int64_t steps = 5);

}  // namespace dew
