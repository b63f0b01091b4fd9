// plugins/data/preference_jsonl — the "preference_jsonl" data source: preference pairs for DPO
// (plugins/objectives/dpo; docs/training.md).
//
// Each non-blank line: {"prompt": P, "chosen": C, "rejected": R} with C and R strings and P a string (the
// prompt's raw text) or a list of messages (rendered with the chat template and its generation prompt,
// as chat_jsonl does), optionally "ref_chosen_logp" and "ref_rejected_logp" (numbers: the reference
// model's summed log-probabilities of C and R given P; every line or none).
// Options: path (required), tokenizer (a folder from dew-tokenize or an import; required), template
// (default: the tokenizer folder's, else dew's default), seq_len (required), val_count (the first
// val_count pairs are the val split; default 0), truncate (false: a pair longer than seq_len + 1 tokens
// is refused naming its line), split (train | val; set by the loader).
// Record: "chosen" and "rejected" i32 [seq_len + 1] (prompt tokens, then the response's, then padding
// with the eos id, or 0), "chosen_mask" and "rejected_mask" i32 [seq_len + 1] (1 on the response's
// tokens), and with reference log-probs "ref_chosen_logp", "ref_rejected_logp" f32 []. The prompt and
// the response are encoded separately (a post-processor's BOS only before the prompt, and not when the
// prompt's text already starts with it). A response with no token in the window is refused.
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/prompt_data.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Pair {
  std::vector<int32_t> chosen, rejected, chosen_mask, rejected_mask;
  float ref_chosen = 0, ref_rejected = 0;
};

class PreferenceJsonlSource final : public dew::DataSource {
 public:
  explicit PreferenceJsonlSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    auto key = [&](const char* k) { return "'" + ctx + k + "'"; };
    DEW_USAGE_CHECK(o.has("path"), "preference_jsonl: missing required option ", key("path"));
    DEW_USAGE_CHECK(o.has("tokenizer"), "preference_jsonl: missing required option ", key("tokenizer"));
    DEW_USAGE_CHECK(o.has("seq_len"), "preference_jsonl: missing required option ", key("seq_len"));
    const std::string path = o.get_string("path", "");
    const std::string tok_dir = o.get_string("tokenizer", "");
    seq_len_ = o.get_int("seq_len", 0);
    DEW_USAGE_CHECK(seq_len_ > 0, "preference_jsonl: option ", key("seq_len"), " must be positive");
    const int64_t val_count = o.get_int("val_count", 0);
    DEW_USAGE_CHECK(val_count >= 0, "preference_jsonl: option ", key("val_count"), " must be >= 0");
    const bool truncate = o.get_bool("truncate", false);
    const std::string split = o.get_string("split", "train");
    DEW_USAGE_CHECK(split == "train" || split == "val", "preference_jsonl: option ", key("split"),
                    " must be train or val, got '", split, "'");
    const dew::PromptEncoder encoder(tok_dir, o.get_string("template", ""), "preference_jsonl", ctx + "template");
    const dew::Tokenizer& tokenizer = *encoder.tokenizer();
    const int64_t n = seq_len_ + 1;
    const int32_t pad = tokenizer.eos_id() >= 0 ? tokenizer.eos_id() : 0;
    int with_ref = -1;
    for (const auto& [at, text] : dew::read_jsonl_split(path, val_count, split, "preference_jsonl", ctx, "pairs")) {
      const std::string where = path + ":" + std::to_string(at) + ": ";
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        throw dew::UsageError("preference_jsonl: " + where + "not valid JSON: " + e.what());
      }
      DEW_USAGE_CHECK(j.is_object() && j.contains("prompt") && j.contains("chosen") && j.contains("rejected") &&
                          j["chosen"].is_string() && j["rejected"].is_string() &&
                          (j["prompt"].is_string() || j["prompt"].is_array()),
                      "preference_jsonl: ", where,
                      "a pair is {\"prompt\": text or messages, \"chosen\": text, \"rejected\": text}");
      const int has_ref = j.contains("ref_chosen_logp") || j.contains("ref_rejected_logp");
      DEW_USAGE_CHECK(with_ref < 0 || with_ref == has_ref, "preference_jsonl: ", where,
                      "reference log-probs are given on some lines and not others");
      with_ref = has_ref;
      std::vector<int32_t> p;
      try {
        p = encoder.encode_prompt(j["prompt"].dump());
      } catch (const dew::Error& e) {
        throw dew::UsageError("preference_jsonl: " + where + e.what());
      }
      Pair pair;
      auto build = [&](const std::string& response, std::vector<int32_t>& ids, std::vector<int32_t>& mask,
                       const char* which) {
        ids = p;
        mask.assign(p.size(), 0);
        for (int32_t id : encoder.encode_response(response)) {
          ids.push_back(id);
          mask.push_back(1);
        }
        DEW_USAGE_CHECK(truncate || int64_t(ids.size()) <= n, "preference_jsonl: ", where, "prompt + ", which, " is ",
                        ids.size(), " tokens, longer than seq_len + 1 = ", n, " (raise ", key("seq_len"), " or set ",
                        key("truncate"), " = true)");
        ids.resize(size_t(std::min<int64_t>(n, int64_t(ids.size()))));
        mask.resize(ids.size());
        int64_t counted = 0;
        for (size_t k = 1; k < mask.size(); ++k) counted += mask[k];
        DEW_USAGE_CHECK(counted > 0, "preference_jsonl: ", where, "the ", which,
                        " response has no token within seq_len + 1 = ", n, " tokens");
        ids.resize(size_t(n), pad);
        mask.resize(size_t(n), 0);
      };
      build(j["chosen"].get<std::string>(), pair.chosen, pair.chosen_mask, "chosen");
      build(j["rejected"].get<std::string>(), pair.rejected, pair.rejected_mask, "rejected");
      if (has_ref) {
        DEW_USAGE_CHECK(j.contains("ref_chosen_logp") && j["ref_chosen_logp"].is_number() &&
                            j.contains("ref_rejected_logp") && j["ref_rejected_logp"].is_number(),
                        "preference_jsonl: ", where, "ref_chosen_logp and ref_rejected_logp must both be numbers");
        pair.ref_chosen = j["ref_chosen_logp"].get<float>();
        pair.ref_rejected = j["ref_rejected_logp"].get<float>();
      }
      pairs_.push_back(std::move(pair));
    }
    with_ref_ = with_ref == 1;
    identity_ = "preference_jsonl:" + fs::weakly_canonical(path).string() + "#" + split +
                "?seq_len=" + std::to_string(seq_len_) + "&val_count=" + std::to_string(val_count);
  }

  int64_t size() const override { return int64_t(pairs_.size()); }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < size(), "preference_jsonl: record ", index, " is outside [0, ", size(), ")");
    const Pair& p = pairs_[size_t(index)];
    const int64_t n = seq_len_ + 1;
    auto field = [&](const std::vector<int32_t>& v) {
      dew::HostArray a = dew::HostArray::make(dew::DType::i32, {n});
      std::copy(v.begin(), v.end(), a.as<int32_t>());
      return a;
    };
    dew::Record r;
    r.emplace("chosen", field(p.chosen));
    r.emplace("rejected", field(p.rejected));
    r.emplace("chosen_mask", field(p.chosen_mask));
    r.emplace("rejected_mask", field(p.rejected_mask));
    if (with_ref_) {
      dew::HostArray c = dew::HostArray::make(dew::DType::f32, {}), x = dew::HostArray::make(dew::DType::f32, {});
      *c.as<float>() = p.ref_chosen;
      *x.as<float>() = p.ref_rejected;
      r.emplace("ref_chosen_logp", std::move(c));
      r.emplace("ref_rejected_logp", std::move(x));
    }
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  int64_t seq_len_ = 0;
  bool with_ref_ = false;
  std::vector<Pair> pairs_;
  std::string identity_;
};

}  // namespace

DEW_PLUGIN("preference_jsonl", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "preference_jsonl",
       .description = "preference pairs (JSONL of {prompt, chosen, rejected}) for DPO: chosen / rejected i32 "
                      "[seq_len + 1] with response masks, optional reference log-probs",
       .factory = [](const dew::Options& o) { return std::make_shared<PreferenceJsonlSource>(o); },
       .probe = {},
       .options = {{"path", "", "a .jsonl file of {prompt, chosen, rejected[, ref_chosen_logp, ref_rejected_logp]}"},
                   {"tokenizer", "", "folder with meta.json (+ tokenizer.json); required"},
                   {"template", "", "chat template for message prompts (default: the tokenizer folder's)"},
                   {"seq_len", "", "tokens per row (the record holds seq_len + 1); required"},
                   {"val_count", "0", "the first val_count pairs are the val split"},
                   {"truncate", "false", "cut pairs longer than seq_len + 1 tokens (else refused)"},
                   {"split", "train", "train or val; set by the loader"}}});
}
