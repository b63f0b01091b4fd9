// dpo.cpp — the `dpo` objective: Direct Preference Optimization (Rafailov et al. 2023) of a causal
// decoder on preference pairs (the preference_jsonl source; docs/training.md).
//
// For a pair (x, y_w, y_l) with policy log-probabilities log pi(y|x) (the sum over the response's
// tokens, the response_mask of the record) and reference ones log ref(y|x):
//   r_w = beta * (log pi(y_w|x) - log ref(y_w|x)),  r_l = beta * (log pi(y_l|x) - log ref(y_l|x)),
//   loss = mean over the batch of -log sigmoid(r_w - r_l)  [+ sft_weight * the mean NLL per chosen token].
// loss = hinge (SLiC, Zhao et al. 2023): max(0, 1 - (r_w - r_l)); loss = ipo (Azar et al. 2023): with log-probabilities
// averaged over each response's tokens, ((r_w - r_l) / beta - 1 / (2 beta))^2; loss = simpo (Meng et al. 2024): no
// reference at all (none is made or run), r = beta * the mean log-probability over the response, loss
// -log sigmoid(r_w - r_l - simpo_gamma); loss = orpo (Hong et al. 2024): no reference either, the chosen tokens' NLL
// (sft_weight, 1 by default here) + beta * -log sigmoid(log odds(y_w) - log odds(y_l)), odds = p / (1 - p) of the mean
// log-probability p; label_smoothing e (sigmoid, simpo: cDPO) takes -(1 - e) log sigmoid(d) - e log sigmoid(-d).
// TRL's loss_type names and forms (ORPO's as its ORPOTrainer).
// The reference is either the starting weights (a frozen copy of the model, made at the first step,
// i.e. after [trainer] init_from loaded the SFT weights; kept in checkpoints as state, so resume and
// eval see the same reference) or, when the records carry ref_chosen_logp / ref_rejected_logp, those
// precomputed numbers (the frozen copy is then never run). With LoRA adapters as the only trained parameters
// (reference = auto), the starting weights are the policy's frozen base: the reference pass runs the policy with
// its adapters off (dew::nn::LoraAdaptersOff, as TRL with PEFT), and no copy is made or checkpointed. -log sigmoid(d)
// is computed as -log_softmax([0, d])[1], finite for every d and with its true gradient -sigmoid(-d) at d = 0 (the
// first step's d with that reference). Metrics (training and validation): loss, dpo_loss, reward_accuracy (the share of
// pairs with r_w > r_l; ties count as wrong), reward_margin (mean r_w - r_l), chosen_reward, rejected_reward (means),
// and sft_nll when sft_weight > 0. The primary metric is reward_accuracy (higher is better).
// A policy with its own training loss (Model::auxiliary_loss(): a mixture of experts' load balancing) adds it to
// the step's loss, logged as aux_loss.
// Options ([objective]): beta (0.1), sft_weight (0; 1 under orpo), loss (sigmoid | hinge | ipo | simpo | orpo),
// simpo_gamma (0.5), label_smoothing (0), reference (auto | copy: the copy even where the adapters-off
// policy would serve), vocab_size (0: from the tokenizer's meta.json, the
// [data] tokenizer folder), fused_head (auto | true | false) and fused_head_mb (256): per-token log-probabilities are
// the cross-entropy kernel's rows (dew::token_logprobs), and with a dew::LinearHeadModel whose [rows, V] f32 logits
// would pass fused_head_mb they come from dew::linear_token_logprobs, the head in chunks, the logits never whole.
// Parameters: the model's, unprefixed (so init_from an lm run loads by name).
// `dew-run sample` and `eval --task ...` run the policy as the lm objective runs its model (dew/lm_commands.hpp):
// text with the [data] tokenizer, token ids without one; `eval` without --task validates on the preference split.
#include <algorithm>
#include <cmath>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/generate.hpp>
#include <dew/lm_commands.hpp>
#include <dew/lora.hpp>
#include <dew/model.hpp>
#include <dew/objective.hpp>
#include <dew/ops.hpp>
#include <dew/policy.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <map>
#include <string>

namespace {

using dew::Tensor;

class Dpo final : public dew::Objective {
 public:
  explicit Dpo(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "dpo: build() needs the run config");
    read_options(ctx.config->section("objective"));
    backend_ = ctx.backend ? ctx.backend : dew::default_backend();
    dew::set_default_backend(backend_);
    tokenizer_ = dew::policy_tokenizer(*ctx.config, vocab_size_, "dpo");
    dew::Options& model = ctx.config->section("model");
    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record r = ctx.train_source->get(0);
      for (const char* f : {"chosen", "rejected", "chosen_mask", "rejected_mask"})
        DEW_USAGE_CHECK(r.count(f), "dpo: the training source ", ctx.train_source->identity(), " has no '", f,
                        "' field (use source = preference_jsonl)");
      if (!model.has("max_seq_len")) model.set("max_seq_len", std::to_string(r.at("chosen").shape[0] - 1));
    }
    model_ = dew::create_model(model);
    model_->initialize(ctx.seed);
    if (!reference_free())
      reference_ = std::make_unique<dew::ReferencePolicy>(*model_, model, reference_mode_, ctx.seed);
    dew::check_fused_head(logprob_, *model_, model.get_string("plugin", ""));
    vocab_ = std::atoll(model.values().at("vocab_size").c_str());
    logprob_.vocab = vocab_;
  }

  std::vector<std::string> batch_fields() const override {
    return {"chosen", "rejected", "chosen_mask", "rejected_mask"};
  }
  dew::NamedTensors parameters() override { return model_->named_parameters(); }
  dew::NamedTensors state() override { return reference_ ? reference_->state() : dew::NamedTensors{}; }
  dew::Model* main_model() override { return model_.get(); }
  std::shared_ptr<const dew::Tokenizer> tokenizer() const override { return tokenizer_; }
  std::string primary_metric() const override { return "reward_accuracy"; }
  bool higher_is_better() const override { return true; }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo&) override {
    model_->set_training(true);
    if (reference_) reference_->freeze();
    Parts p = forward(batch);
    dew::StepResult r;
    r.loss = p.aux.defined() ? dew::add(p.loss, dew::reshape(p.aux, p.loss.shape())) : p.loss;
    if (p.aux.defined()) r.device_metrics["aux_loss"] = dew::reshape(p.aux.detach(), {1});
    r.metrics = p.metrics;
    r.samples = p.rows;
    r.tokens = p.tokens;
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo&) override {
    dew::NoGradGuard no_grad;
    const bool was = model_->training();
    model_->set_training(false);
    if (reference_) reference_->freeze();
    // Sums over this rank's pairs (every key on every rank): the pair means' sums, and sft_nll's over the
    // chosen tokens (it is a token mean), so the metrics do not depend on how the split is batched or sharded.
    std::map<std::string, double> sums;
    for (const char* k : kPairMeans) sums[k] = 0.0;
    if (sft_weight_ > 0) sums["sft_nats"] = sums["chosen_tokens"] = 0.0;
    sums["pairs"] = double(dew::for_each_pass_batch(loader, loader.source().size(), 0, backend_,
                                                    [&](const dew::Batch& bt, int64_t, int64_t use) {
                                                      const Parts p = forward(bt);
                                                      for (const char* k : kPairMeans)
                                                        sums[k] += p.metrics.at(k) * double(use);
                                                      if (sft_weight_ > 0) {
                                                        sums["sft_nats"] += p.metrics.at("sft_nll") * p.chosen_tokens;
                                                        sums["chosen_tokens"] += p.chosen_tokens;
                                                      }
                                                    }));
    dew::ValidationResult out;
    out.sums = sums;
    out.metrics = validation_metrics(sums);
    model_->set_training(was);
    return out;
  }

  bool shards_validation() const override { return true; }
  // The pair means, sft_nll per chosen token, and the loss of the whole split as training forms a batch's.
  std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const override {
    const double pairs = sums.at("pairs");
    std::map<std::string, double> metrics{{"pairs", pairs}};
    for (const char* k : kPairMeans) metrics[k] = pairs > 0 ? sums.at(k) / pairs : 0.0;
    metrics["loss"] = metrics["dpo_loss"];
    if (sft_weight_ > 0) {
      const double tokens = sums.at("chosen_tokens");
      metrics["sft_nll"] = tokens > 0 ? sums.at("sft_nats") / tokens : 0.0;
      metrics["loss"] += sft_weight_ * metrics["sft_nll"];
    }
    return metrics;
  }

  dew::ValidationResult evaluate(dew::DataLoader& loader, dew::Options& req, const dew::StepInfo& info) override {
    if (!req.has("task")) return validate(loader, info);
    return dew::run_lm_task(req.require_string("task"), req, commands());
  }
  void sample(dew::Options& req) override { dew::sample_text(req, commands()); }

 private:
  // The policy as `dew-run sample` and `eval --task` run it (dew/lm_commands.hpp).
  dew::LmCommandContext commands() const {
    DEW_CHECK(model_, "dpo: sample() or evaluate() before build()");
    dew::LmCommandContext c;
    c.model = model_.get();
    c.decoder = dynamic_cast<dew::CausalDecoder*>(model_.get());
    c.tokenizer = tokenizer_.get();
    c.objective = "dpo";
    return c;
  }

  // Inference folds the adapters into the policy, which then is no longer the base: the reference becomes a copy of
  // the base weights (every parameter but the adapters) before that.
  void before_adapters_merged() override {
    if (reference_) reference_->before_adapters_merged();
  }

  bool reference_free() const { return loss_type_ == "simpo" || loss_type_ == "orpo"; }

  static constexpr const char* kPairMeans[] = {"dpo_loss", "reward_accuracy", "reward_margin", "chosen_reward",
                                               "rejected_reward"};

  struct Parts {
    Tensor loss;
    Tensor aux;  // the policy forward's own loss (a mixture of experts' load balancing), undefined when none
    std::map<std::string, double> metrics;
    int64_t rows = 0, tokens = 0;
    double chosen_tokens = 0;  // the chosen responses' scored tokens (sft_nll's denominator)
  };

  void read_options(const dew::Options& o) {
    beta_ = o.get_double("beta", 0.1);
    loss_type_ = o.get_string("loss", "sigmoid");
    sft_weight_ = o.get_double("sft_weight", loss_type_ == "orpo" ? 1.0 : 0.0);  // ORPO's loss holds the NLL
    vocab_size_ = o.get_int("vocab_size", 0);
    logprob_ = dew::read_response_logprob_options(o, "dpo");
    reference_mode_ = o.get_string("reference", "auto");
    DEW_USAGE_CHECK(loss_type_ == "sigmoid" || loss_type_ == "hinge" || loss_type_ == "ipo" || loss_type_ == "simpo" ||
                        loss_type_ == "orpo",
                    "option 'objective.loss' must be sigmoid, hinge, ipo, simpo or orpo, got '", loss_type_, "'");
    simpo_gamma_ = o.get_double("simpo_gamma", 0.5);
    label_smoothing_ = o.get_double("label_smoothing", 0.0);
    DEW_USAGE_CHECK(std::isfinite(simpo_gamma_), "option 'objective.simpo_gamma' must be finite, got ", simpo_gamma_);
    DEW_USAGE_CHECK(label_smoothing_ >= 0 && label_smoothing_ < 0.5,
                    "option 'objective.label_smoothing' must be in [0, 0.5), got ", label_smoothing_);
    DEW_USAGE_CHECK(label_smoothing_ == 0 || loss_type_ == "sigmoid" || loss_type_ == "simpo",
                    "option 'objective.label_smoothing' applies to the sigmoid and simpo losses, not ", loss_type_);
    dew::ReferencePolicy::check_mode(reference_mode_);
    DEW_USAGE_CHECK(beta_ > 0 && std::isfinite(beta_), "option 'objective.beta' must be positive, got ", beta_);
    DEW_USAGE_CHECK(sft_weight_ >= 0, "option 'objective.sft_weight' must be >= 0, got ", sft_weight_);
  }

  // Summed log-probabilities of the masked targets: ids, mask [R, S + 1] -> [R] (dew/policy.hpp's per-token ones).
  Tensor sequence_logp(dew::Model& m, const Tensor& ids, const Tensor& mask) const {
    return dew::sum(dew::response_token_logprobs(m, ids, mask, logprob_), 1);
  }

  Tensor field(const dew::Batch& b, const char* name) const {
    auto it = b.find(name);
    DEW_CHECK(it != b.end(), "dpo: the batch has no '", name, "' field (use source = preference_jsonl)");
    return it->second.dtype() == dew::DType::i32 || it->second.dtype() == dew::DType::f32
               ? it->second
               : dew::cast(it->second, dew::DType::i32);
  }

  Parts forward(const dew::Batch& batch) {
    const Tensor chosen = field(batch, "chosen"), rejected = field(batch, "rejected");
    const Tensor cmask = field(batch, "chosen_mask"), rmask = field(batch, "rejected_mask");
    DEW_CHECK(chosen.shape() == rejected.shape() && chosen.shape() == cmask.shape() && chosen.shape() == rmask.shape(),
              "dpo: chosen, rejected and their masks must have one shape [B, S + 1]");
    const int64_t b = chosen.shape()[0];
    // One forward over both: rows [0, b) chosen, [b, 2b) rejected.
    const Tensor ids = dew::concat({chosen, rejected}, 0), masks = dew::concat({cmask, rmask}, 0);
    const Tensor logp = sequence_logp(*model_, ids, masks);
    const Tensor aux = model_->auxiliary_loss();  // read before a reference pass makes its own forward
    const Tensor pc = dew::slice(logp, 0, 0, b), pr = dew::slice(logp, 0, b, 2 * b);
    Tensor rc, rr;  // the reference's log-probabilities (none for SimPO, ORPO)
    if (!reference_) {
    } else if (batch.count("ref_chosen_logp") && batch.count("ref_rejected_logp")) {
      rc = dew::reshape(dew::cast(batch.at("ref_chosen_logp"), dew::DType::f32), {b});
      rr = dew::reshape(dew::cast(batch.at("ref_rejected_logp"), dew::DType::f32), {b});
    } else {
      reference_->run([&](dew::Model& m) {
        const Tensor ref = sequence_logp(m, ids, masks);
        rc = dew::slice(ref, 0, 0, b);
        rr = dew::slice(ref, 0, b, 2 * b);
      });
    }
    const std::vector<int32_t> cm = cmask.to_ints(), rm = rmask.to_ints();
    const int64_t s = chosen.shape()[1] - 1;
    double chosen_tokens = 0, all_tokens = 0;
    std::vector<float> inverse_counts(size_t(2 * b));  // 1 / the scored tokens of each response: [chosen, rejected]
    for (int64_t r = 0; r < b; ++r) {
      double nc = 0, nr = 0;
      for (int64_t j = 1; j <= s; ++j) {
        nc += cm[size_t(r * (s + 1) + j)];
        nr += rm[size_t(r * (s + 1) + j)];
      }
      chosen_tokens += nc;
      all_tokens += nc + nr;
      inverse_counts[size_t(r)] = float(1.0 / std::max(1.0, nc));
      inverse_counts[size_t(b + r)] = float(1.0 / std::max(1.0, nr));
    }
    // The preference term's log-probabilities: sums over the response, or per-token means for IPO (Azar et al.
    // 2023, as TRL computes it: the sums' length bias is what IPO's squared loss would otherwise fit) and SimPO
    // (Meng et al. 2024) and ORPO (Hong et al. 2024), the policy's alone for those two (no reference).
    Tensor lw = rc.defined() ? pc - rc : pc, ll = rr.defined() ? pr - rr : pr;
    if (loss_type_ == "ipo" || reference_free()) {
      const Tensor inv = Tensor::from_vector(inverse_counts, {2 * b}, backend_);
      lw = lw * dew::slice(inv, 0, 0, b);
      ll = ll * dew::slice(inv, 0, b, 2 * b);
    }
    const Tensor reward_w = lw * float(beta_), reward_l = ll * float(beta_);
    const Tensor d = loss_type_ == "simpo" ? reward_w - reward_l + float(-simpo_gamma_) : reward_w - reward_l;
    Tensor losses;
    if (loss_type_ == "hinge") {  // SLiC (Zhao et al. 2023): max(0, 1 - d)
      losses = dew::relu(-d + 1.0f);
    } else if (loss_type_ == "ipo") {  // (d / beta - 1 / (2 beta))^2
      losses = dew::square((d + float(-0.5)) * float(1.0 / beta_));
    } else {
      // -log sigmoid(d) = -log_softmax([0, d])[1]: finite for every d and smooth at d = 0, where every run with the
      // starting weights as reference begins (policy and reference give the same log-probabilities bit for bit, so
      // d = 0 exactly). The earlier log(1 + exp(-|d|)) - min(d, 0) had a zero gradient there (|d|'s and min's kinks):
      // the first update was lost. With label_smoothing e (cDPO, Mitchell 2023): -(1 - e) log sigmoid(d) - e log
      // sigmoid(-d), log sigmoid(-d) = log_softmax([0, d])[0].
      // ORPO takes beta * -log sigmoid of the log odds ratio instead: log odds(chosen) - log odds(rejected), the odds
      // p / (1 - p) of each response's mean log-probability (log(1 - p) = log(1 - exp(mean)), kept off log 0).
      Tensor z = d;
      if (loss_type_ == "orpo") {
        const auto log1m_exp = [](const Tensor& x) { return dew::log(dew::clamp(-dew::exp(x) + 1.0f, 1e-12f, 1.0f)); };
        z = (lw - ll) - (log1m_exp(lw) - log1m_exp(ll));
      }
      const Tensor zero = Tensor::full({b, 1}, 0.0, dew::DType::f32, backend_);
      const Tensor ls = dew::log_softmax(dew::concat({zero, dew::reshape(z, {b, 1})}, 1));
      losses = -dew::reshape(dew::slice(ls, 1, 1, 2), {b});
      if (label_smoothing_ > 0)
        losses = losses * float(1.0 - label_smoothing_) +
                 dew::reshape(dew::slice(ls, 1, 0, 1), {b}) * float(-label_smoothing_);
      if (loss_type_ == "orpo") losses = losses * float(beta_);
    }
    const Tensor dpo = dew::mean(losses);
    Parts p;
    p.rows = b;
    p.loss = dpo;
    p.aux = aux;
    p.tokens = int64_t(all_tokens);
    p.chosen_tokens = chosen_tokens;
    if (sft_weight_ > 0) {
      const Tensor nll = dew::sum(pc) * float(-1.0 / std::max(1.0, chosen_tokens));
      p.loss = dpo + nll * float(sft_weight_);
      p.metrics["sft_nll"] = nll.item();
    }
    const std::vector<float> w = reward_w.detach().to_floats(), l = reward_l.detach().to_floats();
    double acc = 0, margin = 0, mw = 0, ml = 0;
    for (int64_t r = 0; r < b; ++r) {
      acc += w[size_t(r)] > l[size_t(r)];
      margin += double(w[size_t(r)]) - double(l[size_t(r)]);
      mw += w[size_t(r)];
      ml += l[size_t(r)];
    }
    p.metrics["dpo_loss"] = dpo.item();
    p.metrics["reward_accuracy"] = acc / double(b);
    p.metrics["reward_margin"] = margin / double(b);
    p.metrics["chosen_reward"] = mw / double(b);
    p.metrics["rejected_reward"] = ml / double(b);
    return p;
  }

  std::shared_ptr<dew::Model> model_;
  std::unique_ptr<dew::ReferencePolicy> reference_;  // null for the reference-free losses
  std::shared_ptr<dew::Tokenizer> tokenizer_;
  dew::BackendPtr backend_;
  double beta_ = 0.1, sft_weight_ = 0.0;
  dew::ResponseLogprobOptions logprob_;  // fused_head, fused_head_mb and the vocabulary
  int64_t vocab_size_ = 0, vocab_ = 0;
  std::string reference_mode_ = "auto", loss_type_ = "sigmoid";
  double simpo_gamma_ = 0.5, label_smoothing_ = 0.0;
};

}  // namespace

DEW_PLUGIN("dpo", "0.1.0") {
  registrar.add<dew::Objective>({
      .name = "dpo",
      .description =
          "Preference optimization on pairs (preference_jsonl): DPO (sigmoid), hinge or IPO against a frozen "
          "reference (the starting weights, precomputed log-probs, or a LoRA policy with its adapters off), "
          "SimPO or ORPO without one; reward accuracy and margin",
      .factory = [](const dew::Options& o) { return std::make_shared<Dpo>(o); },
      .options =
          {{"beta", "0.1", "the DPO temperature beta"},
           {"sft_weight", "0", "weight of an SFT term: the mean NLL per chosen token (1 under loss = orpo)"},
           {"loss", "sigmoid",
            "sigmoid (DPO) | hinge (SLiC: max(0, 1 - d)) | ipo ((d / beta - 1 / (2 beta))^2 on per-token means) "
            "| simpo (-log sigmoid(beta (mean log-prob chosen - rejected) - simpo_gamma), no reference) | orpo (the "
            "chosen NLL + beta * -log sigmoid(log odds ratio), no reference)"},
           {"simpo_gamma", "0.5", "SimPO's target reward margin gamma"},
           {"label_smoothing", "0", "cDPO / robust: the share of pairs taken as mislabelled, in [0, 0.5)"},
           {"reference", "auto",
            "auto | copy: the reference pass (without precomputed log-probs) runs a copy of the starting "
            "weights, or under auto, where LoRA adapters are all that is trained, the policy with its "
            "adapters off (no copy)"},
           {"vocab_size", "0", "vocabulary size when [data] tokenizer has no meta.json (0: from it)"},
           {"fused_head", "auto",
            "auto | true | false: the head fused into the log-probabilities, no [rows, V] logits (auto: when "
            "one forward's f32 logits exceed fused_head_mb; needs a dew::LinearHeadModel)"},
           {"fused_head_mb", "256", "MiB of f32 logits per chunk of the fused head"}},
  });
}
