// lm.cpp — the `lm` objective: next-token cross-entropy of a causal backbone over windows of tokens.
//
// Batch field "text" i32 [B, S + 1] (the tokens source; synthetic kind = tokens). The model sees
// text[:, :-1] as {"tokens"} and predicts text[:, 1:]; the loss is the mean cross-entropy in fp32 over
// the targets that are not pad_id. SFT: with a "loss_mask" field i32 [B, S + 1] (the chat_jsonl source:
// 1 on assistant tokens) only the targets j with loss_mask[:, j] = 1 count, in the loss and the metrics;
// the tokenizer then comes from [data] tokenizer. Packed rows ([data] pack = true: "text_segment_ids" and
// "text_positions" i32 [B, S + 1]): the model also gets positions[:, :-1] and segment_ids[:, :-1] (attention
// stays inside the input's document), and a target j counts when segment_ids[:, j] != 0 and
// segment_ids[:, j + 1] != 0 (none on padding). A target in another segment than its input is the first
// token of the next piece: the tokens source makes that the document token, predicted from the end of the
// document it closes, so every document's end and (from its start token) its first token are scored.
// Metrics: ce (the loss, nats per token) and token_accuracy.
// validate() reads every record of the split exactly once (as classify does) and returns ce,
// perplexity = exp(ce), bits_per_byte = ce / ln 2 * tokens / bytes (meta.json's val_bytes / val_tokens: the
// bytes of the text alone, no document or start-of-text token; 1 byte per token for a byte folder without
// byte counts) and token_accuracy, plus an artifact
// samples/sample-step-XXXXXXXX.txt: a continuation of sample_prompt (KV-cached decoding, dew/generate.hpp).
// sample() (`dew-run sample`) prints continuations of --prompt (or one prompt per line of --prompts_file;
// --prompt_ids 1,2,3 samples token ids, for runs without a tokenizer): dew::sample_text (dew/lm_commands.hpp).
// evaluate() (`dew-run eval`): validate() without --task; with --task perplexity | loglikelihood |
// multiple_choice | loglikelihood_rolling | generate_until, the evaluation harness (dew::run_lm_task,
// dew/lm_commands.hpp, docs/eval.md), whose per-request results go to <run-dir>/eval/<task>.jsonl.
//
// build(): the token folder is the [data] section's `path` (meta.json, and tokenizer.json for bpe, as
// dew-tokenize writes them); without one (e.g. the synthetic source) there is no tokenizer and the
// vocabulary comes from model.vocab_size, objective.vocab_size or the synthetic source's `vocab`.
// It fills [model] vocab_size (from meta.json) and max_seq_len (the data's S) when absent, then creates
// the backbone, which must implement dew::CausalDecoder to sample.
// Options ([objective]): pad_id (-1 = none), vocab_size (0 = from the data), sample_prompt ("The "),
// sample_tokens (200; 0 = no sample), sample_temperature (0.8), sample_top_k (0), sample_top_p (0.95),
// sample_seed (0), eval_batches (0 = the whole split; else at most this many batches per validation),
// fused_head (auto | true | false) and fused_head_mb (256): with a model that exposes its last hidden states and
// head (dew::LinearHeadModel: the causal_transformer), the loss is dew::linear_cross_entropy over chunks of at most
// fused_head_mb MiB of f32 logits, so a real vocabulary's [rows, V] logits and their gradient never exist (auto:
// when one micro-batch's logits exceed one chunk). Training and validation alike; same loss up to rounding.
// Parameters: the model's, unprefixed, so checkpoints and safetensors exports carry the backbone's own
// names (the causal_transformer's are the Hugging Face ones: model.layers.0.self_attn.q_proj.weight).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <dew/autocast.hpp>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/generate.hpp>
#include <dew/lm_commands.hpp>
#include <dew/objective.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using dew::Tensor;

class LanguageModel final : public dew::Objective {
 public:
  explicit LanguageModel(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "lm: build() needs the run config");
    read_options(ctx.config->section("objective"));
    backend_ = ctx.backend ? ctx.backend : dew::default_backend();
    dew::set_default_backend(backend_);
    seed_ = ctx.seed;

    dew::Options& data = ctx.config->section("data");
    // The token folder: [data] path (tokens), or [data] tokenizer (chat_jsonl, whose path is the .jsonl);
    // read without marking: the source owns both keys.
    std::string dir = data.get_string("path", "");  // the tokens source reads it too
    if (auto t = data.values().find("tokenizer"); t != data.values().end()) dir = t->second;
    data_path_ = dir;
    namespace fs = std::filesystem;
    if (!dir.empty() && fs::exists(fs::path(dir) / "meta.json")) {
      meta_ = dew::read_token_meta(dir);
      tokenizer_ = dew::load_tokenizer(dir);
      has_meta_ = true;
    }

    // The sequence length S: from the training records, else the [data] seq_len (read without marking it:
    // the source owns that key).
    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record r = ctx.train_source->get(0);
      auto it = r.find("text");
      DEW_USAGE_CHECK(it != r.end(), "lm: the training source ", ctx.train_source->identity(),
                      " has no 'text' field (use source = tokens)");
      DEW_USAGE_CHECK(it->second.shape.size() == 1 && it->second.shape[0] >= 2,
                      "lm: a 'text' record must be [S + 1] "
                      "tokens with S >= 1, got ",
                      dew::shape_str(it->second.shape));
      seq_len_ = it->second.shape[0] - 1;
    } else if (auto it = data.values().find("seq_len"); it != data.values().end()) {
      seq_len_ = std::atoll(it->second.c_str());
    }

    dew::Options& model = ctx.config->section("model");
    if (!model.has("vocab_size")) {
      int64_t vocab = vocab_size_;
      if (vocab <= 0 && has_meta_) vocab = meta_.vocab_size;
      if (vocab <= 0) {
        auto it = data.values().find("vocab");  // the synthetic source's vocabulary (read, not consumed)
        if (it != data.values().end()) vocab = std::atoll(it->second.c_str());
      }
      DEW_USAGE_CHECK(vocab > 0,
                      "lm: the vocabulary size is unknown: point [data] path at a folder written by "
                      "dew-tokenize (meta.json), or set model.vocab_size");
      model.set("vocab_size", std::to_string(vocab));
    }
    if (!model.has("max_seq_len") && seq_len_ > 0) model.set("max_seq_len", std::to_string(seq_len_));
    model_plugin_ = model.get_string("plugin", "");
    model_ = dew::create_model(model);
    model_->initialize(ctx.seed);
    decoder_ = dynamic_cast<dew::CausalDecoder*>(model_.get());
    // The model's context is what sample, serve and eval keep: it must hold the windows it trains on.
    DEW_USAGE_CHECK(
        !decoder_ || seq_len_ <= 0 || decoder_->context_length() <= 0 || seq_len_ <= decoder_->context_length(),
        "lm: the data's sequences of ", seq_len_,
        " tokens are longer than model.max_seq_len = ", decoder_ ? decoder_->context_length() : 0,
        " (the context sample and serve keep): raise model.max_seq_len or lower data.seq_len");
    head_model_ = dynamic_cast<dew::LinearHeadModel*>(model_.get());
    DEW_USAGE_CHECK(fused_head_ != "true" || head_model_, "lm: fused_head = true needs a model with a linear head ",
                    "(dew::LinearHeadModel); model '", model_plugin_, "' has none");
    vocab_ = std::atoll(model.values().at("vocab_size").c_str());
    if (has_meta_)
      DEW_USAGE_CHECK(vocab_ >= meta_.vocab_size, "lm: model.vocab_size = ", vocab_,
                      " is smaller than the tokenizer's ", meta_.vocab_size, " (", dir, "/meta.json)");
  }

  std::vector<std::string> batch_fields() const override { return {"text"}; }

  dew::NamedTensors parameters() override {
    DEW_CHECK(model_, "lm: parameters() before build()");
    return model_->named_parameters();  // unprefixed: checkpoints and exports keep the backbone's (HF) names
  }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo& info) override {
    DEW_CHECK(model_, "lm: step() before build()");
    model_->set_training(true);
    const Tensor text = text_of(batch);
    const int64_t b = text.shape()[0], s = text.shape()[1] - 1;
    const dew::Batch in = model_inputs(batch, text);
    model_->set_random_key(info.random_key());  // as the trainer sets it: the same key when step() is called alone
    Tensor mask;  // f32 [b * s], 1 where a target counts (chat data: the assistant tokens)
    const Tensor targets = masked_targets(batch, text, mask);
    Tensor predictions;
    dew::StepResult r;
    const Tensor ce = loss_of(in, targets, b * s, predictions);
    const Tensor aux = model_->auxiliary_loss();  // a mixture of experts' load balancing
    r.loss = aux.defined() ? dew::add(ce, dew::reshape(aux, ce.shape())) : ce;
    r.samples = b;
    // Token accuracy and the trained-token count stay on the device (the trainer reads them with the loss).
    dew::NoGradGuard no_grad;
    const Tensor truth = dew::cast(targets, dew::DType::f32);  // ids < 2^24: exact in f32
    Tensor hits = dew::compare(dew::cast(predictions, dew::DType::f32), truth, dew::BinaryOp::eq);
    Tensor counted;
    if (pad_id_ >= 0 || mask.defined()) {  // (packed rows set mask too)
      const Tensor ign = Tensor::full({1}, double(ignore_index()), dew::DType::f32, backend_);
      const Tensor valid = dew::add_scalar(dew::neg(dew::compare(truth, ign, dew::BinaryOp::eq)), 1.0f);
      hits = hits * valid;
      counted = dew::sum(valid);
    } else {
      counted = Tensor::full({1}, double(b * s), dew::DType::f32, backend_);
    }
    r.device_tokens = counted;
    r.device_metrics["ce"] = dew::reshape(ce.detach(), {1});
    if (aux.defined()) r.device_metrics["aux_loss"] = dew::reshape(aux.detach(), {1});
    r.device_metrics["token_accuracy"] = dew::sum(hits) / dew::maximum(counted, Tensor::full({1}, 1.0, dew::DType::f32, backend_));
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo& info) override {
    DEW_CHECK(model_, "lm: validate() before build()");
    dew::NoGradGuard no_grad;
    const bool was_training = model_->training();
    model_->set_training(false);
    // One pass = the next n stream indices (the split is read in order): rows at or past n are dropped.
    double nats = 0.0;
    int64_t hits = 0, counted = 0;
    std::vector<int32_t> first_row;
    dew::for_each_pass_batch(loader, loader.source().size(), eval_batches_, backend_,
                             [&](const dew::Batch& bt, int64_t, int64_t) {
                               const Tensor text = text_of(bt);
                               if (first_row.empty()) first_row = text.slice0(0, 1).to_ints();
                               const int64_t b = text.shape()[0], s = text.shape()[1] - 1;
                               Tensor mask;
                               const Tensor targets = masked_targets(bt, text, mask);
                               Tensor predictions;
                               const Tensor loss = loss_of(model_inputs(bt, text), targets, b * s, predictions);
                               int64_t h = 0, c = 0;
                               score(predictions, targets, h, c);
                               if (c > 0) nats += loss.item() * double(c);
                               hits += h;
                               counted += c;
                             });
    dew::ValidationResult r;
    r.sums = {{"nats", nats}, {"hits", double(hits)}, {"tokens", double(counted)}};
    r.metrics = validation_metrics(r.sums);
    if (sample_tokens_ > 0 && decoder_ && loader.config().rank == 0) {  // sharded: rank 0's is kept
      std::string body = validation_sample(first_row);
      char name[64];
      std::snprintf(name, sizeof name, "sample-step-%08lld.txt", (long long)info.step);
      r.artifacts.push_back({name, std::vector<unsigned char>(body.begin(), body.end())});
    }
    model_->set_training(was_training);
    return r;
  }

  bool shards_validation() const override { return true; }
  std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const override {
    const double counted = sums.at("tokens"), ce = counted > 0 ? sums.at("nats") / counted : 0.0;
    return {{"ce", ce},
            {"perplexity", std::exp(ce)},
            {"token_accuracy", counted > 0 ? sums.at("hits") / counted : 0.0},
            {"bits_per_byte", ce / std::log(2.0) / bytes_per_token()},
            {"tokens", counted}};
  }

  std::string primary_metric() const override { return "ce"; }
  bool loss_is_token_mean() const override { return true; }  // the cross-entropy over the counted targets
  bool higher_is_better() const override { return false; }
  double train_flops_per_sample() const override {
    if (!model_) return 0.0;
    if (decoder_ && seq_len_ > 0) return 3.0 * decoder_->flops_per_sequence(seq_len_);
    return 3.0 * model_->flops_per_sample();
  }
  dew::Model* main_model() override { return model_.get(); }
  std::shared_ptr<const dew::Tokenizer> tokenizer() const override { return tokenizer_; }

  // `dew-run eval`: without --task, validate() on the run's validation split; with --task, the
  // evaluation harness (dew::run_lm_task, docs/eval.md).
  dew::ValidationResult evaluate(dew::DataLoader& loader, dew::Options& req, const dew::StepInfo& info) override {
    DEW_CHECK(model_, "lm: evaluate() before build()");
    if (!req.has("task")) {
      DEW_USAGE_CHECK(loader.source().identity() != "none",
                      "lm: this run has no validation data ([data] source = none, e.g. an imported model): pass "
                      "--task perplexity|loglikelihood|multiple_choice|loglikelihood_rolling|generate_until");
      return validate(loader, info);
    }
    return dew::run_lm_task(req.require_string("task"), req, commands());
  }

  void sample(dew::Options& req) override { dew::sample_text(req, commands()); }

 private:
  // What `dew-run sample` and `eval --task` run on (dew/lm_commands.hpp).
  dew::LmCommandContext commands() const {
    DEW_CHECK(model_, "lm: sample() or evaluate() before build()");
    dew::LmCommandContext c;
    c.model = model_.get();
    c.decoder = decoder_;
    c.tokenizer = tokenizer_.get();
    c.data_path = has_meta_ ? data_path_ : std::string();
    c.default_prompt = sample_prompt_;
    c.default_new_tokens = sample_tokens_;
    return c;
  }

  void read_options(const dew::Options& o) {
    pad_id_ = o.get_int("pad_id", -1);
    vocab_size_ = o.get_int("vocab_size", 0);
    sample_prompt_ = dew::unescape_text_option(o.get_string("sample_prompt", "The "));
    sample_tokens_ = o.get_int("sample_tokens", 200);
    sample_temperature_ = o.get_double("sample_temperature", 0.8);
    sample_top_k_ = o.get_int("sample_top_k", 0);
    sample_top_p_ = o.get_double("sample_top_p", 0.95);
    sample_seed_ = o.get_int("sample_seed", 0);
    eval_batches_ = o.get_int("eval_batches", 0);
    fused_head_ = o.get_string("fused_head", "auto");
    fused_head_mb_ = o.get_double("fused_head_mb", 256.0);
    DEW_USAGE_CHECK(fused_head_ == "auto" || fused_head_ == "true" || fused_head_ == "false",
                    "option 'objective.fused_head' must be auto, true or false, got '", fused_head_, "'");
    DEW_USAGE_CHECK(fused_head_mb_ > 0, "option 'objective.fused_head_mb' must be > 0, got ", fused_head_mb_);
    DEW_USAGE_CHECK(pad_id_ >= -1, "option 'objective.pad_id' must be -1 (none) or a token id, got ", pad_id_);
    DEW_USAGE_CHECK(sample_tokens_ >= 0, "option 'objective.sample_tokens' must be >= 0, got ", sample_tokens_);
    DEW_USAGE_CHECK(eval_batches_ >= 0, "option 'objective.eval_batches' must be >= 0, got ", eval_batches_);
    DEW_USAGE_CHECK(sample_seed_ >= 0, "option 'objective.sample_seed' must be >= 0, got ", sample_seed_);
    // The validation sample's options are checked now, not when the first validation samples.
    dew::SamplingParams sp;
    sp.max_new_tokens = sample_tokens_;
    sp.temperature = float(sample_temperature_);
    sp.top_k = sample_top_k_;
    sp.top_p = float(sample_top_p_);
    try {
      dew::validate(sp);
    } catch (const dew::Error& e) {
      const std::string what = std::string(e.what()).substr(std::string("sampling: ").size());  // "temperature must ..."
      const size_t space = what.find(' ');
      DEW_USAGE_CHECK(false, "option 'objective.sample_", what.substr(0, space), "'", what.substr(space));
    }
  }

 public:
  // Every token id validate() will read is below the model's vocabulary (an id out of range late in
  // val.bin would otherwise end the run at its first validation, after the updates).
  void check_validation_data(dew::DataLoader& loader) override {
    const dew::DataSource& src = loader.source();
    const dew::LoaderConfig& lc = loader.config();
    int64_t n = src.size();
    if (eval_batches_ > 0) n = std::min<int64_t>(n, eval_batches_ * lc.batch_size * int64_t(lc.world));
    for (int64_t i = 0; i < n; ++i) {
      const dew::Record r = src.get(i);  // the tokens source refuses ids beyond meta.json's vocab_size
      auto it = r.find("text");
      DEW_USAGE_CHECK(it != r.end(), "lm: the validation source ", src.identity(), " has no 'text' field");
      const dew::HostArray& a = it->second;
      if (a.dtype != dew::DType::i32) continue;
      const int32_t* ids = a.as<int32_t>();
      for (int64_t k = 0; k < a.numel(); ++k)
        DEW_USAGE_CHECK((ids[k] >= 0 && ids[k] < vocab_) || (pad_id_ >= 0 && ids[k] == pad_id_),
                        "lm: the validation split ", src.identity(), " holds token id ", ids[k], " (record ", i,
                        "), outside the model's vocabulary [0, ", vocab_, ")");
    }
  }

 private:

  int64_t ignore_index() const { return pad_id_ >= 0 ? pad_id_ : -100; }

  // text[:, 1:] flattened; with a "loss_mask" field (chat_jsonl: 1 on assistant tokens) the targets whose
  // mask is 0 become ignore_index(), and `mask` is set to the mask as f32 [B * S].
  // Packed rows (text_segment_ids) also zero the mask where the input or the target is padding (segment 0).
  Tensor masked_targets(const dew::Batch& batch, const Tensor& text, Tensor& mask) const {
    const int64_t b = text.shape()[0], s = text.shape()[1] - 1;
    Tensor targets = dew::reshape(dew::slice(text, 1, 1, s + 1), {b * s});
    auto it = batch.find("loss_mask");
    const Tensor seg = packed_field(batch, "text_segment_ids", text);
    if (it == batch.end() && !seg.defined()) return targets;
    dew::NoGradGuard no_grad;
    if (it != batch.end()) {
      DEW_CHECK(it->second.shape() == text.shape(), "lm: 'loss_mask' ", dew::shape_str(it->second.shape()),
                " must have the shape of 'text' ", dew::shape_str(text.shape()));
      mask = dew::cast(dew::reshape(dew::slice(it->second, 1, 1, s + 1), {b * s}), dew::DType::f32);
    }
    if (seg.defined()) {
      const Tensor segf = dew::cast(seg, dew::DType::f32);  // segment numbers < 2^24: exact in f32
      const Tensor next = dew::reshape(dew::slice(segf, 1, 1, s + 1), {b * s});
      const Tensor here = dew::reshape(dew::slice(segf, 1, 0, s), {b * s});
      const Tensor zero = Tensor::full({1}, 0.0, dew::DType::f32, backend_);
      auto nonzero = [&](const Tensor& t) { return dew::add_scalar(dew::neg(dew::compare(t, zero, dew::BinaryOp::eq)), 1.0f); };
      const Tensor real = nonzero(here) * nonzero(next);
      mask = mask.defined() ? mask * real : real;
    }
    const Tensor kept = dew::cast(targets, dew::DType::f32) * mask;  // ids < 2^24: exact in f32
    const Tensor dropped = dew::add_scalar(dew::neg(mask), 1.0f) * float(ignore_index());
    return dew::cast(kept + dropped, dew::DType::i32);
  }

  double bytes_per_token() const {
    if (has_meta_ && meta_.val_tokens > 0 && meta_.val_bytes > 0) return double(meta_.val_bytes) / double(meta_.val_tokens);
    return 1.0;
  }

  // A packed-row field ("text_segment_ids", "text_positions"): i32 [B, S + 1] like text, or undefined.
  Tensor packed_field(const dew::Batch& batch, const char* name, const Tensor& text) const {
    auto it = batch.find(name);
    if (it == batch.end()) return Tensor();
    DEW_CHECK(it->second.shape() == text.shape(), "lm: '", name, "' ", dew::shape_str(it->second.shape()),
              " must have the shape of 'text' ", dew::shape_str(text.shape()));
    Tensor t = it->second;
    if (t.dtype() != dew::DType::i32) t = dew::cast(t, dew::DType::i32);
    return t;
  }

  // The model's inputs: text[:, :-1] as tokens, and for packed rows their positions and segment ids.
  dew::Batch model_inputs(const dew::Batch& batch, const Tensor& text) const {
    const int64_t s = text.shape()[1] - 1;
    dew::Batch in{{"tokens", dew::slice(text, 1, 0, s)}};
    if (const Tensor p = packed_field(batch, "text_positions", text); p.defined()) in["positions"] = dew::slice(p, 1, 0, s);
    if (const Tensor g = packed_field(batch, "text_segment_ids", text); g.defined())
      in["segment_ids"] = dew::slice(g, 1, 0, s);
    return in;
  }

  Tensor text_of(const dew::Batch& batch) const {
    auto it = batch.find("text");
    DEW_CHECK(it != batch.end(), "lm: the batch has no 'text' field (use source = tokens)");
    Tensor t = it->second;
    DEW_CHECK(t.ndim() == 2 && t.shape()[1] >= 2, "lm: 'text' must be [B, S + 1] with S >= 1, got ",
              dew::shape_str(t.shape()));
    if (t.dtype() != dew::DType::i32) t = dew::cast(t, dew::DType::i32);
    return t;
  }

  Tensor flat_logits(const Tensor& logits, int64_t rows) const {
    DEW_CHECK(logits.ndim() == 3 && logits.shape()[0] * logits.shape()[1] == rows, "lm: the model returned logits ",
              dew::shape_str(logits.shape()), "; expected [B, S, V]");
    Tensor l = dew::reshape(logits, {rows, logits.shape()[2]});
    if (l.dtype() != dew::DType::f32) l = dew::cast(l, dew::DType::f32);
    return l;
  }

  // The mean cross-entropy of the model on `in` against targets [rows], and the argmax predictions i32 [rows]:
  // the head fused into the loss (dew::linear_cross_entropy: no [rows, V] logits) when fused_head says so, else
  // cross_entropy over the model's logits.
  Tensor loss_of(const dew::Batch& in, const Tensor& targets, int64_t rows, Tensor& predictions) const {
    if (fuse_head(rows)) {
      const dew::HiddenAndHead o = head_model_->forward_rows(in, rows, vocab_);
      dew::LinearCrossEntropyOptions lo;
      lo.ignore_index = ignore_index();
      lo.softcap = o.softcap;
      lo.chunk_mb = fused_head_mb_;
      lo.predictions = &predictions;
      return dew::linear_cross_entropy(o.hidden, o.weight, targets, lo);
    }
    const Tensor logits = flat_logits(model_->forward(in), rows);
    Tensor loss = dew::cross_entropy(logits, targets, ignore_index());
    dew::NoGradGuard no_grad;
    predictions = dew::argmax(logits.detach());
    return loss;
  }
  // fused_head = true, or auto and one micro-batch's f32 logits past fused_head_mb (more than one chunk); never
  // under f16-mixed with gradients (linear_cross_entropy refuses it: its gradients precede the loss scale).
  bool fuse_head(int64_t rows) const {
    if (!head_model_ || fused_head_ == "false") return false;
    if (dew::autocast_dtype() == dew::DType::f16 && dew::grad_enabled()) {
      DEW_USAGE_CHECK(fused_head_ != "true", "lm: fused_head = true does not train under f16-mixed (the fused ",
                      "head's gradients would underflow before the loss scale); use bf16-mixed or fused_head = auto");
      return false;
    }
    return fused_head_ == "true" || 4.0 * double(rows) * double(vocab_) > fused_head_mb_ * 1048576.0;
  }

  // Correct argmax predictions and counted targets (targets != pad_id; ids checked against the vocab).
  void score(const Tensor& predictions, const Tensor& targets, int64_t& hits, int64_t& counted) const {
    const std::vector<int32_t> truth = targets.to_ints();
    const std::vector<int32_t> pred = predictions.to_ints();
    const int64_t v = vocab_;
    for (size_t i = 0; i < truth.size(); ++i) {
      if (truth[i] == ignore_index()) continue;  // pad_id, or a masked target
      DEW_CHECK(truth[i] >= 0 && truth[i] < v, "lm: token id ", truth[i], " is outside the model's vocabulary [0, ", v,
                ")");
      ++counted;
      hits += pred[i] == truth[i];
    }
  }

  std::string validation_sample(const std::vector<int32_t>& first_row) {
    dew::SamplingParams sp;
    sp.max_new_tokens = sample_tokens_;
    sp.temperature = float(sample_temperature_);
    sp.top_k = sample_top_k_;
    sp.top_p = float(sample_top_p_);
    sp.seed = uint64_t(sample_seed_);
    if (tokenizer_) {
      sp.eos_id = tokenizer_->eos_id();
      const auto g = dew::generate_text(*decoder_, *tokenizer_, {sample_prompt_}, sp);
      return sample_prompt_ + g[0].text + "\n";
    }
    // No tokenizer: continue the first few tokens of the first validation window, as ids.
    std::vector<int32_t> prompt(first_row.begin(), first_row.begin() + std::min<size_t>(first_row.size(), 4));
    if (prompt.empty()) prompt = {0};
    const auto g = dew::generate(dew::decoder_start(*decoder_), {prompt}, sp, nullptr, decoder_->context_length());
    std::ostringstream os;
    for (int32_t t : prompt) os << t << ' ';
    os << "|";
    for (int32_t t : g[0].tokens) os << ' ' << t;
    os << "\n";
    return os.str();
  }

  std::shared_ptr<dew::Model> model_;
  dew::CausalDecoder* decoder_ = nullptr;
  dew::LinearHeadModel* head_model_ = nullptr;  // the model's hidden states and head, when it has them
  std::shared_ptr<dew::Tokenizer> tokenizer_;
  dew::TokenMeta meta_;
  bool has_meta_ = false;
  dew::BackendPtr backend_;
  uint64_t seed_ = 0;
  int64_t pad_id_ = -1, vocab_size_ = 0, vocab_ = 0, seq_len_ = 0, sample_tokens_ = 200, sample_top_k_ = 0,
          sample_seed_ = 0, eval_batches_ = 0;
  double sample_temperature_ = 0.8, sample_top_p_ = 0.95, fused_head_mb_ = 256.0;
  std::string sample_prompt_ = "The ", model_plugin_, data_path_, fused_head_ = "auto";
};

}  // namespace

DEW_PLUGIN("lm", "0.1.0") {
  registrar.add<dew::Objective>({
      .name = "lm",
      .description = "language modelling: next-token cross-entropy of a causal backbone; ce, perplexity, bits per "
                     "byte; text samples",
      .factory = [](const dew::Options& o) { return std::make_shared<LanguageModel>(o); },
      .options = {{"pad_id", "-1", "target id excluded from the loss (-1: none)"},
                  {"vocab_size", "0", "vocabulary size when the data has no meta.json (0: from the data)"},
                  {"sample_prompt", "The ", "prompt of the validation sample"},
                  {"sample_tokens", "200", "tokens of the validation sample (0: none)"},
                  {"sample_temperature", "0.8", "temperature of the validation sample (0: greedy)"},
                  {"sample_top_k", "0", "top-k of the validation sample (0: off)"},
                  {"sample_top_p", "0.95", "top-p of the validation sample"},
                  {"sample_seed", "0", "seed of the validation sample"},
                  {"eval_batches", "0", "at most this many validation batches (0: the whole split)"},
                  {"fused_head", "auto",
                   "auto | true | false: the head fused into the loss, no [rows, V] logits (auto: when one "
                   "micro-batch's f32 logits exceed fused_head_mb; needs a dew::LinearHeadModel)"},
                  {"fused_head_mb", "256", "MiB of f32 logits per chunk of the fused head"}},
  });
}
