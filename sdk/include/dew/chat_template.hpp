// dew/chat_template.hpp — chat templates: the Jinja subset of Hugging Face `chat_template`s, rendered
// in dew (no C++ Jinja library is packaged by Debian), and what a run needs to render chats with one.
//
// The engine renders the way transformers' apply_chat_template does: a Jinja2 environment with
// trim_blocks and lstrip_blocks on, keep_trailing_newline off, the loopcontrols extension
// ({% break %} / {% continue %}), HF's `{% generation %}` tag (the span of an assistant turn), the
// globals raise_exception(msg), namespace(...), range(...), dict(...), strftime_now(fmt), and a
// `tojson` that is Python's json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=).
// Values follow Python: str() of None / True / 1.5 / lists / dicts, `and`/`or` return an operand,
// `/` is true division, `//` and `%` floor, an undefined name prints as "" and fails when used further.
// Supported (tests/text/chat_template/ renders >= 1,000 conversations through the Llama 3 / 3.1,
// Qwen2 / Qwen3, Mistral, Gemma and dew's default templates and compares with Python's jinja2 byte for
// byte; docs/chat.md lists the whole subset):
//   {{ }}, {# #}, whitespace control (- and +), {% if/elif/else %}, {% for x in y [if c] %} with
//   loop.* and {% else %}, {% set %} (names, tuples, namespace attributes, blocks), {% macro %},
//   {% break/continue %}, {% generation %}; literals, lists, dicts, tuples, attributes, subscripts and
//   slices, calls, filters, tests, conditional expressions, the operators of Jinja.
// Anything else ({% include %}, {% extends %}, {% call %}, {% filter %}, {% raw %}, an unknown filter
// or test, ...) is refused when the template is parsed: a dew::UsageError "NAME:LINE: ..." naming the
// template line. Errors while rendering (raise_exception, an undefined value used, a type error) are
// UsageErrors naming the line too.
// Strings are UTF-8; lengths, indices and slices count code points as Python does. Deviations from
// Python, all refused rather than guessed: integers are 64-bit (overflow is an error), dict keys are
// strings, str % args formatting is not supported; upper/lower/title/capitalize change ASCII letters only.
// A ChatTemplate is immutable after parsing; render() is thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dew {

// What one rendering produced: the text and the byte ranges [begin, end) of its {% generation %} blocks.
struct ChatRendering {
  std::string text;
  std::vector<std::pair<int64_t, int64_t>> generation_spans;
};

class ChatTemplate {
 public:
  // Parses the template; refuses unsupported syntax naming `name` and the line.
  explicit ChatTemplate(const std::string& source, std::string name = "chat_template");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the variables of a JSON object (messages, tools, add_generation_prompt, bos_token, ...).
  ChatRendering render(const std::string& context_json) const;
  // True when the template has {% generation %} blocks.
  bool has_generation_tags() const;
  const std::string& name() const;
  const std::string& source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The chat part of a Hugging Face tokenizer_config.json: the template (its "chat_template" string, or
// the one named "default" when it is a list of {name, template}; else a chat_template.jinja file in the
// same folder, as transformers writes it) and the special tokens the template sees (bos_token,
// eos_token, unk_token, pad_token; a string or an {"content": ...} object).
struct ChatConfig {
  std::string chat_template;                                        // "" when the file has none
  std::string template_origin;                                      // the file it came from, for messages
  std::vector<std::pair<std::string, std::string>> special_tokens;  // name -> text, e.g. {"bos_token", "<s>"}
};
ChatConfig read_chat_config(const std::string& tokenizer_config_path);

// dew's default template, for byte and BPE tokenizers trained in dew (docs/chat.md): ChatML turns
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n", the assistant's content and its "<|im_end|>" inside a
// {% generation %} block; add_generation_prompt appends "<|im_start|>assistant\n". With the byte
// tokenizer the markers are plain bytes.
const std::string& default_chat_template();

// The template a run renders with: <dir>/tokenizer_config.json's (or chat_template.jinja's) when there
// is one, else the default. `origin` (when given) says which.
ChatConfig chat_config_of_folder(const std::string& dir);

// One conversation rendered with the byte ranges of its assistant turns (what SFT trains on).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<int64_t, int64_t>> assistant_spans;  // [begin, end) bytes of text, in order
};

// Renders `conversation_json` (an object with "messages" and optionally "tools" and other template
// variables; the special tokens of `config` are added) without a generation prompt, and finds each
// assistant turn: from the {% generation %} blocks when the template has them, else by rendering the
// prefixes (messages[:i] with add_generation_prompt, then messages[:i+1]): the assistant turn i is
// what the second adds to the first. A template whose prefixes are not prefixes of the whole rendering
// (e.g. one that moves the system prompt to the last user turn) is refused for span finding.
RenderedChat render_chat_with_spans(const ChatTemplate& tmpl, const ChatConfig& config,
                                    const std::string& conversation_json);

// The context object a conversation line renders with: its own keys, the special tokens of `config`
// (a key of the line wins) and add_generation_prompt.
std::string chat_context_json(const ChatConfig& config, const std::string& conversation_json,
                              bool add_generation_prompt);

}  // namespace dew
