// core/train/policy.cpp — dew/policy.hpp: the run's tokenizer and vocabulary, responses' per-token log-probabilities,
// and dew::ReferencePolicy (the starting weights as a frozen copy or as the LoRA policy's base), for the dpo and grpo
// objectives.
#include "dew/policy.hpp"

#include <filesystem>
#include <map>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/lora.hpp"
#include "dew/nn.hpp"
#include "dew/ops.hpp"
#include "dew/tokenizer.hpp"

namespace dew {

std::shared_ptr<Tokenizer> policy_tokenizer(Config& config, int64_t vocab_size, const char* who) {
  Options& data = config.section("data");
  Options& model = config.section("model");
  std::string dir;
  if (auto t = data.values().find("tokenizer"); t != data.values().end()) dir = t->second;
  std::shared_ptr<Tokenizer> tokenizer;
  if (!dir.empty() && std::filesystem::exists(std::filesystem::path(dir) / "meta.json")) {
    tokenizer = load_tokenizer(dir);
    if (!model.has("vocab_size")) model.set("vocab_size", std::to_string(read_token_meta(dir).vocab_size));
  }
  if (!model.has("vocab_size") && vocab_size > 0) model.set("vocab_size", std::to_string(vocab_size));
  DEW_USAGE_CHECK(model.has("vocab_size"), who,
                  ": the vocabulary size is unknown: set [data] tokenizer (a folder with meta.json) or "
                  "objective.vocab_size");
  return tokenizer;
}

ResponseLogprobOptions read_response_logprob_options(const Options& objective, const char* who) {
  ResponseLogprobOptions o;
  o.fused_head = objective.get_string("fused_head", "auto");
  o.fused_head_mb = objective.get_double("fused_head_mb", 256.0);
  o.who = who;
  DEW_USAGE_CHECK(o.fused_head == "auto" || o.fused_head == "true" || o.fused_head == "false",
                  "option 'objective.fused_head' must be auto, true or false, got '", o.fused_head, "'");
  DEW_USAGE_CHECK(o.fused_head_mb > 0, "option 'objective.fused_head_mb' must be > 0, got ", o.fused_head_mb);
  return o;
}

void check_fused_head(const ResponseLogprobOptions& o, Model& model, const std::string& plugin) {
  DEW_USAGE_CHECK(o.fused_head != "true" || dynamic_cast<LinearHeadModel*>(&model), o.who,
                  ": fused_head = true needs a model with a linear head (dew::LinearHeadModel); model '", plugin,
                  "' has none");
}

namespace {
constexpr int32_t kOutsideMask = -1;  // the ignored target of a position outside the mask
}  // namespace

Tensor response_token_logprobs(Model& m, const Tensor& ids, const Tensor& mask, const ResponseLogprobOptions& o) {
  DEW_CHECK(ids.ndim() == 2 && ids.shape() == mask.shape() && ids.shape()[1] >= 2, o.who,
            ": response ids and mask must be [R, S + 1] with S >= 1, got ", shape_str(ids.shape()), " and ",
            shape_str(mask.shape()));
  const int64_t rows = ids.shape()[0], s = ids.shape()[1] - 1;
  const BackendPtr& backend = default_backend();
  const Tensor ids32 = ids.dtype() == DType::i32 ? ids : cast(ids, DType::i32);
  const Batch inputs{{"tokens", slice(ids32, 1, 0, s)}};
  std::vector<int32_t> targets = slice(ids32, 1, 1, s + 1).to_ints();
  const std::vector<int32_t> in_mask = cast(slice(mask, 1, 1, s + 1), DType::i32).to_ints();
  for (size_t i = 0; i < targets.size(); ++i) {
    DEW_CHECK(targets[i] >= 0 && targets[i] < o.vocab, o.who, ": token id ", targets[i],
              " is outside the vocabulary [0, ", o.vocab, ")");
    if (in_mask[i] == 0) targets[i] = kOutsideMask;
  }
  const Tensor t = Tensor::from_ints(targets, {rows * s}, backend);
  Tensor logp;
  auto* head = dynamic_cast<LinearHeadModel*>(&m);
  if (head && o.fused_head != "false" &&
      (o.fused_head == "true" || 4.0 * double(rows * s) * double(o.vocab) > o.fused_head_mb * 1048576.0)) {
    const HiddenAndHead h = head->forward_rows(inputs, rows * s, o.vocab);
    LinearCrossEntropyOptions lo;
    lo.ignore_index = kOutsideMask;
    lo.softcap = h.softcap;
    lo.chunk_mb = o.fused_head_mb;
    logp = linear_token_logprobs(h.hidden, h.weight, t, lo);
  } else {
    Tensor logits = m.forward(inputs);
    DEW_CHECK(logits.ndim() == 3 && logits.shape()[2] == o.vocab, o.who, ": the model returned logits ",
              shape_str(logits.shape()), "; expected [R, S, ", o.vocab, "]");
    logits = reshape(logits, {rows * s, o.vocab});
    if (logits.dtype() != DType::f32) logits = cast(logits, DType::f32);
    logp = token_logprobs(logits, t, kOutsideMask);
  }
  return reshape(logp, {rows, s});
}

ReferencePolicy::ReferencePolicy(Model& policy, const Options& model_options, const std::string& mode, uint64_t seed,
                                 const char* option)
    : policy_(policy), model_options_(model_options), mode_(mode) {
  check_mode(mode_, option);
  copy_ = create_model(model_options_);  // overwritten by the starting weights at freeze()
  copy_->initialize(seed);
  copy_->set_training(false);
  backend_ = default_backend();
  ready_ = Tensor::full({1}, 0.0, DType::f32, backend_);
}

void ReferencePolicy::check_mode(const std::string& mode, const char* option) {
  DEW_USAGE_CHECK(mode == "auto" || mode == "copy", "option '", option, "' must be auto or copy, got '", mode, "'");
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
