// tools/dew-run/chat_completions.hpp — POST /v1/chat/completions for `dew-run serve` (docs/serving.md):
// the request is rendered with the run's chat template (dew/chat_template.hpp) into a /v1/completions
// request, which serve.cpp checks, schedules (continuous batching) and answers; these functions shape
// its choices and chunks the way OpenAI's chat API does.
//
// Request fields: messages (required: [{role, content}], content a string, or a list of {"type": "text",
// "text"} parts, which are joined), model, max_tokens / max_completion_tokens, temperature, top_p, top_k,
// min_p, repetition_penalty, seed, stop, n, stream, stream_options ({"include_usage": bool}; usage is
// always sent), user, and template variables in chat_template_kwargs (e.g. {"enable_thinking": false}).
// The prompt ends with the template's generation prompt; the template's end-of-turn text (what follows
// an assistant turn's content, e.g. "<|im_end|>") is added to the stop strings, so a turn that ends
// finishes with finish_reason "stop". logprobs (bool) and top_logprobs (0..20) become the completions body's
// logprobs. Refused (400): tools / tool_choice / functions (no tool-call parsing), response_format, and everything
// /v1/completions refuses.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "dew/chat_template.hpp"
#include "dew/generate.hpp"
#include "dew/tokenizer.hpp"

namespace dew_run::chat {

// The run's template: [data] template, else the tokenizer folder ([data] tokenizer, else [data] path):
// its tokenizer_config.json / chat_template.jinja, else dew's default.
struct ChatSetup {
  dew::ChatConfig config;
  std::shared_ptr<const dew::ChatTemplate> tmpl;
  std::string end_of_turn;  // the stop string after an assistant turn ("" when the template has none)
};
ChatSetup setup_from_folder_or_file(const std::string& path);

// A chat request's body -> the body of the equivalent /v1/completions request (prompt = the rendering),
// or throws std::invalid_argument{"param\tmessage"} for a bad request.
nlohmann::json to_completion_body(const nlohmann::json& chat_body, const ChatSetup& setup);

// {"index", "message": {"role": "assistant", "content"}, "logprobs", "finish_reason"}.
nlohmann::json message_choice(int64_t index, const std::string& text, const nlohmann::json& finish,
                              const nlohmann::json& logprobs = nullptr);
// A stream chunk's choice: {"index", "delta": {"role"? , "content"?}, "logprobs", "finish_reason"}.
nlohmann::json delta_choice(int64_t index, const std::string& text, const nlohmann::json& finish, bool first,
                            const nlohmann::json& logprobs = nullptr);
// A token as the logprobs name it: its text when its bytes are UTF-8, else "bytes:\\xNN..." (OpenAI's spelling: a
// byte-level token can be part of a character, and such tokens must not all read as U+FFFD); "token_id:N" without a
// tokenizer.
std::string token_text(const dew::Tokenizer* tok, int32_t id);
// A choice's logprobs as OpenAI's chat API shapes them: {"content": [{"token", "logprob", "bytes" (the raw bytes; null
// without a tokenizer), "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}.
nlohmann::json logprobs_json(const std::vector<dew::TokenLogprob>& entries, const dew::Tokenizer* tok);

}  // namespace dew_run::chat
