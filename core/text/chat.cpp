// core/text/chat.cpp — chat configs (tokenizer_config.json / chat_template.jinja), dew's default
// template, the rendering context of a conversation line and the assistant spans SFT trains on
// (dew/chat_template.hpp). The Jinja engine itself is chat_template.cpp.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/chat_template.hpp"
#include "dew/error.hpp"

namespace dew {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  DEW_USAGE_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson parse_object(const std::string& text, const std::string& what) {
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + " is not valid JSON: " + e.what());
  }
  DEW_USAGE_CHECK(j.is_object(), what, " must be a JSON object");
  return j;
}

}  // namespace

const std::string& default_chat_template() {
  static const std::string t =
      "{#- dew's default chat template (ChatML turns; docs/chat.md). -#}\n"
      "{%- for message in messages -%}\n"
      "    {%- set content = message['content'] if message['content'] is string else '' -%}\n"
      "    {{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
      "    {%- if message['role'] == 'assistant' -%}\n"
      "        {%- generation -%}\n"
      "            {{- content + '<|im_end|>' -}}\n"
      "        {%- endgeneration -%}\n"
      "    {%- else -%}\n"
      "        {{- content + '<|im_end|>' -}}\n"
      "    {%- endif -%}\n"
      "    {{- '\\n' -}}\n"
      "{%- endfor -%}\n"
      "{%- if add_generation_prompt -%}\n"
      "    {{- '<|im_start|>assistant\\n' -}}\n"
      "{%- endif -%}\n";
  return t;
}

ChatConfig read_chat_config(const std::string& path) {
  const std::string what = "'" + path + "'";
  DEW_USAGE_CHECK(fs::exists(path), "the tokenizer config ", what, " does not exist");
  const ojson j = parse_object(read_text(path), what);
  ChatConfig c;
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]: the default one.
      for (const auto& e : *it) {
        DEW_USAGE_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["template"].is_string(),
                        what, ": chat_template entries must be {\"name\", \"template\"}");
        if (e["name"] == "default") c.chat_template = e["template"].get<std::string>();
      }
      DEW_USAGE_CHECK(!c.chat_template.empty(), what, ": chat_template lists no template named \"default\"");
    } else {
      throw UsageError(what + ": chat_template must be a string or a list of {name, template}");
    }
    c.template_origin = path + " (chat_template)";
  } else {
    const fs::path jinja = fs::path(path).parent_path() / "chat_template.jinja";
    if (fs::exists(jinja)) {
      c.chat_template = read_text(jinja);
      c.template_origin = jinja.string();
    }
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (it->is_string()) {
      c.special_tokens.emplace_back(key, it->get<std::string>());
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      c.special_tokens.emplace_back(key, (*it)["content"].get<std::string>());
    } else {
      throw UsageError(what + ": " + key + " must be a string or an object with \"content\"");
    }
  }
  return c;
}

ChatConfig chat_config_of_folder(const std::string& dir) {
  const fs::path d(dir);
  ChatConfig c;
  if (!dir.empty() && fs::exists(d / "tokenizer_config.json")) {
    c = read_chat_config((d / "tokenizer_config.json").string());
  } else if (!dir.empty() && fs::exists(d / "chat_template.jinja")) {
    c.chat_template = read_text(d / "chat_template.jinja");
    c.template_origin = (d / "chat_template.jinja").string();
  }
  if (c.chat_template.empty()) {
    c.chat_template = default_chat_template();
    c.template_origin = "dew's default chat template";
  }
  return c;
}

std::string chat_context_json(const ChatConfig& config, const std::string& conversation_json,
                              bool add_generation_prompt) {
  const ojson line = parse_object(conversation_json, "a conversation");
  DEW_USAGE_CHECK(line.contains("messages") && line["messages"].is_array(),
                  "a conversation needs \"messages\": a list of {\"role\", \"content\"}");
  for (const auto& m : line["messages"])
    DEW_USAGE_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
                    "every message needs a string \"role\", got ", m.dump());
  ojson ctx = ojson::object();
  for (const auto& [k, v] : config.special_tokens) ctx[k] = v;
  for (auto it = line.begin(); it != line.end(); ++it) ctx[it.key()] = it.value();
  ctx["add_generation_prompt"] = add_generation_prompt;
  return ctx.dump();
}

RenderedChat render_chat_with_spans(const ChatTemplate& tmpl, const ChatConfig& config,
                                    const std::string& conversation_json) {
  RenderedChat r;
  const std::string whole = chat_context_json(config, conversation_json, false);
  const ChatRendering full = tmpl.render(whole);
  r.text = full.text;
  if (tmpl.has_generation_tags()) {
    r.assistant_spans = full.generation_spans;
    return r;
  }
  // No {% generation %} blocks: assistant turn i is what messages[:i+1] adds to messages[:i] with the
  // generation prompt, provided both renderings are prefixes of the whole one.
  ojson conv = ojson::parse(conversation_json);
  const ojson messages = conv["messages"];
  auto render_prefix = [&](size_t n, bool gen) {
    ojson c = conv;
    c["messages"] = ojson::array();
    for (size_t k = 0; k < n; ++k) c["messages"].push_back(messages[k]);
    return tmpl.render(chat_context_json(config, c.dump(), gen)).text;
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    std::string before, upto;
    try {
      before = render_prefix(i, true);
    } catch (const Error& e) {
      throw UsageError(tmpl.name() + ": cannot find assistant turn " + std::to_string(i) +
                       ": rendering the messages before it failed (" + e.what() +
                       "); give the template "
                       "{% generation %} blocks");
    }
    upto = render_prefix(i + 1, false);
    const bool stable = upto.compare(0, before.size(), before) == 0 && r.text.compare(0, upto.size(), upto) == 0 &&
                        (r.assistant_spans.empty() || int64_t(before.size()) >= r.assistant_spans.back().second);
    DEW_USAGE_CHECK(stable, tmpl.name(), ": the rendering of the messages before assistant turn ", i,
                    " is not a prefix of the whole conversation's, so its span cannot be found (the template "
                    "rewrites earlier turns, e.g. it moves the system prompt or drops reasoning); give the "
                    "template {% generation %} blocks around assistant turns");
    r.assistant_spans.emplace_back(int64_t(before.size()), int64_t(upto.size()));
  }
  return r;
}

}  // namespace dew
