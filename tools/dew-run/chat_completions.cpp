// tools/dew-run/chat_completions.cpp — /v1/chat/completions: request -> rendered completion request,
// and the chat shapes of choices and stream chunks (chat_completions.hpp).
#include "chat_completions.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

#include "dew/error.hpp"

namespace dew_run::chat {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw std::invalid_argument(param + "\t" + message);
}

std::string trim_ws(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// What the template writes after an assistant turn's content: render a probe turn and read past it.
std::string end_of_turn(const ChatSetup& s) {
  static const std::string probe =
      "\x1d"
      "dew-end-of-turn-probe"
      "\x1d";
  const std::string conv =
      json{{"messages",
            json::array({json{{"role", "user"}, {"content", "x"}}, json{{"role", "assistant"}, {"content", probe}}})}}
          .dump();
  try {
    const dew::ChatRendering r = s.tmpl->render(dew::chat_context_json(s.config, conv, false));
    const size_t at = r.text.find(probe);
    if (at != std::string::npos) {
      size_t end = r.text.size();
      for (const auto& [b, e] : r.generation_spans)
        if (int64_t(at) >= b && int64_t(at) < e) end = size_t(e);
      const std::string eot = trim_ws(r.text.substr(at + probe.size(), end - at - probe.size()));
      if (!eot.empty()) return eot;
    }
  } catch (const dew::Error&) {
  }
  for (const auto& [k, v] : s.config.special_tokens)
    if (k == "eos_token") return v;
  return "";
}

}  // namespace

ChatSetup setup_from_folder_or_file(const std::string& path) {
  ChatSetup s;
  if (!path.empty() && fs::is_regular_file(path) && fs::path(path).extension() == ".json") {
    s.config = dew::read_chat_config(path);
  } else if (!path.empty() && fs::is_regular_file(path) && fs::path(path).extension() == ".jinja") {
    // The named template itself; the special tokens (bos / eos text) from its folder's files when they have them.
    s.config = dew::chat_config_of_folder(fs::path(path).parent_path().string());
    std::ifstream in(path, std::ios::binary);
    s.config.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    DEW_USAGE_CHECK(in.good() || in.eof(), "--chat-template: cannot read '", path, "'");
    s.config.template_origin = path;
  } else {
    DEW_USAGE_CHECK(path.empty() || fs::is_directory(path), "--chat-template '", path,
                    "' is neither a tokenizer_config.json, a .jinja file nor a folder");
    s.config = dew::chat_config_of_folder(fs::is_directory(path) ? path : std::string());
  }
  if (s.config.chat_template.empty()) {
    s.config.chat_template = dew::default_chat_template();
    s.config.template_origin = "dew's default chat template";
  }
  s.tmpl = std::make_shared<dew::ChatTemplate>(s.config.chat_template, s.config.template_origin);
  s.end_of_turn = end_of_turn(s);
  return s;
}

json to_completion_body(const json& body, const ChatSetup& setup) {
  static const std::set<std::string> passed = {"model",     "temperature", "top_p",  "top_k", "min_p",
                                               "seed",      "n",           "stream", "user",  "repetition_penalty",
                                               "max_tokens"};
  static const std::set<std::string> known = {"messages",
                                              "model",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "seed",
                                              "n",
                                              "stream",
                                              "user",
                                              "repetition_penalty",
                                              "max_tokens",
                                              "max_completion_tokens",
                                              "stop",
                                              "stream_options",
                                              "chat_template_kwargs",
                                              "logprobs",
                                              "top_logprobs"};
  static const std::set<std::string> unsupported = {
      "tools",      "tool_choice",       "functions",        "function_call", "response_format", "parallel_tool_calls",
      "logit_bias", "frequency_penalty", "presence_penalty", "audio",         "modalities",      "prediction"};
  if (!body.is_object()) refuse("", "the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (unsupported.count(it.key())) refuse(it.key(), "'" + it.key() + "' is not supported by dew-run serve");
    if (!known.count(it.key())) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      refuse(it.key(), "unknown field '" + it.key() + "' (known: " + list + ")");
    }
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    refuse("messages", "'messages' must be a non-empty array of {role, content}");
  ojson messages = ojson::array();
  for (const json& m : body["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      refuse("messages", "every message needs a string 'role'");
    ojson out = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it) out[it.key()] = ojson::parse(it.value().dump());
    if (m.contains("content") && m["content"].is_array()) {  // content parts: the text ones, joined
      std::string text;
      for (const json& part : m["content"]) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          refuse("messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      refuse("messages", "a message's 'content' must be a string, null or a list of text parts");
    }
    messages.push_back(out);
  }
  ojson conv = ojson::object();
  if (body.contains("chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object())
      refuse("chat_template_kwargs", "'chat_template_kwargs' must be an object of template variables");
    for (auto it = body["chat_template_kwargs"].begin(); it != body["chat_template_kwargs"].end(); ++it) {
      if (it.key() == "messages" || it.key() == "add_generation_prompt")
        refuse("chat_template_kwargs", "'chat_template_kwargs' may not set '" + it.key() + "'");
      conv[it.key()] = ojson::parse(it.value().dump());
    }
  }
  conv["messages"] = messages;
  if (body.contains("stream_options") && !body["stream_options"].is_object() && !body["stream_options"].is_null())
    refuse("stream_options", "'stream_options' must be an object");
  std::string prompt;
  try {
    prompt = setup.tmpl->render(dew::chat_context_json(setup.config, conv.dump(), true)).text;
  } catch (const dew::Error& e) {
    refuse("messages", std::string("the chat template refused the conversation: ") + e.what());
  }
  json out = json::object();
  for (const std::string& k : passed)
    if (body.contains(k)) out[k] = body[k];
  if (body.contains("max_completion_tokens")) {
    if (body.contains("max_tokens"))
      refuse("max_completion_tokens", "give max_tokens or max_completion_tokens, not both");
    out["max_tokens"] = body["max_completion_tokens"];
  }
  out["prompt"] = prompt;
  // logprobs (true / false) and top_logprobs (0..20, only with logprobs): the completions body's logprobs = N.
  if (body.contains("logprobs") && !body["logprobs"].is_boolean())
    refuse("logprobs", "'logprobs' must be true or false");
  const bool logprobs = body.contains("logprobs") && body["logprobs"].get<bool>();
  if (body.contains("top_logprobs")) {
    const json& top = body["top_logprobs"];
    if (!top.is_number_integer() || top.get<int64_t>() < 0 || top.get<int64_t>() > dew::kMaxLogprobs)
      refuse("top_logprobs", "'top_logprobs' must be an integer in [0, " + std::to_string(dew::kMaxLogprobs) + "]");
    if (!logprobs) refuse("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (logprobs) out["logprobs"] = body.contains("top_logprobs") ? body["top_logprobs"] : json(0);
  // The template's end of turn ends a reply; the caller's stop strings come with it.
  json stops = json::array();
  if (body.contains("stop")) {
    const json& st = body["stop"];
    if (st.is_string()) {
      stops.push_back(st);
    } else if (st.is_array()) {
      stops = st;
    } else if (!st.is_null()) {
      refuse("stop", "'stop' must be a string or an array of strings");
    }
    if (stops.size() > 15)
      refuse("stop", "'stop' holds at most 15 strings (the chat template's end of turn is one more)");
  }
  if (!setup.end_of_turn.empty()) stops.push_back(setup.end_of_turn);
  if (!stops.empty()) out["stop"] = stops;
  return out;
}

json message_choice(int64_t index, const std::string& text, const json& finish, const json& logprobs) {
  return json{{"index", index},
              {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}}},
              {"logprobs", logprobs},
              {"finish_reason", finish}};
}

json delta_choice(int64_t index, const std::string& text, const json& finish, bool first, const json& logprobs) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!text.empty() || first) delta["content"] = text;
  return json{{"index", index}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", finish}};
}

std::string token_text(const dew::Tokenizer* tok, int32_t id) {
  if (!tok) return "token_id:" + std::to_string(id);
  const std::string raw = tok->token_bytes(id);
  if (dew::is_valid_utf8(raw)) return raw;
  std::string out = "bytes:";
  for (const unsigned char b : raw) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", b);
    out += hex;
  }
  return out;
}

json logprobs_json(const std::vector<dew::TokenLogprob>& entries, const dew::Tokenizer* tok) {
  auto one = [&](int32_t id, double logprob) {
    json bytes = json::array();
    if (tok)
      for (const unsigned char b : tok->token_bytes(id)) bytes.push_back(int(b));
    return json{{"token", token_text(tok, id)}, {"logprob", logprob}, {"bytes", tok ? bytes : json(nullptr)}};
  };
  json content = json::array();
  for (const dew::TokenLogprob& e : entries) {
    json entry = one(e.token, e.logprob);
    entry["top_logprobs"] = json::array();
    for (const auto& [id, lp] : e.top) entry["top_logprobs"].push_back(one(id, lp));
    content.push_back(entry);
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

}  // namespace dew_run::chat
