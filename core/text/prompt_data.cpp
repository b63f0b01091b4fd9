// core/text/prompt_data.cpp — dew/prompt_data.hpp: a JSONL file's lines for a split, and prompts (raw text or chat
// messages) as token ids, for the preference_jsonl and prompt_jsonl sources.
#include "dew/prompt_data.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dew/error.hpp"

namespace dew {

namespace fs = std::filesystem;

std::vector<JsonlLine> read_jsonl_split(const std::string& path, int64_t val_count, const std::string& split,
                                        const std::string& who, const std::string& option_prefix,
                                        const std::string& records) {
  const std::string val_key = "'" + option_prefix + "val_count'";
  std::ifstream in(path, std::ios::binary);
  DEW_USAGE_CHECK(in.good(), who, ": cannot read '", option_prefix, "path' '", path, "'");
  std::vector<JsonlLine> lines;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number)
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back({number, line});
  DEW_USAGE_CHECK(!lines.empty(), who, ": '", path, "' holds no ", records);
  DEW_USAGE_CHECK(val_count < int64_t(lines.size()), who, ": ", val_key, " = ", val_count, " leaves no training ",
                  records);
  if (split == "val") {
    DEW_USAGE_CHECK(val_count > 0, who, ": '", path, "' has no validation split: set ", val_key);
    lines.resize(size_t(val_count));
  } else {
    lines.erase(lines.begin(), lines.begin() + val_count);
  }
  return lines;
}

PromptEncoder::PromptEncoder(const std::string& tokenizer_dir, const std::string& template_path, const std::string& who,
                             const std::string& option) {
  tokenizer_ = load_tokenizer(tokenizer_dir);
  const std::vector<int32_t> empty = tokenizer_->encode("");
  bos_ = empty.empty() ? -1 : empty[0];
  const std::string tmpl = template_path.empty() ? tokenizer_dir : template_path;
  DEW_USAGE_CHECK(fs::exists(tmpl), who, ": '", option, "' '", tmpl, "' does not exist");
  config_ = fs::is_directory(tmpl) ? chat_config_of_folder(tmpl) : read_chat_config(tmpl);
  if (config_.chat_template.empty()) {
    config_.chat_template = default_chat_template();
    config_.template_origin = "dew's default chat template";
  }
  template_ = std::make_shared<ChatTemplate>(config_.chat_template, config_.template_origin);
}

std::vector<int32_t> PromptEncoder::strip_bos(std::vector<int32_t> ids) const {
  if (bos_ >= 0 && !ids.empty() && ids[0] == bos_) ids.erase(ids.begin());
  return ids;
}

std::vector<int32_t> PromptEncoder::encode_prompt(const std::string& prompt_json) const {
  const nlohmann::json j = nlohmann::json::parse(prompt_json);
  DEW_USAGE_CHECK(j.is_string() || j.is_array(), "a prompt is a text or a list of messages");
  const std::string text =
      j.is_string() ? j.get<std::string>()
                    : template_->render(chat_context_json(config_, nlohmann::json{{"messages", j}}.dump(), true)).text;
  std::vector<int32_t> ids;
  if (bos_ >= 0) {
    const std::string bos_text = tokenizer_->token_bytes(bos_);
    if (bos_text.empty() || text.compare(0, bos_text.size(), bos_text) != 0) ids.push_back(bos_);
  }
  for (int32_t id : strip_bos(tokenizer_->encode(text))) ids.push_back(id);
  return ids;
}

std::vector<int32_t> PromptEncoder::encode_response(const std::string& text) const {
  return strip_bos(tokenizer_->encode(text));
}

}  // namespace dew
