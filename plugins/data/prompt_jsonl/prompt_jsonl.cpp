// plugins/data/prompt_jsonl — the "prompt_jsonl" data source: prompts (with optional reference answers) for RL
// objectives that generate their own completions (plugins/objectives/grpo; docs/training.md "GRPO").
//
// Each non-blank line: {"prompt": P, "answer": A} with P a string (the prompt's raw text) or a list of messages
// (rendered with the chat template and its generation prompt, as chat_jsonl and preference_jsonl do) and A a string
// or a number (optional: what reward functions such as accuracy compare against; a number is kept as its JSON text).
// Other keys are ignored.
// Options: path (required), tokenizer (a folder from dew-tokenize or an import; required), template (default: the
// tokenizer folder's, else dew's default), prompt_len (required: the most prompt tokens), truncate (false: a longer
// prompt is refused naming its line; true: its last prompt_len tokens are kept, as TRL cuts prompts from the left),
// val_count (the first val_count prompts are the val split; default 0), split (train | val; set by the loader).
// Record: "prompt" i32 [prompt_len] (the prompt's tokens, then 0s), "prompt_length" i32 [] (its token count, >= 1),
// "answer" u8 [A] (the answer's UTF-8 bytes, then 0s; A = the longest answer of the split, at least 1) and
// "answer_length" i32 []. A post-processor's BOS is put before the prompt (not when its text already starts with it).
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

struct Prompt {
  std::vector<int32_t> tokens;
  std::string answer;
};

class PromptJsonlSource final : public dew::DataSource {
 public:
  explicit PromptJsonlSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    auto key = [&](const char* k) { return "'" + ctx + k + "'"; };
    for (const char* k : {"path", "tokenizer", "prompt_len"})
      DEW_USAGE_CHECK(o.has(k), "prompt_jsonl: missing required option ", key(k));
    const std::string path = o.get_string("path", "");
    const std::string tok_dir = o.get_string("tokenizer", "");
    prompt_len_ = o.get_int("prompt_len", 0);
    DEW_USAGE_CHECK(prompt_len_ > 0, "prompt_jsonl: option ", key("prompt_len"), " must be positive");
    const int64_t val_count = o.get_int("val_count", 0);
    DEW_USAGE_CHECK(val_count >= 0, "prompt_jsonl: option ", key("val_count"), " must be >= 0");
    const bool truncate = o.get_bool("truncate", false);
    const std::string split = o.get_string("split", "train");
    DEW_USAGE_CHECK(split == "train" || split == "val", "prompt_jsonl: option ", key("split"),
                    " must be train or val, got '", split, "'");
    const dew::PromptEncoder encoder(tok_dir, o.get_string("template", ""), "prompt_jsonl", ctx + "template");
    for (const auto& [at, text] : dew::read_jsonl_split(path, val_count, split, "prompt_jsonl", ctx, "prompts")) {
      const std::string where = path + ":" + std::to_string(at) + ": ";
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        throw dew::UsageError("prompt_jsonl: " + where + "not valid JSON: " + e.what());
      }
      DEW_USAGE_CHECK(j.is_object() && j.contains("prompt") && (j["prompt"].is_string() || j["prompt"].is_array()) &&
                          (!j.contains("answer") || j["answer"].is_string() || j["answer"].is_number()),
                      "prompt_jsonl: ", where, "a line is {\"prompt\": text or messages, \"answer\": text or number}");
      Prompt p;
      try {
        p.tokens = encoder.encode_prompt(j["prompt"].dump());
      } catch (const dew::Error& e) {
        throw dew::UsageError("prompt_jsonl: " + where + e.what());
      }
      DEW_USAGE_CHECK(!p.tokens.empty(), "prompt_jsonl: ", where, "the prompt encodes to no token");
      DEW_USAGE_CHECK(truncate || int64_t(p.tokens.size()) <= prompt_len_, "prompt_jsonl: ", where, "the prompt is ",
                      p.tokens.size(), " tokens, longer than prompt_len = ", prompt_len_, " (raise ", key("prompt_len"),
                      " or set ", key("truncate"), " = true)");
      if (int64_t(p.tokens.size()) > prompt_len_) p.tokens.erase(p.tokens.begin(), p.tokens.end() - prompt_len_);
      if (j.contains("answer"))
        p.answer = j["answer"].is_string() ? j["answer"].get<std::string>() : j["answer"].dump();
      answer_cap_ = std::max<int64_t>(answer_cap_, int64_t(p.answer.size()));
      prompts_.push_back(std::move(p));
    }
    identity_ = "prompt_jsonl:" + fs::weakly_canonical(path).string() + "#" + split +
                "?prompt_len=" + std::to_string(prompt_len_) + "&val_count=" + std::to_string(val_count) +
                "&truncate=" + (truncate ? "1" : "0");
  }

  int64_t size() const override { return int64_t(prompts_.size()); }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < size(), "prompt_jsonl: record ", index, " is outside [0, ", size(), ")");
    const Prompt& p = prompts_[size_t(index)];
    dew::Record r;
    dew::HostArray tokens = dew::HostArray::make(dew::DType::i32, {prompt_len_});
    std::fill(tokens.as<int32_t>(), tokens.as<int32_t>() + prompt_len_, 0);
    std::copy(p.tokens.begin(), p.tokens.end(), tokens.as<int32_t>());
    dew::HostArray answer = dew::HostArray::make(dew::DType::u8, {answer_cap_});
    std::fill(answer.as<unsigned char>(), answer.as<unsigned char>() + answer_cap_, 0);
    std::copy(p.answer.begin(), p.answer.end(), answer.as<unsigned char>());
    r.emplace("prompt", std::move(tokens));
    r.emplace("prompt_length", dew::HostArray::scalar_i32(int32_t(p.tokens.size())));
    r.emplace("answer", std::move(answer));
    r.emplace("answer_length", dew::HostArray::scalar_i32(int32_t(p.answer.size())));
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  int64_t prompt_len_ = 0, answer_cap_ = 1;
  std::vector<Prompt> prompts_;
  std::string identity_;
};

}  // namespace

DEW_PLUGIN("prompt_jsonl", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "prompt_jsonl",
       .description = "prompts with optional reference answers (JSONL of {prompt, answer}) for RL objectives (grpo): "
                      "prompt i32 [prompt_len] + prompt_length, answer bytes + answer_length",
       .factory = [](const dew::Options& o) { return std::make_shared<PromptJsonlSource>(o); },
       .probe = {},
       .options = {{"path", "", "a .jsonl file of {prompt: text or messages, answer: text or number}"},
                   {"tokenizer", "", "folder with meta.json (+ tokenizer.json); required"},
                   {"template", "", "chat template for message prompts (default: the tokenizer folder's)"},
                   {"prompt_len", "", "the most prompt tokens (records hold prompt_len); required"},
                   {"truncate", "false", "keep a longer prompt's last prompt_len tokens (else refused)"},
                   {"val_count", "0", "the first val_count prompts are the val split"},
                   {"split", "train", "train or val; set by the loader"}}});
}
