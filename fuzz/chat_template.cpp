// fuzz/chat_template.cpp — libFuzzer target: dew's Jinja-subset chat-template engine (core/text/
// chat_template.cpp) as `dew-tokenize render-chat`, SFT data and /v1/chat/completions use it. The input
// is a template, then (after the first NUL, optional) a conversation JSON; without one a fixed multi-turn
// conversation with a system prompt, a tool call and unicode is used. The template must parse or be refused
// (dew::Error naming the line), and a parsed template must render or raise dew::Error — never crash, recurse
// without bound or hang (libFuzzer's -timeout). A rendering's generation spans lie inside its text.
#include <cstdint>
#include <string>

#include "dew/chat_template.hpp"
#include "dew/error.hpp"

namespace {
const char* kConversation = R"({"messages": [
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Hi \u00e9\u4e16 \ud83d\ude00"},
  {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
  {"role": "tool", "content": "42"},
  {"role": "assistant", "content": "Done.", "reasoning_content": "think"},
  {"role": "user", "content": ""}],
 "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
 "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string source = in.substr(0, nul);
  const std::string context = nul == std::string::npos ? std::string(kConversation) : in.substr(nul + 1);
  try {
    const dew::ChatTemplate t(source, "fuzz");
    const dew::ChatRendering r = t.render(context);
    for (const auto& [b, e] : r.generation_spans)
      if (b < 0 || e < b || e > int64_t(r.text.size())) __builtin_trap();
    dew::ChatConfig config;
    config.chat_template = source;
    config.special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    const dew::RenderedChat rc = dew::render_chat_with_spans(t, config, context);
    for (const auto& [b, e] : rc.assistant_spans)
      if (b < 0 || e < b || e > int64_t(rc.text.size())) __builtin_trap();
  } catch (const dew::Error&) {
  }
  return 0;
}
