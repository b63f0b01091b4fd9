// dew/prompt_data.hpp — what the data sources of prompts share (preference_jsonl for DPO, prompt_jsonl for GRPO): a
// JSONL file's lines for one split, and prompts — raw text or chat messages — as token ids.
//
//  * read_jsonl_split(): the non-blank lines of a file with their line numbers; the first val_count are the val split,
//    the rest train. Refused, as usage errors naming the source and the file: an unreadable or empty file, a
//    val_count that leaves no training records, split = val without val_count.
//  * PromptEncoder: a prompt given as a JSON string is its raw text; as a JSON array it is a list of messages,
//    rendered with the chat template (the template file or folder given, else the tokenizer folder's, else dew's
//    default) and its generation prompt. Either is encoded with the tokenizer, a post-processor's BOS first — not when
//    the text already starts with that token's text (a template's bos_token). A response is encoded alone, without
//    the BOS, so prompt + response tokens are what a model sees at generation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dew/chat_template.hpp"
#include "dew/tokenizer.hpp"

namespace dew {

struct JsonlLine {
  int64_t number = 0;  // 1-based line number in the file
  std::string text;
};
// `who`: the source's name ("prompt_jsonl"); `option_prefix`: how its options are quoted in errors ("data.");
// `records`: what a line holds, plural ("prompts").
std::vector<JsonlLine> read_jsonl_split(const std::string& path, int64_t val_count, const std::string& split,
                                        const std::string& who, const std::string& option_prefix,
                                        const std::string& records);

class PromptEncoder {
 public:
  // `template_path` "" takes the tokenizer folder's template; a path that does not exist is refused naming `option`.
  PromptEncoder(const std::string& tokenizer_dir, const std::string& template_path, const std::string& who,
                const std::string& option);
  const std::shared_ptr<Tokenizer>& tokenizer() const { return tokenizer_; }
  // `prompt_json`: a JSON string or array (see the top of the file). Template errors are usage errors.
  std::vector<int32_t> encode_prompt(const std::string& prompt_json) const;
  std::vector<int32_t> encode_response(const std::string& text) const;

 private:
  std::vector<int32_t> strip_bos(std::vector<int32_t> ids) const;
  std::shared_ptr<Tokenizer> tokenizer_;
  ChatConfig config_;
  std::shared_ptr<ChatTemplate> template_;
  int32_t bos_ = -1;
};

}  // namespace dew
