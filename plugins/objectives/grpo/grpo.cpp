// grpo.cpp — the `grpo` objective: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath) of a causal
// decoder on prompts (the prompt_jsonl source) scored by reward functions (dew/reward.hpp; docs/training.md "GRPO").
//
// Each micro-batch of B prompts:
//  1. Rollout: G = num_generations completions per prompt from the current policy (evaluation mode, no gradients),
//     all B * G decoded together by dew::serve::Scheduler (continuous batching over one slot cache), each exactly
//     dew::generate()'s for its prompt alone. Draws are keyed by (run seed, the record's global stream position,
//     g): a resumed run draws the same completions as a straight one, and the ranks of a data-parallel run draw
//     what one rank would for the same records. A completion ends at EOS (which it then includes as a scored token,
//     so the policy learns to stop) or at max_completion_length.
//  2. Rewards: r = sum over the reward functions of weight * score (NaN scores skipped: TRL's nansum).
//  3. Advantages within each prompt's group: A = (r - mean) / (std + 1e-4) (scale_rewards = group; std unbiased as
//     torch.std), the std over the micro-batch instead (batch), or r - mean (none: Dr. GRPO).
//  4. Loss over the completions' tokens t (TRL's GRPOTrainer, generations used once: the ratio
//     pi / pi_old = exp(logp - stopgrad(logp)) is 1 with the gradient of logp, so PPO's clip never binds):
//       l_t = -ratio_t * A  [+ beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)]   (k3, Schulman's estimator)
//     summed with weights: loss_type grpo 1 / (n_i * R) (each completion's token mean, then the mean over the
//     R = B * G completions), bnpo 1 / N (one mean over the micro-batch's N tokens), dr_grpo 1 / (R *
//     max_completion_length) (Dr. GRPO's constant). mask_truncated_completions drops completions cut at the length
//     limit from the loss (DAPO). The reference (beta > 0) is dew::ReferencePolicy: the starting weights, a copy or a
//     LoRA policy's adapters-off base. A policy's own training loss (Model::auxiliary_loss) joins the step's loss.
// Metrics (beside the trainer's loss): reward, reward_std (the groups' mean std), reward_<function> (its mean over what
// it scored), completion_length (scored tokens, EOS included), clipped_ratio (completions cut at the length limit),
// frac_reward_zero_std (groups whose rewards are all equal: no gradient from them), kl (beta > 0, per token),
// rollout_ms (the wall time of generating and scoring: the rest of step_time_ms is the policy's forward and backward).
// Validation generates G completions per prompt of the split (keyed by the record's place in it) and reports their
// means; the primary metric is `reward` (higher is better). The completions of the first log_completions prompts (rank
// 0's) go into the artifact completions-step-<step>.jsonl (<run-dir>/samples/): prompt, answer, completion (text;
// bytes that are not UTF-8 replaced), tokens, finish_reason, reward and each function's score (null: not scored), one
// completion a line. Options ([objective]): rewards (required: comma list of reward names), reward_weights (1 each),
// num_generations (8), max_completion_length (64), temperature (1), top_p (1), top_k (0), min_p (0), repetition_penalty
// (1), generation_slots (0: as many as generation_cache_mb (2048) of keys and values hold, measured on the backend for
// the rollout's context; else that many sequences decoded together; each prompt fed once, its group given copies of
// its cache), log_completions (4), loss_type (bnpo | grpo | dr_grpo; bnpo), eos_token (the token that ends a completion
// and is scored with it: a chat model's end of turn such as <|im_end|>; default the tokenizer's EOS), scale_rewards
// (group | batch | none), beta (0), reference (auto | copy), mask_truncated_completions (false), vocab_size,
// fused_head, fused_head_mb (as dpo's). Reward functions read their options from [reward]. run.shard = parameters is
// refused (the rollout decodes with whole parameters).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <dew/autograd.hpp>
#include <dew/config.hpp>
#include <dew/error.hpp>
#include <dew/generate.hpp>
#include <dew/lm_commands.hpp>
#include <dew/model.hpp>
#include <dew/objective.hpp>
#include <dew/ops.hpp>
#include <dew/policy.hpp>
#include <dew/registry.hpp>
#include <dew/reward.hpp>
#include <dew/serve.hpp>
#include <dew/tokenizer.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

void register_grpo_rewards(dew::Registrar& registrar);  // rewards.cpp

namespace {

using dew::Tensor;

// One micro-batch's completions and their scores, on the host.
struct Rollout {
  int64_t prompts = 0, group = 0;
  std::vector<std::vector<int32_t>> prompt_tokens;  // per prompt
  std::vector<dew::Completion> completions;         // prompt b's g-th at b * group + g
  std::vector<double> rewards;                      // the weighted sums, one per completion
  std::vector<std::vector<double>> scores;          // [function][completion], NaN where not scored
};

class Grpo final : public dew::Objective {
 public:
  explicit Grpo(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "grpo: build() needs the run config");
    read_options(ctx.config->section("objective"));
    backend_ = ctx.backend ? ctx.backend : dew::default_backend();
    dew::set_default_backend(backend_);
    seed_ = ctx.seed;
    DEW_USAGE_CHECK(ctx.config->section("run").get_string("shard", "none") != "parameters",
                    "grpo: run.shard = parameters is not supported (the rollout decodes with whole parameters); use "
                    "none, optimizer or gradients");
    tokenizer_ = dew::policy_tokenizer(*ctx.config, vocab_size_, "grpo");
    dew::Options& model = ctx.config->section("model");
    int64_t prompt_len = 0;
    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record r = ctx.train_source->get(0);
      for (const char* f : {"prompt", "prompt_length", "answer", "answer_length"})
        DEW_USAGE_CHECK(r.count(f), "grpo: the training source ", ctx.train_source->identity(), " has no '", f,
                        "' field (use source = prompt_jsonl)");
      prompt_len = r.at("prompt").shape[0];
      if (!model.has("max_seq_len")) model.set("max_seq_len", std::to_string(prompt_len + max_completion_));
    }
    model_ = dew::create_model(model);
    model_->initialize(ctx.seed);
    decoder_ = dynamic_cast<dew::CausalDecoder*>(model_.get());
    DEW_USAGE_CHECK(decoder_, "grpo: model '", model.get_string("plugin", ""),
                    "' cannot decode (no dew::CausalDecoder): GRPO generates its completions");
    const int64_t context = decoder_->context_length();
    DEW_USAGE_CHECK(context == 0 || prompt_len + max_completion_ <= context, "grpo: prompts of up to ", prompt_len,
                    " tokens plus max_completion_length = ", max_completion_, " exceed the model's context of ",
                    context, " tokens");
    vocab_ = std::atoll(model.values().at("vocab_size").c_str());
    logprob_.vocab = vocab_;
    dew::check_fused_head(logprob_, *model_, model.get_string("plugin", ""));
    eos_id_ = tokenizer_ ? tokenizer_->eos_id() : -1;
    if (!eos_token_.empty()) {  // a chat model's end of turn (e.g. <|im_end|>): one token of the vocabulary
      DEW_USAGE_CHECK(tokenizer_, "grpo: objective.eos_token needs [data] tokenizer");
      const std::vector<int32_t> ids = tokenizer_->encode(eos_token_);
      DEW_USAGE_CHECK(ids.size() == 1 || (ids.size() == 2 && tokenizer_->encode("").size() == 1),
                      "grpo: objective.eos_token '", eos_token_, "' is ", ids.size(),
                      " tokens of this tokenizer, not one");
      eos_id_ = ids.back();
    }
    if (beta_ > 0) reference_ = std::make_unique<dew::ReferencePolicy>(*model_, model, reference_mode_, ctx.seed);
    dew::Options& reward_options = ctx.config->section("reward");
    rewards_.clear();
    for (const std::string& name : reward_names_)
      rewards_.push_back(dew::Registry::global().create<dew::Reward>(name, reward_options));
  }

  std::vector<std::string> batch_fields() const override {
    return {"prompt", "prompt_length", "answer", "answer_length"};
  }
  dew::NamedTensors parameters() override { return model_->named_parameters(); }
  dew::NamedTensors state() override { return reference_ ? reference_->state() : dew::NamedTensors{}; }
  dew::Model* main_model() override { return model_.get(); }
  std::shared_ptr<const dew::Tokenizer> tokenizer() const override { return tokenizer_; }
  std::string primary_metric() const override { return "reward"; }
  // bnpo: one mean over the micro-batch's scored tokens (with trainer.loss_weighting = token, over the update's: TRL's
  // dapo); grpo and dr_grpo weigh completions, not tokens.
  bool loss_is_token_mean() const override { return loss_type_ == "bnpo"; }
  bool higher_is_better() const override { return true; }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo& info) override {
    if (reference_) reference_->freeze();
    const int64_t b = field(batch, "prompt").shape()[0];
    // Draw keys: the record's global stream position (unique over ranks and epochs); the update and micro-batch
    // when the trainer does not say.
    const int64_t position = info.position >= 0 ? info.position : (info.step * 1024 + info.micro) * b;
    const auto started = std::chrono::steady_clock::now();
    const Rollout ro = rollout(batch, seed_, position);
    const double rollout_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    model_->set_training(true);
    dew::StepResult r;
    const Tensor loss = policy_loss(ro, r.metrics, r.tokens);
    const Tensor aux = aux_;
    r.loss = aux.defined() ? dew::add(loss, dew::reshape(aux, loss.shape())) : loss;
    if (aux.defined()) r.device_metrics["aux_loss"] = dew::reshape(aux.detach(), {1});
    std::map<std::string, double> sums = empty_sums();
    add_rollout_sums(ro, sums);
    for (const auto& [k, v] : validation_metrics(sums))  // the means validation reports, over this micro-batch
      if (k != "prompts") r.metrics[k] = v;
    r.metrics["rollout_ms"] = rollout_ms;
    r.samples = ro.prompts * ro.group;
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo& info) override {
    dew::NoGradGuard no_grad;
    const bool was = model_->training();
    std::map<std::string, double> sums = empty_sums();
    std::string logged;
    int64_t logged_prompts = 0;
    dew::for_each_pass_batch(loader, loader.source().size(), 0, backend_,
                             [&](const dew::Batch& bt, int64_t first, int64_t) {
                               // Validation's draws: another seed than training's, keyed by the record's place.
                               const Rollout ro = rollout(bt, seed_ ^ 0x5eed5eed5eedull, first);
                               if (loader.config().rank == 0)
                                 for (int64_t b = 0; b < ro.prompts && logged_prompts < log_completions_; ++b) {
                                   logged += completion_lines(ro, b);
                                   ++logged_prompts;
                                 }
                               add_rollout_sums(ro, sums);
                             });
    model_->set_training(was);
    dew::ValidationResult out;
    out.sums = sums;
    out.metrics = validation_metrics(sums);
    if (!logged.empty()) {
      char name[64];
      std::snprintf(name, sizeof name, "completions-step-%08lld.jsonl", (long long)info.step);
      out.artifacts.push_back({name, std::vector<unsigned char>(logged.begin(), logged.end())});
    }
    return out;
  }

  bool shards_validation() const override { return true; }
  std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const override {
    const double n = sums.at("completions");
    const auto mean = [](double s, double count) { return count > 0 ? s / count : 0.0; };
    std::map<std::string, double> m{{"prompts", sums.at("prompts")},
                                    {"reward", mean(sums.at("reward"), n)},
                                    {"completion_length", mean(sums.at("completion_tokens"), n)},
                                    {"clipped_ratio", mean(sums.at("clipped"), n)}};
    for (const std::string& name : reward_names_)
      m["reward_" + name] = mean(sums.at("reward_" + name), sums.at("scored_" + name));
    return m;
  }

  dew::ValidationResult evaluate(dew::DataLoader& loader, dew::Options& req, const dew::StepInfo& info) override {
    if (!req.has("task")) return validate(loader, info);
    return dew::run_lm_task(req.require_string("task"), req, commands());
  }
  void sample(dew::Options& req) override { dew::sample_text(req, commands()); }
  void before_adapters_merged() override {
    if (reference_) reference_->before_adapters_merged();
  }

 private:
  dew::LmCommandContext commands() const {
    DEW_CHECK(model_, "grpo: sample() or evaluate() before build()");
    dew::LmCommandContext c;
    c.model = model_.get();
    c.decoder = decoder_;
    c.tokenizer = tokenizer_.get();
    c.objective = "grpo";
    return c;
  }

  void read_options(const dew::Options& o) {
    reward_names_ = o.get_strings("rewards", {});
    reward_weights_ = o.get_doubles("reward_weights", std::vector<double>(reward_names_.size(), 1.0));
    group_ = o.get_int("num_generations", 8);
    max_completion_ = o.get_int("max_completion_length", 64);
    sampling_.temperature = float(o.get_double("temperature", 1.0));
    sampling_.top_p = float(o.get_double("top_p", 1.0));
    sampling_.top_k = o.get_int("top_k", 0);
    sampling_.min_p = float(o.get_double("min_p", 0.0));
    sampling_.repetition_penalty = float(o.get_double("repetition_penalty", 1.0));
    sampling_.max_new_tokens = max_completion_;
    slots_ = o.get_int("generation_slots", 0);
    cache_mb_ = o.get_double("generation_cache_mb", 2048.0);
    log_completions_ = o.get_int("log_completions", 4);
    eos_token_ = o.get_string("eos_token", "");
    loss_type_ = o.get_string("loss_type", "bnpo");
    scale_rewards_ = o.get_string("scale_rewards", "group");
    beta_ = o.get_double("beta", 0.0);
    reference_mode_ = o.get_string("reference", "auto");
    mask_truncated_ = o.get_bool("mask_truncated_completions", false);
    vocab_size_ = o.get_int("vocab_size", 0);
    logprob_ = dew::read_response_logprob_options(o, "grpo");
    DEW_USAGE_CHECK(
        !reward_names_.empty(),
        "grpo: option 'objective.rewards' is required: a comma list of reward functions (`dew-run "
        "plugins` lists the kind `reward`: accuracy, contains, number_match, format, overlong, command, ...)");
    DEW_USAGE_CHECK(reward_weights_.size() == reward_names_.size(), "option 'objective.reward_weights' has ",
                    reward_weights_.size(), " weights for ", reward_names_.size(), " reward functions");
    for (double w : reward_weights_)
      DEW_USAGE_CHECK(std::isfinite(w), "option 'objective.reward_weights' must be finite numbers");
    DEW_USAGE_CHECK(group_ >= 2,
                    "option 'objective.num_generations' must be >= 2 (advantages compare a prompt's "
                    "completions), got ",
                    group_);
    DEW_USAGE_CHECK(max_completion_ >= 1, "option 'objective.max_completion_length' must be >= 1, got ",
                    max_completion_);
    DEW_USAGE_CHECK(slots_ >= 0, "option 'objective.generation_slots' must be >= 0 (0: from generation_cache_mb), got ",
                    slots_);
    DEW_USAGE_CHECK(cache_mb_ > 0, "option 'objective.generation_cache_mb' must be > 0, got ", cache_mb_);
    DEW_USAGE_CHECK(log_completions_ >= 0, "option 'objective.log_completions' must be >= 0, got ", log_completions_);
    DEW_USAGE_CHECK(loss_type_ == "bnpo" || loss_type_ == "grpo" || loss_type_ == "dr_grpo",
                    "option 'objective.loss_type' must be bnpo, grpo or dr_grpo, got '", loss_type_, "'");
    DEW_USAGE_CHECK(scale_rewards_ == "group" || scale_rewards_ == "batch" || scale_rewards_ == "none",
                    "option 'objective.scale_rewards' must be group, batch or none, got '", scale_rewards_, "'");
    DEW_USAGE_CHECK(beta_ >= 0 && std::isfinite(beta_), "option 'objective.beta' must be >= 0, got ", beta_);
    dew::ReferencePolicy::check_mode(reference_mode_);
    dew::validate(sampling_);
  }

  Tensor field(const dew::Batch& b, const char* name) const {
    auto it = b.find(name);
    DEW_CHECK(it != b.end(), "grpo: the batch has no '", name, "' field (use source = prompt_jsonl)");
    return it->second.dtype() == dew::DType::i32 ? it->second : dew::cast(it->second, dew::DType::i32);
  }

  // Prompt b's completions as JSON lines (the validation artifact).
  std::string completion_lines(const Rollout& ro, int64_t b) const {
    std::string out;
    for (int64_t g = 0; g < ro.group; ++g) {
      const size_t i = size_t(b * ro.group + g);
      const dew::Completion& c = ro.completions[i];
      nlohmann::json scores = nlohmann::json::object();
      for (size_t f = 0; f < rewards_.size(); ++f)
        scores[reward_names_[f]] =
            std::isnan(ro.scores[f][i]) ? nlohmann::json(nullptr) : nlohmann::json(ro.scores[f][i]);
      const nlohmann::json line{{"prompt", c.prompt},
                                {"answer", c.answer},
                                {"completion", c.text},
                                {"tokens", c.tokens},
                                {"finish_reason", c.finish_reason},
                                {"reward", ro.rewards[i]},
                                {"scores", scores}};
      out += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    return out;
  }

  // A completion's scored tokens: its tokens, then EOS when it ended there.
  std::vector<int32_t> scored_tokens(const dew::Completion& c) const {
    std::vector<int32_t> t = c.tokens;
    if (c.finish_reason == "eos") t.push_back(eos_id());
    return t;
  }
  int32_t eos_id() const { return eos_id_; }

  // Generates G completions for each prompt of the batch and scores them. `position`: the stream position of the
  // batch's first record (draws of record b's g-th completion: Philox stream (position + b) * G + g).
  Rollout rollout(const dew::Batch& batch, uint64_t seed, int64_t position) {
    const Tensor prompt = field(batch, "prompt"), answer_bytes = field(batch, "answer");
    const std::vector<int32_t> ids = prompt.to_ints(), lengths = field(batch, "prompt_length").to_ints();
    const std::vector<int32_t> answers = answer_bytes.to_ints(),
                               answer_lengths = field(batch, "answer_length").to_ints();
    Rollout ro;
    ro.prompts = prompt.shape()[0];
    ro.group = group_;
    const int64_t plen = prompt.shape()[1], alen = answer_bytes.shape()[1];
    std::vector<std::string> prompt_text(static_cast<size_t>(ro.prompts)), answer(static_cast<size_t>(ro.prompts));
    for (int64_t b = 0; b < ro.prompts; ++b) {
      const int32_t n = lengths[size_t(b)];
      DEW_CHECK(n >= 1 && n <= plen, "grpo: prompt_length ", n, " is outside [1, ", plen, "]");
      ro.prompt_tokens.emplace_back(ids.begin() + b * plen, ids.begin() + b * plen + n);
      for (int32_t id : ro.prompt_tokens.back())
        DEW_CHECK(id >= 0 && id < vocab_, "grpo: prompt token id ", id, " is outside the vocabulary");
      if (tokenizer_) prompt_text[size_t(b)] = tokenizer_->decode(ro.prompt_tokens.back());
      for (int32_t k = 0; k < answer_lengths[size_t(b)] && k < alen; ++k)
        answer[size_t(b)] += char(answers[size_t(b * alen + k)]);
    }
    const int64_t n = ro.prompts * group_;
    std::vector<dew::Generation> gens(static_cast<size_t>(n));
    {
      dew::NoGradGuard no_grad;
      const bool was = model_->training();
      model_->set_training(false);
      dew::serve::SchedulerOptions so;
      so.context = plen + max_completion_ + 1;
      so.slots = rollout_slots(n, so.context);
      so.max_queue = n;
      dew::serve::Scheduler scheduler(*decoder_, tokenizer_, so);
      std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
      for (int64_t i = 0; i < n; ++i) {
        dew::serve::Request req;
        req.prompt = ro.prompt_tokens[size_t(i / group_)];
        req.params = sampling_;
        req.params.seed = seed;
        req.params.eos_id = eos_id();
        req.stream = uint64_t(position + i / group_) * uint64_t(group_) + uint64_t(i % group_);
        auto sub = scheduler.submit(std::move(req));
        DEW_INTERNAL_ASSERT(sub.status == dew::serve::Scheduler::Admission::accepted);
        tickets.push_back(sub.ticket);
      }
      while (scheduler.step()) {
      }
      for (int64_t i = 0; i < n; ++i) {
        gens[size_t(i)] = tickets[size_t(i)]->wait();
        DEW_CHECK(gens[size_t(i)].finish_reason == "eos" || gens[size_t(i)].finish_reason == "length",
                  "grpo: a completion ended as '", gens[size_t(i)].finish_reason, "': ", tickets[size_t(i)]->error());
      }
      model_->set_training(was);
    }
    for (int64_t i = 0; i < n; ++i) {
      dew::Completion c;
      c.prompt = prompt_text[size_t(i / group_)];
      c.text = std::move(gens[size_t(i)].text);
      c.tokens = std::move(gens[size_t(i)].tokens);
      c.answer = answer[size_t(i / group_)];
      c.finish_reason = gens[size_t(i)].finish_reason;
      ro.completions.push_back(std::move(c));
    }
    ro.rewards.assign(size_t(n), 0.0);
    for (size_t f = 0; f < rewards_.size(); ++f) {
      std::vector<double> s = rewards_[f]->score(ro.completions);
      DEW_CHECK(int64_t(s.size()) == n, "grpo: reward '", reward_names_[f], "' returned ", s.size(), " scores for ", n,
                " completions");
      for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(s[size_t(i)])) ro.rewards[size_t(i)] += reward_weights_[f] * s[size_t(i)];
      ro.scores.push_back(std::move(s));
    }
    for (int64_t i = 0; i < n; ++i)
      DEW_CHECK(std::isfinite(ro.rewards[size_t(i)]), "grpo: completion ", i, "'s reward is not finite");
    return ro;
  }

  // The sequences the rollout decodes together: generation_slots, or as many as generation_cache_mb of keys and
  // values hold (a one-slot cache's bytes on the backend, measured once per context), at most n.
  int64_t rollout_slots(int64_t n, int64_t context) {
    if (slots_ > 0) return std::min(n, slots_);
    if (slot_bytes_context_ != context) {
      const int64_t before = backend_->memory_stats().in_use;
      const auto probe = decoder_->make_slot_cache(1, context);
      slot_bytes_ = backend_->memory_stats().in_use - before;
      slot_bytes_context_ = context;
    }
    if (slot_bytes_ <= 0) return std::min<int64_t>(n, 64);  // a backend that does not count its memory
    return std::clamp<int64_t>(int64_t(cache_mb_ * 1048576.0 / double(slot_bytes_)), 1, n);
  }

  // Each completion's advantage (see the top of the file).
  std::vector<double> advantages(const Rollout& ro, std::vector<double>* group_std) const {
    const int64_t n = ro.prompts * ro.group;
    const auto stdev = [](const double* r, int64_t k, double mean) {
      double ss = 0;
      for (int64_t i = 0; i < k; ++i) ss += (r[i] - mean) * (r[i] - mean);
      return std::sqrt(ss / double(k - 1));
    };
    double all_mean = 0;
    for (double r : ro.rewards) all_mean += r / double(n);
    const double batch_std = n > 1 ? stdev(ro.rewards.data(), n, all_mean) : 0.0;
    std::vector<double> a(static_cast<size_t>(n));
    for (int64_t b = 0; b < ro.prompts; ++b) {
      const double* r = ro.rewards.data() + b * ro.group;
      double mean = 0;
      for (int64_t g = 0; g < ro.group; ++g) mean += r[g] / double(ro.group);
      const double sd = stdev(r, ro.group, mean);
      if (group_std) group_std->push_back(sd);
      const double scale = scale_rewards_ == "group" ? sd + 1e-4 : scale_rewards_ == "batch" ? batch_std + 1e-4 : 1.0;
      for (int64_t g = 0; g < ro.group; ++g) a[size_t(b * ro.group + g)] = (r[g] - mean) / scale;
    }
    return a;
  }

  // The policy-gradient loss of a rollout (and the KL penalty), with its metrics; sets aux_ to the policy forward's
  // own loss.
  Tensor policy_loss(const Rollout& ro, std::map<std::string, double>& metrics, int64_t& tokens) {
    const int64_t rows = ro.prompts * ro.group;
    std::vector<std::vector<int32_t>> scored(static_cast<size_t>(rows));
    int64_t width = 0;
    for (int64_t i = 0; i < rows; ++i) {
      scored[size_t(i)] = scored_tokens(ro.completions[size_t(i)]);
      width =
          std::max<int64_t>(width, int64_t(ro.prompt_tokens[size_t(i / ro.group)].size() + scored[size_t(i)].size()));
    }
    const int32_t pad = std::max(0, eos_id());
    std::vector<int32_t> ids(size_t(rows * width), pad), mask(size_t(rows * width), 0);
    std::vector<int64_t> counts(size_t(rows), 0);
    int64_t total = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const auto& p = ro.prompt_tokens[size_t(i / ro.group)];
      const bool dropped = mask_truncated_ && ro.completions[size_t(i)].finish_reason == "length";
      std::copy(p.begin(), p.end(), ids.begin() + i * width);
      for (size_t k = 0; k < scored[size_t(i)].size(); ++k) {
        const size_t at = size_t(i * width) + p.size() + k;
        ids[at] = scored[size_t(i)][k];
        mask[at] = dropped ? 0 : 1;
      }
      counts[size_t(i)] = dropped ? 0 : int64_t(scored[size_t(i)].size());
      total += counts[size_t(i)];
    }
    std::vector<double> group_std;
    const std::vector<double> adv = advantages(ro, &group_std);
    const int64_t s = width - 1;
    std::vector<float> pg(size_t(rows * s), 0.0f), kl_weight(size_t(rows * s), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      double w = 0;
      if (loss_type_ == "grpo") w = 1.0 / (double(std::max<int64_t>(1, counts[size_t(i)])) * double(rows));
      if (loss_type_ == "bnpo") w = 1.0 / double(std::max<int64_t>(1, total));
      if (loss_type_ == "dr_grpo") w = 1.0 / (double(rows) * double(max_completion_));
      for (int64_t j = 0; j < s; ++j)
        if (mask[size_t(i * width + j + 1)]) {
          pg[size_t(i * s + j)] = float(-w * adv[size_t(i)]);
          kl_weight[size_t(i * s + j)] = float(beta_ * w);
        }
    }
    const Tensor id_t = Tensor::from_ints(ids, {rows, width}, backend_);
    const Tensor mask_t = Tensor::from_ints(mask, {rows, width}, backend_);
    const Tensor logp = dew::response_token_logprobs(*model_, id_t, mask_t, logprob_);
    aux_ = model_->auxiliary_loss();  // read before a reference pass makes its own forward
    // ratio = pi / pi_old with pi_old the same policy before this update: 1, with the gradient of logp.
    const Tensor ratio = dew::exp(logp - logp.detach());
    Tensor loss = dew::sum(ratio * Tensor::from_vector(pg, {rows, s}, backend_));
    double kl_mean = 0;
    if (reference_) {
      Tensor ref;
      reference_->run([&](dew::Model& m) { ref = dew::response_token_logprobs(m, id_t, mask_t, logprob_); });
      const Tensor d = ref - logp;
      const Tensor k3 = dew::exp(d) - d + (-1.0f);
      loss = loss + dew::sum(k3 * Tensor::from_vector(kl_weight, {rows, s}, backend_));
      const std::vector<float> k = k3.detach().to_floats();
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < s; ++j)
          if (mask[size_t(i * width + j + 1)]) kl_mean += double(k[size_t(i * s + j)]);
      kl_mean /= double(std::max<int64_t>(1, total));
      metrics["kl"] = kl_mean;
    }
    double zero_std = 0, mean_std = 0;
    for (double sd : group_std) {
      zero_std += sd == 0.0;
      mean_std += sd / double(group_std.size());
    }
    metrics["reward_std"] = mean_std;
    metrics["frac_reward_zero_std"] = zero_std / double(group_std.size());
    tokens = total;
    return loss;
  }

  // The sums a rollout's metrics are made of (validation_metrics() turns them into means): prompts, completions,
  // rewards, scored tokens, completions cut at the limit, and each function's scores and how many it scored.
  std::map<std::string, double> empty_sums() const {
    std::map<std::string, double> sums{
        {"prompts", 0.0}, {"completions", 0.0}, {"reward", 0.0}, {"completion_tokens", 0.0}, {"clipped", 0.0}};
    for (const std::string& n : reward_names_) sums["reward_" + n] = sums["scored_" + n] = 0.0;
    return sums;
  }
  void add_rollout_sums(const Rollout& ro, std::map<std::string, double>& sums) const {
    sums["prompts"] += double(ro.prompts);
    for (size_t i = 0; i < ro.completions.size(); ++i) {
      const dew::Completion& c = ro.completions[i];
      sums["completions"] += 1;
      sums["reward"] += ro.rewards[i];
      sums["completion_tokens"] += double(c.tokens.size()) + (c.finish_reason == "eos");  // scored_tokens(c).size()
      sums["clipped"] += c.finish_reason == "length";
      for (size_t f = 0; f < rewards_.size(); ++f)
        if (!std::isnan(ro.scores[f][i])) {
          sums["reward_" + reward_names_[f]] += ro.scores[f][i];
          sums["scored_" + reward_names_[f]] += 1;
        }
    }
  }

  std::shared_ptr<dew::Model> model_;
  dew::CausalDecoder* decoder_ = nullptr;
  std::unique_ptr<dew::ReferencePolicy> reference_;  // beta > 0 only
  std::shared_ptr<dew::Tokenizer> tokenizer_;
  std::vector<std::shared_ptr<dew::Reward>> rewards_;
  std::vector<std::string> reward_names_;
  std::vector<double> reward_weights_;
  dew::SamplingParams sampling_;
  dew::BackendPtr backend_;
  Tensor aux_;
  uint64_t seed_ = 0;
  int64_t group_ = 8, max_completion_ = 64, slots_ = 0, log_completions_ = 4, vocab_size_ = 0, vocab_ = 0;
  int64_t slot_bytes_ = 0, slot_bytes_context_ = -1;  // one slot's cache bytes, measured for this context
  int32_t eos_id_ = -1;                               // where a completion ends: the tokenizer's EOS or eos_token's
  std::string eos_token_;
  double beta_ = 0.0, cache_mb_ = 2048.0;
  dew::ResponseLogprobOptions logprob_;  // fused_head, fused_head_mb and the vocabulary
  bool mask_truncated_ = false;
  std::string loss_type_ = "bnpo", scale_rewards_ = "group", reference_mode_ = "auto";
};

}  // namespace

DEW_PLUGIN("grpo", "0.1.0") {
  registrar.add<dew::Objective>({
      .name = "grpo",
      .description = "Group Relative Policy Optimization on prompts (prompt_jsonl): G sampled completions per prompt "
                     "scored by reward functions (kind `reward`), group-normalised advantages, optional KL to the "
                     "starting weights",
      .factory = [](const dew::Options& o) { return std::make_shared<Grpo>(o); },
      .options = {{"rewards", "", "comma list of reward functions (kind `reward`; required)"},
                  {"reward_weights", "", "one weight per reward function (default 1 each)"},
                  {"num_generations", "8", "completions per prompt (the group G, >= 2)"},
                  {"max_completion_length", "64", "the most tokens a completion generates"},
                  {"temperature", "1", "sampling temperature of the rollout"},
                  {"top_p", "1", "nucleus sampling of the rollout"},
                  {"top_k", "0", "top-k sampling of the rollout (0: off)"},
                  {"min_p", "0", "min-p sampling of the rollout"},
                  {"repetition_penalty", "1", "repetition penalty of the rollout"},
                  {"generation_slots", "0",
                   "sequences decoded together in the rollout (0: as many as generation_cache_mb of keys and values "
                   "hold)"},
                  {"generation_cache_mb", "2048", "MiB of keys and values the rollout's slots may take (slots 0)"},
                  {"eos_token", "",
                   "the text of the token that ends a completion (a chat model's end of turn, e.g. <|im_end|>; "
                   "default: the tokenizer's EOS)"},
                  {"log_completions", "4",
                   "validation prompts whose completions (with their rewards) go to samples/completions-step-N.jsonl"},
                  {"loss_type", "bnpo",
                   "bnpo (a token mean over the micro-batch) | grpo (each completion's token mean, then their mean) | "
                   "dr_grpo (the sum / (completions x max_completion_length))"},
                  {"scale_rewards", "group",
                   "group | batch | none: what divides the advantages (the group's std, the "
                   "micro-batch's, nothing)"},
                  {"beta", "0", "weight of the KL penalty to the starting weights (0: no reference)"},
                  {"reference", "auto", "auto | copy: the reference with beta > 0 (as dpo's)"},
                  {"mask_truncated_completions", "false", "leave completions cut at the length limit out of the loss"},
                  {"vocab_size", "0", "vocabulary size when [data] tokenizer has no meta.json (0: from it)"},
                  {"fused_head", "auto", "auto | true | false: the head fused into the log-probabilities (as dpo's)"},
                  {"fused_head_mb", "256", "MiB of f32 logits per chunk of the fused head"}},
  });
  register_grpo_rewards(registrar);
}
